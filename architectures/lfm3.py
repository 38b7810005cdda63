"""LFM3 (Liquid AI): LFM2's short convolutions with Qwen3-style gated attention and sandwich norms.

Reference: transformers/models/lfm3/modular_lfm3.py (modeling_lfm3.py, configuration_lfm3.py).
LFM2's layer (architectures/lfm2.py: operator_norm -> short conv or attention -> residual, ffn_norm
-> SwiGLU w1/w3/w2 -> residual, `embedding_norm` last, the same carried conv state) with these
differences:
- three layer types: "conv", "full_attention" and "sliding_attention" (a window of
  `sliding_window`); without `layer_types`, layer i attends fully when i % 4 == 2, slides when
  i % 4 == 0 (but not layer 0) and convolves otherwise;
- attention is Qwen3's (q_proj, k_proj, v_proj, o_proj with `attention_bias`, per-head RMSNorms
  q_norm/k_norm before the rotary); with `use_attention_gate` each head's output is scaled by
  sigmoid(g_proj(x)), one logit per head, before o_proj (checkpoints store g_proj as gate_proj);
- with `use_sandwich_norm`, post_operator_norm and post_ffn_norm norm each branch before it joins
  the residual;
- the rotary is OLMo 3's, per layer type (`rope_parameters` holds one dict per attention type):
  by default the full layers' "proportional" rope rotates the first half of the head's pairs at
  theta 1e6, the sliding layers' rotates the whole head at 1e4; any other rope type rotates the
  whole head whatever partial_rotary_factor says;
- the MLP is intermediate_size wide as given (no block_auto_adjust_ff_dim); Lfm3Config reads
  neither full_attn_idxs nor LFM2's older spellings (tie_embedding, block_ff_dim), and reads
  `rms_norm_eps` as `norm_eps` (its attribute_map).

onnxruntime-genai 0.18 runs it as its `lfm2` type: the same state contract (builder/genai_config.py);
its conv cache gives KV to the layers listed "full_attention" and a conv state to every other, so
the sliding layers are listed as "full_attention" too (their window is GroupQueryAttention's).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, ClassVar

from architectures import lfm2
from architectures.lfm2 import Lfm2Config, final_norm
from builder.architecture import Weights, attention_weights
from builder.blocks import AttentionSpec, self_attention
from builder.blocks.gated_attention import gated_self_attention
from builder.blocks.rope import rotary_tables_by_layer_type
from builder.config_checks import rope_sources
from builder.family import Decoder, Family, conv_padding, register, whole_head_rotary
from builder.hf_config import SCALED_ROPE_TYPES, from_dict
from builder.state import LayerState

CONV, FULL, SLIDING = "conv", "full_attention", "sliding_attention"
VARIANTS: dict[str, dict[str, Any]] = {
    "Lfm3ForCausalLM": dict(
        model_type="lfm3", vocab_size=128_000, hidden_size=2048, intermediate_size=7680, num_hidden_layers=24,
        num_attention_heads=16, num_key_value_heads=4, head_dim=128, max_position_embeddings=128_000,
        pad_token_id=124_893, bos_token_id=124_894, eos_token_id=124_900, tie_word_embeddings=True, conv_L_cache=7,
        sliding_window=256, default_theta=1_000_000.0,
    ),
}
# LFM2's keys Lfm3Config does not read, pinned whatever config.json says; genai's model type is LFM2's.
STRUCTURE: dict[str, dict[str, Any]] = {
    "Lfm3ForCausalLM": dict(model_type="lfm2", block_auto_adjust_ff_dim=False, block_ff_dim=None, tie_embedding=None,
                            full_attn_idxs=None),
}
# Lfm3Config's rotary settings when config.json has none.
DEFAULT_ROPE = {
    SLIDING: {"rope_type": "default", "rope_theta": 10_000.0},
    FULL: {"rope_type": "proportional", "rope_theta": 1_000_000.0, "partial_rotary_factor": 0.5},
}


@dataclass(frozen=True)
class Lfm3Config(Lfm2Config):
    """config.json of LFM3: LFM2's keys and LFM3's own (Lfm3Config's defaults)."""

    LAYER_TYPES: ClassVar[tuple[str, ...]] = (CONV, FULL, SLIDING)

    head_dim: int = 128  # Lfm3Config's own default, never derived (a null is refused, as there)
    use_sandwich_norm: bool = True
    use_attention_gate: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        for kind in dict.fromkeys(self.layer_types):
            if kind != CONV:
                self.rope(kind)

    def default_layer_types(self) -> list[str]:
        """Lfm3Config's rule: layer i attends fully when i % 4 == 2, slides when i % 4 == 0 (not the first)."""
        return [FULL if i % 4 == 2 else SLIDING if i % 4 == 0 and i > 0 else CONV
                for i in range(self.num_hidden_layers)]

    def rope(self, kind: str) -> dict[str, Any]:
        """The rotary settings of `kind`'s layers as Lfm3RotaryEmbedding reads them: its own entry
        of rope_parameters (transformers fails without one); "proportional" rotates its
        partial_rotary_factor of the head, every other type the whole head (whole_head_rotary)."""
        params = self.rope_parameters.get(kind)
        if not isinstance(params, dict):
            raise ValueError(f"rope_parameters has no {kind} entry; LFM3 reads one per attention layer type")
        return params if params["rope_type"] == "proportional" else whole_head_rotary(params, "Lfm3ForCausalLM")

    def layer_state(self, layer: int) -> LayerState:
        """LFM2's; an attention layer, sliding or not, is listed "full_attention" (genai's KV layers)."""
        state = super().layer_state(layer)
        return state if state.conv is not None else replace(state, kind=FULL)


def rope_parameters(raw: dict[str, Any], max_positions: int, default_theta: float) -> dict[str, Any]:
    """Lfm3Config's rotary settings: rope_scaling, else rope_parameters, else DEFAULT_ROPE; each
    attention type's entry (or a flat dict, which Lfm3Config.rope refuses) gets config.json's
    rope_theta (else default_theta) and partial_rotary_factor where it has none, as transformers
    standardizes them."""
    scaling, given = rope_sources(raw)
    source = scaling or (given if raw.get("rope_parameters") is not None else DEFAULT_ROPE)
    top = {"rope_theta": raw.get("rope_theta", default_theta)}
    if raw.get("partial_rotary_factor") is not None:
        top["partial_rotary_factor"] = raw["partial_rotary_factor"]

    def filled(params: dict[str, Any]) -> dict[str, Any]:
        params = {**top, **params}
        params.setdefault("rope_type", params.get("type", "default"))
        if params["rope_type"] in SCALED_ROPE_TYPES:
            params.setdefault("original_max_position_embeddings", max_positions)
        return params

    if not any(kind in source for kind in (FULL, SLIDING)):
        return filled(source)
    return {kind: filled(p) if kind in (FULL, SLIDING) and isinstance(p, dict) else p for kind, p in source.items()}


def parse_config(family: Family, raw: dict[str, Any], architecture: str) -> Lfm3Config:
    """config.json over Lfm3Config's defaults; `rms_norm_eps`, where given, is its norm_eps."""
    defaults = dict(family.variants[architecture])
    theta = defaults.pop("default_theta")
    if "rms_norm_eps" in raw:
        raw = {**raw, "norm_eps": raw["rms_norm_eps"]}
    rope = rope_parameters(raw, raw.get("max_position_embeddings", defaults["max_position_embeddings"]), theta)
    return from_dict(family.config, raw, defaults, rope_parameters=rope, **family.structure[architecture])


def rotary(d: Decoder) -> dict[str, Any]:
    """One rotary table per attention type (Lfm3RotaryEmbedding); conv layers have none."""
    c = d.c
    kinds = [kind for kind in c.layer_types if kind != CONV]
    return rotary_tables_by_layer_type(d.g, {kind: c.rope(kind) for kind in kinds}, kinds, c.head_dim,
                                       c.max_position_embeddings, d.target)


def attention(d: Decoder, a: Weights, i: int, h):
    """Lfm3Attention.forward: GQA with per-head q/k RMSNorm before the layer type's rotary, a
    window on sliding layers; with use_attention_gate each head's output times sigmoid(g_proj(h))."""
    g, c = d.g, d.c
    heads, D = c.num_attention_heads, c.head_dim
    weights = attention_weights(a, c, c.attention_bias, c.attention_bias, qk_norm=a)
    spec = AttentionSpec(heads, c.num_key_value_heads, D, window=c.window(i), norm_eps=c.norm_eps)
    rotary = d.rotary[c.layer_types[i]]
    if not c.use_attention_gate:
        out, key, value = self_attention(g, h, d.past(i), d.lengths, rotary, weights, spec, d.target)
        return out, (key, value)
    # Stored as gate_proj (transformers' conversion mapping renames it g_proj when it loads).
    gate = a.optional("g_proj.weight", heads, c.hidden_size) or a("gate_proj.weight", heads, c.hidden_size)
    out, key, value = gated_self_attention(g, h, d.past(i), d.lengths, rotary, weights, gate, spec, d.target)
    return out, (key, value)


def decoder_layer(d: Decoder, w: Weights, i: int):
    """Lfm3DecoderLayer.forward: LFM2's layer with this attention and, with use_sandwich_norm, each
    branch normed before it joins the residual; returns the layer's present state."""
    return lfm2.decoder_layer(d, w, i, attend=attention, sandwich=d.c.use_sandwich_norm)


FAMILY = register(Family("lfm3", Lfm3Config, decoder_layer, VARIANTS, structure=STRUCTURE, parser=parse_config,
                         rotary=rotary, prepare=conv_padding, final_norm=final_norm))

__all__ = ["FAMILY", "STRUCTURE", "VARIANTS", "Lfm3Config", "decoder_layer", "parse_config"]
