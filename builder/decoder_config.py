"""The config.json fields every decoder family shares, parsed once; a family's config adds its own.

A family's config is a frozen dataclass that extends `DecoderConfig` (field names are config.json's
keys, defaults transformers' own), adding the keys that are the family's own. Where transformers'
default of a shared key differs, the family's VARIANTS row says it (`builder.family.parse` applies
the row before config.json); the class redeclares a shared field only to narrow its type:

    VARIANTS = {"PhiForCausalLM": dict(vocab_size=51200, hidden_act="gelu_new", ...)}

    @dataclass(frozen=True)
    class PhiConfig(DecoderConfig):
        layer_norm_eps: float = 1e-5

`builder.hf_config.from_dict` checks every value against these annotations before
`__post_init__` runs, so derivations here may divide by the counts they read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from builder.hf_config import effective_window
from builder.state import KV, LayerState, kv_head_size


@dataclass(frozen=True)
class DecoderConfig:
    """Keys of a decoder's config.json that the shared body, attention and genai_config.json read.

    Derived here: `head_dim` (hidden_size / heads) and `num_key_value_heads` (the query heads)
    when config.json leaves them out, and `layer_types` (see `default_layer_types`)."""

    model_type: str = "llama"
    vocab_size: int = 32000
    hidden_size: int = 4096
    intermediate_size: int = 11008
    num_hidden_layers: int = 32
    num_attention_heads: int = 32
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    hidden_act: str = "silu"
    max_position_embeddings: int = 2048
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    rope_parameters: dict[str, Any] = field(default_factory=dict)
    attention_bias: bool = False
    sliding_window: int | None = None
    layer_types: list[str] | None = None
    bos_token_id: int | None = 1
    eos_token_id: int | list[int] | None = 2
    pad_token_id: int | None = None

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        if self.head_dim is None:
            set_(self, "head_dim", self.hidden_size // self.num_attention_heads)
        if self.num_key_value_heads is None:
            set_(self, "num_key_value_heads", self.num_attention_heads)
        if self.layer_types is None:
            set_(self, "layer_types", self.default_layer_types())
        if len(self.layer_types) != self.num_hidden_layers:
            raise ValueError(f"layer_types has {len(self.layer_types)} entries for {self.num_hidden_layers} layers")
        if self.sliding_window is None and "sliding_attention" in self.layer_types:
            # transformers' mask for them fails ("'NoneType' object cannot be interpreted as an integer")
            raise ValueError("layer_types has sliding_attention layers but sliding_window is null")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"num_attention_heads ({self.num_attention_heads}) is not a multiple of "
                             f"num_key_value_heads ({self.num_key_value_heads})")

    def default_layer_types(self) -> list[str]:
        """`layer_types` when config.json has none: every layer slides when there is a window
        (Mistral's rule); families with a pattern override this."""
        kind = "sliding_attention" if self.sliding_window is not None else "full_attention"
        return [kind] * self.num_hidden_layers

    def layer_state(self, layer: int) -> LayerState:
        """What the layer carries from step to step (builder.state): a KV cache of its KV heads,
        at the head size attention runs at, windowed as the layer is. Families with other layers
        (convolutions, recurrences, shared KV, none) say theirs."""
        kv = KV(self.num_key_value_heads, kv_head_size(self.head_dim), self.window(layer))
        return LayerState(kv=kv, kind=self.layer_types[layer])

    def window(self, layer: int) -> int | None:
        """The layer's sliding window, or None for a global layer (or a window the context never fills)."""
        if self.layer_types[layer] != "sliding_attention":
            return None
        return effective_window(self.sliding_window, self.max_position_embeddings)


__all__ = ["DecoderConfig"]
