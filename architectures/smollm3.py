"""SmolLM3 (SmolLM3ForCausalLM): Llama's decoder with layers that skip the rotary embedding.

Reference: transformers/models/smollm3/modeling_smollm3.py. Apart from Llama:
- `no_rope_layers[i]` (1: rotate, 0: not; by default every `no_rope_layer_interval`-th layer does
  not) — those layers' GroupQueryAttention runs without rotary (NoPE);
- `layer_types` slide only where `use_sliding_window` is set, and only on no-rope layers, unless
  config.json lists them; the sliding layers' mask uses `sliding_window`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from builder.architecture import Weights, attention_weights, decoder_layers, vocabulary
from builder.blocks import (
    AttentionSpec,
    ResidualStream,
    Rope,
    gated_mlp,
    rotary_tables,
    self_attention,
    sequence_lengths,
)
from builder.checkpoint import Checkpoint
from builder.graph import Graph
from builder.hf_config import effective_window, from_dict, rope_parameters
from builder.io import DecoderIO
from builder.target import Target

VARIANTS: dict[str, dict[str, Any]] = {"SmolLM3ForCausalLM": {}}

IGNORED = ("model.layers.*.self_attn.rotary_emb.inv_freq",)

DEFAULT_THETA = 2_000_000.0  # SmolLM3Config.default_theta


@dataclass(frozen=True)
class SmolLM3Config:
    """config.json of SmolLM3ForCausalLM; field names are the file's keys, defaults transformers' own."""

    model_type: str = "smollm3"
    vocab_size: int = 128256
    hidden_size: int = 2048
    intermediate_size: int = 11008
    num_hidden_layers: int = 36
    num_attention_heads: int = 16
    num_key_value_heads: int | None = 4
    head_dim: int | None = None  # not a SmolLM3Config field, but read when config.json has it
    hidden_act: str = "silu"
    max_position_embeddings: int = 32768
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = True
    rope_parameters: dict[str, Any] = field(default_factory=dict)
    use_sliding_window: bool = False
    sliding_window: int | None = None
    no_rope_layers: list[int] | None = None
    no_rope_layer_interval: int = 4
    layer_types: list[str] | None = None
    attention_bias: bool = False
    mlp_bias: bool = False
    bos_token_id: int | None = 128000
    eos_token_id: int | list[int] | None = 128001
    pad_token_id: int | None = 128004

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        if self.num_key_value_heads is None:
            set_(self, "num_key_value_heads", self.num_attention_heads)
        if self.head_dim is None:
            set_(self, "head_dim", self.hidden_size // self.num_attention_heads)
        if self.no_rope_layers is None:
            set_(self, "no_rope_layers", [int((i + 1) % self.no_rope_layer_interval != 0)
                                          for i in range(self.num_hidden_layers)])
        if self.layer_types is None:
            slides = self.use_sliding_window and self.sliding_window is not None
            set_(self, "layer_types", ["sliding_attention" if slides and not rope else "full_attention"
                                       for rope in self.no_rope_layers])
        for name in ("no_rope_layers", "layer_types"):
            if len(getattr(self, name)) < self.num_hidden_layers:
                raise ValueError(f"{name} has {len(getattr(self, name))} entries for {self.num_hidden_layers} layers")

    def window(self, layer: int) -> int | None:
        if self.layer_types[layer] != "sliding_attention":
            return None
        return effective_window(self.sliding_window, self.max_position_embeddings)

    def rotates(self, layer: int) -> bool:
        return bool(self.no_rope_layers[layer])


def parse_config(raw: dict[str, Any], architecture: str) -> SmolLM3Config:
    max_pos = raw.get("max_position_embeddings", 32768)
    params = rope_parameters(raw, max_pos, DEFAULT_THETA)
    return from_dict(SmolLM3Config, raw, VARIANTS[architecture], rope_parameters=params)


def decoder_layer(g: Graph, stream: ResidualStream, w: Weights, c: SmolLM3Config, i: int, past, lengths, rotary,
                  target: Target):
    """SmolLM3DecoderLayer.forward: Llama's pre-norm layer; `rotary` is None on no-rope layers."""
    H, D, I = c.hidden_size, c.head_dim, c.intermediate_size
    with g.scope("input_layernorm"):
        h = stream.norm(w("input_layernorm.weight", H))
    a = w.under("self_attn.")
    attention = attention_weights(a, c, c.attention_bias, c.attention_bias)
    spec = AttentionSpec(c.num_attention_heads, c.num_key_value_heads, D, window=c.window(i))
    with g.scope("self_attn"):
        h, key, value = self_attention(g, h, past, lengths, rotary, attention, spec, target)
    stream.add(h)
    with g.scope("post_attention_layernorm"):
        h = stream.norm(w("post_attention_layernorm.weight", H))
    m = w.under("mlp.")
    biases = (m("gate_proj.bias", I), m("up_proj.bias", I), m("down_proj.bias", H)) if c.mlp_bias else None
    with g.scope("mlp"):
        stream.add(gated_mlp(g, h, m("gate_proj.weight", I, H), m("up_proj.weight", I, H), m("down_proj.weight", H, I),
                             c.hidden_act, target, biases))
    return key, value


def build(g: Graph, io: DecoderIO, ckpt: Checkpoint, c: SmolLM3Config, target: Target):
    rotary = None
    if any(c.rotates(i) for i in range(c.num_hidden_layers)):
        rope = Rope.from_parameters(c.rope_parameters, c.head_dim, c.max_position_embeddings)
        rotary = rotary_tables(g, rope, c.max_position_embeddings, target)
    lengths = sequence_lengths(g, io.attention_mask)
    vocab = vocabulary(g, ckpt, target, (c.vocab_size, c.hidden_size), c.tie_word_embeddings)
    stream = ResidualStream(g, vocab.embed(g, io.input_ids), c.rms_norm_eps, target)
    presents = decoder_layers(g, ckpt, c.num_hidden_layers, lambda i, w: decoder_layer(
        g, stream, w, c, i, io.past[i], lengths, rotary if c.rotates(i) else None, target))
    with g.scope("model", "norm"):
        h = stream.norm(ckpt.weight("model.norm.weight", (c.hidden_size,)))
    return vocab.logits(g, h), presents


__all__ = ["IGNORED", "VARIANTS", "SmolLM3Config", "build", "decoder_layer", "parse_config"]
