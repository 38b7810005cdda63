"""OLMo, OLMo 2 and OLMo 3: the variants as data.

Reference: transformers/models/olmo{,2,3}/modeling_olmo*.py. Apart from Llama:
- OLMo: LayerNorm without weight or bias (eps fixed at 1e-5), and q/k/v clamped to ±clip_qkv;
- OLMo 2/3: no norm before attention or MLP; each branch is normalized before it joins the
  residual (x = x + norm(attn(x)); x = x + norm(mlp(x))), and q_norm/k_norm are RMSNorms over the
  whole q and k projections, all heads at once;
- OLMo 3: sliding-window layers by `layer_types`; full-attention layers take `rope_scaling`
  (yarn), sliding ones plain rotary.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import onnx_ir as ir

from builder.architecture import Weights, attention_weights
from builder.blocks import AttentionSpec, ResidualStream, gated_mlp, self_attention
from builder.blocks.attention import AttentionWeights
from builder.config_checks import rope_sources
from builder.decoder_config import DecoderConfig
from builder.family import Decoder, Family, no_partial_rotary, parse, register, rotary_by_layer_type
from builder.hf_config import SCALED_ROPE_TYPES, from_dict

VARIANTS: dict[str, dict[str, Any]] = {
    "OlmoForCausalLM": dict(model_type="olmo"),
    "Olmo2ForCausalLM": dict(model_type="olmo2"),
    "Olmo3ForCausalLM": dict(model_type="olmo3", sliding_window=4096),
}

# What each modeling file fixes whatever config.json says. onnxruntime-genai 0.18 knows the model
# type "olmo" but not "olmo2"/"olmo3"; its contract (a plain decoder) is theirs too.
STRUCTURE: dict[str, dict[str, Any]] = {
    "OlmoForCausalLM": dict(post_norms=False, rms_norm_eps=1e-5, sliding_window=None, layer_types=None),
    "Olmo2ForCausalLM": dict(model_type="olmo", clip_qkv=None, sliding_window=None, layer_types=None),
    "Olmo3ForCausalLM": dict(model_type="olmo", clip_qkv=None),
}


@dataclass(frozen=True)
class OlmoConfig(DecoderConfig):
    """config.json of the OLMo family: the shared decoder keys and OLMo's own."""

    model_type: str = "olmo"
    vocab_size: int = 50304
    rms_norm_eps: float = 1e-5  # OLMo: its LayerNorm's fixed eps
    clip_qkv: float | None = None
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = 50279
    pad_token_id: int | None = 1
    # Structure the modeling files fix per architecture (not config.json keys): OLMo 2/3's
    # post-norms and whole-projection q/k norms.
    post_norms: bool = True

    def default_layer_types(self) -> list[str]:
        """OLMo 3: three sliding layers, then a full one."""
        return periodic_layer_types(self.num_hidden_layers, 4 if self.sliding_window is not None else None)


def periodic_layer_types(layers: int, period: int | None) -> list[str]:
    """Every `period`-th layer global, the others sliding; every layer global without a period."""
    return ["sliding_attention" if period and (i + 1) % period else "full_attention" for i in range(layers)]


def olmo3_rope_parameters(raw: dict[str, Any], max_position_embeddings: int) -> dict[str, dict[str, Any]]:
    """Olmo3Config.convert_rope_params_to_dict: `rope_scaling` and `rope_theta` (default 500000)
    go to full-attention layers; sliding layers rotate plainly at 500000, whatever `rope_theta`
    says (transformers 5 pops it for the full layers first). A per-layer-type `rope_parameters` is kept."""
    scaling, given = rope_sources(raw)
    params = {t: dict(given.get(t) or {"rope_type": "default"}) for t in ("full_attention", "sliding_attention")}
    params["full_attention"].update(scaling)
    params["full_attention"].setdefault("rope_theta", raw.get("rope_theta", 500_000.0))
    params["sliding_attention"].setdefault("rope_theta", 500_000.0)
    for p in params.values():
        p.setdefault("rope_type", p.get("type", "default"))
        if p["rope_type"] in SCALED_ROPE_TYPES:
            p.setdefault("original_max_position_embeddings", max_position_embeddings)
    return params


def parse_config(family: Family, raw: dict[str, Any], architecture: str) -> OlmoConfig:
    """The shared parse, but OLMo 3 resolves its rotary settings per layer type."""
    if architecture != "Olmo3ForCausalLM":
        return parse(family, raw, architecture)
    rope = no_partial_rotary(olmo3_rope_parameters(raw, raw.get("max_position_embeddings", 2048)), architecture)
    return from_dict(family.config, raw, family.variants[architecture], rope_parameters=rope,
                     **family.structure[architecture])


