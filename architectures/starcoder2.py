"""StarCoder2 (Starcoder2ForCausalLM): starcoder2-3b, -7b and -15b.

Reference: transformers/models/starcoder2/modeling_starcoder2.py. Apart from Llama: LayerNorms
with bias (`norm_epsilon`); a plain MLP, c_fc -> gelu_pytorch_tanh -> c_proj; biases on every
projection when `use_bias` (the default); a sliding window over every layer when `sliding_window`
is set; tied embeddings by default.

onnxruntime-genai 0.18 knows no "starcoder2" model type; its "llama" one runs the same contract
(input_ids, attention_mask, per-layer KV in and out, logits), so genai_config says "llama".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from builder.architecture import Weights, attention_weights, decoder_layers, vocabulary
from builder.blocks import (
    AttentionSpec,
    ResidualStream,
    Rope,
    plain_mlp,
    rotary_tables,
    self_attention,
    sequence_lengths,
)
from builder.checkpoint import Checkpoint
from builder.graph import Graph
from builder.hf_config import effective_window, from_dict, rope_parameters
from builder.io import DecoderIO
from builder.target import Target

VARIANTS: dict[str, dict[str, Any]] = {"Starcoder2ForCausalLM": {}}

# onnxruntime-genai's model type for the same decoder contract (see the module docstring).
STRUCTURE: dict[str, dict[str, Any]] = {"Starcoder2ForCausalLM": dict(model_type="llama")}

IGNORED: tuple[str, ...] = ()


@dataclass(frozen=True)
class Starcoder2Config:
    """config.json of Starcoder2ForCausalLM; field names are the file's keys, defaults transformers' own."""

    model_type: str = "starcoder2"
    vocab_size: int = 49152
    hidden_size: int = 3072
    intermediate_size: int = 12288
    num_hidden_layers: int = 30
    num_attention_heads: int = 24
    num_key_value_heads: int = 2
    head_dim: int | None = None  # not a Starcoder2Config field, but its attention reads it when given
    hidden_act: str = "gelu_pytorch_tanh"
    max_position_embeddings: int = 4096
    norm_epsilon: float = 1e-5
    tie_word_embeddings: bool = True
    rope_parameters: dict[str, Any] = field(default_factory=dict)
    sliding_window: int | None = None
    use_bias: bool = True
    bos_token_id: int | None = 50256
    eos_token_id: int | list[int] | None = 50256
    pad_token_id: int | None = None

    def __post_init__(self) -> None:
        if self.head_dim is None:
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)

    def window(self, layer: int) -> int | None:
        return effective_window(self.sliding_window, self.max_position_embeddings)


def parse_config(raw: dict[str, Any], architecture: str) -> Starcoder2Config:
    params = rope_parameters(raw, raw.get("max_position_embeddings", 4096))
    return from_dict(Starcoder2Config, raw, VARIANTS[architecture], rope_parameters=params, **STRUCTURE[architecture])


def decoder_layer(g: Graph, stream: ResidualStream, w: Weights, c: Starcoder2Config, i: int, past, lengths, rotary,
                  target: Target):
    """Starcoder2DecoderLayer.forward: x + attn(ln1(x)), then x + mlp(ln2(x)); returns the layer's KV."""
    H, I = c.hidden_size, c.intermediate_size
    with g.scope("input_layernorm"):
        h = stream.norm(w("input_layernorm.weight", H), w("input_layernorm.bias", H))
    attention = attention_weights(w.under("self_attn."), c, c.use_bias, c.use_bias)
    spec = AttentionSpec(c.num_attention_heads, c.num_key_value_heads, c.head_dim, window=c.window(i))
    with g.scope("self_attn"):
        h, key, value = self_attention(g, h, past, lengths, rotary, attention, spec, target)
    stream.add(h)
    with g.scope("post_attention_layernorm"):
        h = stream.norm(w("post_attention_layernorm.weight", H), w("post_attention_layernorm.bias", H))
    m = w.under("mlp.")
    biases = (m("c_fc.bias", I), m("c_proj.bias", H)) if c.use_bias else (None, None)
    with g.scope("mlp"):
        stream.add(plain_mlp(g, h, m("c_fc.weight", I, H), m("c_proj.weight", H, I), c.hidden_act, target, biases,
                             names=("c_fc", "c_proj")))
    return key, value


def build(g: Graph, io: DecoderIO, ckpt: Checkpoint, c: Starcoder2Config, target: Target):
    H = c.hidden_size
    rope = Rope.from_parameters(c.rope_parameters, c.head_dim, c.max_position_embeddings)
    rotary = rotary_tables(g, rope, c.max_position_embeddings, target)
    lengths = sequence_lengths(g, io.attention_mask)
    vocab = vocabulary(g, ckpt, target, (c.vocab_size, H), c.tie_word_embeddings)
    stream = ResidualStream(g, vocab.embed(g, io.input_ids), c.norm_epsilon, target, layer_norm=True)
    presents = decoder_layers(g, ckpt, c.num_hidden_layers,
                              lambda i, w: decoder_layer(g, stream, w, c, i, io.past[i], lengths, rotary, target))
    with g.scope("model", "norm"):
        h = stream.norm(ckpt.weight("model.norm.weight", (H,)), ckpt.weight("model.norm.bias", (H,)))
    return vocab.logits(g, h), presents


__all__ = ["IGNORED", "STRUCTURE", "VARIANTS", "Starcoder2Config", "build", "decoder_layer", "parse_config"]
