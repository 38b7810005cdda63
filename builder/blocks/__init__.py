"""Building blocks of decoder graphs. They take lazy weights and IR values, never Hugging Face names."""

from builder.blocks.attention import (
    AttentionSpec,
    AttentionWeights,
    SequenceLengths,
    self_attention,
    sequence_lengths,
)
from builder.blocks.decoder import DecoderLayer, decoder_stack
from builder.blocks.embedding import embedding
from builder.blocks.linear import QuantizedValues, linear, quantized_weight
from builder.blocks.lm_head import lm_head, shared_vocabulary
from builder.blocks.mlp import activation, gated_mlp
from builder.blocks.norm import rms_norm, skip_rms_norm
from builder.blocks.rope import Rope, longrope_tables, rotary_tables

__all__ = [
    "AttentionSpec",
    "AttentionWeights",
    "DecoderLayer",
    "QuantizedValues",
    "Rope",
    "SequenceLengths",
    "activation",
    "decoder_stack",
    "embedding",
    "gated_mlp",
    "linear",
    "lm_head",
    "longrope_tables",
    "quantized_weight",
    "rms_norm",
    "rotary_tables",
    "self_attention",
    "sequence_lengths",
    "shared_vocabulary",
    "skip_rms_norm",
]
