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

from builder.blocks.norm import layer_norm, rms_norm, skip_layer_norm, skip_rms_norm
from builder.graph import Graph
from builder.lazy import Weight
from builder.target import Target


class ResidualStream:
    """The residual stream x, and the branch output h waiting to be added to it: the add is fused
    into the next norm (a Skip…Normalization), so no family writes that bookkeeping.

    `layer_norm` picks LayerNorm (weight and bias) instead of RMSNorm for every norm on the stream.
    Several branches added before the next norm are summed first (parallel attention and MLP).
    The stream and its norms run in `dtype`. That is the IO dtype, except where a family's stream
    outgrows it: Gemma's residual reaches about 1e5 on real weights, past fp16's 65504, so its fp16
    builds keep the stream in float32 (as ONNX Runtime's own builder does) and cast only each
    norm's output to fp16 for the projections.
    `hidden_size` is the stream's width, needed only by LayerNorms without weight or bias (OLMo's).
    """

    def __init__(self, g: Graph, x: ir.Value, eps: float, target: Target, dtype: np.dtype | None = None,
                 layer_norm: bool = False, hidden_size: int | None = None):
        self.g, self.eps, self.target, self.layer_norm = g, eps, target, layer_norm
        self.hidden_size = hidden_size
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

    def _norm(self, x: ir.Value, weight: Weight | None, bias: Weight | None) -> ir.Value:
        if self.layer_norm:
            return layer_norm(self.g, x, weight, bias, self.eps, self.target, self.dtype, self.hidden_size)
        return rms_norm(self.g, x, weight, self.eps, self.target, self.dtype)

    def norm(self, weight: Weight | None, bias: Weight | None = None) -> ir.Value:
        """norm(x + h) in the IO dtype, after adding the pending branch h to the stream."""
        if self.branch is None:
            h = self._norm(self.x, weight, bias)
        elif self.layer_norm:
            h, self.x = skip_layer_norm(self.g, self.branch, self.x, weight, bias, self.eps, self.target, self.dtype,
                                        self.hidden_size)
        else:
            h, self.x = skip_rms_norm(self.g, self.branch, self.x, weight, self.eps, self.target, self.dtype)
        self.branch = None
        return self._out_of_stream(h)

    def add(self, h: ir.Value, norm: Weight | None = None, norm_bias: Weight | None = None) -> None:
        """Queues x + h, or x + norm(h) with a post-norm `norm` (Gemma 2/3's sandwich, OLMo 2's
        post-norm), computed in the stream's dtype."""
        h = self._into_stream(h)
        if norm is not None or norm_bias is not None:
            h = self._norm(h, norm, norm_bias)
        self.branch = h if self.branch is None else self.g.op.Add(self.branch, h)

    def scale(self, factor: Weight) -> None:
        """x ← (x + pending branches) · factor, in the stream's dtype (Gemma 4's layer_scalar)."""
        if self.branch is not None:
            self.x, self.branch = self.g.op.Add(self.x, self.branch), None
        self.x = self.g.op.Mul(self.x, self.g.weight("layer_scalar", factor.astype(self.dtype)))

    def value(self) -> ir.Value:
        """x itself in the IO dtype, pending branches added (for layers that read the residual
        without a norm first, such as OLMo 2's post-norm layers)."""
        if self.branch is not None:
            self.x, self.branch = self.g.op.Add(self.x, self.branch), None
        return self._out_of_stream(self.x)
