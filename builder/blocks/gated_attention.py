"""Attention with an output gate: the usual GroupQueryAttention over normed, rotated q and k, its
output multiplied by sigmoid(x · W_gateᵀ) before o_proj. The gate is one logit per channel
(Qwen3.5's, Qwen3-Next's and MiniCPM5-MoE's full attention: their query projection stores each
head's query rows then its gate rows, head_dim each, which `split_query_gate` takes apart), or one
per head (LFM3's g_proj: [heads, hidden]), which scales the head's whole output."""

from __future__ import annotations

import onnx_ir as ir

from builder.blocks.attention import (
    AttentionSpec,
    AttentionWeights,
    SequenceLengths,
    group_query_attention,
    _qkv_projection,
    _queries_keys_values,
)
from builder.blocks.linear import linear
from builder.blocks.rope import ExplicitRotary
from builder.graph import Graph
from builder.lazy import Weight
from builder.target import Target


def split_query_gate(q_proj: Weight, heads: int, head_dim: int) -> tuple[Weight, Weight]:
    """(query rows, gate rows) of a q_proj whose output per head is [query (head_dim), gate (head_dim)]."""
    rows = [q_proj.slice(0, 2 * head_dim * h + part * head_dim, 2 * head_dim * h + (part + 1) * head_dim)
            for part in (0, 1) for h in range(heads)]
    return Weight.concat(rows[:heads], axis=0), Weight.concat(rows[heads:], axis=0)


def gated_self_attention(
    g: Graph, x: ir.Value, past: tuple[ir.Value, ir.Value], lengths: SequenceLengths,
    rotary: tuple[ir.Value, ir.Value] | ExplicitRotary, w: AttentionWeights, gate: Weight, spec: AttentionSpec,
    target: Target, gate_bias: Weight | None = None,
) -> tuple[ir.Value, ir.Value, ir.Value]:
    """Returns (the gated attention output after o_proj, present key, present value); `gate_bias`:
    the gate rows' share of q_proj's bias (MiniCPM5-MoE's attention_bias). q and k are
    normed per head (w.q_norm, w.k_norm) and rotated: by GroupQueryAttention (`rotary`: cos, sin),
    or before it (an ExplicitRotary: a rotary width GroupQueryAttention cannot take, as a 48-wide
    head's 0.25 = 12)."""
    qkv = _qkv_projection(g, x, w, spec, target)
    explicit = rotary if isinstance(rotary, ExplicitRotary) else None
    q, k, v = _queries_keys_values(g, qkv, explicit, lengths, w, spec, target, None)
    fused = None if explicit is not None else rotary
    out, present_k, present_v = group_query_attention(g, (q, k, v), past, lengths, fused, w.sinks, spec, target)
    with g.scope("gate"):
        scores = g.op.Sigmoid(linear(g, x, gate, target, gate_bias))
        if gate.shape[0] == spec.num_heads != spec.num_heads * spec.head_dim:  # a logit per head
            heads, size = spec.num_heads, spec.head_dim
            out = g.op.Reshape(out, g.constant([0, 0, heads, size], "int64"))  # (B, S, heads, head_dim)
            out = g.op.Mul(out, g.op.Unsqueeze(scores, g.constant([3], "int64")))
            out = g.op.Reshape(out, g.constant([0, 0, heads * size], "int64"))
        else:
            out = g.op.Mul(out, scores)
    with g.scope("o_proj"):
        out = linear(g, out, w.o, target, w.o_bias)
    return out, present_k, present_v


__all__ = ["gated_self_attention", "split_query_gate"]
