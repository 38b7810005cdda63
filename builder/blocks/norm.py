"""RMSNorm as ONNX Runtime's fused SimplifiedLayerNormalization / SkipSimplifiedLayerNormalization.

Both compute in float32 whatever the IO dtype (stash_type=1), as Hugging Face's RMSNorm does.
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
    return g.op.SimplifiedLayerNormalization(x, w, axis=-1, epsilon=float(eps), stash_type=1)


def skip_rms_norm(
    g: Graph, x: ir.Value, residual: ir.Value, weight: Weight, eps: float, target: Target,
    dtype: np.dtype | None = None,
) -> tuple[ir.Value, ir.Value]:
    """(rms_norm(x + residual), x + residual): the residual add fused into the norm; inputs,
    weight and outputs in `dtype` (default: the IO dtype)."""
    w = g.weight("weight", weight.astype(dtype or target.io_dtype))
    # Outputs: normalized, mean, inv_std_var, input + skip. The statistics are not needed.
    out = g.ms.SkipSimplifiedLayerNormalization(x, residual, w, epsilon=float(eps), _outputs=4, _unused=(1, 2))
    return out[0], out[3]
