"""The gated delta rule (Qwen3.5's and Qwen3-Next's linear attention): ONNX Runtime's
com.microsoft::LinearAttention where it has a kernel (CPU), else in standard ONNX ops, a Scan over
the new tokens carrying each head's state S (key_dim × value_dim) from token to token:

    S ← S · exp(g_t);   S ← S + k_t ⊗ (β_t · (v_t − Sᵀ k_t));   o_t = Sᵀ q_t

with q and k l2-normalized per head (q also scaled by 1/√key_dim), β = sigmoid(b) and
g = −exp(A_log) · softplus(a + dt_bias) (transformers' torch_recurrent_gated_delta_rule). Prefill
runs every prompt token through it, decode one; the state in and out is (batch, value_heads,
key_dim, value_dim), as onnxruntime-genai 0.18 declares `past.%d.recurrent`. A padding token
(right padding in onnxruntime-genai's batches) leaves the state as it was."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from builder.graph import Graph

# transformers' l2norm epsilon (added to the sum of squares, inside the square root).
_L2_EPS = 1e-6


@dataclass(frozen=True)
class DeltaHeads:
    """The heads of a gated DeltaNet: key heads (q and k) shared by value_heads / key_heads value heads."""

    key_heads: int
    value_heads: int
    key_dim: int
    value_dim: int


def l2_normalize(g: Graph, x: ir.Value, dtype: np.dtype) -> ir.Value:
    """x · rsqrt(Σx² + 1e-6) over the last axis (transformers' l2norm, matching FLA's)."""
    squares = g.op.ReduceSum(g.op.Mul(x, x), g.constant([-1], "int64"), keepdims=1)
    return g.op.Div(x, g.op.Sqrt(g.op.Add(squares, g.constant(_L2_EPS, dtype))))


def _per_value_head(g: Graph, x: ir.Value, heads: DeltaHeads) -> ir.Value:
    """(B, S, key_heads, D) -> (B, S, value_heads, D): each key head repeated for the consecutive
    value heads it serves (repeat_interleave)."""
    repeat = heads.value_heads // heads.key_heads
    if repeat == 1:
        return x
    x = g.op.Unsqueeze(x, g.constant([3], "int64"))  # (B, S, Hk, 1, D)
    shape = g.op.Concat(g.op.Shape(x, start=0, end=3), g.constant([repeat, heads.key_dim], "int64"), axis=0)
    x = g.op.Expand(x, shape)
    return g.op.Reshape(x, g.constant([0, 0, heads.value_heads, heads.key_dim], "int64"))


def _time_major(g: Graph, x: ir.Value) -> ir.Value:
    """(B, S, H, D) -> (S, B, H, 1, D), one row vector per head and token, as the Scan reads them."""
    return g.op.Unsqueeze(g.op.Transpose(x, perm=[1, 0, 2, 3]), g.constant([3], "int64"))


def gated_delta_rule(
    g: Graph, q: ir.Value, k: ir.Value, v: ir.Value, decay: ir.Value, beta: ir.Value, keep: ir.Value,
    past: ir.Value, heads: DeltaHeads, io_dtype: np.dtype, fused: bool = False,
) -> tuple[ir.Value, ir.Value]:
    """The recurrence over the new tokens, run in float32 (inputs and outputs in `io_dtype`,
    the model's). q, k (B, S, key_heads, key_dim) as projected; v (B, S, value_heads, value_dim);
    `decay` the gate g and `beta` β, (B, S, value_heads); `keep` (B, S, 1) 1 for a real token;
    `past` (B, value_heads, key_dim, value_dim). Returns (the output (B, S, value_heads,
    value_dim), the present state). `fused`: one com.microsoft::LinearAttention (ONNX Runtime's
    CPU kernel: 8× the Scan's speed on a 512-token prefill of 16 heads of 128), else the Scan."""
    dtype = np.float32  # transformers runs the rule in float32 whatever the model's dtype
    with g.scope("delta_rule"):
        if io_dtype != np.float32:
            q, k, v, decay, beta, keep, past = (g.op.Cast(x, to=ir.DataType.FLOAT)
                                                for x in (q, k, v, decay, beta, keep, past))
        q = g.op.Mul(l2_normalize(g, q, dtype), g.constant(1.0 / np.sqrt(heads.key_dim), dtype))
        if fused:
            out, present = _linear_attention(g, q, l2_normalize(g, k, dtype), v, decay, beta, keep, past, heads)
        else:
            out, present = _scan(g, q, k, v, decay, beta, keep, past, heads, dtype)
        if io_dtype != np.float32:
            to = ir.DataType.from_numpy(np.dtype(io_dtype))
            out, present = g.op.Cast(out, to=to), g.op.Cast(present, to=to)
    return out, present


def _linear_attention(g: Graph, q: ir.Value, k: ir.Value, v: ir.Value, decay: ir.Value, beta: ir.Value,
                      keep: ir.Value, past: ir.Value, heads: DeltaHeads) -> tuple[ir.Value, ir.Value]:
    """The rule as ONNX Runtime's LinearAttention (q scaled, k normed; it groups the key heads over
    the value heads itself). A padding token gets k = 0 and g = 0: S · exp(0) + 0 ⊗ … leaves S as it was."""
    k = g.op.Mul(k, g.op.Unsqueeze(keep, g.constant([3], "int64")))
    decay = g.op.Mul(decay, keep)
    packed = [g.op.Reshape(x, g.constant([0, 0, -1], "int64")) for x in (q, k, v)]
    out, present = g.ms.LinearAttention(*packed, past, decay, beta, q_num_heads=heads.key_heads,
                                        kv_num_heads=heads.value_heads, update_rule="gated_delta", scale=1.0,
                                        _outputs=2)
    return g.op.Reshape(out, g.constant([0, 0, heads.value_heads, heads.value_dim], "int64")), present


def _scan(g: Graph, q: ir.Value, k: ir.Value, v: ir.Value, decay: ir.Value, beta: ir.Value, keep: ir.Value,
          past: ir.Value, heads: DeltaHeads, dtype: np.dtype) -> tuple[ir.Value, ir.Value]:
    """The rule as a Scan over the tokens (standard ops), the key heads repeated over the value heads."""
    q = _per_value_head(g, q, heads)
    k = _per_value_head(g, l2_normalize(g, k, dtype), heads)
    gates = g.op.Unsqueeze(g.op.Transpose(g.op.Concat(g.op.Exp(decay), beta, axis=-1), perm=[1, 0, 2]),
                           g.constant([3, 4], "int64"))  # (S, B, 2·Hv, 1, 1)
    real = g.op.Cast(g.op.Unsqueeze(g.op.Transpose(keep, perm=[1, 0, 2]), g.constant([3, 4], "int64")),
                     to=ir.DataType.BOOL)  # (S, B, 1, 1, 1)
    body = _step(g, heads, dtype)
    present, out = g.op.Scan(past, _time_major(g, q), _time_major(g, k), _time_major(g, v), gates, real,
                             body=body, num_scan_inputs=5, _outputs=2)  # out: (S, B, Hv, 1, Dv)
    out = g.op.Transpose(g.op.Squeeze(out, g.constant([3], "int64")), perm=[1, 0, 2, 3])
    return out, present


def _step(outer: Graph, heads: DeltaHeads, dtype: np.dtype) -> ir.Graph:
    """The Scan body: one token's update of the state and its output (constants from the outer graph)."""
    elem = ir.DataType.from_numpy(np.dtype(dtype))
    Hv = heads.value_heads

    def value(name: str, data: ir.DataType = elem) -> ir.Value:
        return ir.Value(name=f"{outer.path}/step/{name}", type=ir.TensorType(data))

    state, q, k, v, gates, real = (value("state"), value("q"), value("k"), value("v"), value("gates"),
                                   value("real", ir.DataType.BOOL))
    body = Graph()
    with body.scope(*outer.path.strip("/").split("/"), "step"):
        decay, beta = body.op.Split(gates, outer.constant([Hv, Hv], "int64"), axis=1, _outputs=2)  # (B, Hv, 1, 1)
        decayed = body.op.Mul(state, decay)  # (B, Hv, Dk, Dv)
        remembered = body.op.MatMul(k, decayed)  # kᵀS: (B, Hv, 1, Dv)
        delta = body.op.Mul(body.op.Sub(v, remembered), beta)
        updated = body.op.Add(decayed, body.op.MatMul(body.op.Transpose(k, perm=[0, 1, 3, 2]), delta))
        new_state = body.op.Where(real, updated, state)
        out = body.op.MatMul(q, new_state)  # qᵀS: (B, Hv, 1, Dv)
    for result in (new_state, out):
        result.type = ir.TensorType(elem)
    return ir.Graph(inputs=[state, q, k, v, gates, real], outputs=[new_state, out], nodes=body.tape.nodes,
                    name="delta_step")


__all__ = ["DeltaHeads", "gated_delta_rule", "l2_normalize"]
