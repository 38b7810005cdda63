"""The decoder stack every supported family shares: embeddings → N × (norm, attention, norm, MLP) →
final norm, with the residual stream carried through ONNX Runtime's fused skip-norms.

Pre-norm layers (Llama, Mistral, Qwen, Phi-3, Gemma 1):
    h = attn(norm₁(x)); x = x + h; h = mlp(norm₂(x)); x = x + h
Sandwich layers (Gemma 2/3) also normalize each branch before it joins the residual:
    h = norm₂(attn(norm₁(x))); x = x + h; h = norm₄(mlp(norm₃(x))); x = x + h
Each `x + h` is fused into the SkipSimplifiedLayerNormalization of the norm that follows it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from builder.blocks.attention import (
    AttentionSpec,
    AttentionWeights,
    SequenceLengths,
    self_attention,
)
from builder.blocks.mlp import gated_mlp
from builder.blocks.norm import rms_norm, skip_rms_norm
from builder.graph import Graph
from builder.io import DecoderIO
from builder.lazy import Weight
from builder.target import Target


@dataclass(frozen=True)
class DecoderLayer:
    """One layer's weights (Hugging Face [out, in] layout) and attention settings.

    With `pre_feedforward_norm` set the layer is a sandwich: `post_attention_norm` then normalizes
    the attention output, `pre_feedforward_norm` the MLP input, `post_feedforward_norm` its output.
    """

    input_norm: Weight
    attention: AttentionWeights
    spec: AttentionSpec
    rotary: tuple[ir.Value, ir.Value]
    post_attention_norm: Weight
    gate: Weight
    up: Weight
    down: Weight
    activation: str
    pre_feedforward_norm: Weight | None = None
    post_feedforward_norm: Weight | None = None
    mlp_biases: tuple[Weight, Weight, Weight] | None = None  # gate, up, down


class ResidualStream:
    """The residual stream x, and the branch output h waiting to be added to it: the add is fused
    into the next norm (SkipSimplifiedLayerNormalization), so no family writes that bookkeeping.

    The stream and its norms run in `dtype`. That is the IO dtype, except where a family's stream
    outgrows it: Gemma's residual reaches about 1e5 on real weights, past fp16's 65504, so its fp16
    builds keep the stream in float32 (as ONNX Runtime's own builder does) and cast only each
    norm's output to fp16 for the projections.
    """

    def __init__(self, g: Graph, x: ir.Value, eps: float, target: Target, dtype: np.dtype | None = None):
        self.g, self.eps, self.target = g, eps, target
        self.dtype = np.dtype(dtype or target.io_dtype)
        self.x, self.branch = self._into_stream(x), None

    def _into_stream(self, v: ir.Value) -> ir.Value:
        if self.dtype == self.target.io_dtype:
            return v
        return self.g.op.Cast(v, to=ir.DataType.from_numpy(self.dtype))

    def _out_of_stream(self, v: ir.Value) -> ir.Value:
        if self.dtype == self.target.io_dtype:
            return v
        return self.g.op.Cast(v, to=ir.DataType.from_numpy(self.target.io_dtype))

    def norm(self, weight: Weight) -> ir.Value:
        """rms_norm(x + h) in the IO dtype, after adding the pending branch h to the stream."""
        if self.branch is None:
            h = rms_norm(self.g, self.x, weight, self.eps, self.target, self.dtype)
        else:
            h, self.x = skip_rms_norm(self.g, self.branch, self.x, weight, self.eps, self.target, self.dtype)
            self.branch = None
        return self._out_of_stream(h)

    def add(self, h: ir.Value, norm: Weight | None = None) -> None:
        """Queues x + h, or x + rms_norm(h) with a post-norm `norm` (Gemma 2/3's sandwich),
        computed in the stream's dtype."""
        h = self._into_stream(h)
        if norm is not None:
            h = rms_norm(self.g, h, norm, self.eps, self.target, self.dtype)
        self.branch = h


def decoder_stack(
    g: Graph, x: ir.Value, layers: Iterable[DecoderLayer], final_norm: Weight,
    io: DecoderIO, lengths: SequenceLengths, eps: float, target: Target,
    residual_dtype: np.dtype | None = None,
) -> tuple[ir.Value, list[tuple[ir.Value, ir.Value]]]:
    """Runs the layers on the embeddings `x`; returns (final normalized hidden states, presents).
    `residual_dtype` is the residual stream's dtype (default: the IO dtype; see ResidualStream)."""
    stream, presents = ResidualStream(g, x, eps, target, residual_dtype), []
    for i, layer in enumerate(layers):
        with g.scope("model", f"layers.{i}"):
            with g.scope("input_layernorm"):
                h = stream.norm(layer.input_norm)
            with g.scope("self_attn"):
                attn, key, value = self_attention(g, h, io.past[i], lengths, layer.rotary, layer.attention, layer.spec, target)
            presents.append((key, value))
            if layer.pre_feedforward_norm is not None:
                with g.scope("post_attention_layernorm"):
                    stream.add(attn, layer.post_attention_norm)
                with g.scope("pre_feedforward_layernorm"):
                    h = stream.norm(layer.pre_feedforward_norm)
            else:
                stream.add(attn)
                with g.scope("post_attention_layernorm"):
                    h = stream.norm(layer.post_attention_norm)
            with g.scope("mlp"):
                mlp = gated_mlp(g, h, layer.gate, layer.up, layer.down, layer.activation, target, layer.mlp_biases)
            if layer.post_feedforward_norm is not None:
                with g.scope("post_feedforward_layernorm"):
                    stream.add(mlp, layer.post_feedforward_norm)
            else:
                stream.add(mlp)
    with g.scope("model", "norm"):
        h = stream.norm(final_norm)
    return h, presents
