"""A short causal depthwise convolution over time with a carried state (LFM2's ShortConv), in
standard ONNX ops: the state (the last kernel−1 inputs) is put before the new inputs, a grouped
Conv without padding gives one output per new input, and the kernel−1 inputs up to each row's
last real one are the present state. A prompt shorter than the kernel reads the zeros the state
starts as, exactly the left zero-padding of transformers' causal_conv1d."""

from __future__ import annotations

from dataclasses import dataclass

import onnx_ir as ir

from builder.blocks.float_ops import op_dtype, to_dtype
from builder.graph import Graph
from builder.lazy import Weight
from builder.target import Target

# Slice's "to the end" (ONNX clamps it to the dimension).
_END = 2**63 - 1


@dataclass(frozen=True)
class Padding:
    """Where each row's real tokens are among the new ones, from the attention mask's last
    `sequence` entries: `keep` (batch, sequence, 1) is 1 for a real token, 0 for padding;
    `ends` (batch,) is the index after the row's last real token (onnxruntime-genai pads a batch's
    shorter prompts on the right, transformers on the left: both are found)."""

    keep: ir.Value
    ends: ir.Value


def padding(g: Graph, input_ids_or_embeds: ir.Value, attention_mask: ir.Value, target: Target) -> Padding:
    """The Padding of this run's new tokens, computed once for every convolution layer."""
    with g.scope("model", "conv_padding"):
        length = g.op.Shape(input_ids_or_embeds, start=1, end=2)  # (1,)
        mask = g.op.Slice(attention_mask, g.op.Neg(length), g.constant([_END], "int64"), g.constant([1], "int64"))
        keep = g.op.Unsqueeze(g.op.Cast(mask, to=ir.DataType.from_numpy(target.io_dtype)), g.constant([2], "int64"))
        positions = g.op.Range(g.constant(1, "int64"), g.op.Add(g.op.Squeeze(length, g.constant([0], "int64")),
                                                                 g.constant(1, "int64")), g.constant(1, "int64"))
        ends = g.op.ReduceMax(g.op.Mul(mask, positions), g.constant([1], "int64"), keepdims=0)  # (B,)
    return Padding(keep, ends)


def causal_conv(
    g: Graph, x: ir.Value, past: ir.Value, weight: Weight, bias: Weight | None, pad: Padding, target: Target,
    scope: str = "conv",
) -> tuple[ir.Value, ir.Value]:
    """Depthwise causal conv of x (batch, sequence, channels) with per-channel kernels `weight`
    (channels, 1, kernel) and `bias` (channels); `past` (batch, channels, kernel−1) holds the inputs
    before x. Padding is zeroed before it enters; the present state is the kernel−1 inputs up to
    each row's last real token. Returns (the output, batch × sequence × channels; the present
    state). The kernel and bias stay float in every precision; `scope`: the conv module's name."""
    channels, _, kernel = weight.shape
    with g.scope(scope):
        seq_first = g.op.Transpose(g.op.Mul(x, pad.keep), perm=[0, 2, 1])  # (B, C, S)
        window = g.op.Concat(past, seq_first, axis=2)  # (B, C, kernel−1+S)
        present = _state_before(g, window, pad.ends, kernel - 1)
        conv = op_dtype(target.io_dtype)
        w = g.weight("weight", weight.astype(conv))
        b = g.weight("bias", bias.astype(conv)) if bias is not None else None
        y = g.op.Conv(to_dtype(g, window, target.io_dtype, conv), w, b, group=channels, kernel_shape=[kernel])  # (B, C, S)
        return g.op.Transpose(to_dtype(g, y, conv, target.io_dtype), perm=[0, 2, 1]), present


def _state_before(g: Graph, window: ir.Value, ends: ir.Value, length: int) -> ir.Value:
    """window[b, :, ends[b] : ends[b] + length]: the `length` inputs up to row b's last real one
    (the window starts with the `length` past inputs, so new token t is at length + t)."""
    taps = g.op.Add(g.op.Unsqueeze(ends, g.constant([1, 2], "int64")), g.constant(list(range(length)), "int64"))
    shape = g.op.Concat(g.op.Shape(window, start=0, end=2), g.constant([length], "int64"), axis=0)
    return g.op.GatherElements(window, g.op.Expand(taps, shape), axis=2)


__all__ = ["Padding", "causal_conv", "padding"]
