"""Ergo (ErgoForCausalLM): DeepSeek-V3's model and sigmoid top-k router with its own attention,
normed relu² experts, sandwich norms and gated residuals.

Reference: transformers/models/ergo/modular_ergo.py (modeling_ergo.py). What differs from
architectures/deepseek_v3.py and glm4_moe.py:
- the attention is GQA over one fused `qkv_proj` (query, key, value rows) with per-head q/k RMSNorm,
  head_dim always hidden_size / heads; the "sliding_attention" layers (every layer but each
  `global_attention_every_n_layers`-th, unless `layer_types` says) see `sliding_window` tokens and
  rotate interleaved pairs (x0, x1), (x2, x3), … (Cohere 2's rotary); the "full_attention" ones have
  no rotary (NoPE) and their logits are multiplied by `global_attention_scale` when it is set
  (transformers multiplies q and k by its square root);
- every norm is in float32 and the residual stream is float32 (kept so in fp16 builds);
- a layer is x ← r ⊙ x + b ⊙ post_norm(branch(pre_norm(x))) for attention, then the MLP, with
  b = sigmoid(w) and r = sqrt(1 + b) · exp(−softplus(w) / 2) per channel (ErgoResidualGate): r
  scales the stream, b is folded into the post norm's weight;
- MLPs are down(relu(up(x))²): the first `num_dense_blocks` layers (`mlp_layer_types`) dense of
  first_dense_intermediate_size, the others a router (`gate.linear`: sigmoid scores, the correction
  bias choosing, the chosen scores renormalized times moe_routed_scaling_factor; one group: GLM's
  grouped_sigmoid_router) over stacked experts [E, H, I] / [E, I, H] (x · W) whose outputs are each
  RMS-normed with their expert's own weight (`post_expert_norm`, [E, H]) before the weighted sum,
  plus a shared expert RMS-normed by `shared_experts.norm`;
- no tied vocabulary whatever tie_word_embeddings says.

ONNX Runtime's MoE sums the weighted experts itself, so the per-expert norm cannot go inside it:
each token is repeated once per chosen expert and the operator runs every row through its one
expert at weight 1 (routed_experts; relu² as u · σ(10⁴u) · u, RELU_SQUARED_ALPHA, as for
Nemotron-H); the rows are then normed, scaled by their expert's weight and routing weight, and summed.
onnxruntime-genai 0.18 knows no ergo: its KV cache and I/O are Llama's, so genai runs it as "llama".
Checkpoints (the released ones and transformers' save_pretrained alike) are in the training
framework's layout (`tok_embeddings`, `layers.N.attention.wqkv`, `feed_forward.gate_kernel`, ...):
read under transformers' names by the model type's renames (its conversion rules); the router and
the shared expert, which it stores as (in, out), are renamed apart (`gate.kernel`,
`shared_experts.up_kernel`, `down_kernel`) and read transposed. Names already transformers' pass
unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx_ir as ir

from builder.architecture import Weights
from builder.blocks import AttentionSpec, AttentionWeights, self_attention
from builder.blocks.mlp import plain_mlp
from builder.blocks.moe import RELU_SQUARED_ALPHA, grouped_sigmoid_router, routed_experts, unstacked
from builder.blocks.norm import rms_norm
from builder.blocks.residual import ResidualStream
from builder.blocks.rope import Rope, rotary_tables
from builder.decoder_config import DecoderConfig
from builder.errors import BuildError
from builder.lazy import Weight
from builder.hf_config import rope_parameters as hf_rope_parameters
from builder.family import Decoder, Family, ModelType, normed_attention, parse, register, whole_head_rotary

FULL, SLIDING = "full_attention", "sliding_attention"

# ErgoConfig's defaults (transformers 5.25).
VARIANTS: dict[str, dict[str, Any]] = {
    "ErgoForCausalLM": dict(
        model_type="ergo", vocab_size=262144, hidden_size=8192, num_hidden_layers=64, num_attention_heads=64,
        num_key_value_heads=8, first_dense_intermediate_size=32768, num_dense_blocks=1, moe_intermediate_size=4096,
        shared_intermediate_size=8192, num_experts=256, num_experts_per_tok=8, moe_routed_scaling_factor=8**0.5,
        max_position_embeddings=524288, rms_norm_eps=1e-12, sliding_window=512, global_attention_every_n_layers=4,
        global_attention_scale=None, pad_token_id=0, eos_token_id=1, bos_token_id=2, default_theta=1_000_000.0,
    ),
}
# What modeling_ergo.py fixes: head_dim from the hidden size, relu² MLPs, an untied lm_head.
STRUCTURE: dict[str, dict[str, Any]] = {
    "ErgoForCausalLM": dict(model_type="llama", head_dim=None, hidden_act="relu2", tie_word_embeddings=False,
                            attention_bias=False),
}


# config.json's model_type -> the row, with ErgoConfig's attribute_map and transformers' conversion
# rules for "ergo" (conversion_mapping.py), the transposed tensors under names of their own.
MODEL_TYPES: dict[str, ModelType] = {"ergo": ModelType("ErgoForCausalLM", keys={"local_attention_window": "sliding_window"},
                                                       renames=(
    (r"^tok_embeddings\.", "model.embed_tokens."), (r"^norm\.", "model.norm."), (r"^output\.", "lm_head."),
    (r"^layers\.", "model.layers."), (r"\.attention_norm\.", ".input_layernorm."),
    (r"\.post_attention_norm\.", ".post_attention_layernorm."), (r"\.ffn_norm\.", ".pre_feedforward_layernorm."),
    (r"\.post_ffn_norm\.", ".post_feedforward_layernorm."),
    (r"\.post_attention_residual\.scale", ".attention_residual_gate.weight"),
    (r"\.post_ffn_residual\.scale", ".feedforward_residual_gate.weight"),
    (r"\.attention\.wqkv\.", ".self_attn.qkv_proj."), (r"\.attention\.wo\.", ".self_attn.o_proj."),
    (r"\.attention\.q_norm\.", ".self_attn.q_norm."), (r"\.attention\.k_norm\.", ".self_attn.k_norm."),
    (r"\.feed_forward\.up\.", ".mlp.up_proj."), (r"\.feed_forward\.down\.", ".mlp.down_proj."),
    (r"\.feed_forward\.gate_kernel$", ".mlp.gate.kernel"),  # (hidden, experts)
    (r"\.feed_forward\.router_bias", ".mlp.gate.e_score_correction_bias"),
    (r"\.feed_forward\.up_proj", ".mlp.experts.up_proj"), (r"\.feed_forward\.down_proj", ".mlp.experts.down_proj"),
    (r"\.feed_forward\.expert_output_norm\.scale", ".mlp.experts.post_expert_norm.weight"),
    (r"\.feed_forward\.shared_up_proj$", ".mlp.shared_experts.up_kernel"),  # (in, out)
    (r"\.feed_forward\.shared_down_proj$", ".mlp.shared_experts.down_kernel"),
    (r"\.feed_forward\.shared_expert_output_norm\.scale", ".mlp.shared_experts.norm.weight"),
))}


@dataclass(frozen=True)
class ErgoConfig(DecoderConfig):
    """config.json of ErgoForCausalLM: the shared decoder keys and Ergo's own."""

    first_dense_intermediate_size: int = 32768
    num_dense_blocks: int = 1
    moe_intermediate_size: int = 4096
    shared_intermediate_size: int = 8192
    num_experts: int = 256
    num_experts_per_tok: int = 8
    moe_routed_scaling_factor: float = 8**0.5
    global_attention_every_n_layers: int = 4
    global_attention_scale: float | None = None
    mlp_layer_types: list[str] | None = None

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        if self.layer_types is None and self.global_attention_every_n_layers < 1:
            raise ValueError(f"global_attention_every_n_layers {self.global_attention_every_n_layers}: transformers "
                             "divides the layer index by it (it must be at least 1)")
        if self.mlp_layer_types is None:
            set_(self, "mlp_layer_types", ["dense" if i < self.num_dense_blocks else "sparse"
                                           for i in range(self.num_hidden_layers)])
        if len(self.mlp_layer_types) != self.num_hidden_layers:
            raise ValueError(f"mlp_layer_types has {len(self.mlp_layer_types)} entries for "
                             f"{self.num_hidden_layers} layers")
        if not 1 <= self.num_experts_per_tok <= self.num_experts:
            raise ValueError(f"num_experts_per_tok={self.num_experts_per_tok} of {self.num_experts} experts: "
                             "transformers' top-k fails")
        if self.global_attention_scale is not None and self.global_attention_scale <= 0:
            raise ValueError(f"global_attention_scale {self.global_attention_scale}: builder builds a positive "
                             "scale (transformers multiplies q and k by its square root)")
        super().__post_init__()

    def default_layer_types(self) -> list[str]:
        """ErgoConfig.__post_init__: every global_attention_every_n_layers-th layer full, the others slide."""
        n = self.global_attention_every_n_layers
        return [SLIDING if (i + 1) % n else FULL for i in range(self.num_hidden_layers)]

    def sparse(self, layer: int) -> bool:
        """ErgoDecoderLayer: the experts unless the layer is "dense"."""
        return self.mlp_layer_types[layer] != "dense"

    def rope(self, layer: int) -> dict[str, Any] | None:
        """The layer's rotary settings: ErgoModel gives a layer type position embeddings only where
        rope_parameters has an entry for it (the sliding layers)."""
        return self.rope_parameters.get(self.layer_types[layer])


