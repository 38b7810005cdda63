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

from dataclasses import dataclass, replace
from typing import Any

from architectures.moe import dense_mlp, pre_norm_layer
from builder.architecture import Weights, attention_weights
from builder.blocks import AttentionSpec, AttentionWeights, Rope, rotary_tables
from builder.blocks.rope import default_inv_freq
from builder.decoder_config import DecoderConfig
from builder.errors import BuildError
from builder.family import Decoder, Family, register

VARIANTS: dict[str, dict[str, Any]] = {"HunYuanDenseV1ForCausalLM": {}}

# onnxruntime-genai names this model type after the architecture, not config.json's model_type.
GENAI_MODEL_TYPE = "hunyuandensev1"

# What the modeling file fixes: no sliding window, and genai's name for the model type.
STRUCTURE: dict[str, dict[str, Any]] = {"HunYuanDenseV1ForCausalLM": dict(model_type=GENAI_MODEL_TYPE,
                                                                          sliding_window=None)}


@dataclass(frozen=True)
class HunYuanDenseConfig(DecoderConfig):
    """config.json of HunYuanDenseV1ForCausalLM (HunYuanDenseV1Config's defaults). Keys the dense
    modeling file never reads (use_qk_norm: the norms are always there; use_cla, mlp_bias) are not
    kept; `head_dim`, which transformers needs given, defaults to hidden_size // heads as everywhere else."""

    model_type: str = GENAI_MODEL_TYPE
    vocab_size: int = 290943
    rms_norm_eps: float = 1e-5
    pad_token_id: int | None = 0

    def rope(self) -> Rope:
        """HunYuanDenseV1RotaryEmbedding: "dynamic" with an alpha is its fixed NTK-alpha base."""
        params = {k: v for k, v in self.rope_parameters.items() if k != "partial_rotary_factor"}
        D = self.head_dim
        if params["rope_type"] == "dynamic" and params.get("alpha"):
            base = params["rope_theta"] * params["alpha"] ** (D / (D - 2))
            return Rope(default_inv_freq(base, D))
        if params["rope_type"] != "default" and self.rope_parameters.get("partial_rotary_factor", 1.0) != 1.0:
            # the shared scaled ropes take the share, the attention rotates the whole head: transformers fails
            raise BuildError(f"HunYuanDenseV1ForCausalLM with partial_rotary_factor and {params['rope_type']} rope: "
                             "transformers rotates the whole head for these, and cannot run this combination")
        return Rope.from_parameters(params, D, self.max_position_embeddings)


def rotary(d: Decoder):
    """Explicit tables: q and k are rotated before their norms, which GroupQueryAttention cannot do."""
    return rotary_tables(d.g, d.c.rope(), d.c.max_position_embeddings, d.target, explicit=True)


def attention(d: Decoder, w: Weights) -> tuple[AttentionWeights, AttentionSpec]:
    """HunYuan's attention (the dense and MoE models'): q/k/v/o with `attention_bias`, q and k
    rotated, then each head normalized (query_layernorm, key_layernorm)."""
    c, D = d.c, d.c.head_dim
    a = w.under("self_attn.")
    weights = replace(attention_weights(a, c, c.attention_bias, c.attention_bias),
                      q_norm=a("query_layernorm.weight", D), k_norm=a("key_layernorm.weight", D))
    spec = AttentionSpec(c.num_attention_heads, c.num_key_value_heads, D, norm_eps=c.rms_norm_eps,
                         qk_norm_after_rotary=True)
    return weights, spec


def decoder_layer(d: Decoder, w: Weights, i: int):
    """HunYuanDenseV1DecoderLayer.forward: x + attn(norm(x)), then x + mlp(norm(x))."""
    return pre_norm_layer(d, w, i, *attention(d, w),
                          lambda h: dense_mlp(d, h, w.under("mlp."), d.c.intermediate_size))


FAMILY = register(Family(
    "hunyuan", HunYuanDenseConfig, decoder_layer, VARIANTS, structure=STRUCTURE, rotary=rotary,
    partial_rotary=True,  # HunYuanDenseConfig.rope reads it (its NTK-alpha rope ignores it)
    ignored=("model.layers.*.self_attn.rotary_emb.inv_freq",),
))

__all__ = ["FAMILY", "GENAI_MODEL_TYPE", "VARIANTS", "HunYuanDenseConfig", "attention", "decoder_layer", "rotary"]
