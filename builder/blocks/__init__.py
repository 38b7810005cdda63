"""Building blocks of decoder graphs. They take lazy weights and IR values, never Hugging Face names."""

from builder.blocks.attention import AttentionInputs, AttentionSpec, AttentionWeights, attention_inputs, self_attention
from builder.blocks.embedding import embedding
from builder.blocks.linear import QuantizedValues, linear, quantized_weight
from builder.blocks.lm_head import lm_head, tied_quantized_lm_head
from builder.blocks.mlp import activation, gated_mlp
from builder.blocks.norm import rms_norm, skip_rms_norm
from builder.blocks.rope import Rope

__all__ = [
    "AttentionInputs",
    "AttentionSpec",
    "AttentionWeights",
    "QuantizedValues",
    "Rope",
    "activation",
    "attention_inputs",
    "embedding",
    "gated_mlp",
    "linear",
    "lm_head",
    "quantized_weight",
    "rms_norm",
    "self_attention",
    "skip_rms_norm",
    "tied_quantized_lm_head",
]
