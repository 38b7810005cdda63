"""Cohere (Command R, Aya 23) and Cohere 2 (Command R7B, Command A): parallel attention and MLP.

Reference: transformers/models/cohere/modeling_cohere.py and cohere2/modeling_cohere2.py. Apart
from Llama: one LayerNorm without bias feeds attention and the MLP in parallel, x + attn(h) + mlp(h);
rotary pairs are interleaved (rotate_every_two); the logits are multiplied by `logit_scale`;
attention_bias covers q, k, v and o. Cohere: an optional per-head LayerNorm on q and k with one
weight per head (`use_qk_norm`). Cohere 2: sliding layers by `layer_types` (every 4th global),
and only the sliding layers rotate; the global ones have no position embedding at all.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import onnx_ir as ir

from architectures import stablelm
from builder.architecture import Weights
from builder.blocks import AttentionSpec, self_attention
from builder.decoder_config import DecoderConfig
from builder.family import Decoder, Family, register
from builder.io import logits_dtype

# transformers' config defaults where they differ from the shared ones, and where Cohere 2 differs
# from Cohere; default_theta: rope_theta when config.json has none (CohereConfig.default_theta;
# Cohere2Config keeps PreTrainedConfig's).
COHERE = dict(vocab_size=256000, hidden_size=8192, intermediate_size=22528, num_hidden_layers=40,
              num_attention_heads=64, max_position_embeddings=8192, pad_token_id=0, bos_token_id=5,
              eos_token_id=255001, tie_word_embeddings=True)
VARIANTS: dict[str, dict[str, Any]] = {
    "CohereForCausalLM": dict(COHERE, model_type="cohere", default_theta=500_000.0),
    "Cohere2ForCausalLM": dict(COHERE, model_type="cohere2", sliding_window=4096),
}

# What each modeling file fixes: Cohere has no sliding layers and rotates everywhere; Cohere 2
# rotates only its sliding layers and has no q/k norm. onnxruntime-genai 0.18 knows neither
# model type; its decoder contract is Llama's (same inputs, outputs and KV cache layout).
STRUCTURE: dict[str, dict[str, Any]] = {
    "CohereForCausalLM": dict(model_type="llama", sliding_window=None, global_rope=True),
    "Cohere2ForCausalLM": dict(model_type="llama", use_qk_norm=False, global_rope=False),
}


@dataclass(frozen=True)
class CohereConfig(DecoderConfig):
    """config.json of Cohere and Cohere 2: the shared decoder keys and their own."""

    logit_scale: float | None = 0.0625
    layer_norm_eps: float = 1e-5
    use_qk_norm: bool = False  # Cohere only
    sliding_window_pattern: int = 4  # Cohere 2's older key: every pattern-th layer is global
    # Structure the modeling files fix per architecture (not config.json keys).
    global_rope: bool = True

    def default_layer_types(self) -> list[str]:
        """Cohere 2 without layer_types: every sliding_window_pattern-th layer is global."""
        return ["sliding_attention" if self.sliding_window is not None and (i + 1) % self.sliding_window_pattern
                else "full_attention" for i in range(self.num_hidden_layers)]

    def rotates(self, layer: int) -> bool:
        """Cohere2Attention applies rotary only where it has a sliding window."""
        return self.global_rope or (self.sliding_window is not None and self.layer_types[layer] == "sliding_attention")


def decoder_layer(d: Decoder, w: Weights, i: int) -> tuple[ir.Value, ir.Value]:
    """CohereDecoderLayer / Cohere2DecoderLayer.forward: x + attn(h) + mlp(h), h = input_layernorm(x)."""
    g, c, D = d.g, d.c, d.c.head_dim
    with g.scope("input_layernorm"):
        h = d.stream.norm(w("input_layernorm.weight", c.hidden_size))
    a = w.under("self_attn.")
    attention = stablelm.biased_self_attn(a, c)
    if c.use_qk_norm:  # CohereLayerNorm((heads, head_dim)): one weight row per head
        attention = dataclasses.replace(attention, q_norm=a("q_norm.weight", c.num_attention_heads, D),
                                        k_norm=a("k_norm.weight", c.num_key_value_heads, D))
    spec = AttentionSpec(c.num_attention_heads, c.num_key_value_heads, D, window=c.window(i),
                         norm_eps=c.layer_norm_eps, rotary_interleaved=True, qk_layer_norm=True)
    with g.scope("self_attn"):
        attn, key, value = self_attention(g, h, d.past(i), d.lengths, d.rotary if c.rotates(i) else None, attention,
                                          spec, d.target)
    with g.scope("mlp"):
        mlp = stablelm.gated(d, w.under("mlp."), h)
    d.stream.add(attn)
    d.stream.add(mlp)  # both branches join at the layer, after the MLP
    return key, value


def scaled_logits(d: Decoder, h: ir.Value) -> ir.Value:
    """CohereForCausalLM: lm_head's logits times logit_scale."""
    logits, scale = d.vocab.logits(d.g, h), d.c.logit_scale
    if scale is None or scale == 1.0:
        return logits
    with d.g.scope("lm_head", "logit_scale"):
        return d.g.op.Mul(logits, d.g.constant(scale, logits_dtype(d.target.io_dtype)))


FAMILY = register(Family(
    "cohere", CohereConfig, decoder_layer, VARIANTS, structure=STRUCTURE, stream=stablelm.layer_norm_stream,
    logits=scaled_logits,
    # Older checkpoints saved the rotary buffer; it is recomputed from the config.
    ignored=("model.layers.*.self_attn.rotary_emb.inv_freq",),
))

__all__ = ["FAMILY", "STRUCTURE", "VARIANTS", "CohereConfig", "decoder_layer"]
