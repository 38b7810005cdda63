"""Operators a bfloat16 build runs in float32, with a Cast on each side: Conv, TopK and Softplus,
whose ONNX schemas at builder's opset (21) have no bfloat16, and Log, Greater, ArgMax and Pad,
which ONNX Runtime 1.31 has no bfloat16 kernel for on CUDA (nor the CPU: the session fails, no
provider for the node; seen on an H200 with scripts/cuda_check.py). Other dtypes run them as they are.

Example:
    conv = op_dtype(target.io_dtype)                       # float32 for a bfloat16 build
    y = g.op.Conv(to_dtype(g, x, target.io_dtype, conv), w.astype(conv), ...)
    y = to_dtype(g, y, conv, target.io_dtype)
    y = in_op_dtype(g, x, target.io_dtype, g.op.Log)       # one input, one output: both casts
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx_ir as ir

from collections.abc import Callable

from builder.graph import Graph


def op_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype those operators run in for activations of `dtype`."""
    return np.dtype(np.float32) if np.dtype(dtype) == ml_dtypes.bfloat16 else np.dtype(dtype)


def to_dtype(g: Graph, x: ir.Value, dtype: np.dtype, to: np.dtype) -> ir.Value:
    """x (of `dtype`) as `to`: x itself when they are the same."""
    if np.dtype(dtype) == np.dtype(to):
        return x
    return g.op.Cast(x, to=ir.DataType.from_numpy(np.dtype(to)))


def in_op_dtype(g: Graph, x: ir.Value, dtype: np.dtype, op: Callable[[ir.Value], ir.Value]) -> ir.Value:
    """op(x) for x of `dtype`, computed in op_dtype(dtype) and returned in `dtype`."""
    inner = op_dtype(dtype)
    return to_dtype(g, op(to_dtype(g, x, dtype, inner)), inner, dtype)
