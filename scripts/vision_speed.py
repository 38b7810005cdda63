"""Speed and peak memory of a Qwen-VL package's vision.onnx on one image grid, in ONNX Runtime.

Each run is a fresh process per folder, runs alternating between the folders: it opens the
session, encodes random patches of `--grid T H W` once to warm up and once timed, and reports the
timed run's seconds and the process's peak RSS (VmHWM). Medians over `--runs`.

    python scripts/vision_speed.py /tmp/vl-before /tmp/vl-after --grid 1 72 72 --runs 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import json, sys, time
import numpy as np, onnxruntime as ort
folder, t, h, w, threads = sys.argv[1], *map(int, sys.argv[2:])
options = ort.SessionOptions()
options.intra_op_num_threads = threads
session = ort.InferenceSession(f"{folder}/vision.onnx", options, providers=["CPUExecutionProvider"])
width = session.get_inputs()[0].shape[1]
pixels = np.random.default_rng(0).standard_normal((t * h * w, width)).astype(np.float32)
feed = {"pixel_values": pixels, "image_grid_thw": np.array([[t, h, w]], np.int64)}
session.run(None, feed)
start = time.perf_counter()
session.run(None, feed)
seconds = time.perf_counter() - start
peak = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM"))
print(json.dumps({"seconds": seconds, "peak_mb": peak / 1024}))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folders", nargs="+", type=Path)
    ap.add_argument("--grid", nargs=3, type=int, default=[1, 72, 72], metavar=("T", "H", "W"),
                    help="image_grid_thw in patches (72 x 72: a 1008 x 1008 image)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    results: dict[Path, list[dict]] = {f: [] for f in args.folders}
    for run in range(args.runs):
        for folder in args.folders:
            out = subprocess.run([sys.executable, "-c", CHILD, str(folder), *map(str, args.grid), str(args.threads)],
                                 capture_output=True, text=True, check=True)
            results[folder].append(json.loads(out.stdout.strip().splitlines()[-1]))
            r = results[folder][-1]
            print(f"run {run} {folder.name}: {r['seconds']:.2f} s, peak {r['peak_mb']:.0f} MB", flush=True)
    for folder, rs in results.items():
        print(f"{folder.name}: {statistics.median(r['seconds'] for r in rs):.2f} s, peak "
              f"{statistics.median(r['peak_mb'] for r in rs):.0f} MB (medians of {len(rs)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
