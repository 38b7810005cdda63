"""ERNIE 4.5 MoE (Ernie4_5_MoeForCausalLM): the ERNIE 4.5 decoder with sparse SwiGLU experts.

Reference: transformers/models/ernie4_5_moe/modeling_ernie4_5_moe.py. As ERNIE 4.5 dense
(architectures/llama.py's row): `use_bias` on q/k/v/o, every dense MLP and the lm_head; rotary on
interleaved pairs (x0, x1), (x2, x3), … Its own:
- layer i is sparse when (i + 1) % moe_layer_interval == 0 and moe_layer_start_index ≤ i ≤
  moe_layer_end_index (−1: the last layer); the others keep the dense MLP (intermediate_size);
- the router (Ernie4_5_MoeTopKRouter): p = softmax(x · gateᵀ); the experts are the top k of
  p + e_score_correction_bias (`moe_statics`), their weights p itself (without the bias), divided
  by max(Σ, moe_norm_min). ONNX Runtime's MoE ranks by its own softmax, not a biased one: the
  routing is built from standard operators and the fused experts get only the choices and weights
  (builder/blocks/moe.py: routed_experts). The experts have no biases;
- shared experts: one dense MLP of moe_intermediate_size · moe_num_shared_experts, added.
Multi-token-prediction tensors (`mtp*`) are not part of the decoder; transformers skips them too.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from builder.architecture import Weights, attention_weights, rms_norm_decoder
from builder.blocks import (AttentionSpec, ResidualStream, Rope, gated_mlp, linear, rotary_tables, self_attention)
from builder.blocks.moe import routed_experts, unstacked
from builder.checkpoint import Checkpoint
from builder.errors import BuildError
from builder.graph import Graph
from builder.hf_config import from_dict, rope_parameters
from builder.io import DecoderIO
from builder.target import Target

VARIANTS: dict[str, dict[str, Any]] = {"Ernie4_5_MoeForCausalLM": {}}

# onnxruntime-genai 0.18 knows "ernie4_5" (a plain decoder), not "ernie4_5_moe": the same contract.
STRUCTURE: dict[str, Any] = dict(model_type="ernie4_5")

IGNORED = ("model.layers.*.self_attn.rotary_emb.inv_freq", "*mtp*")


@dataclass(frozen=True)
class Ernie4_5_MoeConfig:
    """config.json of Ernie4_5_MoeForCausalLM; field names are the file's keys, defaults transformers' own."""

    model_type: str = "ernie4_5_moe"
    vocab_size: int = 103424
    hidden_size: int = 2560
    intermediate_size: int = 12288
    num_hidden_layers: int = 28
    num_attention_heads: int = 20
    num_key_value_heads: int | None = 4
    head_dim: int | None = None  # not a key of the config class; its attention reads it when present
    hidden_act: str = "silu"
    max_position_embeddings: int = 131072
    rms_norm_eps: float = 1e-5
    tie_word_embeddings: bool = True
    rope_parameters: dict[str, Any] = field(default_factory=dict)
    use_bias: bool = False
    moe_intermediate_size: int = 1536
    moe_k: int = 6
    moe_num_experts: int = 64
    moe_num_shared_experts: int = 2
    moe_layer_start_index: int = 1
    moe_layer_end_index: int = -1
    moe_layer_interval: int = 1
    moe_norm_min: float = 1e-12
    bos_token_id: int | None = 1
    eos_token_id: int | list[int] | None = 2
    pad_token_id: int | None = 0

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        if self.head_dim is None:
            set_(self, "head_dim", self.hidden_size // self.num_attention_heads)
        if self.num_key_value_heads is None:
            set_(self, "num_key_value_heads", self.num_attention_heads)
        if self.moe_layer_end_index == -1:  # Ernie4_5_MoeConfig.__post_init__
            set_(self, "moe_layer_end_index", self.num_hidden_layers - 1)

    def window(self, layer: int) -> int | None:
        return None

    def sparse(self, layer: int) -> bool:
        """Ernie4_5_MoeDecoderLayer.__init__: experts on every interval-th layer in [start, end]."""
        return ((layer + 1) % self.moe_layer_interval == 0
                and self.moe_layer_start_index <= layer <= self.moe_layer_end_index)


def parse_config(raw: dict[str, Any], architecture: str) -> Ernie4_5_MoeConfig:
    rope = rope_parameters(raw, raw.get("max_position_embeddings", 131072), 500_000.0)
    if rope.pop("partial_rotary_factor", 1.0) != 1.0:
        raise BuildError(f"{architecture} with partial_rotary_factor: transformers rotates the whole head")
    return from_dict(Ernie4_5_MoeConfig, raw, VARIANTS[architecture], rope_parameters=rope, **STRUCTURE)


def experts(m: Weights, c: Ernie4_5_MoeConfig):
    """Each expert's (gate, up, down) matrices: per-expert Linears as on the hub, or the stacked
    [E, 2I, H] / [E, H, I] tensors of Ernie4_5_MoeExperts (gate rows first, then up)."""
    E, H, I = c.moe_num_experts, c.hidden_size, c.moe_intermediate_size
    if m.prefix + "experts.gate_up_proj" in m.ckpt:
        gate_up = m("experts.gate_up_proj", E, 2 * I, H)
        return unstacked(gate_up, 0, I), unstacked(gate_up, I), unstacked(m("experts.down_proj", E, H, I))
    each = [m.under(f"experts.{e}.") for e in range(E)]
    return ([x("gate_proj.weight", I, H) for x in each], [x("up_proj.weight", I, H) for x in each],
            [x("down_proj.weight", H, I) for x in each])


def dense_mlp(g: Graph, h, m: Weights, c: Ernie4_5_MoeConfig, size: int, target: Target):
    """Ernie4_5_MoeMLP: down(silu(gate(x)) · up(x)), biased by `use_bias`."""
    H = c.hidden_size
    biases = (m("gate_proj.bias", size), m("up_proj.bias", size), m("down_proj.bias", H)) if c.use_bias else None
    return gated_mlp(g, h, m("gate_proj.weight", size, H), m("up_proj.weight", size, H),
                     m("down_proj.weight", H, size), c.hidden_act, target, biases)


def sparse_moe_block(g: Graph, h, m: Weights, c: Ernie4_5_MoeConfig, target: Target):
    """Ernie4_5_MoeSparseMoeBlock.forward: routed experts plus the shared experts."""
    H, E, k = c.hidden_size, c.moe_num_experts, c.moe_k
    with g.scope("gate"):  # Ernie4_5_MoeTopKRouter, in float (transformers keeps it in fp32)
        scores = linear(g, h, m("gate.weight", E, H), replace(target, quantization=None))  # (B, S, E)
        p = g.op.Softmax(scores, axis=-1)  # (B, S, E)
        bias = g.weight("moe_statics.e_score_correction_bias",
                        m("moe_statics.e_score_correction_bias", 1, E).astype(target.io_dtype))  # (1, E)
        index = g.op.TopK(g.op.Add(p, bias), g.constant([k], "int64"), axis=-1, _outputs=2)[1]  # (B, S, k)
        weight = g.op.GatherElements(p, index, axis=-1)  # (B, S, k): unbiased
        total = g.op.ReduceSum(weight, g.constant([-1], "int64"), keepdims=1)  # (B, S, 1)
        floor = g.op.CastLike(g.constant(c.moe_norm_min, "float32"), total)
        weight = g.op.Div(weight, g.op.Max(total, floor))
    y = routed_experts(g, h, scores, index, weight, k, *experts(m, c), target)
    if c.moe_num_shared_experts > 0:
        with g.scope("shared_experts"):
            shared = dense_mlp(g, h, m.under("shared_experts."), c, c.moe_intermediate_size * c.moe_num_shared_experts,
                               target)
        y = g.op.Add(y, shared)
    return y


def decoder_layer(g: Graph, stream: ResidualStream, w: Weights, c: Ernie4_5_MoeConfig, i: int, past, lengths,
                  rotary, target: Target):
    """Ernie4_5_MoeDecoderLayer.forward: x + attn(norm(x)), then x + mlp(norm(x)); returns the layer's KV."""
    H = c.hidden_size
    with g.scope("input_layernorm"):
        h = stream.norm(w("input_layernorm.weight", H))
    attention = attention_weights(w.under("self_attn."), c, c.use_bias, c.use_bias)
    spec = AttentionSpec(c.num_attention_heads, c.num_key_value_heads, c.head_dim, rotary_interleaved=True)
    with g.scope("self_attn"):
        h, key, value = self_attention(g, h, past, lengths, rotary, attention, spec, target)
    stream.add(h)
    with g.scope("post_attention_layernorm"):
        h = stream.norm(w("post_attention_layernorm.weight", H))
    m = w.under("mlp.")
    with g.scope("mlp"):
        if c.sparse(i):
            stream.add(sparse_moe_block(g, h, m, c, target))
        else:
            stream.add(dense_mlp(g, h, m, c, c.intermediate_size, target))
    return key, value


def build(g: Graph, io: DecoderIO, ckpt: Checkpoint, c: Ernie4_5_MoeConfig, target: Target):
    rope = Rope.from_parameters(c.rope_parameters, c.head_dim, c.max_position_embeddings)
    rotary = rotary_tables(g, rope, c.max_position_embeddings, target)
    bias = ckpt.weight("lm_head.bias", (c.vocab_size,)) if c.use_bias else None  # nn.Linear(bias=use_bias)
    return rms_norm_decoder(g, io, ckpt, c, target, decoder_layer, rotary, bias)


__all__ = ["IGNORED", "STRUCTURE", "VARIANTS", "Ernie4_5_MoeConfig", "build", "decoder_layer", "parse_config"]
