"""Gemma 4's text decoder: Gemma4ForCausalLM and the decoder of Gemma4ForConditionalGeneration.

Reference: transformers/models/gemma4/modeling_gemma4.py (Gemma4Text*), configuration_gemma4.py.
Gemma 3's layer (sandwich norms, √hidden embedding scale, tanh-GELU, q/k norms, sliding layers by
`layer_types`, an fp32 residual stream in fp16 builds) with these differences:
- RMSNorms scale by the weight itself (no `1 + weight`); values get a weightless RMSNorm per head;
  the attention scale is 1 (q and k are normed).
- Full-attention layers have their own head size (`global_head_dim`) and, with
  `attention_k_eq_v`, their own KV head count (`num_global_key_value_heads`) and no v_proj: the
  values are the keys' projection (before k_norm and rotary). transformers 5 saves these as
  `per_layer_config`. Their rotary is "proportional": the first partial_rotary_factor of the pairs
  rotate, at exponents over the whole head; the rest do not.
- KV sharing: the last `num_kv_shared_layers` layers compute no keys or values; each attends over
  the KV of the last earlier layer of its type. Here such a layer has no cache of its own (a
  stateless layer: onnxruntime-genai allocates none) and runs GroupQueryAttention on its source
  layer's past and new keys and values, which rebuilds that layer's present; their MLPs are twice
  as wide with `use_double_wide_mlp`.
- Per-layer embeddings (`hidden_size_per_layer_input`): a second table, [vocab, layers·P], plus a
  projection of the embeddings, give each layer a P-wide input that gates a branch after its MLP.
- Each layer's output is multiplied by its stored `layer_scalar`; the final logits soft-capped.
- The MoE block (`enable_moe_block`, gemma-4-26B-A4B): GeGLU experts beside the dense MLP, routed
  from the residual. ONNX Runtime's MoE/QMoE CPU kernels (1.31, 1.32) run SwiGLU only, so the experts run
  densely, exactly: every expert for every token as two stacked linears ([E·2I, H] and [H, E·I],
  quantized as any linear), each expert's activation times its routing weight (0 off the top k).
  That is num_experts / top_k_experts times the expert compute of a sparse kernel (a warning says so).
Not built (refused in the config): bidirectional attention ("all").
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import onnx_ir as ir

from builder.architecture import Weights
from builder.blocks import AttentionSpec, gated_mlp
from builder.blocks.attention import group_query_attention
from builder.blocks.embedding import embedding
from builder.blocks.linear import linear, quantized_weight
from builder.blocks.mlp import activation
from builder.blocks.norm import rms_norm
from builder.blocks.rope import ExplicitRotary, Rope, rotary_tables
from builder.decoder_config import DecoderConfig
from builder.errors import BuildError
from builder.family import Decoder, Family, register, whole_head_rotary
from builder.state import KV, LayerState, kv_head_size
from builder.graph import Graph
from builder.hf_config import from_dict, text_config
from builder.lazy import Weight
from builder.target import Target

from architectures.gemma import decoder_prefix, stream, text_vocabulary

log = logging.getLogger("builder")
FULL, SLIDING = "full_attention", "sliding_attention"
VARIANTS: dict[str, dict[str, Any]] = {"Gemma4ForCausalLM": dict(model_type="gemma4_text")}
VARIANTS["Gemma4ForConditionalGeneration"] = VARIANTS["Gemma4ForCausalLM"]
TEXT_CONFIG = {"Gemma4ForConditionalGeneration": "text_config"}
# Gemma4TextConfig's rotary settings when config.json has none.
DEFAULT_ROPE = {
    SLIDING: {"rope_type": "default", "rope_theta": 10_000.0},
    FULL: {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0},
}
PER_LAYER_KEYS = ("head_dim", "num_key_value_heads")  # what builder reads from per_layer_config


@dataclass(frozen=True)
class Gemma4TextConfig(DecoderConfig):
    """config.json of Gemma 4's text decoder (Gemma4TextConfig's keys and defaults)."""

    model_type: str = "gemma4_text"
    vocab_size: int = 262_144
    hidden_size: int = 2304
    intermediate_size: int = 9216
    num_hidden_layers: int = 30
    num_attention_heads: int = 8
    num_key_value_heads: int = 4
    head_dim: int = 256
    hidden_activation: str = "gelu_pytorch_tanh"
    max_position_embeddings: int = 131_072
    tie_word_embeddings: bool = True
    sliding_window: int | None = 512
    final_logit_softcapping: float | None = None
    use_bidirectional_attention: str | None = None
    vocab_size_per_layer_input: int = 262_144
    hidden_size_per_layer_input: int | None = 256
    attention_k_eq_v: bool = False
    num_kv_shared_layers: int = 0
    enable_moe_block: bool = False
    num_experts: int | None = None
    top_k_experts: int | None = None
    moe_intermediate_size: int | None = None
    use_double_wide_mlp: bool = False
    global_head_dim: int = 512
    num_global_key_value_heads: int | None = None
    per_layer_config: dict[str, dict[str, int]] | None = None
    bos_token_id: int | None = 2
    eos_token_id: int | list[int] | None = 1
    pad_token_id: int | None = 0
    # Derived: each layer's (num_kv_heads, head_dim), and the layer whose KV each layer reads.
    layer_dims: list[tuple[int, int]] = field(default_factory=list)
    kv_source: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.enable_moe_block and not (self.num_experts and self.top_k_experts and self.moe_intermediate_size):
            raise ValueError("enable_moe_block needs num_experts, top_k_experts and moe_intermediate_size")
        if self.use_bidirectional_attention == "all":
            raise ValueError("use_bidirectional_attention 'all': builder builds causal decoders only")
        super().__post_init__()
        set_ = object.__setattr__
        if self.per_layer_config is not None:  # transformers writes the layer keys zero-padded ("05") and reads int(key)
            if not all(str(k).isdigit() for k in self.per_layer_config):
                raise ValueError(f"per_layer_config has a key that is no layer index: {sorted(self.per_layer_config)}")
            set_(self, "per_layer_config", {str(int(k)): v for k, v in self.per_layer_config.items()})
        types = list(self.layer_types)
        types[-1] = FULL  # Gemma4TextConfig forces the last layer global, whatever config.json says
        set_(self, "layer_types", types)
        set_(self, "layer_dims", [self._dims(i) for i in range(self.num_hidden_layers)])
        for kind in set(types):
            if len({d for d, t in zip(self.layer_dims, types) if t == kind}) > 1:
                raise ValueError(f"per_layer_config: the {kind} layers differ in head size or KV heads; "
                                 "builder builds one rotary table per layer type")
        set_(self, "kv_source", self._kv_sources())

    def default_layer_types(self) -> list[str]:
        """Gemma4TextConfig's: five sliding layers, then a global one."""
        return [SLIDING if (i + 1) % 6 else FULL for i in range(self.num_hidden_layers)]

    def _dims(self, layer: int) -> tuple[int, int]:
        """(num_kv_heads, head_dim) of `layer`: config.json's per_layer_config (transformers 5's
        spelling), else global_head_dim on full layers and, with attention_k_eq_v,
        num_global_key_value_heads (Gemma4TextConfig.__post_init__)."""
        if self.per_layer_config is not None:
            own = self.per_layer_config.get(str(layer), {})
            unknown = sorted(set(own) - set(PER_LAYER_KEYS))
            if unknown:
                raise ValueError(f"per_layer_config.{layer}.{unknown[0]}: builder reads only "
                                 f"{', '.join(PER_LAYER_KEYS)}")
            return own.get("num_key_value_heads", self.num_key_value_heads), own.get("head_dim", self.head_dim)
        if self.layer_types[layer] != FULL:
            return self.num_key_value_heads, self.head_dim
        heads = self.num_global_key_value_heads if self.attention_k_eq_v else None
        return heads or self.num_key_value_heads, self.global_head_dim

    def _kv_sources(self) -> list[int]:
        """Each layer's own index, or for the last num_kv_shared_layers the last earlier layer of
        their type (Gemma4TextConfig.kv_sharing_modes)."""
        first = self.num_hidden_layers - self.num_kv_shared_layers
        if not 0 < first <= self.num_hidden_layers:
            raise ValueError(f"num_kv_shared_layers ({self.num_kv_shared_layers}) leaves no layer computing KV")
        last = {t: i for i, t in enumerate(self.layer_types[:first])}
        missing = sorted(set(self.layer_types[first:]) - set(last))
        if missing:
            raise ValueError(f"num_kv_shared_layers: no layer before the shared ones computes {missing[0]} KV")
        return [i if i < first else last[t] for i, t in enumerate(self.layer_types)]

    def layer_state(self, layer: int) -> LayerState:
        """A layer's own KV, of its own heads and head size (layer_dims: full layers differ), or
        nothing for a KV-sharing layer, which attends over an earlier layer's cache."""
        if self.kv_source[layer] != layer:
            return LayerState(kind=self.layer_types[layer])
        heads, size = self.layer_dims[layer]
        return LayerState(kv=KV(heads, kv_head_size(size), self.window(layer)), kind=self.layer_types[layer])

    def mlp_size(self, layer: int) -> int:
        return self.intermediate_size * (2 if self.use_double_wide_mlp and self.kv_source[layer] != layer else 1)


