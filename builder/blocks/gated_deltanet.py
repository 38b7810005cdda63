"""The gated delta rule (Qwen3.5's and Qwen3-Next's linear attention), on the shared linear
recurrence (builder.blocks.linear_recurrence: ONNX Runtime's LinearAttention on CPU, a Scan elsewhere):

    S ← S · exp(g_t);   S ← S + k_t ⊗ (β_t · (v_t − Sᵀ k_t));   o_t = Sᵀ q_t

with q and k l2-normalized per head (q also scaled by 1/√key_dim), β = sigmoid(b) and
g = −exp(A_log) · softplus(a + dt_bias) (transformers' torch_recurrent_gated_delta_rule). Prefill
runs every prompt token through it, decode one; the state in and out is (batch, value_heads,
key_dim, value_dim), as onnxruntime-genai 0.18 declares `past.%d.recurrent`. A padding token
(right padding in onnxruntime-genai's batches) leaves the state as it was."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from builder.blocks.linear_recurrence import RecurrentHeads, linear_recurrence
from builder.graph import Graph

# transformers' l2norm epsilon (added to the sum of squares, inside the square root).
_L2_EPS = 1e-6

# The DeltaNet's heads: key heads (q and k) shared by value_heads / key_heads value heads.
DeltaHeads = RecurrentHeads


def l2_normalize(g: Graph, x: ir.Value, dtype: np.dtype) -> ir.Value:
    """x · rsqrt(Σx² + 1e-6) over the last axis (transformers' l2norm, matching FLA's)."""
    squares = g.op.ReduceSum(g.op.Mul(x, x), g.constant([-1], "int64"), keepdims=1)
    return g.op.Div(x, g.op.Sqrt(g.op.Add(squares, g.constant(_L2_EPS, dtype))))


def gated_delta_rule(
    g: Graph, q: ir.Value, k: ir.Value, v: ir.Value, decay: ir.Value, beta: ir.Value, keep: ir.Value,
    past: ir.Value, heads: DeltaHeads, io_dtype: np.dtype, fused: bool = False,
) -> tuple[ir.Value, ir.Value]:
    """The recurrence over the new tokens, run in float32 (inputs and outputs in `io_dtype`,
    the model's). q, k (B, S, key_heads, key_dim) as projected; v (B, S, value_heads, value_dim);
    `decay` the gate g and `beta` β, (B, S, value_heads); `keep` (B, S, 1) 1 for a real token;
    `past` (B, value_heads, key_dim, value_dim). Returns (the output (B, S, value_heads,
    value_dim), the present state). `fused`: ONNX Runtime's LinearAttention, else the Scan."""
    dtype = np.float32  # transformers runs the rule in float32 whatever the model's dtype
    with g.scope("delta_rule"):
        if io_dtype != np.float32:
            q, k, v, decay, beta, keep, past = (g.op.Cast(x, to=ir.DataType.FLOAT)
                                                for x in (q, k, v, decay, beta, keep, past))
        q = g.op.Mul(l2_normalize(g, q, dtype), g.constant(1.0 / np.sqrt(heads.key_dim), dtype))
        out, present = linear_recurrence(g, q, l2_normalize(g, k, dtype), v, decay, beta, keep, past, heads, fused)
        if io_dtype != np.float32:
            to = ir.DataType.from_numpy(np.dtype(io_dtype))
            out, present = g.op.Cast(out, to=to), g.op.Cast(present, to=to)
    return out, present


__all__ = ["DeltaHeads", "gated_delta_rule", "l2_normalize"]
