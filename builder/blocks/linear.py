"""Linear layers: y = x · Wᵀ (+ b), from a weight in Hugging Face's [out_features, in_features] layout."""

from __future__ import annotations

import onnx_ir as ir

from builder.graph import Graph
from builder.lazy import Weight
from builder.target import Target


def linear(g: Graph, x: ir.Value, weight: Weight, target: Target, bias: Weight | None = None) -> ir.Value:
    """MatMul against the transposed weight (written once, transposed and cast in one pass)."""
    w = g.weight("weight", weight.transpose().astype(target.io_dtype))  # [out, in] -> [in, out]
    y = g.op.MatMul(x, w)
    if bias is not None:
        y = g.op.Add(y, g.weight("bias", bias.astype(target.io_dtype)))
    return y
