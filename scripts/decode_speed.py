"""Prefill and decode speed of built models in onnxruntime-genai, alternating runs, medians.

Every run feeds the same random prompt of --prompt tokens (ids below the vocabulary; greedy, with
min_length so no end token stops it) and times the prompt's run (append_tokens) and --new decode
steps (generate_next_token). Runs alternate between the folders, so a slower or busier moment of
the machine costs each model alike; with two folders, the median of the per-run ratios (second /
first) too.

Each run loads its model in a fresh process (after a short warm-up run), as a user's program
does. In one process the models loaded after the first decode faster: the same 1B int4 folder
loaded twice read 16.4 and 19.0 tok/s (an hour later 20.7 and 21.6), three times 15.1, 19.0 and
19.8 tok/s, so comparing models loaded side by side favoured the later ones (the cause is not
pinned down; where glibc places the weights' buffers is the suspect: docs/BENCHMARKS.md, "Huge
pages"). `--same-process` keeps that old protocol (faster: each model is loaded once).

    python scripts/decode_speed.py /work/synth/lfm2-ours /work/synth/lfm2-reference --runs 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np


def measure(model, vocab: int, prompt: int, new: int, seed: int, clock=time.perf_counter) -> tuple[float, float]:
    """(prefill tokens/s, decode tokens/s) of one greedy run, timed by `clock`."""
    import onnxruntime_genai as og

    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=prompt + new, min_length=prompt + new)
    generator = og.Generator(model, params)
    ids = np.random.default_rng(seed).integers(0, vocab, (1, prompt)).astype(np.int32)
    start = clock()
    generator.append_tokens(ids)
    prefilled = clock()
    steps = 0
    while not generator.is_done() and steps < new:
        generator.generate_next_token()
        steps += 1
    done = clock()
    return prompt / (prefilled - start), steps / (done - prefilled)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folders", nargs="+", type=Path)
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, help="ONNX Runtime's intra-op threads (default: genai_config.json's)")
    ap.add_argument("--cpu-time", action="store_true",
                    help="time by this thread's CPU time (with --threads 1 ONNX Runtime computes on the calling "
                         "thread): what other processes on a shared machine take is not counted")
    ap.add_argument("--same-process", action="store_true",
                    help="load every model once in this process (later-loaded models decode faster: see above)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)  # one run of one folder, as JSON
    args = ap.parse_args(argv)
    if args.cpu_time and args.threads != 1:
        ap.error("--cpu-time counts the calling thread only: it needs --threads 1")
    if not args.same_process and not args.child:
        return _isolated(args, argv if argv is not None else sys.argv[1:])
    import onnxruntime_genai as og

    def load(folder: Path):
        config = og.Config(str(folder))
        if args.threads is not None:
            config.overlay(json.dumps({"model": {"decoder": {"session_options": {"intra_op_num_threads": args.threads}}}}))
        return og.Model(config)

    clock = time.thread_time if args.cpu_time else time.perf_counter
    models = {f: load(f) for f in args.folders}
    vocab = {f: json.loads((f / "genai_config.json").read_text())["model"]["vocab_size"] for f in args.folders}
    for f, model in models.items():  # warm-up: first-run allocations are not the model's speed
        measure(model, vocab[f], 16, 4, 0)
    if args.child:  # --runs is the run's seed here
        (f, model), = models.items()
        print(json.dumps(measure(model, vocab[f], args.prompt, args.new, args.runs, clock)))
        return 0
    seen: dict[Path, list[tuple[float, float]]] = {f: [] for f in args.folders}
    for run in range(args.runs):
        for f, model in models.items():
            seen[f].append(measure(model, vocab[f], args.prompt, args.new, run, clock))
            print(f"run {run} {f.name}: prefill {seen[f][-1][0]:.1f} tok/s, decode {seen[f][-1][1]:.2f} tok/s",
                  file=sys.stderr)
    return _report(seen)


def _isolated(args: argparse.Namespace, argv: list[str]) -> int:
    """Each run of each folder in a process of its own (this script with --child)."""
    import subprocess

    options = [a for a in argv if not Path(a).is_dir()]  # the flags, without the folders
    seen: dict[Path, list[tuple[float, float]]] = {f: [] for f in args.folders}
    for run in range(args.runs):
        for f in args.folders:
            cmd = [sys.executable, __file__, str(f), *options, "--child", "--runs", str(run)]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True)
            seen[f].append(tuple(json.loads(out.stdout.strip().splitlines()[-1])))
            print(f"run {run} {f.name}: prefill {seen[f][-1][0]:.1f} tok/s, decode {seen[f][-1][1]:.2f} tok/s",
                  file=sys.stderr)
    return _report(seen)


def _report(seen: dict[Path, list[tuple[float, float]]]) -> int:
    for f, rows in seen.items():
        prefill, decode = (statistics.median(r[k] for r in rows) for k in (0, 1))
        print(f"{f.name}: prefill {prefill:.1f} tok/s, decode {decode:.2f} tok/s (medians of {len(rows)})")
    if len(seen) == 2:  # on a shared machine the load moves between runs: compare each run with its neighbour's
        (a, first), (b, second) = seen.items()
        prefill, decode = (statistics.median(y[k] / x[k] for x, y in zip(first, second)) for k in (0, 1))
        print(f"{b.name} / {a.name}: prefill {prefill:.3f}x, decode {decode:.3f}x (medians of per-run ratios)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