def parse_config(family: Family, raw: dict[str, Any], architecture: str) -> Gemma4TextConfig:
    """config.json's (or the multimodal one's text_config) over Gemma4TextConfig's defaults; the
    rotary settings are config.json's per-layer-type dicts as given (Gemma 4 has no older form)."""
    prefix = ""
    if architecture in TEXT_CONFIG:
        raw, prefix = text_config(raw, TEXT_CONFIG[architecture]), f"{TEXT_CONFIG[architecture]}."
    rope = raw.get("rope_parameters") or DEFAULT_ROPE
    if not isinstance(rope, dict) or not all(isinstance(rope.get(t), dict) for t in (FULL, SLIDING)):
        raise BuildError(f"config.json: {prefix}rope_parameters needs a {FULL} and a {SLIDING} entry")
    # A top-level partial_rotary_factor lands in both entries; the proportional rope reads it, the
    # default one (Gemma4's own compute_default_rope_parameters) rotates the whole head.
    rope = {t: dict(p) if p.get("rope_type") == "proportional" else whole_head_rotary(p, architecture)
            for t, p in rope.items()}
    return from_dict(family.config, raw, family.variants[architecture], key_prefix=prefix, rope_parameters=rope)


@dataclass(eq=False)
class Shared:
    """What the layers share: the per-layer inputs (B, S, layers, P), and per layer type the last
    layer's new keys, values and past (the KV a sharing layer reads)."""

    per_layer: ir.Value | None = None
    kv: dict[str, tuple[ir.Value, ir.Value, tuple[ir.Value, ir.Value]]] = field(default_factory=dict)


