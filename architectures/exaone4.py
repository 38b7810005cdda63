"""EXAONE 4.0 (Exaone4ForCausalLM).

Reference: transformers/models/exaone4/modeling_exaone4.py. Apart from Llama:
- post-norms as OLMo 2's: x = x + norm(attn(x)); x = x + norm(mlp(x)), no norm before either;
- a per-head q/k RMSNorm (as Qwen3's);
- sliding-window layers by `layer_types` (or every `sliding_window_pattern`-th layer global);
  when the config has a sliding window, its global layers have no rotary embedding at all.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from builder.architecture import Weights, attention_weights, rms_norm_decoder
from builder.blocks import (
    AttentionSpec,
    ResidualStream,
    Rope,
    gated_mlp,
    rotary_tables,
    self_attention,
)
from builder.checkpoint import Checkpoint
from builder.graph import Graph
from builder.hf_config import effective_window, from_dict, rope_parameters
from builder.io import DecoderIO
from builder.target import Target

# onnxruntime-genai 0.18 does not know "exaone4"; "decoder" is its plain decoder-only model type,
# whose contract (input_ids, attention_mask, past/present KV, logits) this graph has.
VARIANTS: dict[str, dict[str, Any]] = {"Exaone4ForCausalLM": {}}
STRUCTURE: dict[str, dict[str, Any]] = {"Exaone4ForCausalLM": dict(model_type="decoder")}

IGNORED = ("model.layers.*.self_attn.rotary_emb.inv_freq",)


@dataclass(frozen=True)
class Exaone4Config:
    """config.json of Exaone4ForCausalLM; field names are the file's keys, defaults transformers' own."""

    model_type: str = "exaone4"
    vocab_size: int = 102400
    hidden_size: int = 4096
    intermediate_size: int = 16384
    num_hidden_layers: int = 32
    num_attention_heads: int = 32
    num_key_value_heads: int = 32
    head_dim: int | None = None
    hidden_act: str = "silu"
    max_position_embeddings: int = 2048
    rms_norm_eps: float = 1e-5
    tie_word_embeddings: bool = False
    rope_parameters: dict[str, Any] = field(default_factory=dict)
    sliding_window: int | None = 4096
    sliding_window_pattern: int | str | None = 4
    layer_types: list[str] | None = None
    bos_token_id: int | None = 0
    eos_token_id: int | list[int] | None = 2
    pad_token_id: int | None = None

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        if self.head_dim is None:
            set_(self, "head_dim", self.hidden_size // self.num_attention_heads)
        if self.layer_types is None:
            # Exaone4Config derives them from an integer pattern only: a string one ("LLLG") or
            # none (no sliding window) needs `layer_types`, there as here.
            if self.sliding_window is None or not isinstance(self.sliding_window_pattern, int):
                raise ValueError(f"layer_types is required with sliding_window={self.sliding_window!r} and "
                                 f"sliding_window_pattern={self.sliding_window_pattern!r}")
            set_(self, "layer_types", [
                "sliding_attention" if (i + 1) % self.sliding_window_pattern else "full_attention"
                for i in range(self.num_hidden_layers)
            ])
        if len(self.layer_types) != self.num_hidden_layers:
            raise ValueError(f"layer_types has {len(self.layer_types)} entries for {self.num_hidden_layers} layers")

    def window(self, layer: int) -> int | None:
        if self.layer_types[layer] != "sliding_attention":
            return None
        return effective_window(self.sliding_window, self.max_position_embeddings)

    def rotates(self, layer: int) -> bool:
        """Exaone4Attention: rotary everywhere without a sliding window, else on sliding layers only."""
        return self.sliding_window is None or self.layer_types[layer] == "sliding_attention"


def parse_config(raw: dict[str, Any], architecture: str) -> Exaone4Config:
    rope = rope_parameters(raw, raw.get("max_position_embeddings", 2048))
    return from_dict(Exaone4Config, raw, VARIANTS[architecture], rope_parameters=rope, **STRUCTURE[architecture])


def decoder_layer(g: Graph, stream: ResidualStream, w: Weights, c: Exaone4Config, i: int, past, lengths, rotary,
                  target: Target):
    """Exaone4DecoderLayer.forward: x + norm(attn(x)), then x + norm(mlp(x)); returns the layer's KV."""
    H, I = c.hidden_size, c.intermediate_size
    h = stream.value()
    a = w.under("self_attn.")
    attention = attention_weights(a, c, qk_norm=a)
    spec = AttentionSpec(c.num_attention_heads, c.num_key_value_heads, c.head_dim, window=c.window(i),
                         norm_eps=c.rms_norm_eps)
    with g.scope("self_attn"):
        h, key, value = self_attention(g, h, past, lengths, rotary if c.rotates(i) else None, attention, spec, target)
    with g.scope("post_attention_layernorm"):
        stream.add(h, w("post_attention_layernorm.weight", H))
    h = stream.value()
    m = w.under("mlp.")
    with g.scope("mlp"):
        h = gated_mlp(g, h, m("gate_proj.weight", I, H), m("up_proj.weight", I, H), m("down_proj.weight", H, I),
                      c.hidden_act, target)
    with g.scope("post_feedforward_layernorm"):
        stream.add(h, w("post_feedforward_layernorm.weight", H))
    return key, value


def build(g: Graph, io: DecoderIO, ckpt: Checkpoint, c: Exaone4Config, target: Target):
    rope = Rope.from_parameters(c.rope_parameters, c.head_dim, c.max_position_embeddings)
    rotary = rotary_tables(g, rope, c.max_position_embeddings, target)
    return rms_norm_decoder(g, io, ckpt, c, target, decoder_layer, rotary)


__all__ = ["IGNORED", "STRUCTURE", "VARIANTS", "Exaone4Config", "build", "decoder_layer", "parse_config"]
