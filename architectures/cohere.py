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
from builder.io import DecoderIO, logits_dtype
from builder.target import Target

# transformers' config defaults where Cohere 2 differs from Cohere.
VARIANTS: dict[str, dict[str, Any]] = {
    "CohereForCausalLM": dict(model_type="cohere"),
    "Cohere2ForCausalLM": dict(model_type="cohere2", sliding_window=4096),
}

# What each modeling file fixes: Cohere has no sliding layers and rotates everywhere; Cohere 2
# rotates only its sliding layers and has no q/k norm. onnxruntime-genai 0.18 knows neither
# model type; its decoder contract is Llama's (same inputs, outputs and KV cache layout).
STRUCTURE: dict[str, dict[str, Any]] = {
    "CohereForCausalLM": dict(model_type="llama", sliding_window=None, global_rope=True),
    "Cohere2ForCausalLM": dict(model_type="llama", use_qk_norm=False, global_rope=False),
}

# CohereConfig.default_theta and Cohere2Config's (PreTrainedConfig's): rope_theta when config.json has none.
DEFAULT_THETA = {"CohereForCausalLM": 500_000.0, "Cohere2ForCausalLM": 10_000.0}

IGNORED = ("model.layers.*.self_attn.rotary_emb.inv_freq",)


@dataclass(frozen=True)
class CohereConfig:
    """config.json of Cohere and Cohere 2; field names are the file's keys, defaults transformers' own."""

    model_type: str = "cohere"
    vocab_size: int = 256000
    hidden_size: int = 8192
    intermediate_size: int = 22528
    logit_scale: float | None = 0.0625
    num_hidden_layers: int = 40
    num_attention_heads: int = 64
    num_key_value_heads: int | None = None
    head_dim: int | None = None  # not a CohereConfig field, but read when config.json has it
    hidden_act: str = "silu"
    max_position_embeddings: int = 8192
    layer_norm_eps: float = 1e-5
    pad_token_id: int | None = 0
    bos_token_id: int | None = 5
    eos_token_id: int | list[int] | None = 255001
    tie_word_embeddings: bool = True
    rope_parameters: dict[str, Any] = field(default_factory=dict)
    attention_bias: bool = False
    use_qk_norm: bool = False  # Cohere only
    sliding_window: int | None = None  # Cohere 2
    sliding_window_pattern: int = 4  # Cohere 2's older key: every pattern-th layer is global
    layer_types: list[str] | None = None  # Cohere 2
    # Structure the modeling files fix per architecture (not config.json keys).
    global_rope: bool = True

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        if self.num_key_value_heads is None:
            set_(self, "num_key_value_heads", self.num_attention_heads)
        if self.head_dim is None:
            set_(self, "head_dim", self.hidden_size // self.num_attention_heads)
        if self.layer_types is None:
            set_(self, "layer_types", [
                "sliding_attention" if self.sliding_window is not None and (i + 1) % self.sliding_window_pattern
                else "full_attention"
                for i in range(self.num_hidden_layers)
            ])
        if len(self.layer_types) != self.num_hidden_layers:
            raise ValueError(f"layer_types has {len(self.layer_types)} entries for {self.num_hidden_layers} layers")

    def sliding(self, layer: int) -> bool:
        return self.sliding_window is not None and self.layer_types[layer] == "sliding_attention"

    def window(self, layer: int) -> int | None:
        return effective_window(self.sliding_window, self.max_position_embeddings) if self.sliding(layer) else None

    def rotates(self, layer: int) -> bool:
        """Cohere2Attention applies rotary only where it has a sliding window."""
        return self.global_rope or self.sliding(layer)


def parse_config(raw: dict[str, Any], architecture: str) -> CohereConfig:
    defaults = VARIANTS[architecture]
    params = rope_parameters(raw, raw.get("max_position_embeddings", 8192), DEFAULT_THETA[architecture])
    if params["rope_type"] == "default":  # Cohere's default rotary ignores partial_rotary_factor
        params.pop("partial_rotary_factor", None)
    return from_dict(CohereConfig, raw, defaults, rope_parameters=params, **STRUCTURE[architecture])


def decoder_layer(g: Graph, stream: ResidualStream, w: Weights, c: CohereConfig, i: int, past, lengths, rotary,
                  target: Target):
    """CohereDecoderLayer / Cohere2DecoderLayer.forward: x + attn(h) + mlp(h), h = input_layernorm(x)."""
    H, D, I = c.hidden_size, c.head_dim, c.intermediate_size
    with g.scope("input_layernorm"):
        h = stream.norm(w("input_layernorm.weight", H))
    a = w.under("self_attn.")
    attention = attention_weights(a, c, c.attention_bias, c.attention_bias)
    if c.use_qk_norm:  # CohereLayerNorm((heads, head_dim)): one weight row per head
        attention = dataclasses.replace(attention, q_norm=a("q_norm.weight", c.num_attention_heads, D),
                                        k_norm=a("k_norm.weight", c.num_key_value_heads, D))
    spec = AttentionSpec(c.num_attention_heads, c.num_key_value_heads, D, window=c.window(i),
                         norm_eps=c.layer_norm_eps, rotary_interleaved=True, qk_layer_norm=True)
    with g.scope("self_attn"):
        attn, key, value = self_attention(g, h, past, lengths, rotary if c.rotates(i) else None, attention, spec,
                                          target)
    m = w.under("mlp.")
    with g.scope("mlp"):
        mlp = gated_mlp(g, h, m("gate_proj.weight", I, H), m("up_proj.weight", I, H), m("down_proj.weight", H, I),
                        c.hidden_act, target)
    stream.add(attn)
    stream.add(mlp)
    return key, value


def build(g: Graph, io: DecoderIO, ckpt: Checkpoint, c: CohereConfig, target: Target):
    rope = Rope.from_parameters(c.rope_parameters, c.head_dim, c.max_position_embeddings)
    rotary = rotary_tables(g, rope, c.max_position_embeddings, target)
    lengths = sequence_lengths(g, io.attention_mask)
    vocab = vocabulary(g, ckpt, target, (c.vocab_size, c.hidden_size), c.tie_word_embeddings)
    stream = ResidualStream(g, vocab.embed(g, io.input_ids), c.layer_norm_eps, target, layer_norm=True)
    presents = decoder_layers(g, ckpt, c.num_hidden_layers,
                              lambda i, w: decoder_layer(g, stream, w, c, i, io.past[i], lengths, rotary, target))
    with g.scope("model", "norm"):
        h = stream.norm(ckpt.weight("model.norm.weight", (c.hidden_size,)))
    logits = vocab.logits(g, h)
    if c.logit_scale is not None and c.logit_scale != 1.0:  # CohereForCausalLM: logits * logit_scale
        with g.scope("lm_head", "logit_scale"):
            logits = g.op.Mul(logits, g.constant(c.logit_scale, logits_dtype(target.io_dtype)))
    return logits, presents


__all__ = ["IGNORED", "STRUCTURE", "VARIANTS", "CohereConfig", "build", "decoder_layer", "parse_config"]