def rotary(d: Decoder) -> dict[str, Any]:
    """One rotary table per layer type, each over its layers' head size (Gemma4TextRotaryEmbedding)."""
    c = d.c
    return {t: rotary_tables(d.g, Rope.from_parameters(c.rope_parameters[t], c.layer_dims[c.layer_types.index(t)][1],
                                                      c.max_position_embeddings),
                             c.max_position_embeddings, d.target, t.split("_")[0] + "_",
                             head_size=c.layer_dims[c.layer_types.index(t)][1])
            for t in dict.fromkeys(c.layer_types)}


def head_norm(g: Graph, x: ir.Value, weight: Weight, heads: int, size: int, eps: float, target: Target) -> ir.Value:
    """RMSNorm over each head's vector (Gemma4RMSNorm on the (B, S, heads, D) view)."""
    x = g.op.Reshape(x, g.constant([0, 0, heads, size], "int64"))  # (B, S, heads*D) -> (B, S, heads, D)
    x = rms_norm(g, x, weight, eps, target)
    return g.op.Reshape(x, g.constant([0, 0, heads * size], "int64"))  # -> (B, S, heads*D)


def attention(d: Decoder, a: Weights, x: ir.Value, i: int) -> tuple[ir.Value, tuple[ir.Value, ...]]:
    """Gemma4TextAttention.forward: returns (o_proj output, the layer's present KV, () when it
    reads another layer's)."""
    g, c, target, shared = d.g, d.c, d.target, d.prepared
    kind, source = c.layer_types[i], c.kv_source[i]
    kv_heads, D = c.layer_dims[i]
    Hq, H, eps = c.num_attention_heads, c.hidden_size, c.rms_norm_eps
    k_eq_v = c.attention_k_eq_v and kind == FULL
    names = ["q_proj"] if source != i else ["q_proj", "k_proj"] if k_eq_v else ["q_proj", "k_proj", "v_proj"]
    sizes = [Hq * D] + [kv_heads * D] * (len(names) - 1)
    weights = [a(f"{n}.weight", s, H) for n, s in zip(names, sizes)]
    bias = Weight.concat([a(f"{n}.bias", s) for n, s in zip(names, sizes)]) if c.attention_bias else None
    with g.scope("qkv_proj" if len(names) > 1 else "q_proj"):
        y = linear(g, x, Weight.concat(weights) if len(weights) > 1 else weights[0], target, bias)
    parts = g.op.Split(y, g.constant(sizes, "int64"), axis=-1, _outputs=len(sizes)) if len(sizes) > 1 else [y]
    with g.scope("q_norm"):
        q = head_norm(g, parts[0], a("q_norm.weight", D), Hq, D, eps, target)
    rotary = d.rotary[kind]
    if source == i:
        with g.scope("k_norm"):
            k = head_norm(g, parts[1], a("k_norm.weight", D), kv_heads, D, eps, target)
        with g.scope("v_norm"):  # weightless (with_scale=False)
            ones = Weight.constant(np.ones(D, np.float32))
            v = head_norm(g, parts[1] if k_eq_v else parts[2], ones, kv_heads, D, eps, target)
        if isinstance(rotary, ExplicitRotary):
            with g.scope("k_rotary"):
                k = rotary.rotate(g, k, kv_heads, d.lengths.seqlens_k, False)
        past = d.past(i)
        shared.kv[kind] = (k, v, past)
    else:
        for n in ("k_proj.weight", "v_proj.weight", "k_norm.weight"):  # transformers ignores them on load
            a.optional(n)
        k, v, past = shared.kv[kind]
    if isinstance(rotary, ExplicitRotary):
        with g.scope("q_rotary"):
            q = rotary.rotate(g, q, Hq, d.lengths.seqlens_k, False)
        rotary = None
    spec = AttentionSpec(Hq, kv_heads, D, scale=1.0, window=c.window(i), norm_eps=eps)
    out, present_k, present_v = group_query_attention(g, (q, k, v), past, d.lengths, rotary, None, spec, target)
    with g.scope("o_proj"):
        out = linear(g, out, a("o_proj.weight", H, Hq * D), target, a("o_proj.bias", H) if c.attention_bias else None)
    return out, ((present_k, present_v) if source == i else ())


