"""IBM Bamba (BambaForCausalLM): Mamba-2 layers with a few attention layers among them, each
followed by a SwiGLU MLP.

Reference: transformers/models/bamba/modeling_bamba.py. `attn_layer_indices` says which layers
attend (`self_attn.*`); every other layer is a Mamba-2 mixer (`mamba.*`, builder.blocks.mamba2 as
Granite 4.0's: in_proj with `mamba_proj_bias`, conv with `mamba_conv_bias`, B and C in
`mamba_n_groups` groups, the gated RMSNorm per group, dt clamped to `time_step_limit`). Each
layer is x + mixer(input_layernorm(x)), then x + feed_forward(pre_ff_layernorm(x)) with
`feed_forward.gate_proj/up_proj/down_proj` (`mlp_bias`); the final norm is
`model.final_layernorm`. Attention is GQA with `attention_bias` on q, k, v and o, and a rotary on
the first half of each head: BambaConfig sets partial_rotary_factor 0.5 whatever config.json's
top level says ("hardcode for BC"); only `rope_parameters`' own factor overrides it.

State contract: attention layers past_key_values.%d.key/value; Mamba layers past.%d.conv and
past.%d.recurrent, Granite 4.0's shapes (architectures/granitemoehybrid.py's MambaStates).
onnxruntime-genai 0.18 knows no bamba type: its granitemoehybrid type runs the same state names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from architectures.falcon_h1 import final_norm
from architectures.granitemoehybrid import ATTENTION, MAMBA, Mamba2Keys, MambaStates, mixer, resolve_mamba_keys
from builder.architecture import Weights, attention_weights
from builder.blocks import AttentionSpec, gated_mlp, self_attention
from builder.decoder_config import DecoderConfig
from builder.family import Decoder, Family, conv_padding, parse, register

VARIANTS: dict[str, dict[str, Any]] = {"BambaForCausalLM": dict(
    model_type="bamba", vocab_size=128000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
    num_key_value_heads=8, rms_norm_eps=1e-5, max_position_embeddings=262144, pad_token_id=0,
    partial_rotary_factor=0.5,
)}
STRUCTURE: dict[str, dict[str, Any]] = {"BambaForCausalLM": dict(model_type="granitemoehybrid")}


@dataclass(frozen=True)
class BambaConfig(MambaStates, DecoderConfig, Mamba2Keys):
    """config.json of Bamba: the shared decoder keys, the attention layers' indices and the Mamba-2
    mixer's keys (Granite 4.0's, with BambaConfig's default dt limit)."""

    LAYER_TYPES: ClassVar[tuple[str, ...]] = (MAMBA, ATTENTION)

    attn_layer_indices: list[int] | None = None
    mlp_bias: bool = False
    time_step_limit: list[float | dict[str, str]] | tuple[float, float] | None = (0.0, float("inf"))

    def __post_init__(self) -> None:
        indices = self.attn_layer_indices or []
        if any(not isinstance(i, int) or not 0 <= i < self.num_hidden_layers for i in indices):
            raise ValueError(f"attn_layer_indices {indices} must be layer indices below num_hidden_layers "
                             f"({self.num_hidden_layers})")
        # BambaConfig.layers_block_type: from the indices, whatever else config.json says
        object.__setattr__(self, "layer_types", [ATTENTION if i in indices else MAMBA
                                                 for i in range(self.num_hidden_layers)])
        resolve_mamba_keys(self, self.mamba_expand * self.hidden_size, "mamba_expand · hidden_size")
        super().__post_init__()

    @property
    def conv_layers(self) -> list[int]:
        """The Mamba layers: each carries a conv state and an SSM state, no KV."""
        return [i for i, kind in enumerate(self.layer_types) if kind == MAMBA]


def decoder_layer(d: Decoder, w: Weights, i: int):
    """BambaDecoderLayer.forward; returns the layer's present state: (key, value), or (conv, SSM)."""
    g, c = d.g, d.c
    H, I = c.hidden_size, c.intermediate_size
    with g.scope("input_layernorm"):
        h = d.stream.norm(w("input_layernorm.weight", H))
    if c.layer_types[i] == MAMBA:
        with g.scope("mamba"):
            h, *state = mixer(d, w.under("mamba."), i, h)
    else:
        with g.scope("self_attn"):
            attention = attention_weights(w.under("self_attn."), c, c.attention_bias, c.attention_bias)
            spec = AttentionSpec(c.num_attention_heads, c.num_key_value_heads, c.head_dim)
            h, *state = self_attention(g, h, d.past(i), d.lengths, d.rotary, attention, spec, d.target)
    d.stream.add(h)
    with g.scope("pre_ff_layernorm"):
        h = d.stream.norm(w("pre_ff_layernorm.weight", H))
    f = w.under("feed_forward.")
    with g.scope("feed_forward"):
        biases = (f("gate_proj.bias", I), f("up_proj.bias", I), f("down_proj.bias", H)) if c.mlp_bias else None
        d.stream.add(gated_mlp(g, h, f("gate_proj.weight", I, H), f("up_proj.weight", I, H), f("down_proj.weight", H, I),
                               c.hidden_act, d.target, biases))
    return tuple(state)


def parse_config(family: Family, raw: dict[str, Any], architecture: str) -> BambaConfig:
    """`parse`, without config.json's top-level partial_rotary_factor: BambaConfig replaces it by 0.5."""
    return parse(family, {k: v for k, v in raw.items() if k != "partial_rotary_factor"}, architecture)


FAMILY = register(Family(
    "bamba", BambaConfig, decoder_layer, VARIANTS, structure=STRUCTURE, partial_rotary=True, parser=parse_config,
    prepare=conv_padding, final_norm=final_norm,
))

__all__ = ["FAMILY", "VARIANTS", "BambaConfig", "decoder_layer"]