def parse_config(family: Family, raw: dict[str, Any], architecture: str) -> ErgoConfig:
    """`parse` over config.json as ErgoConfig reads it (`local_attention_window`, the released
    configs' name, already sliding_window: MODEL_TYPES). Flat rotary settings describe the sliding
    layers and the full ones have none; a rope_parameters per layer type (what save_pretrained
    writes) is kept per type, each entry resolved as a flat one."""
    given = raw.get("rope_parameters")
    if not (isinstance(given, dict) and (FULL in given or SLIDING in given)):
        c = parse(family, raw, architecture)
        object.__setattr__(c, "rope_parameters", {SLIDING: whole_head_rotary(c.rope_parameters, architecture),
                                                  FULL: None})
        return c
    c = parse(family, {k: v for k, v in raw.items() if k not in ("rope_parameters", "rope_scaling")}, architecture)
    theta = family.variants[architecture]["default_theta"]
    per_type = {}
    for kind in (SLIDING, FULL):
        entry = given.get(kind)
        if entry is not None and not isinstance(entry, dict):
            raise BuildError(f"config.json: rope_parameters[{kind!r}] is {entry!r}, not a dict or null")
        per_type[kind] = None if entry is None else whole_head_rotary(
            hf_rope_parameters({"rope_parameters": entry}, c.max_position_embeddings, theta), architecture)
    object.__setattr__(c, "rope_parameters", per_type)
    return c


