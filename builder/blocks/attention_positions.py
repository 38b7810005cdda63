"""Per-token factors of attention computed from the tokens' positions: Llama 4's attention
temperature (a query scale growing with the position) and its chunked attention's mask (keys in the
query's own chunk of positions), both derived from GroupQueryAttention's sequence lengths."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from builder.blocks.attention import SequenceLengths
from builder.graph import Graph
from builder.target import Target


def new_token_positions(g: Graph, tokens: ir.Value, lengths: SequenceLengths) -> ir.Value:
    """(B, S) int32: each new token's position, the tokens before it: seqlens_k + 1 − S, at least
    0 (a first prompt's right padding), plus its index among the new ones."""
    one = g.constant(1, np.int32)
    new = g.op.Shape(tokens, start=1, end=2)  # (1,): S
    new = g.op.Cast(g.op.Squeeze(new, g.constant([0], "int64")), to=ir.DataType.INT32)
    before = g.op.Max(g.op.Sub(g.op.Add(lengths.seqlens_k, one), new), g.constant(0, np.int32))  # (B,)
    return g.op.Add(g.op.Unsqueeze(before, g.constant([1], "int64")),
                    g.op.Range(g.constant(0, np.int32), new, one))  # (B, 1) + (S,) -> (B, S)


def attention_temperature(
    g: Graph, input_ids: ir.Value, lengths: SequenceLengths, beta: float, original_max_positions: int, target: Target,
    offset: int = 0,
) -> ir.Value:
    """Llama 4's attention temperature (transformers' ministral3 `get_llama_4_attn_scale`), the
    `q_scale` of self_attention: 1 + beta·log(1 + ⌊(position + offset) / original_max_positions⌋)
    per token, (B, S, 1), in float32 as there (Llama 4's own modeling file counts from 1: offset 1)."""
    with g.scope("model", "attn_temperature"):
        positions = new_token_positions(g, input_ids, lengths)
        if offset:
            positions = g.op.Add(positions, g.constant(offset, np.int32))
        blocks = g.op.Div(positions, g.constant(int(original_max_positions), np.int32))  # floor: both ≥ 0
        f_one = g.constant(1.0, np.float32)
        log = g.op.Log(g.op.Add(g.op.Cast(blocks, to=ir.DataType.FLOAT), f_one))
        scale = g.op.Add(g.op.Mul(log, g.constant(float(beta), np.float32)), f_one)
        scale = g.op.Cast(scale, to=ir.DataType.from_numpy(target.io_dtype))
        return g.op.Unsqueeze(scale, g.constant([2], "int64"))  # (B, S) -> (B, S, 1)


def chunk_mask(g: Graph, tokens: ir.Value, attention_mask: ir.Value, lengths: SequenceLengths, chunk: int,
               target: Target) -> ir.Value:
    """(B, 1, S, total) attention_bias of chunked attention (Llama 4's local layers): 0 where the key
    is in the query's chunk of `chunk` positions (⌊t / chunk⌋ = ⌊p / chunk⌋), −∞ elsewhere;
    GroupQueryAttention keeps it causal."""
    with g.scope("model", "chunk_mask"):
        size = g.constant(int(chunk), np.int32)
        queries = g.op.Div(new_token_positions(g, tokens, lengths), size)  # (B, S)
        total = g.op.Cast(g.op.Squeeze(g.op.Shape(attention_mask, start=1, end=2), g.constant([0], "int64")),
                          to=ir.DataType.INT32)
        keys = g.op.Div(g.op.Range(g.constant(0, np.int32), total, g.constant(1, np.int32)), size)  # (total,)
        same = g.op.Equal(g.op.Unsqueeze(queries, g.constant([1, 3], "int64")), keys)  # (B, 1, S, total)
        dtype = np.dtype(target.io_dtype)
        return g.op.Where(same, g.constant(0.0, dtype), g.constant(-np.inf, dtype))
