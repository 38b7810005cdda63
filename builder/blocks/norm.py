"""RMSNorm and LayerNorm, and each fused with the residual add before it.

RMSNorm is ONNX Runtime's SimplifiedLayerNormalization / SkipSimplifiedLayerNormalization,
LayerNorm ONNX's LayerNormalization / ONNX Runtime's SkipLayerNormalization; a standard-ops
target uses ONNX's RMSNormalization and a separate Add, a provider without the fused norms
(TensorRT-RTX) RMSNorm in plain ops. All compute their
statistics in float32 whatever the IO dtype (stash_type=1), as Hugging Face's norms do.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from builder.graph import Graph
from builder.lazy import Weight
from builder.target import Target


def rms_norm(
    g: Graph, x: ir.Value, weight: Weight, eps: float, target: Target, dtype: np.dtype | None = None
) -> ir.Value:
    """y = x / sqrt(mean(x², last axis) + eps) · weight; `x`, the weight and y are in `dtype`
    (default: the IO dtype)."""
    w = g.weight("weight", weight.astype(dtype or target.io_dtype))
    if target.standard_ops:  # ONNX's own (opset 23)
        return g.op.RMSNormalization(x, w, axis=-1, epsilon=float(eps), stash_type=1)
    if not target.provider.fused_norms:
        return _rms_norm_expanded(g, x, w, eps)
    return g.op.SimplifiedLayerNormalization(x, w, axis=-1, epsilon=float(eps), stash_type=1)


def _rms_norm_expanded(g: Graph, x: ir.Value, w: ir.Value, eps: float) -> ir.Value:
    """RMSNorm in plain ops for providers without ONNX Runtime's fused norms (TensorRT-RTX):
    x (in float32) · 1/sqrt(mean(x²) + eps), cast back, times the weight: transformers' order."""
    x32 = g.op.Cast(x, to=ir.DataType.FLOAT)
    mean = g.op.ReduceMean(g.op.Mul(x32, x32), g.constant([-1], "int64"), keepdims=1)  # (..., 1)
    inv = g.op.Reciprocal(g.op.Sqrt(g.op.Add(mean, g.constant(float(eps), np.float32))))
    return g.op.Mul(g.op.CastLike(g.op.Mul(x32, inv), w), w)


def skip_rms_norm(
    g: Graph, x: ir.Value, residual: ir.Value, weight: Weight, eps: float, target: Target,
    dtype: np.dtype | None = None,
) -> tuple[ir.Value, ir.Value]:
    """(rms_norm(x + residual), x + residual): the residual add fused into the norm; inputs,
    weight and outputs in `dtype` (default: the IO dtype)."""
    if target.standard_ops or not target.provider.fused_norms:
        total = g.op.Add(x, residual)
        return rms_norm(g, total, weight, eps, target, dtype), total
    w = g.weight("weight", weight.astype(dtype or target.io_dtype))
    # Outputs: normalized, mean, inv_std_var, input + skip. The statistics are not needed.
    out = g.ms.SkipSimplifiedLayerNormalization(x, residual, w, epsilon=float(eps), _outputs=4, _unused=(1, 2))
    return out[0], out[3]


def layer_norm(
    g: Graph, x: ir.Value, weight: Weight | None, bias: Weight | None, eps: float, target: Target,
    dtype: np.dtype | None = None, hidden: int | None = None,
) -> ir.Value:
    """y = (x − mean) / sqrt(var + eps) · weight + bias over the last axis; no weight (OLMo's
    non-parametric norm) means ones, no bias zeros (then `hidden` gives their length)."""
    dtype = np.dtype(dtype or target.io_dtype)
    w, b = _layer_norm_params(g, weight, bias, dtype, hidden)
    return g.op.LayerNormalization(x, w, b, axis=-1, epsilon=float(eps), stash_type=1)


def skip_layer_norm(
    g: Graph, x: ir.Value, residual: ir.Value, weight: Weight | None, bias: Weight | None, eps: float,
    target: Target, dtype: np.dtype | None = None, hidden: int | None = None,
) -> tuple[ir.Value, ir.Value]:
    """(layer_norm(x + residual), x + residual): the residual add fused into the norm."""
    if target.standard_ops or not target.provider.fused_norms:
        total = g.op.Add(x, residual)
        return layer_norm(g, total, weight, bias, eps, target, dtype, hidden), total
    dtype = np.dtype(dtype or target.io_dtype)
    w, b = _layer_norm_params(g, weight, bias, dtype, hidden)
    out = g.ms.SkipLayerNormalization(x, residual, w, b, epsilon=float(eps), _outputs=4, _unused=(1, 2))
    return out[0], out[3]


def _layer_norm_params(g: Graph, weight: Weight | None, bias: Weight | None, dtype: np.dtype, hidden: int | None):
    size = weight.shape[0] if weight is not None else bias.shape[0] if bias is not None else hidden
    w = g.weight("weight", weight.astype(dtype)) if weight is not None else g.constant(np.ones(size, dtype))
    b = g.weight("bias", bias.astype(dtype)) if bias is not None else g.constant(np.zeros(size, dtype))
    return w, b