def rotary(d: Decoder) -> dict[str, Any] | None:
    """(cos, sin) tables per layer type that has rotary settings, when any layer rotates."""
    c = d.c
    kinds = [t for t in dict.fromkeys(c.layer_types) if c.rope_parameters.get(t) is not None]
    if not kinds:
        return None
    return {t: rotary_tables(d.g, Rope.from_parameters(c.rope_parameters[t], c.head_dim, c.max_position_embeddings),
                             c.max_position_embeddings, d.target, t.split("_")[0] + "_", head_size=c.head_dim)
            for t in kinds}


def stream(d: Decoder, x: ir.Value) -> ResidualStream:
    """The residual stream in float32, as ErgoModel keeps it (its embedding, norms and gates are float32)."""
    return ResidualStream(d.g, x, d.c.rms_norm_eps, d.target, np.float32)


def attention(d: Decoder, a: Weights, i: int, h: ir.Value):
    """ErgoAttention.forward: (output after o_proj, present key, present value)."""
    c, D = d.c, d.c.head_dim
    q, kv = c.num_attention_heads * D, c.num_key_value_heads * D
    weights = AttentionWeights(o=a("o_proj.weight", c.hidden_size, q), qkv=a("qkv_proj.weight", q + 2 * kv, c.hidden_size),
                               q_norm=a("q_norm.weight", D), k_norm=a("k_norm.weight", D))
    rotates = c.rope(i) is not None
    scaled = c.layer_types[i] != SLIDING and c.global_attention_scale is not None  # ErgoAttention.qk_scale
    scale = D ** -0.5 * (c.global_attention_scale if scaled else 1.0)
    spec = AttentionSpec(c.num_attention_heads, c.num_key_value_heads, D, scale=scale, window=c.window(i),
                         norm_eps=c.rms_norm_eps, rotary_interleaved=True)
    tables = d.rotary[c.layer_types[i]] if rotates else None
    return self_attention(d.g, h, d.past(i), d.lengths, tables, weights, spec, d.target)


