"""Token embedding lookup."""

from __future__ import annotations

import onnx_ir as ir

from builder.graph import Graph
from builder.lazy import Weight
from builder.target import Target


def embedding(g: Graph, input_ids: ir.Value, weight: Weight, target: Target, scale: float | None = None) -> ir.Value:
    """Gathers rows of the [vocab, hidden] matrix; `scale` multiplies the result (Gemma's √hidden).

    The scale is rounded to the IO dtype first, as Hugging Face does with its `normalizer` buffer.
    """
    x = g.op.Gather(g.weight("weight", weight.astype(target.io_dtype)), input_ids, axis=0)
    if scale is not None:
        x = g.op.Mul(x, g.constant(scale, target.io_dtype))
    return x
