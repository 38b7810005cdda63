"""Gemma 1, 2 and 3, and the text decoder of Gemma3ForConditionalGeneration (the hub's -it models).

Reference: transformers/models/gemma{,2,3}/modeling_gemma*.py. Apart from Llama: embeddings times
√hidden_size (rounded to the model's dtype); RMSNorm by (1 + weight), folded into the weights;
tanh-GELU; Gemma 2/3: sandwich norms (each branch normalized before it joins the residual),
attention scale query_pre_attn_scalar^-0.5, sliding layers by `layer_types`; Gemma 2: soft-capped
attention and final logits; Gemma 3: per-head q/k RMSNorm, one rotary table per layer type.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx_ir as ir

from builder.architecture import Weights, attention_weights, vocabulary
from builder.blocks import AttentionSpec, ResidualStream, Vocabulary, gated_mlp, self_attention
from builder.decoder_config import DecoderConfig
from builder.errors import BuildError
from builder.family import Decoder, Family, no_partial_rotary, register, rotary_by_layer_type, whole_head_rotary
from builder.graph import Graph
from builder.hf_config import from_dict, rope_parameters, rope_parameters_by_layer_type, text_config
from builder.inputs.source import Checkpoint
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
# Multimodal checkpoints keep the text decoder's settings under this key of config.json.
TEXT_CONFIG = {"Gemma3ForConditionalGeneration": "text_config"}


@dataclass(frozen=True)
class GemmaConfig(DecoderConfig):
    """config.json of the Gemma family (for Gemma3ForConditionalGeneration: its `text_config`):
    the shared decoder keys with Gemma 2's defaults, and Gemma's own."""

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
    tie_word_embeddings: bool = True
    query_pre_attn_scalar: float | None = 256
    sliding_window: int | None = 4096
    sliding_window_pattern: int = 2
    final_logit_softcapping: float | None = None
    attn_logit_softcapping: float | None = None
    bos_token_id: int | None = 2
    eos_token_id: int | list[int] | None = 1
    pad_token_id: int | None = 0
    # Structure the modeling files fix per architecture (not config.json keys).
    sandwich_norms: bool = True
    qk_norm: bool = False

    def __post_init__(self) -> None:
        act = self.hidden_activation or self.hidden_act or "gelu_pytorch_tanh"
        if act == "gelu":  # transformers maps Gemma's legacy "gelu" to the tanh approximation
            act = "gelu_pytorch_tanh"
        object.__setattr__(self, "hidden_activation", act)
        super().__post_init__()

    def default_layer_types(self) -> list[str]:
        """Every `sliding_window_pattern`-th layer global, the others sliding (all global without a window)."""
        if self.sliding_window is None:
            return ["full_attention"] * self.num_hidden_layers
        if self.sliding_window_pattern < 1:
            raise ValueError(f"sliding_window_pattern is {self.sliding_window_pattern}; expected a positive integer")
        return ["sliding_attention" if (i + 1) % self.sliding_window_pattern else "full_attention"
                for i in range(self.num_hidden_layers)]


def parse_config(family: Family, raw: dict[str, Any], architecture: str) -> GemmaConfig:
    """The config of `architecture` (a multimodal one's `text_config`); Gemma 3 rotates its sliding
    layers at their own theta."""
    defaults = family.variants[architecture]
    if architecture in TEXT_CONFIG:
        raw = text_config(raw, TEXT_CONFIG[architecture])
    max_pos = raw.get("max_position_embeddings", defaults.get("max_position_embeddings", 8192))
    if defaults["model_type"] == "gemma3_text":  # global layers: rope_theta and scaling; local: their own theta
        rope = rope_parameters_by_layer_type(raw, max_pos, 1_000_000.0, "rope_local_base_freq", 10_000.0)
    else:
        rope = rope_parameters(raw, max_pos)
    prefix = f"{TEXT_CONFIG[architecture]}." if architecture in TEXT_CONFIG else ""
    if "full_attention" not in rope:  # Gemma's and Gemma 2's modeling files rotate the whole head
        rope = whole_head_rotary(rope, architecture)
    else:
        rope = no_partial_rotary(rope, architecture)
    return from_dict(family.config, raw, defaults, key_prefix=prefix, rope_parameters=rope)


def text_prefix(ckpt: Checkpoint) -> str:
    """Where the decoder lives: top level, or inside a multimodal checkpoint (either layout)."""
    for prefix in ("", "language_model.", "model.language_model."):
        if f"{prefix}model.embed_tokens.weight" in ckpt or f"{prefix}embed_tokens.weight" in ckpt:
            return prefix
    raise BuildError("the checkpoint has no model.embed_tokens.weight (nor a language_model's)")


def decoder_prefix(ckpt: Checkpoint) -> str:
    """The prefix of the decoder's own tensors (`{prefix}layers.*`, `{prefix}embed_tokens.weight`):
    transformers 5 saves the multimodal decoder as model.language_model.* (no inner "model.")."""
    prefix = text_prefix(ckpt)
    return prefix if prefix.startswith("model.") else prefix + "model."


class GemmaWeights(Weights):
    """Weights of a Gemma module; `norm` folds Gemma's (1 + weight) RMSNorm scale into the weight."""

    def norm(self, name: str, *shape: int) -> Weight:
        return self(name, *shape).map(lambda x: x.astype(np.float32) + 1, np.float32)


def decoder_layer(d: Decoder, w: GemmaWeights, i: int):
    """GemmaDecoderLayer / Gemma2DecoderLayer / Gemma3DecoderLayer.forward; returns the layer's KV.
    Gemma 2/3 normalize each branch's output before it joins the residual (sandwich norms)."""
    g, c, stream = d.g, d.c, d.stream
    H, D, I = c.hidden_size, c.head_dim, c.intermediate_size
    with g.scope("input_layernorm"):
        h = stream.norm(w.norm("input_layernorm.weight", H))
    a = w.under("self_attn.")
    attention = attention_weights(a, c, c.attention_bias, c.attention_bias, a.norm if c.qk_norm else None)
    spec = AttentionSpec(
        c.num_attention_heads, c.num_key_value_heads, D,
        scale=c.query_pre_attn_scalar ** -0.5 if c.query_pre_attn_scalar else None,
        window=c.window(i), softcap=c.attn_logit_softcapping or 0.0, norm_eps=c.rms_norm_eps,
    )
    with g.scope("self_attn"):
        h, key, value = self_attention(g, h, d.past(i), d.lengths, d.rotary[c.layer_types[i]], attention, spec,
                                       d.target)
    if c.sandwich_norms:
        with g.scope("post_attention_layernorm"):
            stream.add(h, w.norm("post_attention_layernorm.weight", H))
        with g.scope("pre_feedforward_layernorm"):
            h = stream.norm(w.norm("pre_feedforward_layernorm.weight", H))
    else:
        stream.add(h)
        with g.scope("post_attention_layernorm"):
            h = stream.norm(w.norm("post_attention_layernorm.weight", H))
    m = w.under("mlp.")
    with g.scope("mlp"):
        h = gated_mlp(g, h, m("gate_proj.weight", I, H), m("up_proj.weight", I, H), m("down_proj.weight", H, I),
                      c.hidden_activation, d.target)
    if c.sandwich_norms:
        with g.scope("post_feedforward_layernorm"):
            stream.add(h, w.norm("post_feedforward_layernorm.weight", H))
    else:
        stream.add(h)
    return key, value


def text_vocabulary(g: Graph, ckpt: Checkpoint, c: GemmaConfig, target: Target) -> Vocabulary:
    """The decoder's embed_tokens (wherever the checkpoint keeps it) and lm_head; the multimodal
    package's embedding model reads the same table."""
    embed = decoder_prefix(ckpt) + "embed_tokens.weight"
    return vocabulary(g, ckpt, target, (c.vocab_size, c.hidden_size), c.tie_word_embeddings, embed=embed)


def embed(d: Decoder) -> ir.Value:
    """Token embeddings times √hidden; a multimodal package's decoder reads inputs_embeds instead,
    which its embedding model has already looked up, scaled and merged with the image features."""
    if d.io.inputs_embeds is not None:
        return d.io.inputs_embeds
    return d.vocab.embed(d.g, d.io.input_ids, scale=float(np.sqrt(d.c.hidden_size)))


def stream(d: Decoder, x: ir.Value) -> ResidualStream:
    """The residual stream reaches ~1e5 on real weights (gemma-3-270m), past fp16's 65504: in fp16
    builds it and its norms stay in float32 (bf16 has float32's range and keeps its own)."""
    residual = np.float32 if d.target.io_dtype == np.float16 else None
    return ResidualStream(d.g, x, d.c.rms_norm_eps, d.target, residual)


def final_norm(d: Decoder) -> ir.Value:
    """model.norm (wherever the checkpoint keeps the decoder), its (1 + weight) scale folded."""
    with d.g.scope("model", "norm"):
        return d.stream.norm(GemmaWeights(d.ckpt, d.prefix).norm("norm.weight", d.c.hidden_size))


FAMILY = register(Family(
    "gemma", GemmaConfig, decoder_layer, VARIANTS, parser=parse_config, rotary=rotary_by_layer_type,
    vocabulary=lambda d: text_vocabulary(d.g, d.ckpt, d.c, d.target), embed=embed, stream=stream,
    weights=GemmaWeights, prefix=lambda d: decoder_prefix(d.ckpt), final_norm=final_norm,
    logits=lambda d, h: d.vocab.logits(d.g, h, softcap=d.c.final_logit_softcapping),
    # The multimodal checkpoints carry a vision tower and projector; the decoder's build reads none.
    ignored=("vision_tower.*", "multi_modal_projector.*", "model.vision_tower.*", "model.multi_modal_projector.*"),
))

__all__ = ["FAMILY", "TEXT_CONFIG", "VARIANTS", "GemmaConfig", "GemmaWeights", "decoder_layer", "decoder_prefix",
           "parse_config", "text_prefix", "text_vocabulary"]
