"""Llama, Mistral, Qwen2 and Qwen3: one decoder, the variants as data.

Reference: transformers/models/llama/modeling_llama.py (and mistral, qwen2, qwen3). Differences:
Mistral has a sliding window; Qwen2 has q/k/v biases and optional sliding layers; Qwen3 has a
per-head RMSNorm on q and k. Each is a row of VARIANTS, not a class.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

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
from builder.graph import Graph
from builder.hf_config import effective_window, from_dict, rope_parameters
from builder.io import DecoderIO
from builder.target import Target

# Per architecture: transformers' config defaults where they differ from Llama's, and the
# structural facts its modeling file hard-codes.
VARIANTS: dict[str, dict[str, Any]] = {
    "LlamaForCausalLM": dict(model_type="llama"),
    "MistralForCausalLM": dict(
        model_type="mistral", intermediate_size=14336, num_key_value_heads=8,
        max_position_embeddings=4096 * 32, sliding_window=4096,
    ),
    "Qwen2ForCausalLM": dict(
        model_type="qwen2", vocab_size=151936, intermediate_size=22016, num_key_value_heads=32,
        max_position_embeddings=32768, bos_token_id=None, eos_token_id=None, qkv_bias=True,
        use_sliding_window=False, sliding_window=4096, max_window_layers=28,
    ),
    "Qwen3ForCausalLM": dict(
        model_type="qwen3", vocab_size=151936, intermediate_size=22016, num_key_value_heads=32,
        head_dim=128, max_position_embeddings=32768, bos_token_id=None, eos_token_id=None, qk_norm=True,
        use_sliding_window=False, sliding_window=4096, max_window_layers=28,
    ),
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

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        if self.head_dim is None:
            set_(self, "head_dim", self.hidden_size // self.num_attention_heads)
        if self.num_key_value_heads is None:
            set_(self, "num_key_value_heads", self.num_attention_heads)
        if self.use_sliding_window is False:
            set_(self, "sliding_window", None)
        if self.layer_types is None:
            # Mistral slides in every layer; Qwen2/3 from max_window_layers on.
            first_sliding = self.max_window_layers or 0
            set_(self, "layer_types", [
                "sliding_attention" if self.sliding_window is not None and i >= first_sliding else "full_attention"
                for i in range(self.num_hidden_layers)
            ])
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) is not a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )

    def window(self, layer: int) -> int | None:
        if self.layer_types[layer] != "sliding_attention":
            return None
        return effective_window(self.sliding_window, self.max_position_embeddings)


def parse_config(raw: dict[str, Any], architecture: str) -> LlamaConfig:
    defaults = VARIANTS[architecture]
    derived: dict[str, Any] = {}
    if architecture == "Qwen2ForCausalLM":
        derived["attention_bias"] = False  # Qwen2 hard-codes q/k/v biases and no o_proj bias
    elif raw.get("attention_bias"):
        derived["qkv_bias"] = True  # Llama/Qwen3: attention_bias covers q, k, v and o
    if architecture in ("LlamaForCausalLM",):
        derived["sliding_window"] = None  # not a Llama config key; transformers ignores it
    max_pos = raw.get("max_position_embeddings", defaults.get("max_position_embeddings", 2048))
    return from_dict(LlamaConfig, raw, defaults, rope_parameters=rope_parameters(raw, max_pos), **derived)


def info(c: LlamaConfig) -> DecoderInfo:
    return decoder_info(c, [c.window(i) for i in range(c.num_hidden_layers)])


def build(g: Graph, io: DecoderIO, ckpt: Checkpoint, c: LlamaConfig, target: Target):
    H, D, V, I = c.hidden_size, c.head_dim, c.vocab_size, c.intermediate_size
    q_dim, kv_dim = c.num_attention_heads * D, c.num_key_value_heads * D

    def w(name: str, *shape: int):
        return ckpt.weight(name, shape)

    def opt(name: str, *shape: int):
        return ckpt.weight(name, shape) if name in ckpt else None

    rope = Rope.from_parameters(c.rope_parameters, D, c.max_position_embeddings)
    rotary = rotary_tables(g, rope, c.max_position_embeddings, target)
    lengths = sequence_lengths(g, io.attention_mask)

    embed = w("model.embed_tokens.weight", V, H)
    head, tied = output_embedding(ckpt, embed, c.tie_word_embeddings, (V, H))
    shared = shared_vocabulary(g, head, target) if tied else None
    with g.scope("model", "embed_tokens"):
        x = embedding(g, io.input_ids, embed, target, shared=shared)

    def layer(i: int) -> DecoderLayer:
        a, m = f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp."
        return DecoderLayer(
            input_norm=w(f"model.layers.{i}.input_layernorm.weight", H),
            attention=AttentionWeights(
                q=w(a + "q_proj.weight", q_dim, H), k=w(a + "k_proj.weight", kv_dim, H),
                v=w(a + "v_proj.weight", kv_dim, H), o=w(a + "o_proj.weight", H, q_dim),
                q_bias=w(a + "q_proj.bias", q_dim) if c.qkv_bias else None,
                k_bias=w(a + "k_proj.bias", kv_dim) if c.qkv_bias else None,
                v_bias=w(a + "v_proj.bias", kv_dim) if c.qkv_bias else None,
                o_bias=w(a + "o_proj.bias", H) if c.attention_bias else None,
                q_norm=w(a + "q_norm.weight", D) if c.qk_norm else None,
                k_norm=w(a + "k_norm.weight", D) if c.qk_norm else None,
            ),
            spec=AttentionSpec(c.num_attention_heads, c.num_key_value_heads, D, window=c.window(i), norm_eps=c.rms_norm_eps),
            rotary=rotary,
            post_attention_norm=w(f"model.layers.{i}.post_attention_layernorm.weight", H),
            gate=w(m + "gate_proj.weight", I, H), up=w(m + "up_proj.weight", I, H), down=w(m + "down_proj.weight", H, I),
            activation=c.hidden_act,
            mlp_biases=(w(m + "gate_proj.bias", I), w(m + "up_proj.bias", I), w(m + "down_proj.bias", H)) if c.mlp_bias else None,
        )

    layers = (layer(i) for i in range(c.num_hidden_layers))
    h, presents = decoder_stack(g, x, layers, w("model.norm.weight", H), io, lengths, c.rms_norm_eps, target)
    return lm_head(g, h, head, target, shared=shared), presents

__all__ = ["IGNORED", "VARIANTS", "LlamaConfig", "build", "info", "parse_config"]
