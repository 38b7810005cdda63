"""One decode step of one DeepSeek-V3 attention layer on ONNX Runtime's CPU, for the two cache
layouts of multi-head latent attention: the latent (what architectures/deepseek_v3.py builds: the
query absorbs W_UK, one KV head of rank + rope, W_UV after) against the per-head keys and values
(kv_b_proj expands the new token's latent; heads KV heads of nope + rope, V padded to that width).
Float32, V3's sizes (128 heads, rank 512, rope 64, nope 128, v 128), the rotary left out of both.

    python scripts/mla_cache_speed.py --context 512 2048 8192
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

HEADS, RANK, ROPE, NOPE, V = 128, 512, 64, 128, 128


def _session(nodes, inputs, outputs, inits) -> ort.InferenceSession:
    graph = helper.make_graph(nodes, "mla", inputs, outputs, initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)],
                              ir_version=10)
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def _io(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def _const(name, value):
    return numpy_helper.from_array(np.asarray(value), name)


def latent(rng) -> ort.InferenceSession:
    """q (1, 1, heads, nope + rope), the new latent and k_pe -> GQA over [k_pe | c], one KV head."""
    w_uk = rng.standard_normal((HEADS, NOPE, RANK)).astype(np.float32) * 0.05
    w_uv = rng.standard_normal((HEADS, RANK, V)).astype(np.float32) * 0.05
    nodes = [
        helper.make_node("Split", ["q", "split_q"], ["q_nope", "q_pe"], axis=-1),
        helper.make_node("Transpose", ["q_nope"], ["q_nope_t"], perm=[0, 2, 1, 3]),
        helper.make_node("MatMul", ["q_nope_t", "w_uk"], ["q_lat_t"]),
        helper.make_node("Transpose", ["q_lat_t"], ["q_lat"], perm=[0, 2, 1, 3]),
        helper.make_node("Concat", ["q_pe", "q_lat"], ["q_full"], axis=-1),
        helper.make_node("Reshape", ["q_full", "q_shape"], ["query"]),
        helper.make_node("Concat", ["k_pe", "c"], ["key"], axis=-1),
        helper.make_node("GroupQueryAttention", ["query", "key", "key", "past_k", "past_v", "seqlens", "total"],
                         ["attn", "present_k", "present_v"], domain="com.microsoft", num_heads=HEADS, kv_num_heads=1,
                         scale=0.07),
        helper.make_node("Reshape", ["attn", "o_shape"], ["attn4"]),
        helper.make_node("Slice", ["attn4", "lat_start", "lat_end", "axis3"], ["attn_lat"]),
        helper.make_node("Transpose", ["attn_lat"], ["attn_t"], perm=[0, 2, 1, 3]),
        helper.make_node("MatMul", ["attn_t", "w_uv"], ["out"]),
    ]
    inits = [_const("w_uk", w_uk), _const("w_uv", w_uv), _const("split_q", np.array([NOPE, ROPE], np.int64)),
             _const("q_shape", np.array([0, 0, HEADS * (ROPE + RANK)], np.int64)),
             _const("o_shape", np.array([0, 0, HEADS, ROPE + RANK], np.int64)),
             _const("lat_start", np.array([ROPE], np.int64)), _const("lat_end", np.array([ROPE + RANK], np.int64)),
             _const("axis3", np.array([3], np.int64))]
    inputs = [_io("q", [1, 1, HEADS, NOPE + ROPE]), _io("c", [1, 1, RANK]), _io("k_pe", [1, 1, ROPE]),
              _io("past_k", [1, 1, "T", ROPE + RANK]), _io("past_v", [1, 1, "T", ROPE + RANK]),
              helper.make_tensor_value_info("seqlens", TensorProto.INT32, [1]),
              helper.make_tensor_value_info("total", TensorProto.INT32, [])]
    return _session(nodes, inputs, [_io("out", None)], inits)


def decompressed(rng) -> ort.InferenceSession:
    """q, the new latent and k_pe -> kv_b_proj's keys and values per head, GQA over heads KV heads."""
    w_kv = rng.standard_normal((RANK, HEADS * (NOPE + V))).astype(np.float32) * 0.05
    width = NOPE + ROPE
    nodes = [
        helper.make_node("MatMul", ["c", "w_kv"], ["kv"]),
        helper.make_node("Reshape", ["kv", "kv_shape"], ["kv4"]),
        helper.make_node("Split", ["kv4", "split_kv"], ["k_nope", "v"], axis=-1),
        helper.make_node("Unsqueeze", ["k_pe", "axis2"], ["k_pe4"]),
        helper.make_node("Expand", ["k_pe4", "pe_shape"], ["k_pe_all"]),
        helper.make_node("Concat", ["k_nope", "k_pe_all"], ["k4"], axis=-1),
        helper.make_node("Pad", ["v", "v_pads"], ["v4"]),
        helper.make_node("Reshape", ["k4", "kv_flat"], ["key"]),
        helper.make_node("Reshape", ["v4", "kv_flat"], ["value"]),
        helper.make_node("Reshape", ["q", "kv_flat"], ["query"]),
        helper.make_node("GroupQueryAttention", ["query", "key", "value", "past_k", "past_v", "seqlens", "total"],
                         ["out", "present_k", "present_v"], domain="com.microsoft", num_heads=HEADS,
                         kv_num_heads=HEADS, scale=0.07),
    ]
    inits = [_const("w_kv", w_kv), _const("kv_shape", np.array([0, 0, HEADS, NOPE + V], np.int64)),
             _const("split_kv", np.array([NOPE, V], np.int64)), _const("axis2", np.array([2], np.int64)),
             _const("pe_shape", np.array([1, 1, HEADS, ROPE], np.int64)),
             _const("v_pads", np.array([0, 0, 0, 0, 0, 0, 0, width - V], np.int64)),
             _const("kv_flat", np.array([0, 0, HEADS * width], np.int64))]
    inputs = [_io("q", [1, 1, HEADS, width]), _io("c", [1, 1, RANK]), _io("k_pe", [1, 1, ROPE]),
              _io("past_k", [1, HEADS, "T", width]), _io("past_v", [1, HEADS, "T", width]),
              helper.make_tensor_value_info("seqlens", TensorProto.INT32, [1]),
              helper.make_tensor_value_info("total", TensorProto.INT32, [])]
    return _session(nodes, inputs, [_io("out", None)], inits)


