"""EXAONE 4.0 (Exaone4ForCausalLM).

Reference: transformers/models/exaone4/modeling_exaone4.py. Apart from Llama:
- post-norms as OLMo 2's: x = x + norm(attn(x)); x = x + norm(mlp(x)), no norm before either;
- a per-head q/k RMSNorm (as Qwen3's);
- sliding-window layers by `layer_types` (or every `sliding_window_pattern`-th layer global);
  when the config has a sliding window, its global layers have no rotary embedding at all.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from architectures.olmo import periodic_layer_types, post_norm_layer
from builder.architecture import Weights, attention_weights
from builder.blocks import AttentionSpec
from builder.decoder_config import DecoderConfig
from builder.family import Decoder, Family, register

# onnxruntime-genai 0.18 does not know "exaone4"; "decoder" is its plain decoder-only model type,
# whose contract (input_ids, attention_mask, past/present KV, logits) this graph has.
VARIANTS: dict[str, dict[str, Any]] = {
    "Exaone4ForCausalLM": dict(model_type="exaone4", vocab_size=102400, intermediate_size=16384, rms_norm_eps=1e-5,
                               sliding_window=4096, bos_token_id=0),
}
STRUCTURE: dict[str, dict[str, Any]] = {"Exaone4ForCausalLM": dict(model_type="decoder")}


@dataclass(frozen=True)
class Exaone4Config(DecoderConfig):
    """config.json of Exaone4ForCausalLM: the shared decoder keys and EXAONE 4's own."""

    # Narrowed as well as defaulted: Exaone4Config derives no KV heads, so config.json's null is refused.
    num_key_value_heads: int = 32
    sliding_window_pattern: int | str | None = 4

    def default_layer_types(self) -> list[str]:
        """Exaone4Config derives them from an integer pattern only: a string one ("LLLG") or none
        (no sliding window) needs `layer_types`, there as here."""
        pattern = self.sliding_window_pattern
        if self.sliding_window is None or not isinstance(pattern, int) or pattern < 1:
            raise ValueError(f"layer_types is required with sliding_window={self.sliding_window!r} and "
                             f"sliding_window_pattern={pattern!r}")
        return periodic_layer_types(self.num_hidden_layers, pattern)

    def rotates(self, layer: int) -> bool:
        """Exaone4Attention: rotary everywhere without a sliding window, else on sliding layers only."""
        return self.sliding_window is None or self.layer_types[layer] == "sliding_attention"


def decoder_layer(d: Decoder, w: Weights, i: int):
    """Exaone4DecoderLayer.forward: x + norm(attn(x)), then x + norm(mlp(x)) (OLMo 2's layer) with a
    per-head q/k RMSNorm; returns the layer's KV."""
    c = d.c
    a = w.under("self_attn.")
    attention = attention_weights(a, c, qk_norm=a)
    spec = AttentionSpec(c.num_attention_heads, c.num_key_value_heads, c.head_dim, window=c.window(i),
                         norm_eps=c.rms_norm_eps)
    return post_norm_layer(d, w, i, attention, spec, d.rotary if c.rotates(i) else None)


FAMILY = register(Family(
    "exaone4", Exaone4Config, decoder_layer, VARIANTS, structure=STRUCTURE,
    ignored=("model.layers.*.self_attn.rotary_emb.inv_freq",),
))

__all__ = ["FAMILY", "STRUCTURE", "VARIANTS", "Exaone4Config", "decoder_layer"]
