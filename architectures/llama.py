"""Llama and the decoders that are its math with other data, each a row of VARIANTS and STRUCTURE.

Reference: transformers/models/<model_type>/modeling_*.py. Mistral: a sliding window; Qwen2: q/k/v
biases, optional sliding layers; Qwen3: per-head q/k RMSNorm; Seed-OSS: q/k/v biases apart from
o_proj's (`attention_out_bias`); ERNIE 4.5: `use_bias` on every projection, interleaved rotary
pairs. Ministral and Ministral 3 are rows of architectures/ministral.py on this decoder.
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
from builder.blocks.attention import attention_temperature
from builder.checkpoint import Checkpoint
from builder.errors import BuildError
from builder.graph import Graph
from builder.hf_config import effective_window, from_dict, rope_parameters
from builder.io import DecoderIO
from builder.target import Target

QWEN = dict(vocab_size=151936, intermediate_size=22016, num_key_value_heads=32, max_position_embeddings=32768,
            bos_token_id=None, eos_token_id=None, use_sliding_window=False, sliding_window=4096, max_window_layers=28)
# Per architecture: transformers' config defaults where they differ from Llama's, and the
# structural facts its modeling file hard-codes.
VARIANTS: dict[str, dict[str, Any]] = {
    "LlamaForCausalLM": dict(model_type="llama"),
    "MistralForCausalLM": dict(
        model_type="mistral", intermediate_size=14336, num_key_value_heads=8,
        max_position_embeddings=4096 * 32, sliding_window=4096,
    ),
    "Qwen2ForCausalLM": dict(model_type="qwen2", **QWEN),
    "Qwen3ForCausalLM": dict(model_type="qwen3", head_dim=128, **QWEN),
    "SeedOssForCausalLM": dict(
        model_type="seed_oss", vocab_size=155136, intermediate_size=27648, num_hidden_layers=64,
        num_attention_heads=80, num_key_value_heads=8, head_dim=128, max_position_embeddings=524288,
        pad_token_id=1, bos_token_id=0, eos_token_id=2, attention_bias=True, attention_out_bias=False,
    ),
    "Ernie4_5ForCausalLM": dict(
        model_type="ernie4_5", vocab_size=103424, hidden_size=1024, intermediate_size=3072, num_hidden_layers=18,
        num_attention_heads=16, num_key_value_heads=2, head_dim=128, max_position_embeddings=131072,
        rms_norm_eps=1e-5, pad_token_id=0, eos_token_id=2, tie_word_embeddings=True, default_theta=500_000.0,
    ),
}

# What each modeling file fixes whatever config.json says: Llama has no window (its config ignores
# `sliding_window`); Qwen2 has q/k/v biases and no o_proj bias; Qwen3 a per-head q/k RMSNorm.
STRUCTURE: dict[str, dict[str, Any]] = {
    "LlamaForCausalLM": dict(sliding_window=None),
    "Qwen2ForCausalLM": dict(qkv_bias=True, attention_bias=False),
    "Qwen3ForCausalLM": dict(qk_norm=True),
    # onnxruntime-genai 0.18 knows no "seed_oss": the same contract as Llama's (a plain decoder).
    "SeedOssForCausalLM": dict(model_type="llama"),
    "Ernie4_5ForCausalLM": dict(rotary_interleaved=True, attention_bias=False, mlp_bias=False),
}

# Older checkpoints saved the rotary buffer; it is recomputed from the config.
IGNORED = ("model.layers.*.self_attn.rotary_emb.inv_freq",)


@dataclass(frozen=True)
class LlamaConfig:
    """config.json of the Llama family; field names are the file's keys, defaults transformers' own."""

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
    attention_out_bias: bool | None = None  # Seed-OSS: o_proj's bias; None: attention_bias
    use_bias: bool = False  # ERNIE 4.5: biases on q, k, v, o and the MLP
    mlp_bias: bool = False
    sliding_window: int | None = None
    use_sliding_window: bool | None = None  # Qwen2/3: the window applies only when this is true
    max_window_layers: int | None = None  # Qwen2/3: layers from this index on slide
    layer_types: list[str] | None = None
    bos_token_id: int | None = 1
    eos_token_id: int | list[int] | None = 2
    pad_token_id: int | None = None
    # Structure the modeling file fixes per architecture (not config.json keys).
    qkv_bias: bool = False
    qk_norm: bool = False
    rotary_interleaved: bool = False
    llama_4_scaling: bool = False

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        if self.use_bias:
            set_(self, "attention_bias", True)
            set_(self, "mlp_bias", True)
        if self.attention_out_bias is None:
            set_(self, "attention_out_bias", self.attention_bias)
        if self.head_dim is None:
            set_(self, "head_dim", self.hidden_size // self.num_attention_heads)
        if self.num_key_value_heads is None:
            set_(self, "num_key_value_heads", self.num_attention_heads)
        if self.use_sliding_window is False:
            set_(self, "sliding_window", None)
        if self.attention_bias:
            set_(self, "qkv_bias", True)  # Llama/Qwen3: attention_bias covers q, k, v (and o)
        if self.layer_types is None:
            # Mistral slides in every layer; Qwen2/3 from max_window_layers on.
            first_sliding = self.max_window_layers or 0
            set_(self, "layer_types", [
                "sliding_attention" if self.sliding_window is not None and i >= first_sliding else "full_attention"
                for i in range(self.num_hidden_layers)
            ])
        temperature = ("llama_4_scaling_beta", "original_max_position_embeddings")
        if self.llama_4_scaling and any(self.rope_parameters.get(k) is None for k in temperature):
            raise ValueError(f"Ministral 3's attention temperature needs rope_parameters' {' and '.join(temperature)}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"num_attention_heads ({self.num_attention_heads}) is not a multiple of "
                             f"num_key_value_heads ({self.num_key_value_heads})")

    def window(self, layer: int) -> int | None:
        if self.layer_types[layer] != "sliding_attention":
            return None
        return effective_window(self.sliding_window, self.max_position_embeddings)


def parse_config(raw: dict[str, Any], architecture: str, variants: dict[str, dict[str, Any]] = VARIANTS,
                 structure: dict[str, dict[str, Any]] = STRUCTURE) -> LlamaConfig:
    """The config of `architecture`, a row of `variants` and `structure` (this module's, or those of
    a module that reuses this decoder with its own rows, as architectures/ministral.py does)."""
    defaults = dict(variants[architecture])
    theta = defaults.pop("default_theta", 10_000.0)  # the config class's default_theta
    if "rope_parameters" in defaults and not (raw.get("rope_scaling") or raw.get("rope_parameters")):
        raw = dict(raw, rope_parameters=defaults["rope_parameters"])
    max_pos = raw.get("max_position_embeddings", defaults.get("max_position_embeddings", 2048))
    rope = rope_parameters(raw, max_pos, theta)
    # These modeling files rotate the whole head: their default rotary ignores partial_rotary_factor,
    # and their scaled ones cannot run with it (cos/sin narrower than the head).
    if rope.pop("partial_rotary_factor", 1.0) != 1.0 and rope["rope_type"] != "default":
        raise BuildError(f"{architecture} with partial_rotary_factor and {rope['rope_type']} rope: transformers "
                         "rotates the whole head for these, and cannot run this combination")
    return from_dict(LlamaConfig, raw, defaults, rope_parameters=rope, **structure.get(architecture, {}))


def decoder_layer(g: Graph, stream: ResidualStream, w: Weights, c: LlamaConfig, i: int, past, lengths, rotary,
                  target: Target, q_scale=None):
    """LlamaDecoderLayer.forward: x + attn(norm(x)), then x + mlp(norm(x)); returns the layer's KV."""
    H, D, I = c.hidden_size, c.head_dim, c.intermediate_size
    with g.scope("input_layernorm"):
        h = stream.norm(w("input_layernorm.weight", H))
    a = w.under("self_attn.")
    attention = attention_weights(a, c, c.qkv_bias, c.attention_out_bias, a if c.qk_norm else None)
    spec = AttentionSpec(c.num_attention_heads, c.num_key_value_heads, D, window=c.window(i), norm_eps=c.rms_norm_eps,
                         rotary_interleaved=c.rotary_interleaved)
    with g.scope("self_attn"):
        h, key, value = self_attention(g, h, past, lengths, rotary, attention, spec, target, q_scale)
    stream.add(h)
    with g.scope("post_attention_layernorm"):
        h = stream.norm(w("post_attention_layernorm.weight", H))
    m = w.under("mlp.")
    biases = (m("gate_proj.bias", I), m("up_proj.bias", I), m("down_proj.bias", H)) if c.mlp_bias else None
    with g.scope("mlp"):
        stream.add(gated_mlp(g, h, m("gate_proj.weight", I, H), m("up_proj.weight", I, H), m("down_proj.weight", H, I),
                             c.hidden_act, target, biases))
    return key, value


