"""Llama 4's text decoder (Llama4ForCausalLM, and the text of the hub's Llama4ForConditionalGeneration).

Reference: transformers/models/llama4/modeling_llama4.py. Each layer is x + attn(norm(x)), then
x + feed_forward(norm(x)). The attention of a rotary layer (`no_rope_layers[i]` 1: three of four by
default) rotates interleaved pairs (a complex product), then L2-normalizes q and k per head without
a weight (`use_qk_norm`), and attends within chunks of `attention_chunk_size` positions (a key
whose ⌊t / chunk⌋ differs from the query's is masked: GroupQueryAttention's attention_bias); the
other layers have no rotary, attend globally, and scale each query by the temperature
1 + attn_scale·log(1 + ⌊(position + 1) / floor_scale⌋) (`attn_temperature_tuning`). The feed-forward
of a `moe_layers` layer is a top-1 mixture of SwiGLU experts beside a shared expert: the router's
sigmoid(top logit) scales the expert's *input* (Llama4TextMoe: expert(s·x), not s·expert(x)), so
the graph scales x by the chosen expert's s and runs MoE/QMoE with that expert at weight 1
(exact for one expert per token; more is refused). Its experts are stored transposed,
gate_up_proj [E, H, 2I] and down_proj [E, I, H]. The other layers have a SwiGLU of
`intermediate_size_mlp`.

genai type "llama": an ordinary KV cache per layer.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, ClassVar

import numpy as np
import onnx_ir as ir

from architectures.moe import dense_mlp
from builder.architecture import Weights, attention_weights, prefix_holding, vocabulary
from builder.blocks import AttentionSpec, Rope, rotary_tables, self_attention
from builder.blocks.attention_positions import attention_temperature, chunk_mask
from builder.blocks.linear import linear
from builder.blocks.moe import routed_experts
from builder.decoder_config import DecoderConfig
from builder.family import Decoder, Family, normed_attention, parse, register
from builder.hf_config import text_config
from builder.inputs.source import Checkpoint
from builder.lazy import Weight

VARIANTS: dict[str, dict[str, Any]] = {
    "Llama4ForCausalLM": dict(
        model_type="llama4_text", vocab_size=202048, hidden_size=5120, intermediate_size=8192, num_hidden_layers=48,
        num_attention_heads=40, num_key_value_heads=8, head_dim=128, max_position_embeddings=4096 * 32,
        rms_norm_eps=1e-5, default_theta=500_000.0,
    ),
}
VARIANTS["Llama4ForConditionalGeneration"] = VARIANTS["Llama4ForCausalLM"]
TEXT_CONFIG = {"Llama4ForConditionalGeneration": "text_config"}
STRUCTURE: dict[str, dict[str, Any]] = {a: dict(model_type="llama", sliding_window=None) for a in VARIANTS}
CHUNKED, FULL = "chunked_attention", "full_attention"


@dataclass(frozen=True)
class Llama4TextConfig(DecoderConfig):
    """config.json's text_config of Llama 4: the shared decoder keys and its own (Llama4TextConfig's defaults)."""

    LAYER_TYPES: ClassVar[tuple[str, ...]] = (CHUNKED, FULL)

    intermediate_size_mlp: int = 16384
    num_experts_per_tok: int = 1
    num_local_experts: int = 16
    moe_layers: list[int] | None = None
    interleave_moe_layer_step: int = 1
    use_qk_norm: bool = True
    no_rope_layers: list[int] | None = None
    no_rope_layer_interval: int = 4
    attention_chunk_size: int | None = 8192
    attn_temperature_tuning: bool = True
    floor_scale: int = 8192
    attn_scale: float = 0.1

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        n = self.num_hidden_layers
        if not self.no_rope_layers:  # 1: the layer rotates (and is chunked); 0: no rotary, global
            set_(self, "no_rope_layers", [int((i + 1) % self.no_rope_layer_interval != 0) for i in range(n)])
        if len(self.no_rope_layers) != n:
            raise ValueError(f"no_rope_layers has {len(self.no_rope_layers)} entries for {n} layers")
        if self.moe_layers is None:
            step = self.interleave_moe_layer_step
            set_(self, "moe_layers", list(range(step - 1, n, step)))
        if self.moe_layers and self.num_experts_per_tok != 1:
            raise ValueError(f"num_experts_per_tok {self.num_experts_per_tok}: Llama 4's router scales each "
                             "expert's input, which builder builds for one expert per token (every Llama 4 has 1)")
        if self.hidden_act != "silu":
            raise ValueError(f"hidden_act {self.hidden_act!r}: the experts run as SwiGLU (silu) only")
        super().__post_init__()

    def default_layer_types(self) -> list[str]:
        """Llama4TextConfig's: the rotary layers are chunked, the others full."""
        return [CHUNKED if rope else FULL for rope in self.no_rope_layers]

    def rotates(self, layer: int) -> bool:
        return bool(self.no_rope_layers[layer])


def parse_config(family: Family, raw: dict[str, Any], architecture: str) -> Llama4TextConfig:
    """The config of `architecture`: config.json's, or the multimodal one's `text_config`."""
    if architecture in TEXT_CONFIG:
        raw = {**text_config(raw, TEXT_CONFIG[architecture]), "architectures": [architecture]}
    return parse(family, raw, architecture)


# Where the decoder's tensors are -> its lm_head: Llama4ForCausalLM's, the hub's
# Llama4ForConditionalGeneration's, and the layout transformers 5 saves that class in.
PREFIXES = {"model.": "lm_head.weight", "language_model.model.": "language_model.lm_head.weight",
            "model.language_model.": "lm_head.weight"}


def decoder_prefix(ckpt: Checkpoint) -> str:
    return prefix_holding(ckpt, "embed_tokens.weight", tuple(PREFIXES))


