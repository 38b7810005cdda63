"""Gemma 1, 2 and 3, and the text decoder of Gemma3ForConditionalGeneration (the hub's -it models).

Reference: transformers/models/gemma/modeling_gemma.py, gemma2/modeling_gemma2.py,
gemma3/modeling_gemma3.py. What sets the family apart from Llama:
- embeddings multiplied by √hidden_size, rounded to the model's dtype (ScaledWordEmbedding);
- RMSNorm scales by (1 + weight): folded into the weights here, so the graph uses a plain norm;
- tanh-approximated GELU in the gated MLP; head_dim independent of hidden_size / heads;
- Gemma 2/3: "sandwich" norms (post-attention and post-feedforward norms on the branch output),
  attention scale query_pre_attn_scalar^-0.5, sliding-window layers by `layer_types`;
- Gemma 2: tanh soft-capping of attention logits and final logits;
- Gemma 3: per-head q/k RMSNorm, and one rotary table per layer type (global theta with the
  config's scaling, local `rope_local_base_freq` without it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from builder.architecture import DecoderInfo, decoder_info, output_embedding
from builder.blocks import (
    AttentionSpec,
    AttentionWeights,
    DecoderLayer,
    Rope,
    decoder_stack,
    embedding,
    lm_head,
    rotary_tables,
    sequence_lengths,
    shared_vocabulary,
)
from builder.checkpoint import Checkpoint
from builder.errors import BuildError
from builder.graph import Graph
from builder.hf_config import (
    SCALED_ROPE_TYPES,
    effective_window,
    from_dict,
    rope_parameters,
)
from builder.io import DecoderIO
from builder.lazy import Weight
from builder.target import Target

VARIANTS: dict[str, dict[str, Any]] = {
    "GemmaForCausalLM": dict(
        model_type="gemma", hidden_size=3072, intermediate_size=24576, num_hidden_layers=28,
        num_attention_heads=16, num_key_value_heads=16, max_position_embeddings=8192, vocab_size=256000,
        sliding_window=None, query_pre_attn_scalar=None, final_logit_softcapping=None,
        attn_logit_softcapping=None, sandwich_norms=False, qk_norm=False,
    ),
    "Gemma2ForCausalLM": dict(model_type="gemma2", final_logit_softcapping=30.0, attn_logit_softcapping=50.0),
    "Gemma3ForCausalLM": dict(
        model_type="gemma3_text", vocab_size=262_208, max_position_embeddings=131_072,
        qk_norm=True, sliding_window_pattern=6,
    ),
}
VARIANTS["Gemma3ForConditionalGeneration"] = VARIANTS["Gemma3ForCausalLM"]

# The multimodal checkpoints carry a vision tower and projector; the build is text-only.
IGNORED = (
    "vision_tower.*", "multi_modal_projector.*",
    "model.vision_tower.*", "model.multi_modal_projector.*",
)


@dataclass(frozen=True)
class GemmaConfig:
    """config.json of the Gemma family (for Gemma3ForConditionalGeneration: its `text_config`)."""

    model_type: str = "gemma2"
    vocab_size: int = 256000
    hidden_size: int = 2304
    intermediate_size: int = 9216
    num_hidden_layers: int = 26
    num_attention_heads: int = 8
    num_key_value_heads: int = 4
    head_dim: int = 256
    hidden_act: str | None = None  # Gemma 1's key
    hidden_activation: str | None = None  # Gemma 2/3's key
    max_position_embeddings: int = 8192
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = True
    rope_parameters: dict[str, Any] = field(default_factory=dict)  # Gemma 3: one dict per layer type
    attention_bias: bool = False
    query_pre_attn_scalar: float | None = 256
    sliding_window: int | None = 4096
    sliding_window_pattern: int = 2
    layer_types: list[str] | None = None
    final_logit_softcapping: float | None = None
    attn_logit_softcapping: float | None = None
    bos_token_id: int | None = 2
    eos_token_id: int | list[int] | None = 1
    pad_token_id: int | None = 0
    # Structure the modeling files fix per architecture (not config.json keys).
    sandwich_norms: bool = True
    qk_norm: bool = False
    prefix: str = ""  # where the text decoder's tensors live in a multimodal checkpoint

    def __post_init__(self) -> None:
        act = self.hidden_activation or self.hidden_act or "gelu_pytorch_tanh"
        if act == "gelu":  # transformers maps Gemma's legacy "gelu" to the tanh approximation
            act = "gelu_pytorch_tanh"
        object.__setattr__(self, "hidden_activation", act)
        if self.layer_types is None:
            layer_types = [
                "sliding_attention" if self.sliding_window is not None and (i + 1) % self.sliding_window_pattern
                else "full_attention"
                for i in range(self.num_hidden_layers)
            ]
            object.__setattr__(self, "layer_types", layer_types)
        if len(self.layer_types) != self.num_hidden_layers:
            raise ValueError(f"layer_types has {len(self.layer_types)} entries for {self.num_hidden_layers} layers")

    def window(self, layer: int) -> int | None:
        if self.layer_types[layer] != "sliding_attention":
            return None
        return effective_window(self.sliding_window, self.max_position_embeddings)

    def rope(self, layer: int) -> dict[str, Any]:
        params = self.rope_parameters
        return params[self.layer_types[layer]] if "full_attention" in params else params


def gemma3_rope_parameters(raw: dict[str, Any], max_positions: int) -> dict[str, dict[str, Any]]:
    """Gemma 3's rotary settings per layer type, as transformers' Gemma3TextConfig resolves them:
    `rope_scaling` and `rope_theta` (default 1e6) apply to global layers, `rope_local_base_freq`
    (default 1e4) to sliding ones, which are never scaled."""
    given = raw.get("rope_parameters")
    params = {k: dict(v) for k, v in given.items()} if isinstance(given, dict) and "full_attention" in given else {}
    full = params.setdefault("full_attention", {"rope_type": "default"})
    sliding = params.setdefault("sliding_attention", {"rope_type": "default"})
    if raw.get("rope_scaling"):
        full.update(raw["rope_scaling"])
    full.setdefault("rope_theta", raw.get("rope_theta", 1_000_000.0))
    sliding.setdefault("rope_theta", raw.get("rope_local_base_freq", 10_000.0))
    for p in (full, sliding):
        p.setdefault("rope_type", p.get("type", "default"))
        if p["rope_type"] in SCALED_ROPE_TYPES:
            p.setdefault("original_max_position_embeddings", max_positions)
    return params


def parse_config(raw: dict[str, Any], architecture: str) -> GemmaConfig:
    defaults = VARIANTS[architecture]
    derived: dict[str, Any] = {}
    if architecture == "Gemma3ForConditionalGeneration":
        text = dict(raw.get("text_config") or {})
        for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
            if key not in text and key in raw:
                text[key] = raw[key]
        raw = text
    max_pos = raw.get("max_position_embeddings", defaults.get("max_position_embeddings", 8192))
    if defaults["model_type"] == "gemma3_text":
        derived["rope_parameters"] = gemma3_rope_parameters(raw, max_pos)
    else:
        derived["rope_parameters"] = rope_parameters(raw, max_pos)
    return from_dict(GemmaConfig, raw, defaults, **derived)


def info(c: GemmaConfig) -> DecoderInfo:
    return decoder_info(c, [c.window(i) for i in range(c.num_hidden_layers)])


def text_prefix(ckpt: Checkpoint) -> str:
    """Where the decoder lives: top level, or inside a multimodal checkpoint (either layout)."""
    for prefix in ("", "language_model.", "model.language_model."):
        if f"{prefix}model.embed_tokens.weight" in ckpt or f"{prefix}embed_tokens.weight" in ckpt:
            return prefix
    raise BuildError("the checkpoint has no model.embed_tokens.weight (nor a language_model's)")


def build(g: Graph, io: DecoderIO, ckpt: Checkpoint, c: GemmaConfig, target: Target):
    H, D, V, I = c.hidden_size, c.head_dim, c.vocab_size, c.intermediate_size
    q_dim, kv_dim = c.num_attention_heads * D, c.num_key_value_heads * D
    prefix = text_prefix(ckpt)
    # transformers 5 saves the multimodal decoder as model.language_model.layers.* (no inner "model.").
    base = prefix if prefix.startswith("model.") else prefix + "model."

    def w(name: str, *shape: int) -> Weight:
        return ckpt.weight(base + name, shape)

    def norm(name: str, *shape: int) -> Weight:
        # Gemma's RMSNorm multiplies by (1 + weight), in float32: fold it into the weight.
        return w(name, *shape).map(lambda x: x.astype(np.float32) + 1, np.float32)

    # One rotary table per distinct rope setting (Gemma 3: global and local layers differ).
    rotary: dict[str, tuple] = {}
    per_type = "full_attention" in c.rope_parameters
    for layer_type in dict.fromkeys(c.layer_types):
        if not per_type and rotary:
            rotary[layer_type] = next(iter(rotary.values()))
            continue
        rope = Rope.from_parameters(c.rope(c.layer_types.index(layer_type)), D, c.max_position_embeddings)
        name = layer_type.split("_")[0] + "_" if per_type else ""  # full_cos_cache / sliding_cos_cache
        rotary[layer_type] = rotary_tables(g, rope, c.max_position_embeddings, target, name)
    lengths = sequence_lengths(g, io.attention_mask)

    embed = w("embed_tokens.weight", V, H)
    head, tied = output_embedding(ckpt, embed, c.tie_word_embeddings, (V, H))
    shared = shared_vocabulary(g, head, target) if tied else None
    with g.scope("model", "embed_tokens"):
        x = embedding(g, io.input_ids, embed, target, scale=float(np.sqrt(H)), shared=shared)

    def layer(i: int) -> DecoderLayer:
        p, a, m = f"layers.{i}.", f"layers.{i}.self_attn.", f"layers.{i}.mlp."
        return DecoderLayer(
            input_norm=norm(p + "input_layernorm.weight", H),
            attention=AttentionWeights(
                q=w(a + "q_proj.weight", q_dim, H), k=w(a + "k_proj.weight", kv_dim, H),
                v=w(a + "v_proj.weight", kv_dim, H), o=w(a + "o_proj.weight", H, q_dim),
                q_bias=w(a + "q_proj.bias", q_dim) if c.attention_bias else None,
                k_bias=w(a + "k_proj.bias", kv_dim) if c.attention_bias else None,
                v_bias=w(a + "v_proj.bias", kv_dim) if c.attention_bias else None,
                o_bias=w(a + "o_proj.bias", H) if c.attention_bias else None,
                q_norm=norm(a + "q_norm.weight", D) if c.qk_norm else None,
                k_norm=norm(a + "k_norm.weight", D) if c.qk_norm else None,
            ),
            spec=AttentionSpec(
                c.num_attention_heads, c.num_key_value_heads, D,
                scale=c.query_pre_attn_scalar ** -0.5 if c.query_pre_attn_scalar else None,
                window=c.window(i), softcap=c.attn_logit_softcapping or 0.0, norm_eps=c.rms_norm_eps,
            ),
            rotary=rotary[c.layer_types[i]],
            post_attention_norm=norm(p + "post_attention_layernorm.weight", H),
            gate=w(m + "gate_proj.weight", I, H), up=w(m + "up_proj.weight", I, H), down=w(m + "down_proj.weight", H, I),
            activation=c.hidden_activation,
            pre_feedforward_norm=norm(p + "pre_feedforward_layernorm.weight", H) if c.sandwich_norms else None,
            post_feedforward_norm=norm(p + "post_feedforward_layernorm.weight", H) if c.sandwich_norms else None,
        )

    layers = (layer(i) for i in range(c.num_hidden_layers))
    # The residual stream reaches ~1e5 on real weights (gemma-3-270m), past fp16's 65504: in fp16
    # builds it and its norms stay in float32 (bf16 has float32's range and keeps its own).
    residual = np.float32 if target.io_dtype == np.float16 else None
    h, presents = decoder_stack(g, x, layers, norm("norm.weight", H), io, lengths, c.rms_norm_eps, target, residual)
    return lm_head(g, h, head, target, softcap=c.final_logit_softcapping, shared=shared), presents