def step_ms(session: ort.InferenceSession, heads: int, width: int, context: int, rng, reps: int) -> float:
    feed = {"q": rng.standard_normal((1, 1, HEADS, NOPE + ROPE)).astype(np.float32),
            "c": rng.standard_normal((1, 1, RANK)).astype(np.float32),
            "k_pe": rng.standard_normal((1, 1, ROPE)).astype(np.float32),
            "past_k": rng.standard_normal((1, heads, context, width)).astype(np.float32),
            "past_v": rng.standard_normal((1, heads, context, width)).astype(np.float32),
            "seqlens": np.array([context], np.int32), "total": np.array(context + 1, np.int32)}
    session.run(None, feed)
    start = time.perf_counter()
    for _ in range(reps):
        session.run(None, feed)
    return (time.perf_counter() - start) / reps * 1e3


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--context", type=int, nargs="+", default=[512, 2048, 8192])
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    forms = {"latent": (latent(rng), 1, ROPE + RANK), "per-head": (decompressed(rng), HEADS, NOPE + ROPE)}
    for context in args.context:
        for name, (session, heads, width) in forms.items():
            cache = 2 * heads * width * context * 4
            print(f"context {context:6d}  {name:9s} cache {cache / 2**20:8.1f} MiB/layer  "
                  f"step {step_ms(session, heads, width, context, rng, args.reps):8.3f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
