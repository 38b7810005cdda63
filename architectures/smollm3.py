"""SmolLM3 (SmolLM3ForCausalLM): Llama's decoder with layers that skip the rotary embedding.

Reference: transformers/models/smollm3/modeling_smollm3.py. Apart from Llama:
- `no_rope_layers[i]` (1: rotate, 0: not; by default every `no_rope_layer_interval`-th layer does
  not) — those layers' GroupQueryAttention runs without rotary (NoPE);
- `layer_types` slide only where `use_sliding_window` is set, and only on no-rope layers, unless
  config.json lists them; the sliding layers' mask uses `sliding_window`.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from architectures import llama
from builder.architecture import Weights
from builder.decoder_config import DecoderConfig
from builder.family import Decoder, Family, register, rotary

# The row's max_position_embeddings is also what the rotary settings are resolved against when
# config.json leaves it out; default_theta is SmolLM3Config's.
VARIANTS: dict[str, dict[str, Any]] = {
    "SmolLM3ForCausalLM": dict(model_type="smollm3", vocab_size=128256, hidden_size=2048, num_hidden_layers=36,
                               num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=32768,
                               tie_word_embeddings=True, bos_token_id=128000, eos_token_id=128001,
                               pad_token_id=128004, default_theta=2_000_000.0),
}


@dataclass(frozen=True)
class SmolLM3Config(DecoderConfig):
    """config.json of SmolLM3ForCausalLM: the shared decoder keys and SmolLM3's own."""

    use_sliding_window: bool = False
    no_rope_layers: list[int] | None = None
    no_rope_layer_interval: int = 4
    mlp_bias: bool = False
    # What llama.decoder_layer reads besides: attention_bias covers q, k, v and o; no q/k norm,
    # rotary pairs split in halves.
    qkv_bias = attention_out_bias = property(lambda self: self.attention_bias)
    qk_norm = rotary_interleaved = False

    def __post_init__(self) -> None:
        if self.no_rope_layers is None:
            object.__setattr__(self, "no_rope_layers", [int((i + 1) % self.no_rope_layer_interval != 0)
                                                        for i in range(self.num_hidden_layers)])
        if len(self.no_rope_layers) < self.num_hidden_layers:
            raise ValueError(f"no_rope_layers has {len(self.no_rope_layers)} entries for {self.num_hidden_layers} "
                             "layers")
        super().__post_init__()

    def default_layer_types(self) -> list[str]:
        """Sliding only where `use_sliding_window` is set, and only on no-rope layers."""
        slides = self.use_sliding_window and self.sliding_window is not None
        return ["sliding_attention" if slides and not rope else "full_attention"
                for rope in self.no_rope_layers[:self.num_hidden_layers]]

    def rotates(self, layer: int) -> bool:
        return bool(self.no_rope_layers[layer])


def rotary_when_used(d: Decoder) -> Any:
    """The rotary tables, when any layer rotates."""
    return rotary(d) if any(d.c.rotates(i) for i in range(d.c.num_hidden_layers)) else None


def decoder_layer(d: Decoder, w: Weights, i: int):
    """SmolLM3DecoderLayer.forward: Llama's pre-norm layer, without rotary on no-rope layers (NoPE)."""
    if not d.c.rotates(i):
        d = copy.copy(d)  # the same build (graph, stream, sequence lengths) without the rotary tables
        d.rotary = None
    return llama.decoder_layer(d, w, i)


FAMILY = register(Family(
    "smollm3", SmolLM3Config, decoder_layer, VARIANTS, rotary=rotary_when_used,
    ignored=("model.layers.*.self_attn.rotary_emb.inv_freq",),
))

__all__ = ["FAMILY", "VARIANTS", "SmolLM3Config", "decoder_layer"]