def decoder_layer(d: Decoder, w: Weights, i: int) -> tuple[ir.Value, ...]:
    """Gemma4TextDecoderLayer.forward; returns the layer's present KV (none for a sharing layer)."""
    g, c, s = d.g, d.c, d.stream
    H, I = c.hidden_size, c.mlp_size(i)
    with g.scope("input_layernorm"):
        h = s.norm(w("input_layernorm.weight", H))
    with g.scope("self_attn"):
        h, present = attention(d, w.under("self_attn."), h, i)
    with g.scope("post_attention_layernorm"):
        s.add(h, w("post_attention_layernorm.weight", H))
    with g.scope("pre_feedforward_layernorm"):
        h = s.norm(w("pre_feedforward_layernorm.weight", H))
    m = w.under("mlp.")
    with g.scope("mlp"):
        h = gated_mlp(g, h, m("gate_proj.weight", I, H), m("up_proj.weight", I, H), m("down_proj.weight", H, I),
                      c.hidden_activation, d.target)
    if c.enable_moe_block:
        with g.scope("post_feedforward_layernorm_1"):
            h = rms_norm(g, h, w("post_feedforward_layernorm_1.weight", H), c.rms_norm_eps, d.target)
        h = g.op.Add(h, moe(d, w, s.value()))
    with g.scope("post_feedforward_layernorm"):
        s.add(h, w("post_feedforward_layernorm.weight", H))
    if c.hidden_size_per_layer_input:  # the layer's per-layer input gates a branch read from x itself
        P = c.hidden_size_per_layer_input
        with g.scope("per_layer_input_gate"):
            h = activation(g, linear(g, s.value(), w("per_layer_input_gate.weight", P, H), d.target),
                           c.hidden_activation)
        h = g.op.Mul(h, g.op.Gather(d.prepared.per_layer, g.constant(i, "int64"), axis=2))  # (B, S, P)
        with g.scope("per_layer_projection"):
            h = linear(g, h, w("per_layer_projection.weight", H, P), d.target)
        with g.scope("post_per_layer_input_norm"):
            s.add(h, w("post_per_layer_input_norm.weight", H))
    s.scale(w("layer_scalar", 1))
    return present


