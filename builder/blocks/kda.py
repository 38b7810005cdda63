"""Kimi Delta Attention's recurrence (KimiLinearDeltaAttention): the gated delta rule with a decay
per key channel, as a standard-op Scan over the new tokens, in float32.

Reference: transformers/models/kimi_linear/modeling_kimi_linear.py (recurrent_kimi_delta_attention,
which its chunked form equals). Per head, the state S is key_dim × value_dim:

    S ← diag(exp(g_t)) · S                  g_t (key_dim,): one decay per key channel (row of S)
    S ← S + k_t ⊗ (β_t · (v_t − Sᵀ k_t))    β_t one per head
    o_t = Sᵀ q_t

with q and k l2-normalized per head (builder.blocks.gated_deltanet.l2_normalize, transformers'
l2norm) and q scaled by 1/√key_dim. The decay is applied before the delta update, as there.

Unlike Qwen3.5's gated DeltaNet (builder.blocks.linear_recurrence: one decay per head), the decay
differs along the state's key axis; builder feeds com.microsoft::LinearAttention one decay per
head, and whether it takes a per-key decay was not checked, so this is its own Scan, as Mamba-1's
(builder.blocks.mamba1).
Cost: one step per token of O(batch · heads · key_dim · value_dim) multiply-adds and ~10 small
kernels; no (S, heads, key_dim, value_dim) tensor is ever made.

A padding token (onnxruntime-genai pads shorter prompts on the right) gets k = 0 and g = 0:
exp(0) = 1 and 0 ⊗ … = 0, so the state passes it unchanged. The state in and out is
(batch, heads, key_dim, value_dim), transformers' recurrent state's layout, in the model's dtype.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from builder.blocks.gated_deltanet import l2_normalize
from builder.graph import Graph


def kda_rule(
    g: Graph, q: ir.Value, k: ir.Value, v: ir.Value, decay: ir.Value, beta: ir.Value, keep: ir.Value,
    past: ir.Value, key_dim: int, io_dtype: np.dtype,
) -> tuple[ir.Value, ir.Value]:
    """The rule over the new tokens: q, k (B, S, heads, key_dim) as projected (normalized here);
    v (B, S, heads, value_dim); `decay` g (B, S, heads, key_dim) in log space; `beta` (B, S, heads);
    `keep` (B, S, 1) 1 for a real token; `past` (B, heads, key_dim, value_dim). Inputs and outputs
    in `io_dtype`, the arithmetic in float32. Returns (the output (B, S, heads, value_dim), the
    present state)."""
    f32 = np.float32
    with g.scope("kda_rule"):
        if np.dtype(io_dtype) != f32:
            q, k, v, decay, beta, keep, past = (g.op.Cast(x, to=ir.DataType.FLOAT)
                                                for x in (q, k, v, decay, beta, keep, past))
        q = g.op.Mul(l2_normalize(g, q, f32), g.constant(1.0 / np.sqrt(key_dim), f32))
        keep4 = g.op.Unsqueeze(keep, g.constant([3], "int64"))  # (B, S, 1, 1)
        k = g.op.Mul(l2_normalize(g, k, f32), keep4)
        decay = g.op.Exp(g.op.Mul(decay, keep4))
        seq_first = [1, 0, 2, 3]
        rows = g.constant([3], "int64")
        qs, ks, vs = (g.op.Unsqueeze(g.op.Transpose(x, perm=seq_first), rows) for x in (q, k, v))  # (S, B, H, 1, D)
        decays = g.op.Unsqueeze(g.op.Transpose(decay, perm=seq_first), g.constant([4], "int64"))  # (S, B, H, Dk, 1)
        betas = g.op.Unsqueeze(g.op.Transpose(beta, perm=[1, 0, 2]), g.constant([3, 4], "int64"))  # (S, B, H, 1, 1)
        present, out = g.op.Scan(past, qs, ks, vs, decays, betas, body=_step(g), num_scan_inputs=5, _outputs=2)
        out = g.op.Transpose(g.op.Squeeze(out, rows), perm=seq_first)  # (S, B, H, 1, Dv) -> (B, S, H, Dv)
        if np.dtype(io_dtype) != f32:
            to = ir.DataType.from_numpy(np.dtype(io_dtype))
            out, present = g.op.Cast(out, to=to), g.op.Cast(present, to=to)
    return out, present


def _step(outer: Graph) -> ir.Graph:
    """The Scan body: one token's decay, delta update and output, on the (B, H, Dk, Dv) state."""
    elem = ir.DataType.FLOAT

    def value(name: str) -> ir.Value:
        return ir.Value(name=f"{outer.path}/step/{name}", type=ir.TensorType(elem))

    state, q, k, v, decay, beta = (value(n) for n in ("state", "q", "k", "v", "decay", "beta"))
    body = Graph()
    with body.scope(*outer.path.strip("/").split("/"), "step"):
        decayed = body.op.Mul(state, decay)  # each key row of S by its own exp(g): (B, H, Dk, Dv)
        remembered = body.op.MatMul(k, decayed)  # kᵀS: (B, H, 1, Dv)
        written = body.op.Mul(body.op.Sub(v, remembered), beta)
        new_state = body.op.Add(decayed, body.op.MatMul(body.op.Transpose(k, perm=[0, 1, 3, 2]), written))
        out = body.op.MatMul(q, new_state)  # qᵀS: (B, H, 1, Dv)
    for result in (new_state, out):
        result.type = ir.TensorType(elem)
    return ir.Graph(inputs=[state, q, k, v, decay, beta], outputs=[new_state, out], nodes=body.tape.nodes,
                    name="kda_step")


__all__ = ["kda_rule"]
