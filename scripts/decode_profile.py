"""Where one decode step's time goes, by operator type (ONNX Runtime's profiler, CPU provider).

Each folder's model.onnx runs --steps decode steps of one token over a past of --past positions
(zeros: the arithmetic is that of real ones) after --warmup steps; prints the mean step and the
operator types that take the most. The KV shape comes from the folder's genai_config.json.

    python scripts/decode_profile.py /work/synth/ours-int4 /work/synth/ref-int4 --threads 2
"""

from __future__ import annotations

import argparse
import collections
import json
import tempfile
from pathlib import Path

import numpy as np


def profile(folder: Path, past: int, steps: int, warmup: int, threads: int) -> tuple[float, dict[str, tuple[float, int]]]:
    """(mean ms a step, op type -> (mean ms a step, nodes a step)) over the steps after warm-up."""
    import onnxruntime as ort

    decoder = json.loads((folder / "genai_config.json").read_text())["model"]["decoder"]
    kv_shape = (1, decoder["num_key_value_heads"], past, decoder["head_size"])
    options = ort.SessionOptions()
    options.enable_profiling = True
    options.intra_op_num_threads = threads
    options.profile_file_prefix = str(Path(tempfile.mkdtemp()) / folder.name)
    session = ort.InferenceSession(str(folder / "model.onnx"), options, providers=["CPUExecutionProvider"])
    feed = {"input_ids": np.array([[5]], np.int64), "attention_mask": np.ones((1, past + 1), np.int64)}
    for meta in session.get_inputs():
        if meta.name.startswith("past"):
            feed[meta.name] = np.zeros(kv_shape, np.float32 if meta.type == "tensor(float)" else np.float16)
        elif meta.name == "position_ids":
            feed[meta.name] = np.array([[past]], np.int64)
    for _ in range(warmup + steps):
        session.run(None, feed)
    events = json.loads(Path(session.end_profiling()).read_text())
    runs = [e for e in events if e.get("name") == "model_run"]
    first = runs[warmup]["ts"]  # node events after the warm-up's runs
    times, counts = collections.Counter(), collections.Counter()
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time") and e["ts"] >= first:
            times[e["args"]["op_name"]] += e["dur"]
            counts[e["args"]["op_name"]] += 1
    step = sum(e["dur"] for e in runs[warmup:]) / steps / 1000
    return step, {op: (t / steps / 1000, counts[op] // steps) for op, t in times.most_common()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folders", nargs="+", type=Path)
    p.add_argument("--past", type=int, default=128)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--top", type=int, default=6)
    args = p.parse_args()
    for folder in args.folders:
        step, ops = profile(folder, args.past, args.steps, args.warmup, args.threads)
        print(f"{folder.name}: {step:.2f} ms a step")
        for op, (ms, nodes) in list(ops.items())[: args.top]:
            print(f"    {op:36s} {ms:7.3f} ms  ({nodes} nodes)")


if __name__ == "__main__":
    main()
