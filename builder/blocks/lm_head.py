"""The output projection to vocabulary logits."""

from __future__ import annotations

import onnx_ir as ir

from builder.blocks.linear import QuantizedValues, linear, quantized_weight
from builder.graph import Graph
from builder.io import logits_dtype
from builder.lazy import Weight
from builder.target import Target


def tied_quantized_lm_head(g: Graph, weight: Weight, target: Target) -> QuantizedValues | None:
    """When lm_head is quantized to 4 bits, its quantized matrix, registered once so that a tied
    embedding can gather from it (GatherBlockQuantized) instead of storing a second copy."""
    q = target.quantization
    if q is None or q.bits != 4 or not target.quantizes("lm_head"):
        return None
    with g.scope("lm_head"):
        return quantized_weight(g, weight, q, target.io_dtype)


def lm_head(
    g: Graph, x: ir.Value, weight: Weight, target: Target,
    softcap: float | None = None, quantized: QuantizedValues | None = None,
) -> ir.Value:
    """logits = x · Wᵀ, optionally soft-capped (softcap · tanh(logits / softcap)), in the logits dtype."""
    with g.scope("lm_head"):
        logits = linear(g, x, weight, target, quantized=quantized)
        out_dtype = logits_dtype(target.io_dtype)
        if out_dtype != target.io_dtype:
            logits = g.op.Cast(logits, to=ir.DataType.from_numpy(out_dtype))
        if softcap:
            cap = g.constant(softcap, out_dtype)
            logits = g.op.Mul(g.op.Tanh(g.op.Div(logits, cap)), cap)
    return logits