def linear_weight(m: Weights, name: str, kernel: str, out: int, into: int) -> Weight:
    """A Linear's [out, in] weight: transformers' `name`, or the stored (in, out) `kernel`, transposed."""
    return m(kernel, into, out).transpose() if m.prefix + kernel in m.ckpt else m(name, out, into)


def relu2_mlp(d: Decoder, m: Weights, h: ir.Value, size: int, kernels: bool = False) -> ir.Value:
    """ErgoMLP / ErgoSharedExpert's MLP: down_proj(relu(up_proj(h))²); `kernels`: the shared
    expert's, which checkpoints store as (in, out)."""
    H = d.c.hidden_size
    up = linear_weight(m, "up_proj.weight", "up_kernel", size, H) if kernels else m("up_proj.weight", size, H)
    down = linear_weight(m, "down_proj.weight", "down_kernel", H, size) if kernels else m("down_proj.weight", H, size)
    return plain_mlp(d.g, h, up, down, "relu2", d.target)


def normed(d: Decoder, x: ir.Value, weight) -> ir.Value:
    """ErgoRMSNorm over x in float32, back in the IO dtype."""
    g, target = d.g, d.target
    y = rms_norm(g, g.op.Cast(x, to=ir.DataType.FLOAT), weight, d.c.rms_norm_eps, target, np.float32)
    return g.op.CastLike(y, x)


