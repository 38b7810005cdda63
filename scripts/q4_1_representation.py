"""How to run a GGUF Q4_1 weight (w = d·q + m per block of 32: a scale and a float minimum) in
ONNX Runtime exactly, and at what speed (ONNX Runtime CPU, MatMulNBits).

An integer zero point cannot hold −m/d. The candidates, each a graph of `--copies` weights of
[N, K] read by one input (more than the L3 cache holds, as a model's weights are):

- plain: MatMulNBits with codes and scales only (implicit zero point 8): the speed of the lossy
  symmetric int4 re-quantization builder wrote before. Its error is against its own weights.
- uint8-zp: the same with explicit uint8 zero points (an asymmetric int4 re-quantization).
- float-zp: MatMulNBits with float zero points zp = −m/d (the spec allows zero points in the
  scales' type): (q − zp)·d, equal to m + d·q only where −m/d·d rounds back to m.
- min-term-zp0: MatMulNBits with the codes as stored and explicit zero points 0 (d·q), plus each
  block's minimum times the sum of the block's inputs: ReduceSum(Reshape(x, [..., K/32, 32]), -1)
  · M [K/32, N], then Add. Exact in real arithmetic.
- min-term: what builder writes (builder/inputs/gguf/blocks.py): the same with zero points 8, (q − 8)·d,
  and the offset m + 8·d (builder takes 8 where that sum is a float32 exactly, as it is for every
  block here, else 0): centred weights for accuracy_level 4's int8 activations.

Prints median milliseconds per weight (decode M=1, prefill M=128) at accuracy_level 0 and 4, and the
relative max error against the float64 product with the weights the graph means to hold.

    python scripts/q4_1_representation.py [--k 2048] [--n 8192] [--copies 8] [--runs 30] [--threads 2]

Needs onnx and onnxruntime.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

BLOCK = 32
KINDS = ("plain", "uint8-zp", "float-zp", "min-term-zp0", "min-term")


def q4_1_weight(n: int, k: int, rng) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Codes uint8 [N, K] in 0..15, scales d and minimums m fp16 [N, K/32], as llama.cpp's
    quantizer makes them (d = (max − min)/15, m = min)."""
    w = rng.standard_normal((n, k // BLOCK, BLOCK)).astype(np.float32) * 0.02
    lo, hi = w.min(-1), w.max(-1)
    d = ((hi - lo) / 15).astype(np.float16)
    m = lo.astype(np.float16)
    q = np.clip(np.round((w - m[..., None].astype(np.float32)) / d[..., None].astype(np.float32)), 0, 15)
    return q.astype(np.uint8).reshape(n, k), d, m


def meant(kind: str, q, d, m) -> np.ndarray:
    """The float64 [N, K] weight each graph means: Q4_1's own, or (q − zp)·d for the re-quantizations."""
    s = d.astype(np.float64).repeat(BLOCK, 1)
    if kind == "plain":
        return (q - 8.0) * s
    if kind == "uint8-zp":
        return (q - 8.0) * s  # zero points all 8, written out
    return q * s + m.astype(np.float64).repeat(BLOCK, 1)


def weight_nodes(kind: str, i: int, q, d, m, level: int):
    n, k = q.shape
    kb = k // BLOCK
    p = f"w{i}."
    inits = [numpy_helper.from_array(((q[:, 0::2]) | (q[:, 1::2] << 4)).reshape(n, kb, BLOCK // 2), p + "B"),
             numpy_helper.from_array(d.astype(np.float32).reshape(-1), p + "scales")]
    inputs = ["x", p + "B", p + "scales"]
    d32, m32 = d.astype(np.float32), m.astype(np.float32)
    if kind == "uint8-zp":
        inits.append(numpy_helper.from_array(np.full((n, kb // 2), 0x88, np.uint8), p + "zp"))
    elif kind == "float-zp":
        inits.append(numpy_helper.from_array((-(m32 / d32)).reshape(-1), p + "zp"))
    elif kind == "min-term-zp0":
        inits.append(numpy_helper.from_array(np.zeros((n, kb // 2), np.uint8), p + "zp"))
    elif kind == "min-term":
        inits.append(numpy_helper.from_array(np.full((n, kb // 2), 0x88, np.uint8), p + "zp"))
    if len(inits) == 3:
        inputs.append(p + "zp")
    minterm = kind.startswith("min-term")
    out = f"y{i}" if not minterm else p + "dq"
    nodes = [helper.make_node("MatMulNBits", inputs, [out], domain="com.microsoft", K=k, N=n, bits=4,
                              block_size=BLOCK, accuracy_level=level)]
    if minterm:
        offset = m32 if kind == "min-term-zp0" else m32 + 8 * d32
        assert kind == "min-term-zp0" or np.array_equal(offset.astype(np.float64) - 8 * d.astype(np.float64),
                                                        m.astype(np.float64)), "m + 8d not exact in float32"
        inits.append(numpy_helper.from_array(np.ascontiguousarray(offset.T), p + "offsets"))
        nodes += [helper.make_node("MatMul", ["sums", p + "offsets"], [p + "offset"]),  # (B, S, N)
                  helper.make_node("Add", [p + "dq", p + "offset"], [f"y{i}"])]
    return nodes, inits


def model(kind: str, weights, level: int) -> onnx.ModelProto:
    n, k = weights[0][0].shape
    nodes, inits = [], []
    if kind.startswith("min-term"):
        inits += [numpy_helper.from_array(np.array([0, 0, k // BLOCK, BLOCK], np.int64), "blocked"),
                  numpy_helper.from_array(np.array([-1], np.int64), "last")]
        nodes += [helper.make_node("Reshape", ["x", "blocked"], ["xb"]),  # (B, S, K) -> (B, S, K/32, 32)
                  helper.make_node("ReduceSum", ["xb", "last"], ["sums"], keepdims=0)]  # (B, S, K/32)
    for i, (q, d, m) in enumerate(weights):
        more_nodes, more_inits = weight_nodes(kind, i, q, d, m, level)
        nodes += more_nodes
        inits += more_inits
    outputs = [helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, [1, "S", n]) for i in range(len(weights))]
    graph = helper.make_graph(nodes, kind, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "S", k])],
                              outputs, inits)
    return helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 21),
                                                                  helper.make_opsetid("com.microsoft", 1)])


def interleaved_ms(sessions: dict, x: np.ndarray, runs: int) -> dict[str, float]:
    """Median milliseconds per call of each session, their runs interleaved so that a busy moment
    on a shared machine falls on all of them alike."""
    times = {kind: [] for kind in sessions}
    for session in sessions.values():
        session.run(None, {"x": x})
    for _ in range(runs):
        for kind, session in sessions.items():
            start = time.perf_counter()
            session.run(None, {"x": x})
            times[kind].append(time.perf_counter() - start)
    return {kind: 1000 * statistics.median(t) for kind, t in times.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--k", type=int, default=2048)
    p.add_argument("--n", type=int, default=8192)
    p.add_argument("--copies", type=int, default=8)
    p.add_argument("--runs", type=int, default=30)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    rng = np.random.default_rng(0)
    weights = [q4_1_weight(args.n, args.k, rng) for _ in range(args.copies)]
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = args.threads
    print(f"onnxruntime {ort.__version__} CPU, {args.threads} threads, K={args.k}, N={args.n}, {args.copies} weights "
          f"a graph, median of {args.runs} runs; ms per weight; error: relative max error of weight 0's product")
    print("| representation | accuracy_level | M=1 (ms) | M=128 (ms) | error |\n|---|---|---|---|---|")
    xs = {rows: rng.standard_normal((1, rows, args.k)).astype(np.float32) for rows in (1, 128)}
    for level in (0, 4):
        sessions = {kind: ort.InferenceSession(model(kind, weights, level).SerializeToString(), opts,
                                               providers=["CPUExecutionProvider"]) for kind in KINDS}
        times = {rows: interleaved_ms(sessions, x, args.runs if rows == 1 else max(args.runs // 5, 3))
                 for rows, x in xs.items()}
        for kind, session in sessions.items():
            err = 0.0
            for x in xs.values():
                y = session.run(["y0"], {"x": x})[0][0].astype(np.float64)
                want = x[0].astype(np.float64) @ meant(kind, *weights[0]).T
                err = max(err, float(np.abs(y - want).max() / np.abs(want).max()))
            print(f"| {kind} | {level} | {times[1][kind] / args.copies:.3f} | {times[128][kind] / args.copies:.2f} "
                  f"| {err:.1e} |")
        del sessions


if __name__ == "__main__":
    main()
