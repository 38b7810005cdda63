"""The residual stream of a decoder, and the fusion of each `x + h` into the norm that follows.

A family's decoder layer reads like its modeling file:

    h = stream.norm(input_layernorm)            # rms_norm(x), or rms_norm(x + pending h) fused
    stream.add(self_attention(h))               # queues x + h for the next norm
    h = stream.norm(post_attention_layernorm)
    stream.add(mlp(h))

and Gemma 2/3's sandwich layers pass the branch's own norm: `stream.add(attn, post_attention_norm)`.
Each `x + h` becomes the SkipSimplifiedLayerNormalization of the next norm.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from builder.blocks.norm import rms_norm, skip_rms_norm
from builder.graph import Graph
from builder.lazy import Weight
from builder.target import Target


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