def decoder_layer(d: Decoder, w: Weights, i: int):
    """OlmoDecoderLayer.forward: x + attn(norm(x)), then x + mlp(norm(x)), norms without weights;
    Olmo2/Olmo3DecoderLayer.forward: x + norm(attn(x)), then x + norm(mlp(x)). Returns the layer's KV."""
    c = d.c
    a = w.under("self_attn.")
    attention = attention_weights(a, c, c.attention_bias, c.attention_bias)
    if c.post_norms:  # Olmo2Attention: RMSNorm over the whole q and k projections
        attention = replace(attention, q_norm=a("q_norm.weight", c.num_attention_heads * c.head_dim),
                            k_norm=a("k_norm.weight", c.num_key_value_heads * c.head_dim))
    spec = AttentionSpec(c.num_attention_heads, c.num_key_value_heads, c.head_dim, window=c.window(i),
                         norm_eps=c.rms_norm_eps, qk_norm_whole=c.post_norms, clip_qkv=c.clip_qkv)
    layer = post_norm_layer if c.post_norms else weightless_norm_layer
    return layer(d, w, i, attention, spec, d.rotary[c.layer_types[i]])


def weightless_norm_layer(d: Decoder, w: Weights, i: int, attention: AttentionWeights, spec: AttentionSpec,
                          rotary: Any):
    """OLMo's x + attn(norm(x)), then x + mlp(norm(x)), with LayerNorms of neither weight nor bias."""
    g, stream = d.g, d.stream
    with g.scope("input_layernorm"):
        h = stream.norm(None)
    with g.scope("self_attn"):
        h, key, value = self_attention(g, h, d.past(i), d.lengths, rotary, attention, spec, d.target)
    stream.add(h)
    with g.scope("post_attention_layernorm"):
        h = stream.norm(None)
    stream.add(mlp(d, w, h))
    return key, value


def post_norm_layer(d: Decoder, w: Weights, i: int, attention: AttentionWeights, spec: AttentionSpec, rotary: Any):
    """x + norm(attn(x)), then x + norm(mlp(x)): OLMo 2/3's layer, and EXAONE 4's
    (architectures/exaone4.py) with its own attention. Returns the layer's KV."""
    g, stream, H = d.g, d.stream, d.c.hidden_size
    h = stream.value()
    with g.scope("self_attn"):
        h, key, value = self_attention(g, h, d.past(i), d.lengths, rotary, attention, spec, d.target)
    with g.scope("post_attention_layernorm"):
        stream.add(h, w("post_attention_layernorm.weight", H))
    h = mlp(d, w, stream.value())
    with g.scope("post_feedforward_layernorm"):
        stream.add(h, w("post_feedforward_layernorm.weight", H))
    return key, value


def mlp(d: Decoder, w: Weights, h: ir.Value) -> ir.Value:
    """The layer's gated MLP (gate, up and down projections) of `h`."""
    c, m = d.c, w.under("mlp.")
    H, I = c.hidden_size, c.intermediate_size
    with d.g.scope("mlp"):
        return gated_mlp(d.g, h, m("gate_proj.weight", I, H), m("up_proj.weight", I, H), m("down_proj.weight", H, I),
                         c.hidden_act, d.target)


def stream(d: Decoder, x: ir.Value) -> ResidualStream:
    """OLMo's LayerNorm has neither weight nor bias (the stream's width gives its ones and zeros);
    OLMo 2/3 use RMSNorm."""
    return ResidualStream(d.g, x, d.c.rms_norm_eps, d.target, layer_norm=not d.c.post_norms,
                          hidden_size=d.c.hidden_size)


def final_norm(d: Decoder) -> ir.Value:
    """model.norm: OLMo's without weight, OLMo 2/3's RMSNorm."""
    with d.g.scope("model", "norm"):
        weight = d.ckpt.weight("model.norm.weight", (d.c.hidden_size,)) if d.c.post_norms else None
        return d.stream.norm(weight)


FAMILY = register(Family(
    "olmo", OlmoConfig, decoder_layer, VARIANTS, structure=STRUCTURE, parser=parse_config,
    rotary=rotary_by_layer_type, stream=stream, final_norm=final_norm,
    ignored=("model.layers.*.self_attn.rotary_emb.inv_freq",),
))

__all__ = ["FAMILY", "STRUCTURE", "VARIANTS", "OlmoConfig", "decoder_layer", "mlp", "olmo3_rope_parameters",
           "parse_config", "periodic_layer_types", "post_norm_layer"]
