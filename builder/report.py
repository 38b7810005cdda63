"""What a build will do, known before it runs: sizes, op histogram, predicted peak memory and disk.

Everything here reads the recorded graph and the safetensors headers only; no weight is computed.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass

import onnx_ir as ir

from builder.materialize import ROW_BLOCK_BYTES
from builder.quantize import ROW_CHUNK_ELEMENTS
from builder.writer import INLINE_BYTES, MAX_WORKERS, content_keys, data_tensors

# Interpreter, numpy, onnx_ir and the recorded graph, measured on a tiny build (about 80 MB) plus margin.
BASE_RSS = 128 * 2**20
# float32 temporaries of one quantization chunk (input, codes, rounding), per writer thread.
QUANTIZE_SCRATCH = 6 * 4 * ROW_CHUNK_ELEMENTS
# The compiled quantizer's code once loaded (numba and llvmlite; measured 105 MB), in a build that
# quantizes float values (not one that keeps a GGUF's stored blocks).
QUANTIZER_RSS = 112 * 2**20
QUANTIZED_OPS = ("com.microsoft::MatMulNBits", "com.microsoft::GatherBlockQuantized", "com.microsoft::QMoE",
                 "DequantizeLinear")


@dataclass(frozen=True)
class Estimate:
    data_bytes: int  # model.onnx.data
    proto_bytes: int  # model.onnx
    peak_rss: int
    ops: dict[str, int]


def _weights(model: ir.Model):
    return [v.const_value for v in model.graph.initializers.values() if v.const_value is not None]


def estimate(model: ir.Model, sources: dict[str, list[int]], members: dict[str, int] | None = None,
             stored: set | None = None, quantizes: bool | None = None) -> Estimate:
    """`sources`: for each initializer, the bytes of each checkpoint tensor its recipe reads;
    `members`: the initializers written one member at a time (stacks of experts), how many;
    `stored`: the content keys the models written before this one store (their values are not
    written again: writer.save_models); this model's are added. `quantizes`: weights are quantized
    from float values as they are written (Graph.quantizes; None: any quantized operator says so)."""
    tensors = _weights(model)
    stored = set() if stored is None else stored
    external = data_tensors(model, stored)
    referenced = len(data_tensors(model)) - len(external)  # stored by an earlier model: a record only
    stored |= content_keys(external)
    data = sum(t.nbytes for t in external)
    # The proto holds the graph, inline constants and ~100 bytes of external-data record per weight.
    nodes = sum(1 for _ in model.graph.all_nodes())
    proto = sum(t.nbytes for t in tensors if t.nbytes <= INLINE_BYTES) + 160 * (len(external) + referenced) + 400 * nodes
    # Peak: each writer thread holds one tensor's output plus what it has mapped of the source —
    # a row block, as pages are handed back while converting — or a whole concatenation of
    # several sources (a fused QKV written whole). The two largest such tensors may be in flight
    # together. A stack of experts holds one expert's output and sources at a time; a value written
    # a block of rows at a time (an embedding, a float linear's matrix, a fused QKV of such parts),
    # one block.
    def transient(t) -> int:
        if getattr(t, "held", None) is not None:
            return min(t.held, t.nbytes + sum(sources.get(t.name, [])))
        parts, count = sources.get(t.name, []), (members or {}).get(t.name, 1)
        if count > 1:
            return (t.nbytes + sum(parts)) // count
        held = sum(parts) if len(parts) > 1 else min(sum(parts), 2 * ROW_BLOCK_BYTES)
        return t.nbytes + held

    per_tensor = sorted((transient(t) for t in external), reverse=True)
    ops = collections.Counter(f"{n.domain + '::' if n.domain else ''}{n.op_type}" for n in model.graph.all_nodes())
    if quantizes is None:
        quantizes = any(op in ops for op in QUANTIZED_OPS)
    peak = BASE_RSS + sum(per_tensor[:MAX_WORKERS]) + quantizes * (MAX_WORKERS * QUANTIZE_SCRATCH + QUANTIZER_RSS)
    return Estimate(data, proto, peak, dict(sorted(ops.items())))


def combined(estimates: list[Estimate]) -> Estimate:
    """A package of models written one after another: sizes and operators add up, the peak is the
    largest of theirs."""
    ops = collections.Counter()
    for e in estimates:
        ops.update(e.ops)
    return Estimate(sum(e.data_bytes for e in estimates), sum(e.proto_bytes for e in estimates),
                    max(e.peak_rss for e in estimates), dict(sorted(ops.items())))
