"""A gated linear recurrence over the new tokens, carrying each head's state S (key_dim × value_dim):

    gated (Mamba-2's SSD):        S ← S · exp(g_t) + k_t ⊗ v_t;                        o_t = Sᵀ q_t
    gated delta (Gated DeltaNet): S ← S · exp(g_t);  S ← S + k_t ⊗ (β_t · (v_t − Sᵀ k_t)); o_t = Sᵀ q_t

ONNX Runtime's com.microsoft::LinearAttention where it has a kernel (CPU), else standard ONNX ops:
a Scan over the tokens. q and k have `key_heads` heads, each serving value_heads / key_heads
consecutive value heads (Qwen3.5's key heads, Mamba-2's groups of B and C). A padding token
(onnxruntime-genai pads a batch's shorter prompts on the right) leaves the state as it was. Both
forms run in float32; the callers cast around them."""

from __future__ import annotations

from dataclasses import dataclass

import onnx_ir as ir

from builder.graph import Graph


@dataclass(frozen=True)
class RecurrentHeads:
    """The heads of a linear recurrence: `key_heads` heads of q and k, each shared by
    value_heads / key_heads consecutive value heads; the state is (value_heads, key_dim, value_dim)."""

    key_heads: int
    value_heads: int
    key_dim: int
    value_dim: int


def linear_recurrence(
    g: Graph, q: ir.Value, k: ir.Value, v: ir.Value, decay: ir.Value, beta: ir.Value | None, keep: ir.Value,
    past: ir.Value, heads: RecurrentHeads, fused: bool,
) -> tuple[ir.Value, ir.Value]:
    """The recurrence in float32: q, k (B, S, key_heads, key_dim) as the rule reads them (scaled,
    normalized); v (B, S, value_heads, value_dim); `decay` g (B, S, value_heads) in log space;
    `beta` β (B, S, value_heads) for the delta rule, None for the plain gated rule; `keep` (B, S, 1)
    1 for a real token; `past` (B, value_heads, key_dim, value_dim). Returns (the output (B, S,
    value_heads, value_dim), the present state). `fused`: one LinearAttention (ONNX Runtime's CPU
    kernel: 8× the Scan's speed on a 512-token prefill of 16 heads of 128), else the Scan."""
    if fused:
        return _linear_attention(g, q, k, v, decay, beta, keep, past, heads)
    return _scan(g, q, k, v, decay, beta, keep, past, heads)


def _per_value_head(g: Graph, x: ir.Value, heads: RecurrentHeads) -> ir.Value:
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


def _linear_attention(g: Graph, q: ir.Value, k: ir.Value, v: ir.Value, decay: ir.Value, beta: ir.Value | None,
                      keep: ir.Value, past: ir.Value, heads: RecurrentHeads) -> tuple[ir.Value, ir.Value]:
    """The rule as ONNX Runtime's LinearAttention (it groups the key heads over the value heads
    itself). A padding token gets k = 0 and g = 0: S · exp(0) + 0 ⊗ … leaves S as it was."""
    k = g.op.Mul(k, g.op.Unsqueeze(keep, g.constant([3], "int64")))
    decay = g.op.Mul(decay, keep)
    packed = [g.op.Reshape(x, g.constant([0, 0, -1], "int64")) for x in (q, k, v)]
    rule = "gated" if beta is None else "gated_delta"
    out, present = g.ms.LinearAttention(*packed, past, decay, beta, q_num_heads=heads.key_heads,
                                        kv_num_heads=heads.value_heads, update_rule=rule, scale=1.0, _outputs=2)
    return g.op.Reshape(out, g.constant([0, 0, heads.value_heads, heads.value_dim], "int64")), present


def _scan(g: Graph, q: ir.Value, k: ir.Value, v: ir.Value, decay: ir.Value, beta: ir.Value | None,
          keep: ir.Value, past: ir.Value, heads: RecurrentHeads) -> tuple[ir.Value, ir.Value]:
    """The rule as a Scan over the tokens (standard ops), the key heads repeated over the value heads."""
    q, k = _per_value_head(g, q, heads), _per_value_head(g, k, heads)
    gates = g.op.Exp(decay) if beta is None else g.op.Concat(g.op.Exp(decay), beta, axis=-1)
    gates = g.op.Unsqueeze(g.op.Transpose(gates, perm=[1, 0, 2]), g.constant([3, 4], "int64"))  # (S, B, Hv|2Hv, 1, 1)
    real = g.op.Cast(g.op.Unsqueeze(g.op.Transpose(keep, perm=[1, 0, 2]), g.constant([3, 4], "int64")),
                     to=ir.DataType.BOOL)  # (S, B, 1, 1, 1)
    body = _step(g, heads, delta=beta is not None)
    present, out = g.op.Scan(past, _time_major(g, q), _time_major(g, k), _time_major(g, v), gates, real,
                             body=body, num_scan_inputs=5, _outputs=2)  # out: (S, B, Hv, 1, Dv)
    out = g.op.Transpose(g.op.Squeeze(out, g.constant([3], "int64")), perm=[1, 0, 2, 3])
    return out, present


def _step(outer: Graph, heads: RecurrentHeads, delta: bool) -> ir.Graph:
    """The Scan body: one token's update of the state and its output (constants from the outer graph)."""
    elem = ir.DataType.FLOAT
    Hv = heads.value_heads

    def value(name: str, data: ir.DataType = elem) -> ir.Value:
        return ir.Value(name=f"{outer.path}/step/{name}", type=ir.TensorType(data))

    state, q, k, v, gates, real = (value("state"), value("q"), value("k"), value("v"), value("gates"),
                                   value("real", ir.DataType.BOOL))
    body = Graph()
    with body.scope(*outer.path.strip("/").split("/"), "step"):
        if delta:
            decay, beta = body.op.Split(gates, outer.constant([Hv, Hv], "int64"), axis=1, _outputs=2)  # (B, Hv, 1, 1)
        else:
            decay = gates
        decayed = body.op.Mul(state, decay)  # (B, Hv, Dk, Dv)
        written = v
        if delta:
            remembered = body.op.MatMul(k, decayed)  # kᵀS: (B, Hv, 1, Dv)
            written = body.op.Mul(body.op.Sub(v, remembered), beta)
        updated = body.op.Add(decayed, body.op.MatMul(body.op.Transpose(k, perm=[0, 1, 3, 2]), written))
        new_state = body.op.Where(real, updated, state)
        out = body.op.MatMul(q, new_state)  # qᵀS: (B, Hv, 1, Dv)
    for result in (new_state, out):
        result.type = ir.TensorType(elem)
    return ir.Graph(inputs=[state, q, k, v, gates, real], outputs=[new_state, out], nodes=body.tape.nodes,
                    name="recurrence_step")


__all__ = ["RecurrentHeads", "linear_recurrence"]