def routing_weights(d: Decoder, r: Weights, x: ir.Value) -> ir.Value:
    """Gemma4TextRouter: softmax(proj(norm(x) · scale · hidden^-½)) in float32, its top k
    renormalized and times per_expert_scale, scattered over the experts: (B, S, E), 0 off the top k.
    The router stays float (a logit moved by rounding can pick another expert)."""
    g, c = d.g, d.c
    H, E = c.hidden_size, c.num_experts
    with g.scope("norm"):  # weightless norm, then the scale and hidden^-½, folded into its weight
        scale = r("scale", H).map(lambda v: v.astype(np.float32) * np.float32(H ** -0.5), np.float32)
        h = rms_norm(g, x, scale, c.rms_norm_eps, d.target)
    with g.scope("proj"):
        logits = linear(g, h, r("proj.weight", E, H), replace(d.target, quantization=None))  # (B, S, E)
    probs = g.op.Softmax(g.op.Cast(logits, to=ir.DataType.FLOAT), axis=-1)
    top, index = g.op.TopK(probs, g.constant([c.top_k_experts], "int64"), axis=-1, _outputs=2)  # (B, S, k)
    top = g.op.Div(top, g.op.ReduceSum(top, g.constant([-1], "int64"), keepdims=1))
    per_expert = g.weight("per_expert_scale", r("per_expert_scale", E).astype(np.float32))
    top = g.op.Mul(top, g.op.Gather(per_expert, index, axis=0))
    zeros = g.op.Mul(probs, g.constant(0.0, np.float32))
    dense = g.op.ScatterElements(zeros, index, top, axis=-1)  # (B, S, E)
    return g.op.Cast(dense, to=ir.DataType.from_numpy(d.target.io_dtype))


def moe(d: Decoder, w: Weights, x: ir.Value) -> ir.Value:
    """The experts' branch of Gemma4TextDecoderLayer (before post_feedforward_layernorm):
    post_feedforward_layernorm_2(Σ_e p_e · down_e(gelu(gate_e(x')) · up_e(x'))), x' =
    pre_feedforward_layernorm_2(x), p the router's weights of the residual x. Every expert runs
    (p_e = 0 off the top k): gate_up as one [E·2I, H] linear, down as one [H, E·I] linear over the
    weighted activations of all experts side by side."""
    g, c, target = d.g, d.c, d.target
    H, E, I = c.hidden_size, c.num_experts, c.moe_intermediate_size
    with g.scope("router"):
        p = routing_weights(d, w.under("router."), x)
    with g.scope("pre_feedforward_layernorm_2"):
        h = rms_norm(g, x, w("pre_feedforward_layernorm_2.weight", H), c.rms_norm_eps, target)
    with g.scope("experts", "gate_up_proj"):
        h = linear(g, h, w("experts.gate_up_proj", E, 2 * I, H).reshaped(E * 2 * I, H), target)
    h = g.op.Reshape(h, g.constant([0, 0, E, 2 * I], "int64"))  # (B, S, E·2I) -> (B, S, E, 2I)
    gate, up = g.op.Split(h, g.constant([I, I], "int64"), axis=-1, _outputs=2)
    h = g.op.Mul(g.op.Mul(activation(g, gate, c.hidden_activation), up), g.op.Unsqueeze(p, g.constant([-1], "int64")))
    h = g.op.Reshape(h, g.constant([0, 0, E * I], "int64"))  # (B, S, E, I) -> (B, S, E·I)
    down = w("experts.down_proj", E, H, I).permuted(1, 0, 2).reshaped(H, E * I)  # [E, H, I] -> [H, E·I]
    with g.scope("experts", "down_proj"):
        h = linear(g, h, down, target)
    with g.scope("post_feedforward_layernorm_2"):
        return rms_norm(g, h, w("post_feedforward_layernorm_2.weight", H), c.rms_norm_eps, target)


