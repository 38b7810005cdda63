"""IBM Granite 4.0 (GraniteMoeHybridForCausalLM): Mamba-2 layers interleaved with attention layers,
each followed by a mixture of experts beside a shared MLP (or the shared MLP alone), with Granite's
four multipliers.

Reference: transformers/models/granitemoehybrid/modular_granitemoehybrid.py. `layer_types` (or
`layers_block_type`; the hub's "mamba"/"attention" are transformers' "linear_attention"/
"full_attention") says which layers are Mamba-2 mixers (builder.blocks.mamba2, `mamba.*`) and
which attend (`self_attn.*`, scale `attention_multiplier`, rotary only with
`position_embedding_type: "rope"`: Granite 4.0-H uses none). Each layer is
x + mixer(input_layernorm(x)) · m, then x + (moe(h) + shared_mlp(h)) · m with h =
post_attention_layernorm(x) and m the residual_multiplier; the experts are Granite MoE's
(`block_sparse_moe`: input_linear [E, 2I, H], output_linear [E, H, I], router.layer), the shared
MLP is one SwiGLU whose `input_linear` holds the gate rows, then the up rows. The embeddings are
scaled by `embedding_multiplier`, the logits divided by `logits_scaling` (architectures/granite.py).
Attention-only Granite 4.0 checkpoints (every layer "attention") are the same family.

State contract: attention layers past_key_values.%d.key/value; Mamba layers past.%d.conv
(batch, conv_dim, mamba_d_conv − 1) and past.%d.recurrent (batch, mamba_n_heads, mamba_d_head,
mamba_d_state), transformers' cache layout, declared in genai_config.json as onnxruntime-genai 0.18
declares Qwen3.5's (its runtime's state handling is by name, not by model type), type
"granitemoehybrid".
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

from architectures import granite
from builder.architecture import Weights, attention_weights
from builder.blocks import AttentionSpec, gated_mlp, self_attention, sparse_moe
from builder.blocks.mamba2 import Mamba2Spec, Mamba2Weights, mamba2_mixer
from builder.blocks.moe import unstacked
from builder.decoder_config import DecoderConfig
from builder.family import Decoder, Family, conv_padding, parse, register, rotary, strip_partial_rotary
from builder.state import Conv, LayerState, Recurrent

VARIANTS: dict[str, dict[str, Any]] = {"GraniteMoeHybridForCausalLM": dict(model_type="granitemoehybrid")}
MAMBA, ATTENTION = "linear_attention", "full_attention"
# config.json's older names for the layer types (transformers' _LEGACY_LAYER_TYPE_REMAP).
LEGACY = {"mamba": MAMBA, "attention": ATTENTION}


class MambaStates:
    """A Mamba-2 hybrid config's layer states: its Mamba layers (`conv_layers`) carry the mixer's
    conv state (channels, taps − 1) and SSM state (heads, head_dim, state), from its `mamba` (a
    Mamba2Spec), and no KV."""

    def layer_state(self, layer: int) -> LayerState:
        if layer not in self.conv_layers:
            return super().layer_state(layer)
        return LayerState(conv=Conv(*self.mamba.conv_state), recurrent=Recurrent(self.mamba.recurrent_state),
                          kind=self.layer_types[layer])


@dataclass(frozen=True)
class Mamba2Keys:
    """config.json's Mamba-2 mixer keys as Granite 4.0's and Bamba's config classes name them, with
    their defaults; `mamba` is the mixer they describe."""

    mamba_n_heads: int = 128
    mamba_n_groups: int = 1
    mamba_d_state: int = 256
    mamba_d_head: int | str = "auto"
    mamba_d_conv: int = 4
    mamba_expand: int = 2
    mamba_chunk_size: int = 256
    mamba_conv_bias: bool = True
    mamba_proj_bias: bool = False
    # transformers writes an infinite limit as {"__float__": "Infinity"} (strict JSON has no Infinity).
    time_step_limit: list[float | dict[str, str]] | tuple[float, float] | None = None

    @property
    def mamba(self) -> Mamba2Spec:
        limit = self.time_step_limit or (0.0, math.inf)
        return Mamba2Spec(self.mamba_n_heads, self.mamba_d_head, self.mamba_n_groups, self.mamba_d_state,
                          self.mamba_d_conv, self.rms_norm_eps, self.hidden_act, limit)


@dataclass(frozen=True)
class GraniteMoeHybridConfig(MambaStates, DecoderConfig, Mamba2Keys):
    """config.json of Granite 4.0: the shared decoder keys, Granite's multipliers, the experts and
    the Mamba-2 mixer's keys (GraniteMoeHybridConfig's defaults)."""

    LAYER_TYPES: ClassVar[tuple[str, ...]] = (MAMBA, ATTENTION, *LEGACY)

    embedding_multiplier: float = 1.0
    logits_scaling: float = 1.0
    residual_multiplier: float = 1.0
    attention_multiplier: float = 1.0
    num_local_experts: int | None = 8  # 0 in config.json (dense checkpoints): None here, see parse_config
    num_experts_per_tok: int = 2
    shared_intermediate_size: int = 1024
    position_embedding_type: str | None = None
    layers_block_type: list[str] | None = None

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        if self.layer_types is None and self.layers_block_type is not None:
            set_(self, "layer_types", self.layers_block_type)
        if self.layer_types is not None:
            set_(self, "layer_types", [LEGACY.get(t, t) for t in self.layer_types])
        resolve_mamba_keys(self, self.mamba_expand * self.hidden_size, "mamba_expand · hidden_size")
        super().__post_init__()

    def default_layer_types(self) -> list[str]:
        """GraniteMoeHybridConfig's: every layer a Mamba layer."""
        return [MAMBA] * self.num_hidden_layers

    @property
    def conv_layers(self) -> list[int]:
        """The Mamba layers: each carries a conv state and an SSM state, no KV."""
        return [i for i, kind in enumerate(self.layer_types) if kind == MAMBA]


