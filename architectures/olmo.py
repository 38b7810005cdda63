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

from dataclasses import dataclass, field, replace
from typing import Any

from builder.architecture import Weights, attention_weights, decoder_layers, vocabulary
from builder.blocks import (
    AttentionSpec,
    ResidualStream,
    gated_mlp,
    rotary_tables_by_layer_type,
    self_attention,
    sequence_lengths,
)
from builder.checkpoint import Checkpoint
from builder.graph import Graph
from builder.hf_config import (
    SCALED_ROPE_TYPES,
    effective_window,
    from_dict,
    rope_parameters,
)
from builder.io import DecoderIO
from builder.target import Target

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

IGNORED = ("model.layers.*.self_attn.rotary_emb.inv_freq",)


@dataclass(frozen=True)
class OlmoConfig:
    """config.json of the OLMo family; field names are the file's keys, defaults transformers' own."""

    model_type: str = "olmo"
    vocab_size: int = 50304
    hidden_size: int = 4096
    intermediate_size: int = 11008
    num_hidden_layers: int = 32
    num_attention_heads: int = 32
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    hidden_act: str = "silu"
    max_position_embeddings: int = 2048
    rms_norm_eps: float = 1e-5  # OLMo: its LayerNorm's fixed eps
    tie_word_embeddings: bool = False
    rope_parameters: dict[str, Any] = field(default_factory=dict)  # OLMo 3: one dict per layer type
    attention_bias: bool = False
    clip_qkv: float | None = None
    sliding_window: int | None = None
    layer_types: list[str] | None = None
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = 50279
    pad_token_id: int | None = 1
    # Structure the modeling files fix per architecture (not config.json keys): OLMo 2/3's
    # post-norms and whole-projection q/k norms.
    post_norms: bool = True

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        if self.head_dim is None:
            set_(self, "head_dim", self.hidden_size // self.num_attention_heads)
        if self.num_key_value_heads is None:
            set_(self, "num_key_value_heads", self.num_attention_heads)
        if self.layer_types is None:  # OLMo 3: three sliding layers, then a full one
            set_(self, "layer_types", [
                "sliding_attention" if self.sliding_window is not None and (i + 1) % 4 else "full_attention"
                for i in range(self.num_hidden_layers)
            ])
        if len(self.layer_types) != self.num_hidden_layers:
            raise ValueError(f"layer_types has {len(self.layer_types)} entries for {self.num_hidden_layers} layers")

    def window(self, layer: int) -> int | None:
        if self.layer_types[layer] != "sliding_attention":
            return None
        return effective_window(self.sliding_window, self.max_position_embeddings)


def olmo3_rope_parameters(raw: dict[str, Any], max_position_embeddings: int) -> dict[str, dict[str, Any]]:
    """Olmo3Config.convert_rope_params_to_dict: `rope_scaling` and `rope_theta` (default 500000)
    go to full-attention layers; sliding layers rotate plainly at 500000, whatever `rope_theta`
    says (transformers 5 pops it for the full layers first). A per-layer-type `rope_parameters` is kept."""
    given = raw.get("rope_parameters") or {}
    params = {t: dict(given.get(t) or {"rope_type": "default"}) for t in ("full_attention", "sliding_attention")}
    params["full_attention"].update(raw.get("rope_scaling") or {})
    params["full_attention"].setdefault("rope_theta", raw.get("rope_theta", 500_000.0))
    params["sliding_attention"].setdefault("rope_theta", 500_000.0)
    for p in params.values():
        p.setdefault("rope_type", p.get("type", "default"))
        if p["rope_type"] in SCALED_ROPE_TYPES:
            p.setdefault("original_max_position_embeddings", max_position_embeddings)
    return params


# How each variant's config resolves its rotary settings (OLMo 3: per layer type).
ROPE = {"Olmo3ForCausalLM": olmo3_rope_parameters}


def parse_config(raw: dict[str, Any], architecture: str) -> OlmoConfig:
    rope = ROPE.get(architecture, rope_parameters)(raw, raw.get("max_position_embeddings", 2048))
    return from_dict(OlmoConfig, raw, VARIANTS[architecture], rope_parameters=rope, **STRUCTURE[architecture])


def decoder_layer(g: Graph, stream: ResidualStream, w: Weights, c: OlmoConfig, i: int, past, lengths, rotary,
                  target: Target):
    """OlmoDecoderLayer.forward: x + attn(norm(x)), then x + mlp(norm(x)), norms without weights;
    Olmo2/Olmo3DecoderLayer.forward: x + norm(attn(x)), then x + norm(mlp(x)). Returns the layer's KV."""
    H, D, I = c.hidden_size, c.head_dim, c.intermediate_size
    if c.post_norms:
        h = stream.value()
    else:
        with g.scope("input_layernorm"):
            h = stream.norm(None)
    a = w.under("self_attn.")
    attention = attention_weights(a, c, c.attention_bias, c.attention_bias)
    if c.post_norms:  # Olmo2Attention: RMSNorm over the whole q and k projections
        attention = replace(attention, q_norm=a("q_norm.weight", c.num_attention_heads * D),
                            k_norm=a("k_norm.weight", c.num_key_value_heads * D))
    spec = AttentionSpec(c.num_attention_heads, c.num_key_value_heads, D, window=c.window(i), norm_eps=c.rms_norm_eps,
                         qk_norm_whole=c.post_norms, clip_qkv=c.clip_qkv)
    with g.scope("self_attn"):
        h, key, value = self_attention(g, h, past, lengths, rotary, attention, spec, target)
    if c.post_norms:
        with g.scope("post_attention_layernorm"):
            stream.add(h, w("post_attention_layernorm.weight", H))
        h = stream.value()
    else:
        stream.add(h)
        with g.scope("post_attention_layernorm"):
            h = stream.norm(None)
    m = w.under("mlp.")
    with g.scope("mlp"):
        h = gated_mlp(g, h, m("gate_proj.weight", I, H), m("up_proj.weight", I, H), m("down_proj.weight", H, I),
                      c.hidden_act, target)
    if c.post_norms:
        with g.scope("post_feedforward_layernorm"):
            stream.add(h, w("post_feedforward_layernorm.weight", H))
    else:
        stream.add(h)
    return key, value


def build(g: Graph, io: DecoderIO, ckpt: Checkpoint, c: OlmoConfig, target: Target):
    H = c.hidden_size
    rotary = rotary_tables_by_layer_type(g, c.rope_parameters, c.layer_types, c.head_dim, c.max_position_embeddings,
                                         target)
    lengths = sequence_lengths(g, io.attention_mask)
    vocab = vocabulary(g, ckpt, target, (c.vocab_size, H), c.tie_word_embeddings)
    # OLMo's LayerNorm has neither weight nor bias; OLMo 2/3 use RMSNorm.
    stream = ResidualStream(g, vocab.embed(g, io.input_ids), c.rms_norm_eps, target, layer_norm=not c.post_norms,
                            hidden_size=H)
    presents = decoder_layers(g, ckpt, c.num_hidden_layers, lambda i, w: decoder_layer(
        g, stream, w, c, i, io.past[i], lengths, rotary[c.layer_types[i]], target))
    with g.scope("model", "norm"):
        h = stream.norm(ckpt.weight("model.norm.weight", (H,)) if c.post_norms else None)
    return vocab.logits(g, h), presents


__all__ = ["IGNORED", "ROPE", "STRUCTURE", "VARIANTS", "OlmoConfig", "build", "decoder_layer", "olmo3_rope_parameters",
           "parse_config"]
