"""Prefill and decode speed of built models in onnxruntime-genai, alternating runs, medians.

Each folder is loaded once; every run feeds the same random prompt of --prompt tokens (ids below
the vocabulary; greedy, with min_length so no end token stops it) and times the prompt's run
(append_tokens) and --new decode steps (generate_next_token). Runs alternate between the folders,
so a slower or busier moment of the machine costs each model alike.

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


def measure(model, vocab: int, prompt: int, new: int, seed: int) -> tuple[float, float]:
    """(prefill tokens/s, decode tokens/s) of one greedy run."""
    import onnxruntime_genai as og

    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=prompt + new, min_length=prompt + new)
    generator = og.Generator(model, params)
    ids = np.random.default_rng(seed).integers(0, vocab, (1, prompt)).astype(np.int32)
    start = time.perf_counter()
    generator.append_tokens(ids)
    prefilled = time.perf_counter()
    steps = 0
    while not generator.is_done() and steps < new:
        generator.generate_next_token()
        steps += 1
    done = time.perf_counter()
    return prompt / (prefilled - start), steps / (done - prefilled)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folders", nargs="+", type=Path)
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args(argv)
    import onnxruntime_genai as og

    models = {f: og.Model(str(f)) for f in args.folders}
    vocab = {f: json.loads((f / "genai_config.json").read_text())["model"]["vocab_size"] for f in args.folders}
    for f, model in models.items():  # warm-up: first-run allocations are not the model's speed
        measure(model, vocab[f], 16, 4, 0)
    seen: dict[Path, list[tuple[float, float]]] = {f: [] for f in args.folders}
    for run in range(args.runs):
        for f, model in models.items():
            seen[f].append(measure(model, vocab[f], args.prompt, args.new, run))
            print(f"run {run} {f.name}: prefill {seen[f][-1][0]:.1f} tok/s, decode {seen[f][-1][1]:.2f} tok/s",
                  file=sys.stderr)
    for f, rows in seen.items():
        prefill, decode = (statistics.median(r[k] for r in rows) for k in (0, 1))
        print(f"{f.name}: prefill {prefill:.1f} tok/s, decode {decode:.2f} tok/s (medians of {len(rows)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
