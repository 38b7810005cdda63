"""AI21 Jamba (JambaForCausalLM): Mamba-1 layers with an attention layer every `attn_layer_period`
(from `attn_layer_offset`), and a mixture of experts instead of the MLP every
`expert_layer_period` (from `expert_layer_offset`).

Reference: transformers/models/jamba/modular_jamba.py. Each layer is x + mixer(input_layernorm(x)),
then x + feed_forward(pre_ff_layernorm(x)); the final norm is `model.final_layernorm`. The mixer
is attention (`self_attn.*`: Llama's GQA without biases and without any rotary: Jamba's attention
has no positional encoding) or a Mamba-1 mixer (`mamba.*`, builder.blocks.mamba1: in_proj to x
and z with `mamba_proj_bias`, a `mamba_d_conv`-tap conv with `mamba_conv_bias`, x_proj to dt
(`mamba_dt_rank`, "auto": ceil(hidden_size / 16)), B and C, Jamba's RMSNorms on each, dt_proj,
the selective scan with A = −exp(A_log) per channel and state, y · silu(z), out_proj). The feed
forward is a SwiGLU MLP (`feed_forward.gate_proj/up_proj/down_proj`) or, on expert layers with
`num_experts` > 1, Mixtral's experts (`feed_forward.experts.{e}.*` as on the hub, or the stacked
`experts.gate_up_proj`/`down_proj` of transformers 5) behind `feed_forward.router`: softmax, top
`num_experts_per_tok`, the chosen probabilities not renormalized.

State contract: attention layers past_key_values.%d.key/value; Mamba layers past.%d.conv
(batch, mamba_expand · hidden_size, mamba_d_conv − 1) and past.%d.recurrent (batch,
mamba_expand · hidden_size, mamba_d_state), transformers' cache layout. onnxruntime-genai 0.18
knows no jamba type: its granitemoehybrid type runs the same state names (architectures/bamba.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

from architectures.falcon_h1 import final_norm
from architectures.moe import dense_mlp, expert_matrices
from builder.architecture import Weights, attention_weights
from builder.blocks import AttentionSpec, self_attention, sparse_moe
from builder.blocks.mamba1 import Mamba1Spec, Mamba1Weights, mamba1_mixer
from builder.decoder_config import DecoderConfig
from builder.family import (
    Decoder,
    Family,
    conv_padding,
    parse,
    register,
    strip_partial_rotary,
)
from builder.state import Conv, LayerState, Recurrent

MAMBA, ATTENTION = "linear_attention", "full_attention"
VARIANTS: dict[str, dict[str, Any]] = {"JambaForCausalLM": dict(
    model_type="jamba", vocab_size=65536, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
    num_attention_heads=32, num_key_value_heads=8, hidden_act="silu", rms_norm_eps=1e-6,
    max_position_embeddings=262144, tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2,
)}
# genai 0.18 has no jamba type; its granitemoehybrid type runs these state names.
STRUCTURE: dict[str, dict[str, Any]] = {"JambaForCausalLM": dict(model_type="granitemoehybrid")}


@dataclass(frozen=True)
class JambaConfig(DecoderConfig):
    """config.json of Jamba: the shared decoder keys, the layer periods, the experts and the Mamba-1
    mixer's keys (JambaConfig's defaults). `layer_types` always follows the attention period and
    offset (JambaConfig.layer_types is a property of them)."""

    LAYER_TYPES: ClassVar[tuple[str, ...]] = (MAMBA, ATTENTION)

    num_experts: int = 16
    num_local_experts: int | None = None  # JambaConfig's attribute_map name for num_experts
    num_experts_per_tok: int = 2
    expert_layer_period: int = 2
    expert_layer_offset: int = 1
    attn_layer_period: int = 8
    attn_layer_offset: int = 4
    mamba_d_state: int = 16
    mamba_d_conv: int = 4
    mamba_expand: int = 2
    mamba_dt_rank: int | str = "auto"
    mamba_conv_bias: bool = True
    mamba_proj_bias: bool = False

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        if self.num_local_experts is not None:
            set_(self, "num_experts", self.num_local_experts)
        for kind in ("attn", "expert"):
            period, offset = getattr(self, f"{kind}_layer_period"), getattr(self, f"{kind}_layer_offset")
            if not 0 <= offset < period:
                raise ValueError(f"{kind}_layer_offset ({offset}) must be smaller than {kind}_layer_period ({period})")
        if self.mamba_dt_rank == "auto":
            set_(self, "mamba_dt_rank", math.ceil(self.hidden_size / 16))
        if not isinstance(self.mamba_dt_rank, int) or self.mamba_dt_rank < 1:
            raise ValueError(f"mamba_dt_rank {self.mamba_dt_rank!r}: expected a positive integer or 'auto'")
        if self.mamba_d_conv < 2:
            raise ValueError(f"mamba_d_conv {self.mamba_d_conv}: the convolution needs at least 2 taps")
        if self.num_experts < 1:
            raise ValueError(f"num_experts {self.num_experts}: expected at least 1")
        if self.num_experts > 1 and not 1 <= self.num_experts_per_tok <= self.num_experts:
            raise ValueError(f"num_experts_per_tok ({self.num_experts_per_tok}) must be between 1 and num_experts "
                             f"({self.num_experts})")
        set_(self, "layer_types", [ATTENTION if i % self.attn_layer_period == self.attn_layer_offset else MAMBA
                                   for i in range(self.num_hidden_layers)])
        super().__post_init__()
        set_(self, "rope_parameters", None)  # no rotary anywhere: JambaConfig has no rope_parameters

    @property
    def conv_layers(self) -> list[int]:
        """The Mamba layers: each carries a conv state and an SSM state, no KV."""
        return [i for i, kind in enumerate(self.layer_types) if kind == MAMBA]

    @property
    def mamba(self) -> Mamba1Spec:
        return Mamba1Spec(self.mamba_expand * self.hidden_size, self.mamba_d_state, self.mamba_d_conv,
                          self.mamba_dt_rank, self.rms_norm_eps, self.hidden_act)

    def sparse(self, layer: int) -> bool:
        """JambaConfig.layers_num_experts: experts on the expert layers, when there is more than one."""
        return self.num_experts > 1 and layer % self.expert_layer_period == self.expert_layer_offset

    def layer_state(self, layer: int) -> LayerState:
        if layer not in self.conv_layers:
            return super().layer_state(layer)
        return LayerState(conv=Conv(*self.mamba.conv_state), recurrent=Recurrent(self.mamba.recurrent_state),
                          kind=MAMBA)


def feed_forward(d: Decoder, m: Weights, i: int, h):
    """JambaSparseMoeBlock.forward on an expert layer, JambaMLP's otherwise."""
    g, c = d.g, d.c
    if not c.sparse(i):
        return dense_mlp(d, h, m, c.intermediate_size)
    E, H = c.num_experts, c.hidden_size
    gate, up, down = expert_matrices(m, E, H, c.intermediate_size)
    return sparse_moe(g, h, m("router.weight", E, H), gate, up, down, c.num_experts_per_tok, False, c.hidden_act,
                      d.target, router_name="router")


