"""Float weights stored in the checkpoint's own 16-bit dtype under float32 activations on the CPU.

Every value of a bfloat16 or float16 weight is a float32 exactly. Built for float32 activations,
such a weight can be stored as it is, half the bytes of a float32 copy, and widened in the graph by
a Cast: the same float32 values reach every operator.

- A lookup table (embedding, `table_dtype`): gathered as stored and each gathered row widened
  (`widened`). It costs nothing at load and one Cast of the gathered rows a step: always done.
- A matrix (`matrix`): Cast right after the initializer. ONNX Runtime folds a Cast of a constant
  when it loads the session (its constant folding, on at every optimization level but
  ORT_DISABLE_ALL), so a run multiplies the same prepacked float32 matrix as before; what it costs
  is the widening at every session start, 0.5 to 1 s per GB of float32 on this project's machine
  (docs/BENCHMARKS.md). So only where Target.narrow_float_matrices asks: a quantized build's float
  layers and a quantized package's vision tower, not an fp32 build, whose user asked for float32.

Other providers and activation dtypes store the weight in the activations' dtype, as before.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx_ir as ir

from builder.graph import Graph
from builder.lazy import Weight
from builder.target import Target

HALF = (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))


def table_dtype(weight: Weight, target: Target) -> np.dtype:
    """The dtype a float lookup table is stored in: its own bfloat16 or float16 under float32
    activations on the CPU, the activations' dtype otherwise."""
    if (weight.blocks is None and np.dtype(target.io_dtype) == np.float32 and target.execution_provider == "cpu"
            and weight.dtype in HALF):
        return weight.dtype
    return np.dtype(target.io_dtype)


def matrix_dtype(weight: Weight, target: Target) -> np.dtype:
    """The dtype a float matrix is stored in: table_dtype's where the target narrows its float
    matrices, the activations' dtype otherwise."""
    return table_dtype(weight, target) if target.narrow_float_matrices else np.dtype(target.io_dtype)


def widened(g: Graph, x: ir.Value, target: Target, stored: ir.Value | None = None) -> ir.Value:
    """x in the activations' dtype: a Cast when x (or `stored`, the initializer x was gathered
    from, whose dtype x has) is narrower, x itself else."""
    io = ir.DataType.from_numpy(np.dtype(target.io_dtype))
    dtype = (stored if stored is not None else x).dtype
    if dtype is None:
        raise ValueError(f"{x.name}: no dtype to widen from")
    return x if dtype == io else g.op.Cast(x, to=io)


def matrix(g: Graph, name: str, weight: Weight, target: Target) -> ir.Value:
    """The float matrix `weight` registered as `name` (in matrix_dtype), read in the activations' dtype."""
    return widened(g, g.weight(name, weight.astype(matrix_dtype(weight, target))), target)