def prepare(d: Decoder) -> Shared:
    c = d.c
    if c.enable_moe_block:
        log.warning("Gemma 4's GeGLU experts run densely (ONNX Runtime's MoE/QMoE CPU kernels run SwiGLU only): "
                    "every expert for every token, %d/%d times a sparse kernel's expert compute",
                    c.num_experts, c.top_k_experts)
    return Shared()


def embed(d: Decoder) -> ir.Value:
    """Token embeddings times √hidden; with per-layer inputs, those too (Gemma4TextModel's
    get_per_layer_inputs and project_per_layer_inputs): (embed_tokens_per_layer(ids)·√P +
    norm(per_layer_model_projection(x)·hidden^-½)) · 2^-½, as (B, S, layers, P)."""
    g, c = d.g, d.c
    x = d.vocab.embed(g, d.io.input_ids, scale=float(np.sqrt(c.hidden_size)))
    if not c.hidden_size_per_layer_input:
        return x
    L, P, H = c.num_hidden_layers, c.hidden_size_per_layer_input, c.hidden_size
    w = Weights(d.ckpt, d.prefix)
    with g.scope("model", "embed_tokens_per_layer"):
        table = w("embed_tokens_per_layer.weight", c.vocab_size_per_layer_input, L * P)
        # The per-layer table is the E models' largest tensor (2.3 B of E2B's 5 B weights), only ever
        # gathered: a quantized build gathers it from 8-bit blocks (GatherBlockQuantized, RTN,
        # symmetric) rather than a float copy (9.4 GB in an int4 CPU build's float32).
        q = d.target.quantization
        rows = None if q is None else quantized_weight(g, table, replace(q, symmetric=True, method="rtn"),
                                                       d.target.io_dtype, 8)
        tokens = embedding(g, d.io.input_ids, table, d.target, scale=float(np.sqrt(P)), shared=rows)
    with g.scope("model", "per_layer_model_projection"):
        projected = linear(g, x, w("per_layer_model_projection.weight", L * P, H), d.target)
        projected = g.op.Mul(projected, g.constant(H ** -0.5, d.target.io_dtype))
    shape = g.constant([0, 0, L, P], "int64")  # (B, S, L*P) -> (B, S, L, P)
    with g.scope("model", "per_layer_projection_norm"):
        projected = rms_norm(g, g.op.Reshape(projected, shape), w("per_layer_projection_norm.weight", P),
                             c.rms_norm_eps, d.target)
    d.prepared.per_layer = g.op.Mul(g.op.Add(projected, g.op.Reshape(tokens, shape)),
                                    g.constant(2 ** -0.5, d.target.io_dtype))
    return x


def final_norm(d: Decoder) -> ir.Value:
    """model.norm (wherever the checkpoint keeps the decoder), its weight as stored."""
    with d.g.scope("model", "norm"):
        return d.stream.norm(Weights(d.ckpt, d.prefix)("norm.weight", d.c.hidden_size))


FAMILY = register(Family(
    "gemma4", Gemma4TextConfig, decoder_layer, VARIANTS, parser=parse_config, rotary=rotary,
    prepare=prepare, vocabulary=lambda d: text_vocabulary(d.g, d.ckpt, d.c, d.target), embed=embed,
    stream=stream, prefix=lambda d: decoder_prefix(d.ckpt), final_norm=final_norm,
    logits=lambda d, h: d.vocab.logits(d.g, h, softcap=d.c.final_logit_softcapping),
    # The multimodal checkpoints' vision and audio towers and their embedders: not part of the decoder.
    ignored=("model.vision_tower.*", "model.audio_tower.*", "model.embed_vision.*", "model.embed_audio.*"),
))

__all__ = ["FAMILY", "TEXT_CONFIG", "VARIANTS", "Gemma4TextConfig", "decoder_layer", "parse_config"]