def decoder_layer(d: Decoder, w: Weights, i: int):
    """JambaAttentionDecoderLayer/JambaMambaDecoderLayer.forward; returns the layer's present
    state: (key, value), or (conv, SSM)."""
    g, c = d.g, d.c
    H = c.hidden_size
    with g.scope("input_layernorm"):
        h = d.stream.norm(w("input_layernorm.weight", H))
    if c.layer_types[i] == MAMBA:
        with g.scope("mamba"):
            weights = Mamba1Weights.read(w.under("mamba."), c.mamba, H, c.mamba_conv_bias, c.mamba_proj_bias)
            h, *state = mamba1_mixer(g, h, weights, c.mamba, d.io.conv[i], d.io.recurrent[i], d.prepared, d.target)
    else:
        with g.scope("self_attn"):
            attention = attention_weights(w.under("self_attn."), c)
            spec = AttentionSpec(c.num_attention_heads, c.num_key_value_heads, c.head_dim)
            h, *state = self_attention(g, h, d.past(i), d.lengths, d.rotary, attention, spec, d.target)
    d.stream.add(h)
    with g.scope("pre_ff_layernorm"):
        h = d.stream.norm(w("pre_ff_layernorm.weight", H))
    with g.scope("feed_forward"):
        d.stream.add(feed_forward(d, w.under("feed_forward."), i, h))
    return tuple(state)


def parse_config(family: Family, raw: dict[str, Any], architecture: str) -> JambaConfig:
    """`parse` without rotary settings (Jamba's attention has none: they are never read)."""
    return parse(family, strip_partial_rotary(raw), architecture)


FAMILY = register(Family(
    "jamba", JambaConfig, decoder_layer, VARIANTS, structure=STRUCTURE, parser=parse_config, rotary=lambda d: None,
    prepare=conv_padding, final_norm=final_norm,
))

__all__ = ["FAMILY", "VARIANTS", "JambaConfig", "decoder_layer"]