def resolve_mamba_keys(c: Any, inner: int, width: str) -> None:
    """The mixer keys a Mamba-2 hybrid's config (Granite 4.0's, Falcon-H1's) shares, checked and
    resolved in place: mamba_d_head ("auto": the mixer's width `inner` over mamba_n_heads), the
    groups, the conv's taps, time_step_limit; `width` names where `inner` comes from."""
    set_ = object.__setattr__
    if c.mamba_d_head == "auto":
        if inner % c.mamba_n_heads:
            raise ValueError(f"mamba_n_heads ({c.mamba_n_heads}) must divide {width} ({inner})")
        set_(c, "mamba_d_head", inner // c.mamba_n_heads)
    if not isinstance(c.mamba_d_head, int) or c.mamba_d_head * c.mamba_n_heads != inner:
        raise ValueError(f"mamba_d_head {c.mamba_d_head!r} · mamba_n_heads {c.mamba_n_heads} is not {width} ({inner})")
    if c.mamba_n_heads % c.mamba_n_groups:
        raise ValueError(f"mamba_n_groups ({c.mamba_n_groups}) must divide mamba_n_heads ({c.mamba_n_heads})")
    if c.mamba_d_conv < 2:
        raise ValueError(f"mamba_d_conv {c.mamba_d_conv}: the convolution needs at least 2 taps")
    if c.time_step_limit is not None:
        set_(c, "time_step_limit", time_step_limit(c.time_step_limit))


def time_step_limit(limit: list) -> tuple[float, float]:
    """config.json's [low, high] clamp of the time step: numbers, or transformers' {"__float__":
    "Infinity"} for an open upper end; 0 <= low < high."""
    def number(x):
        if isinstance(x, dict):
            if x != {"__float__": "Infinity"}:
                raise ValueError(f"time_step_limit has {x}; expected a number or {{'__float__': 'Infinity'}}")
            return math.inf
        return float(x)

    values = tuple(number(x) for x in limit)
    if len(values) != 2 or not 0 <= values[0] < values[1]:
        raise ValueError(f"time_step_limit {limit}: expected [low, high] with 0 <= low < high")
    return values


def mixer(d: Decoder, w: Weights, i: int, h):
    """GraniteMoeHybridMambaLayer.forward; returns (output, present conv state, present SSM state)."""
    c = d.c
    weights = Mamba2Weights.read(w, c.mamba, c.hidden_size, c.mamba_conv_bias, c.mamba_proj_bias)
    return mamba2_mixer(d.g, h, weights, c.mamba, d.io.conv[i], d.io.recurrent[i], d.prepared, d.target)


def feed_forward(d: Decoder, w: Weights, h):
    """block_sparse_moe(h) + shared_mlp(h), or shared_mlp(h) alone without experts."""
    g, c = d.g, d.c
    H, S = c.hidden_size, c.shared_intermediate_size
    with g.scope("shared_mlp"):
        fused = w("shared_mlp.input_linear.weight", 2 * S, H)  # chunk(2): the gate rows, then the up rows
        y = gated_mlp(g, h, fused.slice(0, 0, S), fused.slice(0, S, 2 * S), w("shared_mlp.output_linear.weight", H, S),
                      c.hidden_act, d.target)
    if not c.num_local_experts:
        return y
    E, I = c.num_local_experts, c.intermediate_size
    m = w.under("block_sparse_moe.")
    with g.scope("block_sparse_moe"):
        experts = m("input_linear.weight", E, 2 * I, H)
        moe = sparse_moe(g, h, m("router.layer.weight", E, H), unstacked(experts, 0, I), unstacked(experts, I),
                         unstacked(m("output_linear.weight", E, H, I)), c.num_experts_per_tok, True, c.hidden_act,
                         d.target, router_name="router")
    return g.op.Add(moe, y)


def decoder_layer(d: Decoder, w: Weights, i: int):
    """GraniteMoeHybridDecoderLayer.forward; returns the layer's present state: (key, value), or (conv, SSM)."""
    g, c = d.g, d.c
    H = c.hidden_size

    def scaled(h):
        return h if c.residual_multiplier == 1 else g.op.Mul(h, g.constant(c.residual_multiplier, d.target.io_dtype))

    with g.scope("input_layernorm"):
        h = d.stream.norm(w("input_layernorm.weight", H))
    if c.layer_types[i] == MAMBA:
        with g.scope("mamba"):
            h, conv, ssm = mixer(d, w.under("mamba."), i, h)
        state = (conv, ssm)
    else:
        with g.scope("self_attn"):
            attention = attention_weights(w.under("self_attn."), c, c.attention_bias, c.attention_bias)
            spec = AttentionSpec(c.num_attention_heads, c.num_key_value_heads, c.head_dim, scale=c.attention_multiplier)
            h, key, value = self_attention(g, h, d.past(i), d.lengths, d.rotary, attention, spec, d.target)
        state = (key, value)
    d.stream.add(scaled(h))
    with g.scope("post_attention_layernorm"):
        h = d.stream.norm(w("post_attention_layernorm.weight", H))
    d.stream.add(scaled(feed_forward(d, w, h)))
    return state


def parse_config(family: Family, raw: dict[str, Any], architecture: str) -> GraniteMoeHybridConfig:
    """`parse`, reading num_local_experts 0 (Granite 4.0's dense checkpoints: the shared MLP alone)
    as None, since elsewhere an expert count is positive."""
    if raw.get("num_local_experts") == 0:
        raw = {**raw, "num_local_experts": None}
    if raw.get("position_embedding_type") != "rope":  # no rotary at all: its settings are never read
        raw = strip_partial_rotary(raw)
    return parse(family, raw, architecture)


def rope_if_asked(d: Decoder):
    """The rotary tables with `position_embedding_type: "rope"`; none otherwise (GraniteMoeHybridModel)."""
    return rotary(d) if d.c.position_embedding_type == "rope" else None



FAMILY = register(Family(
    "granitemoehybrid", GraniteMoeHybridConfig, decoder_layer, VARIANTS, parser=parse_config, rotary=rope_if_asked,
    prepare=conv_padding,
    embed=granite.embed, logits=granite.logits,
))

__all__ = ["FAMILY", "VARIANTS", "GraniteMoeHybridConfig", "Mamba2Keys", "MambaStates", "decoder_layer", "resolve_mamba_keys"]