def llama4_vocabulary(d: Decoder):
    """The embedding under the decoder's prefix, and the lm_head of that layout."""
    return vocabulary(d.g, d.ckpt, d.target, (d.c.vocab_size, d.c.hidden_size), d.c.tie_word_embeddings,
                      embed=d.prefix + "embed_tokens.weight", head=PREFIXES[d.prefix])


def explicit_rotary(d: Decoder):
    """The rotary tables, applied before the attention: the q/k L2 norm comes after the rotation."""
    c = d.c
    rope = Rope.from_parameters(c.rope_parameters, c.head_dim, c.max_position_embeddings)
    return rotary_tables(d.g, rope, c.max_position_embeddings, d.target, explicit=c.use_qk_norm, head_size=c.head_dim)


@dataclass(frozen=True)
class Shared:
    """What the layers share: the chunk mask of the rotary layers, the temperature of the others."""

    chunk_mask: ir.Value | None
    temperature: ir.Value | None


def prepare(d: Decoder) -> Shared:
    c = d.c
    mask = temperature = None
    if c.attention_chunk_size and any(c.rotates(i) for i in range(c.num_hidden_layers)):
        mask = chunk_mask(d.g, d.io.token_input, d.io.attention_mask, d.lengths, c.attention_chunk_size, d.target)
    if c.attn_temperature_tuning and not all(c.rotates(i) for i in range(c.num_hidden_layers)):
        temperature = attention_temperature(d.g, d.io.token_input, d.lengths, c.attn_scale, c.floor_scale, d.target,
                                            offset=1)
    return Shared(mask, temperature)


def attention(d: Decoder, a: Weights, i: int, h):
    """Llama4TextAttention.forward; returns (output, key, value)."""
    c = d.c
    weights = attention_weights(a, c, c.attention_bias, c.attention_bias)
    rotates = c.rotates(i)
    if rotates and c.use_qk_norm:  # Llama4TextL2Norm: RMS without a weight, after the rotary
        unit = Weight.constant(np.ones(c.head_dim, np.float32))
        weights = replace(weights, q_norm=unit, k_norm=unit)
    spec = AttentionSpec(c.num_attention_heads, c.num_key_value_heads, c.head_dim, norm_eps=c.rms_norm_eps,
                         rotary_interleaved=True, qk_norm_after_rotary=rotates and c.use_qk_norm)
    shared = d.prepared
    return self_attention(d.g, h, d.past(i), d.lengths, d.rotary if rotates else None, weights, spec, d.target,
                          q_scale=None if rotates else shared.temperature,
                          attention_bias=shared.chunk_mask if rotates else None)


def experts(d: Decoder, f: Weights, h):
    """Llama4TextMoe.forward: expert_e(sigmoid(top logit)·x) for the chosen e, plus the shared expert."""
    g, c = d.g, d.c
    H, E, I = c.hidden_size, c.num_local_experts, c.intermediate_size
    with g.scope("router"):  # a float Linear, as every router here
        logits = linear(g, g.op.Cast(h, to=ir.DataType.FLOAT), f("router.weight", E, H),
                        replace(d.target, quantization=None, io_dtype=np.dtype(np.float32)))  # (B, S, E)
        top, index = g.op.TopK(logits, g.constant([1], "int64"), axis=-1, _outputs=2)  # (B, S, 1)
        scaled = g.op.Mul(h, g.op.CastLike(g.op.Sigmoid(top), h))  # the expert's input
    gate_up = f("experts.gate_up_proj", E, H, 2 * I)  # per expert x @ W: [H, 2I], gate columns first
    down = f("experts.down_proj", E, I, H)

    def columns(stacked: Weight, e: int, start: int, stop: int) -> Weight:  # expert e's [out, in] matrix
        rows, cols = stacked.shape[1:]
        return stacked.slice(0, e, e + 1).reshaped(rows, cols).slice(1, start, stop).transpose()

    gates = [columns(gate_up, e, 0, I) for e in range(E)]
    ups = [columns(gate_up, e, I, 2 * I) for e in range(E)]
    downs = [columns(down, e, 0, H) for e in range(E)]
    one = g.op.Expand(g.constant(1.0, d.target.io_dtype), g.op.Shape(top))  # the scale is in the input
    y = routed_experts(g, scaled, logits, index, one, 1, gates, ups, downs, d.target)
    with g.scope("shared_expert"):
        return g.op.Add(y, dense_mlp(d, h, f.under("shared_expert."), I))


def decoder_layer(d: Decoder, w: Weights, i: int):
    """Llama4TextDecoderLayer.forward; returns the layer's KV."""
    g, c = d.g, d.c
    H = c.hidden_size
    h, key, value = normed_attention(d, w, i, attention)
    d.stream.add(h)
    with g.scope("post_attention_layernorm"):
        h = d.stream.norm(w("post_attention_layernorm.weight", H))
    f = w.under("feed_forward.")
    with g.scope("feed_forward"):
        d.stream.add(experts(d, f, h) if i in c.moe_layers else dense_mlp(d, h, f, c.intermediate_size_mlp))
    return key, value


FAMILY = register(Family(
    "llama4", Llama4TextConfig, decoder_layer, VARIANTS, structure=STRUCTURE, parser=parse_config,
    rotary=explicit_rotary, prepare=prepare, vocabulary=llama4_vocabulary,
    prefix=lambda d: decoder_prefix(d.ckpt),
    # The hub's multimodal checkpoints: the vision tower and projector are not part of the text build.
    ignored=("vision_model.*", "multi_modal_projector.*", "model.vision_model.*", "model.multi_modal_projector.*"),
))

__all__ = ["FAMILY", "VARIANTS", "Llama4TextConfig", "decoder_layer"]
