"""Building blocks of decoder graphs. They take lazy weights and IR values, never Hugging Face names."""

from builder.blocks.attention import (
    AttentionSpec,
    AttentionWeights,
    SequenceLengths,
    self_attention,
    sequence_lengths,
)
from builder.blocks.embedding import embedding
from builder.blocks.linear import QuantizedValues, linear, quantized_weight
from builder.blocks.lm_head import lm_head, shared_vocabulary
from builder.blocks.mlp import activation, gated_mlp, plain_mlp
from builder.blocks.moe import sparse_moe
from builder.blocks.norm import layer_norm, rms_norm, skip_layer_norm, skip_rms_norm
from builder.blocks.residual import ResidualStream
from builder.blocks.rope import (
    Rope,
    longrope_tables,
    rotary_tables,
    rotary_tables_by_layer_type,
)
from builder.blocks.vocabulary import Vocabulary

__all__ = [
    "AttentionSpec",
    "AttentionWeights",
    "QuantizedValues",
    "ResidualStream",
    "Rope",
    "SequenceLengths",
    "Vocabulary",
    "activation",
    "embedding",
    "gated_mlp",
    "linear",
    "layer_norm",
    "lm_head",
    "longrope_tables",
    "plain_mlp",
    "quantized_weight",
    "rms_norm",
    "rotary_tables",
    "rotary_tables_by_layer_type",
    "self_attention",
    "sequence_lengths",
    "shared_vocabulary",
    "skip_layer_norm",
    "skip_rms_norm",
    "sparse_moe",
]
