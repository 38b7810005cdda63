"""CPU seconds of builder.quantize on one 16-bit matrix: the numpy path against the compiled kernel.

    python scripts/quantize_speed.py --shape 8192 2048 --runs 3
    python scripts/quantize_speed.py --dtype float16 --asymmetric --methods search

Prints the median CPU time (user + sys, one thread) of each method and path, and checks that the two
paths give the same bytes. The kernel's first call (compilation, or loading numba's cache) is timed
separately.
"""

from __future__ import annotations

import argparse
import statistics
import time

import ml_dtypes
import numpy as np

import builder.quantize as q


def cpu(fn) -> float:
    start = time.process_time()
    fn()
    return time.process_time() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", type=int, nargs=2, default=(8192, 2048))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--methods", nargs="+", default=["rtn", "search"])
    ap.add_argument("--asymmetric", action="store_true")
    ap.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16",
                    help="the matrix's dtype, as a checkpoint stores it")
    args = ap.parse_args()
    dtype = ml_dtypes.bfloat16 if args.dtype == "bfloat16" else np.dtype(args.dtype)
    w = (np.random.default_rng(0).standard_normal(args.shape) * 0.02).astype(dtype)
    sym = not args.asymmetric
    q.KERNEL_MIN_ELEMENTS = 0  # the first call below is small
    if q._kernel() is None:
        raise SystemExit("numba is not installed: pip install -e '.[fast]'")
    start = time.perf_counter()
    q.quantize(w[:8], 4, 32, sym, np.float32, "search")
    print(f"kernel first call (compile or cache load): {time.perf_counter() - start:.2f} s wall")
    for method in args.methods:
        times, outs = {}, {}
        for _ in range(args.runs):
            for use in (False, True):  # alternate the paths
                q.USE_KERNEL = use
                box = []
                times.setdefault(use, []).append(cpu(lambda: box.append(q.quantize(w, 4, 32, sym, np.float32, method))))
                outs[use] = box[0]
        same = all(np.array_equal(a, b) for a, b in zip(
            (outs[True].data, outs[True].scales, outs[True].zero_points),
            (outs[False].data, outs[False].scales, outs[False].zero_points)) if a is not None)
        numpy_s, kernel_s = statistics.median(times[False]), statistics.median(times[True])
        print(f"{method:6s} {'sym' if sym else 'asym'}: numpy {numpy_s:.2f} s, kernel {kernel_s:.2f} s CPU "
              f"({numpy_s / kernel_s:.1f}x, {kernel_s / w.size * 1e9:.2f} ns a weight); bytes identical: {same}")


if __name__ == "__main__":
    main()