def experts(d: Decoder, m: Weights, h: ir.Value) -> ir.Value:
    """ErgoMoE.forward: Σ_j weight_j · n_{e_j} ⊙ rms(expert_{e_j}(h)), plus the normed shared expert."""
    g, c, target = d.g, d.c, d.target
    H, E, I, k = c.hidden_size, c.num_experts, c.moe_intermediate_size, c.num_experts_per_tok
    last = g.constant([-1], "int64")
    with g.scope("gate"):
        logits, index, weight = grouped_sigmoid_router(
            g, h, linear_weight(m, "gate.linear.weight", "gate.kernel", E, H), m("gate.e_score_correction_bias", E), k, 1, 1, True,
            c.moe_routed_scaling_factor, target)
    with g.scope("experts"):
        up = unstacked(m("experts.up_proj", E, H, I), transposed=True)  # x · up_proj[e]: [E, H, I]
        down = unstacked(m("experts.down_proj", E, I, H), transposed=True)
        with g.scope("routes"):  # each token once per chosen expert: (B, S·k, H), expert (B, S·k, 1)
            rows = g.op.Reshape(g.op.Expand(g.op.Unsqueeze(h, g.constant([2], "int64")),
                                            g.constant([1, 1, k, 1], "int64")), g.constant([0, -1, H], "int64"))
            route = g.op.Reshape(index, g.constant([0, -1, 1], "int64"))
            shape = g.op.Concat(g.op.Slice(g.op.Shape(route), g.constant([0], "int64"), g.constant([2], "int64")),
                                g.constant([E], "int64"), axis=0)
            one = g.op.Expand(g.constant(1.0, target.io_dtype), g.op.Shape(route))
    y = routed_experts(g, rows, g.op.Expand(g.constant(0.0, target.io_dtype), shape), route, one, 1, up, up, down,
                       target, RELU_SQUARED_ALPHA)  # (B, S·k, H): each row its expert's output
    with g.scope("experts"), g.scope("post_expert_norm"):
        with g.scope("rms"):  # the rms alone; each route's expert weight next
            y = normed(d, y, Weight.constant(np.ones(H, np.float32)))
        table = g.weight("weight", m("experts.post_expert_norm.weight", E, H).astype(np.float32))
        scale = g.op.Gather(table, g.op.Reshape(index, g.constant([0, -1], "int64")), axis=0)  # (B, S·k, H)
        y = g.op.Mul(g.op.Cast(y, to=ir.DataType.FLOAT), scale)
        y = g.op.Reshape(y, g.constant([0, -1, k, H], "int64"))  # (B, S, k, H)
        y = g.op.Mul(y, g.op.Unsqueeze(g.op.Cast(weight, to=ir.DataType.FLOAT), last))
        y = g.op.CastLike(g.op.ReduceSum(y, g.constant([2], "int64"), keepdims=0), h)  # (B, S, H)
    with g.scope("shared_experts"):
        shared = relu2_mlp(d, m.under("shared_experts."), h, c.shared_intermediate_size, kernels=True)
        with g.scope("norm"):
            shared = normed(d, shared, m("shared_experts.norm.weight", H))
    return g.op.Add(y, shared)


def gated(d: Decoder, w: Weights, name: str, gate: str, branch: ir.Value) -> None:
    """ErgoResidualGate: x ← r ⊙ x + b ⊙ post_norm(branch), b = σ(w), r = sqrt(1 + b) · exp(−softplus(w)/2)."""
    H = d.c.hidden_size
    weight = w(f"{gate}.weight", H)
    with d.g.scope(gate):
        d.stream.scale(weight.map(lambda v: _residual_gate(v), np.float32))
    with d.g.scope(name):
        norm = w(f"{name}.weight", H)
        folded = norm.map(lambda n: (n.astype(np.float64) * _sigmoid(weight.numpy())).astype(np.float32), np.float32)
        d.stream.add(branch, folded)


def _sigmoid(v: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-v.astype(np.float64)))


def _residual_gate(v: np.ndarray) -> np.ndarray:
    v = v.astype(np.float64)
    return (np.sqrt(1.0 + _sigmoid(v)) * np.exp(-0.5 * np.logaddexp(0.0, v))).astype(np.float32)


def decoder_layer(d: Decoder, w: Weights, i: int):
    """ErgoDecoderLayer.forward: both branches sandwich-normed and gated into the residual; returns the KV."""
    g, c = d.g, d.c
    H = c.hidden_size
    h, key, value = normed_attention(d, w, i, attention)
    gated(d, w, "post_attention_layernorm", "attention_residual_gate", h)
    with g.scope("pre_feedforward_layernorm"):
        h = d.stream.norm(w("pre_feedforward_layernorm.weight", H))
    with g.scope("mlp"):
        m = w.under("mlp.")
        h = experts(d, m, h) if c.sparse(i) else relu2_mlp(d, m, h, c.first_dense_intermediate_size)
    gated(d, w, "post_feedforward_layernorm", "feedforward_residual_gate", h)
    return key, value


FAMILY = register(Family(
    "ergo", ErgoConfig, decoder_layer, VARIANTS, structure=STRUCTURE, parser=parse_config, rotary=rotary,
    stream=stream, model_types=MODEL_TYPES,
))

__all__ = ["FAMILY", "MODEL_TYPES", "STRUCTURE", "VARIANTS", "ErgoConfig", "decoder_layer", "parse_config"]