def build(g: Graph, io: DecoderIO, ckpt: Checkpoint, c: LlamaConfig, target: Target):
    rope = Rope.from_parameters(c.rope_parameters, c.head_dim, c.max_position_embeddings)
    rotary = rotary_tables(g, rope, c.max_position_embeddings, target)
    lengths = sequence_lengths(g, io.attention_mask)
    p = c.rope_parameters  # Ministral 3: each query times its position's temperature
    q_scale = attention_temperature(g, io.input_ids, lengths, p["llama_4_scaling_beta"],
                                    p["original_max_position_embeddings"], target) if c.llama_4_scaling else None
    vocab = vocabulary(g, ckpt, target, (c.vocab_size, c.hidden_size), c.tie_word_embeddings)
    stream = ResidualStream(g, vocab.embed(g, io.input_ids), c.rms_norm_eps, target)
    presents = decoder_layers(g, ckpt, c.num_hidden_layers, lambda i, w: decoder_layer(
        g, stream, w, c, i, io.past[i], lengths, rotary, target, q_scale))
    with g.scope("model", "norm"):
        h = stream.norm(ckpt.weight("model.norm.weight", (c.hidden_size,)))
    return vocab.logits(g, h), presents


__all__ = ["IGNORED", "STRUCTURE", "VARIANTS", "LlamaConfig", "build", "decoder_layer", "parse_config"]
