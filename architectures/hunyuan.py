"""HunYuan dense (HunYuanDenseV1ForCausalLM: Hunyuan-0.5B/1.8B/4B/7B, Hy-MT).

Reference: transformers/models/hunyuan_v1_dense/modeling_hunyuan_v1_dense.py. A Llama-shaped
decoder, apart from:
- the per-head RMSNorm of q and k (`query_layernorm`, `key_layernorm`) comes AFTER the rotary
  embedding, which GroupQueryAttention's fused rotary cannot do: q and k are rotated explicitly
  (rotary_tables(explicit=True)), normalized, and attention runs with do_rotary=0;
- the checkpoints' rope_scaling `{"type": "dynamic", "alpha": 1000}` is not dynamic NTK but a
  fixed stretch of the base (HunYuanDenseV1RotaryEmbedding's "ntk_alpha"):
  theta · alpha^(head_dim / (head_dim − 2)), the same at every length;
- the rotary embedding always spans the whole head (its default and alpha rotaries ignore
  partial_rotary_factor).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
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
from builder.blocks.rope import default_inv_freq
from builder.checkpoint import Checkpoint
from builder.graph import Graph
from builder.hf_config import from_dict, rope_parameters
from builder.io import DecoderIO
from builder.target import Target

VARIANTS: dict[str, dict[str, Any]] = {"HunYuanDenseV1ForCausalLM": {}}

# onnxruntime-genai names this model type after the architecture, not config.json's model_type.
GENAI_MODEL_TYPE = "hunyuandensev1"

IGNORED = ("model.layers.*.self_attn.rotary_emb.inv_freq",)


@dataclass(frozen=True)
class HunYuanDenseConfig:
    """config.json of HunYuanDenseV1ForCausalLM; field names are the file's keys, defaults
    transformers' own (HunYuanDenseV1Config). Keys the dense modeling file never reads
    (use_qk_norm: the norms are always there; use_cla, mlp_bias) are not kept."""

    model_type: str = GENAI_MODEL_TYPE
    vocab_size: int = 290943
    hidden_size: int = 4096
    intermediate_size: int = 11008
    num_hidden_layers: int = 32
    num_attention_heads: int = 32
    num_key_value_heads: int | None = None
    head_dim: int | None = None  # transformers needs it given; hidden_size // heads as everywhere else
    hidden_act: str = "silu"
    max_position_embeddings: int = 2048
    rms_norm_eps: float = 1e-5
    tie_word_embeddings: bool = False
    rope_parameters: dict[str, Any] = field(default_factory=dict)
    attention_bias: bool = False
    bos_token_id: int | None = 1
    eos_token_id: int | list[int] | None = 2
    pad_token_id: int | None = 0

    def __post_init__(self) -> None:
        if self.head_dim is None:
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)
        if self.num_key_value_heads is None:
            object.__setattr__(self, "num_key_value_heads", self.num_attention_heads)

    def window(self, layer: int) -> int | None:
        return None

    def rope(self) -> Rope:
        """HunYuanDenseV1RotaryEmbedding: "dynamic" with an alpha is its fixed NTK-alpha base."""
        params = {k: v for k, v in self.rope_parameters.items() if k != "partial_rotary_factor"}
        D = self.head_dim
        if params["rope_type"] == "dynamic" and params.get("alpha"):
            base = params["rope_theta"] * params["alpha"] ** (D / (D - 2))
            return Rope(default_inv_freq(base, D))
        return Rope.from_parameters(params, D, self.max_position_embeddings)


def parse_config(raw: dict[str, Any], architecture: str) -> HunYuanDenseConfig:
    params = rope_parameters(raw, raw.get("max_position_embeddings", 2048))
    return from_dict(HunYuanDenseConfig, raw, rope_parameters=params, model_type=GENAI_MODEL_TYPE)


def decoder_layer(g: Graph, stream: ResidualStream, w: Weights, c: HunYuanDenseConfig, i: int, past, lengths,
                  rotary, target: Target):
    """HunYuanDenseV1DecoderLayer.forward: x + attn(norm(x)), then x + mlp(norm(x)); the attention
    rotates q and k, then normalizes each head (query_layernorm, key_layernorm)."""
    H, D, I = c.hidden_size, c.head_dim, c.intermediate_size
    with g.scope("input_layernorm"):
        h = stream.norm(w("input_layernorm.weight", H))
    a = w.under("self_attn.")
    attention = replace(attention_weights(a, c, c.attention_bias, c.attention_bias),
                        q_norm=a("query_layernorm.weight", D), k_norm=a("key_layernorm.weight", D))
    spec = AttentionSpec(c.num_attention_heads, c.num_key_value_heads, D, norm_eps=c.rms_norm_eps,
                         qk_norm_after_rotary=True)
    with g.scope("self_attn"):
        h, key, value = self_attention(g, h, past, lengths, rotary, attention, spec, target)
    stream.add(h)
    with g.scope("post_attention_layernorm"):
        h = stream.norm(w("post_attention_layernorm.weight", H))
    m = w.under("mlp.")
    with g.scope("mlp"):
        stream.add(gated_mlp(g, h, m("gate_proj.weight", I, H), m("up_proj.weight", I, H), m("down_proj.weight", H, I),
                             c.hidden_act, target))
    return key, value


def build(g: Graph, io: DecoderIO, ckpt: Checkpoint, c: HunYuanDenseConfig, target: Target):
    rotary = rotary_tables(g, c.rope(), c.max_position_embeddings, target, explicit=True)
    return rms_norm_decoder(g, io, ckpt, c, target, decoder_layer, rotary)


__all__ = ["IGNORED", "VARIANTS", "HunYuanDenseConfig", "build", "decoder_layer", "parse_config"]
