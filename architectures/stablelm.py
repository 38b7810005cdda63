"""StableLM (StableLmForCausalLM): StableLM-3B-4E1T, StableLM-2 1.6B/12B, Zephyr and Code variants.

Reference: transformers/models/stablelm/modeling_stablelm.py. Apart from Llama: LayerNorms with
bias; partial rotary (a quarter of the head by default); optional q/k/v biases (`use_qkv_bias`,
StableLM 2); optional per-head LayerNorms on q and k, one weight per head and no bias
(`qk_layernorm`, StableLM 2 12B); optionally parallel branches from the one input LayerNorm
(`use_parallel_residual`, StableLM 2 12B), with no post_attention_layernorm then.

onnxruntime-genai 0.18 knows no "stablelm" model type; its "llama" one runs the same contract
(input_ids, attention_mask, per-layer KV in and out, logits), so genai_config says "llama".
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from builder.architecture import Weights, attention_weights, decoder_layers, vocabulary
from builder.blocks import (
    AttentionSpec,
    ResidualStream,
    Rope,
    gated_mlp,
    rotary_tables,
    self_attention,
    sequence_lengths,
)
from builder.checkpoint import Checkpoint
from builder.graph import Graph
from builder.hf_config import from_dict, rope_parameters
from builder.io import DecoderIO
from builder.lazy import Weight
from builder.target import Target

VARIANTS: dict[str, dict[str, Any]] = {"StableLmForCausalLM": {}}

# onnxruntime-genai's model type for the same decoder contract (see the module docstring).
STRUCTURE: dict[str, dict[str, Any]] = {"StableLmForCausalLM": dict(model_type="llama")}

IGNORED: tuple[str, ...] = ()


@dataclass(frozen=True)
class StableLmConfig:
    """config.json of StableLmForCausalLM; field names are the file's keys, defaults transformers' own."""

    model_type: str = "stablelm"
    vocab_size: int = 50304
    hidden_size: int = 2560
    intermediate_size: int = 6912
    num_hidden_layers: int = 32
    num_attention_heads: int = 32
    num_key_value_heads: int = 32
    hidden_act: str = "silu"
    max_position_embeddings: int = 4096
    layer_norm_eps: float = 1e-5
    tie_word_embeddings: bool = False
    rope_parameters: dict[str, Any] = field(default_factory=dict)
    use_qkv_bias: bool = False
    qk_layernorm: bool = False
    use_parallel_residual: bool = False
    bos_token_id: int | None = 0
    eos_token_id: int | list[int] | None = 0
    pad_token_id: int | None = None

    def window(self, layer: int) -> int | None:
        return None

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


def parse_config(raw: dict[str, Any], architecture: str) -> StableLmConfig:
    params = rope_parameters(raw, raw.get("max_position_embeddings", 4096))
    params.setdefault("partial_rotary_factor", 0.25)  # StableLmConfig's default, for configs that omit it
    return from_dict(StableLmConfig, raw, VARIANTS[architecture], rope_parameters=params,
                     **STRUCTURE[architecture])


def per_head_norm(a: Weights, name: str, heads: int, dim: int) -> Weight:
    """StableLmLayerNormPerHead's weights `<name>.norms.<h>.weight`, stacked to [heads, head_dim]."""
    return Weight.stack([a(f"{name}.norms.{h}.weight", dim) for h in range(heads)])


def decoder_layer(g: Graph, stream: ResidualStream, w: Weights, c: StableLmConfig, i: int, past, lengths, rotary,
                  target: Target):
    """StableLmDecoderLayer.forward: x + attn(ln1(x)), then + mlp(ln2(x)); with use_parallel_residual
    x + attn(ln1(x)) + mlp(ln1(x)). Returns the layer's KV."""
    H, D, I = c.hidden_size, c.head_dim, c.intermediate_size
    with g.scope("input_layernorm"):
        h = stream.norm(w("input_layernorm.weight", H), w("input_layernorm.bias", H))
    a = w.under("self_attn.")
    attention = attention_weights(a, c, c.use_qkv_bias, False)
    if c.qk_layernorm:
        attention = dataclasses.replace(attention, q_norm=per_head_norm(a, "q_layernorm", c.num_attention_heads, D),
                                        k_norm=per_head_norm(a, "k_layernorm", c.num_key_value_heads, D))
    spec = AttentionSpec(c.num_attention_heads, c.num_key_value_heads, D, norm_eps=c.layer_norm_eps, qk_layer_norm=True)
    with g.scope("self_attn"):
        attn, key, value = self_attention(g, h, past, lengths, rotary, attention, spec, target)
    stream.add(attn)
    if not c.use_parallel_residual:
        with g.scope("post_attention_layernorm"):
            h = stream.norm(w("post_attention_layernorm.weight", H), w("post_attention_layernorm.bias", H))
    m = w.under("mlp.")
    with g.scope("mlp"):
        stream.add(gated_mlp(g, h, m("gate_proj.weight", I, H), m("up_proj.weight", I, H), m("down_proj.weight", H, I),
                             c.hidden_act, target))
    return key, value


def build(g: Graph, io: DecoderIO, ckpt: Checkpoint, c: StableLmConfig, target: Target):
    H = c.hidden_size
    rope = Rope.from_parameters(c.rope_parameters, c.head_dim, c.max_position_embeddings)
    rotary = rotary_tables(g, rope, c.max_position_embeddings, target)
    lengths = sequence_lengths(g, io.attention_mask)
    vocab = vocabulary(g, ckpt, target, (c.vocab_size, H), c.tie_word_embeddings)
    stream = ResidualStream(g, vocab.embed(g, io.input_ids), c.layer_norm_eps, target, layer_norm=True)
    presents = decoder_layers(g, ckpt, c.num_hidden_layers,
                              lambda i, w: decoder_layer(g, stream, w, c, i, io.past[i], lengths, rotary, target))
    with g.scope("model", "norm"):
        h = stream.norm(ckpt.weight("model.norm.weight", (H,)), ckpt.weight("model.norm.bias", (H,)))
    return vocab.logits(g, h), presents


__all__ = ["IGNORED", "STRUCTURE", "VARIANTS", "StableLmConfig", "build", "decoder_layer", "parse_config"]
