"""GLM-4 (GlmForCausalLM: glm-4-9b-chat-hf) and GLM-4-0414 (Glm4ForCausalLM: GLM-4-9B/32B-0414).

Reference: transformers/models/glm/modeling_glm.py and glm4/modeling_glm4.py. Apart from Llama:
q/k/v biases (`attention_bias`, o_proj never has one); `gate_up_proj` holds gate then up (split
lazily here); partial rotary (`partial_rotary_factor`, 0.5 unless given) on the first dims of
each head, in interleaved pairs (x0, x1), (x2, x3), … — apply_rotary_pos_emb repeats each
frequency twice and rotates with rotate_every_two. Glm4: sandwich norms, each branch normalized
(post_self_attn_layernorm, post_mlp_layernorm) before it joins the residual.
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
from builder.hf_config import from_dict, rope_parameters
from builder.io import DecoderIO
from builder.target import Target

VARIANTS: dict[str, dict[str, Any]] = {
    "GlmForCausalLM": dict(model_type="glm"),
    "Glm4ForCausalLM": dict(model_type="glm4"),
}

# What each modeling file fixes. onnxruntime-genai names the GLM family "chatglm" (its decoder
# contract is Llama's: same inputs, outputs and KV cache layout); it knows neither glm nor glm4.
STRUCTURE: dict[str, dict[str, Any]] = {
    "GlmForCausalLM": dict(model_type="chatglm", sandwich_norms=False),
    "Glm4ForCausalLM": dict(model_type="chatglm", sandwich_norms=True),
}

IGNORED = ("model.layers.*.self_attn.rotary_emb.inv_freq",)


@dataclass(frozen=True)
class GlmConfig:
    """config.json of Glm and Glm4 (the same keys and defaults); names are the file's keys."""

    model_type: str = "glm"
    vocab_size: int = 151552
    hidden_size: int = 4096
    intermediate_size: int = 13696
    num_hidden_layers: int = 40
    num_attention_heads: int = 32
    num_key_value_heads: int = 2
    head_dim: int | None = 128
    hidden_act: str = "silu"
    max_position_embeddings: int = 131072
    rms_norm_eps: float = 0.00000015625
    tie_word_embeddings: bool = False
    rope_parameters: dict[str, Any] = field(default_factory=dict)
    pad_token_id: int | None = 151329
    eos_token_id: int | list[int] | None = None
    bos_token_id: int | None = None
    attention_bias: bool = True
    # Structure the modeling files fix per architecture (not a config.json key).
    sandwich_norms: bool = False

    def __post_init__(self) -> None:
        if self.head_dim is None:
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)
        if self.eos_token_id is None:  # GlmConfig.__post_init__
            object.__setattr__(self, "eos_token_id", [151329, 151336, 151338])

    def window(self, layer: int) -> int | None:
        return None


def parse_config(raw: dict[str, Any], architecture: str) -> GlmConfig:
    params = rope_parameters(raw, raw.get("max_position_embeddings", 131072))
    params.setdefault("partial_rotary_factor", 0.5)  # GlmConfig's default "for BC"
    return from_dict(GlmConfig, raw, VARIANTS[architecture], rope_parameters=params, **STRUCTURE[architecture])


def post_norm(g: Graph, stream: ResidualStream, h, w: Weights, name: str, c: GlmConfig) -> None:
    """residual + h, or with Glm4's sandwich norms residual + name(h)."""
    if not c.sandwich_norms:
        stream.add(h)
        return
    with g.scope(name):
        stream.add(h, w(f"{name}.weight", c.hidden_size))


def decoder_layer(g: Graph, stream: ResidualStream, w: Weights, c: GlmConfig, i: int, past, lengths, rotary,
                  target: Target):
    """GlmDecoderLayer / Glm4DecoderLayer.forward; Glm4 normalizes each branch before the residual add."""
    H, D, I = c.hidden_size, c.head_dim, c.intermediate_size
    with g.scope("input_layernorm"):
        h = stream.norm(w("input_layernorm.weight", H))
    attention = attention_weights(w.under("self_attn."), c, c.attention_bias, o_bias=False)
    spec = AttentionSpec(c.num_attention_heads, c.num_key_value_heads, D, rotary_interleaved=True)
    with g.scope("self_attn"):
        h, key, value = self_attention(g, h, past, lengths, rotary, attention, spec, target)
    post_norm(g, stream, h, w, "post_self_attn_layernorm", c)
    with g.scope("post_attention_layernorm"):
        h = stream.norm(w("post_attention_layernorm.weight", H))
    gate_up = w("mlp.gate_up_proj.weight", 2 * I, H)  # gate rows, then up rows (GlmMLP: chunk(2))
    with g.scope("mlp"):
        h = gated_mlp(g, h, gate_up.slice(0, 0, I), gate_up.slice(0, I, 2 * I), w("mlp.down_proj.weight", H, I),
                      c.hidden_act, target)
    post_norm(g, stream, h, w, "post_mlp_layernorm", c)
    return key, value


def build(g: Graph, io: DecoderIO, ckpt: Checkpoint, c: GlmConfig, target: Target):
    rope = Rope.from_parameters(c.rope_parameters, c.head_dim, c.max_position_embeddings)
    rotary = rotary_tables(g, rope, c.max_position_embeddings, target)
    return rms_norm_decoder(g, io, ckpt, c, target, decoder_layer, rotary)


__all__ = ["IGNORED", "STRUCTURE", "VARIANTS", "GlmConfig", "build", "decoder_layer", "parse_config"]
