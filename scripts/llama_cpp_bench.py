"""llama.cpp's llama-bench against onnxruntime-genai on our build of the same GGUF, alternating rounds, medians.

Each round runs llama-bench once (`-p P -n N -t T -r 1 -o json`: prompt processing of P tokens and
N decode steps from an empty cache) and then times our build with decode_speed.measure (a random
prompt of P tokens through append_tokens, then N generate_next_token steps, so our decode steps
run after the prompt). With --depth-decode (the default) each round also runs llama-bench's decode at
the same depth as ours (`-p 0 -n N -d P`), the like-for-like decode number. Both sides use T
threads: llama-bench through -t, onnxruntime-genai through session_options.intra_op_num_threads,
overlaid on the folder's genai_config.json (the folder is not changed). Rounds alternate so a busier
moment of a shared machine costs both alike; the load average is printed with each round, and the
summary gives the medians of each side and the median of the per-round ratios.

    python scripts/llama_cpp_bench.py --llama-bench /work/llamacpp/.../build/bin/llama-bench \\
        --gguf model.gguf --ours /work/bench/smol-int4 --rounds 3

The script downloads nothing: llama-bench is built separately (docs/BENCHMARKS.md says how).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from decode_speed import measure  # noqa: E402


def llama_bench(binary: Path, gguf: Path, args: list[str]) -> list[dict]:
    """llama-bench's JSON records (one per test) for these arguments."""
    cmd = [str(binary), "-m", str(gguf), *args, "-o", "json"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def tokens_per_s(records: list[dict], n_prompt: int, n_gen: int, n_depth: int) -> float:
    for r in records:
        if (r["n_prompt"], r["n_gen"], r.get("n_depth", 0)) == (n_prompt, n_gen, n_depth):
            return float(r["avg_ts"])
    raise KeyError(f"no llama-bench record for pp{n_prompt} tg{n_gen} d{n_depth}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-bench", required=True, type=Path, help="path to a built llama-bench binary")
    ap.add_argument("--gguf", required=True, type=Path, help="the GGUF file llama.cpp runs")
    ap.add_argument("--ours", required=True, type=Path, help="our build of that GGUF (a genai folder)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--llama-args", default="", help="more llama-bench arguments, one string (e.g. \"-mmp 0\": "
                    "weights read into memory instead of mapped)")
    ap.add_argument("--no-depth-decode", dest="depth_decode", action="store_false",
                    help="skip llama-bench's decode at depth --prompt (tg N @ d P)")
    args = ap.parse_args(argv)
    import onnxruntime_genai as og

    config = og.Config(str(args.ours))
    config.overlay(json.dumps({"model": {"decoder": {"session_options": {"intra_op_num_threads": args.threads}}}}))
    model = og.Model(config)
    vocab = json.loads((args.ours / "genai_config.json").read_text())["model"]["vocab_size"]
    measure(model, vocab, 16, 4, 0)  # warm-up, as decode_speed does (llama-bench warms up on its own)

    common = ["-t", str(args.threads), "-r", "1", *args.llama_args.split()]
    rows: dict[str, list[float]] = {k: [] for k in ("lc_pp", "lc_tg", "lc_tg_d", "our_pp", "our_tg")}
    for rnd in range(args.rounds):
        load = os.getloadavg()[0]
        recs = llama_bench(args.llama_bench, args.gguf, ["-p", str(args.prompt), "-n", str(args.new), *common])
        rows["lc_pp"].append(tokens_per_s(recs, args.prompt, 0, 0))
        rows["lc_tg"].append(tokens_per_s(recs, 0, args.new, 0))
        if args.depth_decode:
            recs = llama_bench(args.llama_bench, args.gguf,
                               ["-p", "0", "-n", str(args.new), "-d", str(args.prompt), *common])
            rows["lc_tg_d"].append(tokens_per_s(recs, 0, args.new, args.prompt))
        pp, tg = measure(model, vocab, args.prompt, args.new, rnd)
        rows["our_pp"].append(pp)
        rows["our_tg"].append(tg)
        depth = f", tg{args.new}@d{args.prompt} {rows['lc_tg_d'][-1]:.2f}" if args.depth_decode else ""
        print(f"round {rnd} (load {load:.2f}): llama.cpp pp{args.prompt} {rows['lc_pp'][-1]:.1f}, "
              f"tg{args.new} {rows['lc_tg'][-1]:.2f}{depth} tok/s; ours prefill {pp:.1f}, decode {tg:.2f} tok/s",
              file=sys.stderr, flush=True)

    med = {k: statistics.median(v) for k, v in rows.items() if v}
    n = args.rounds
    print(f"medians of {n} rounds, {args.threads} threads, prompt {args.prompt}, {args.new} new tokens")
    print("ranges: " + ", ".join(f"{k} {min(v):.1f}-{max(v):.1f}" for k, v in rows.items() if v))
    print(f"llama.cpp: prefill {med['lc_pp']:.1f} tok/s, decode {med['lc_tg']:.2f} tok/s (empty cache)"
          + (f", decode {med['lc_tg_d']:.2f} tok/s (after {args.prompt} tokens)" if args.depth_decode else ""))
    print(f"ours:      prefill {med['our_pp']:.1f} tok/s, decode {med['our_tg']:.2f} tok/s "
          f"(after {args.prompt} tokens)")
    print(f"ours / llama.cpp: prefill {med['our_pp'] / med['lc_pp']:.2f}, decode {med['our_tg'] / med['lc_tg']:.2f}"
          + (f" (against decode after {args.prompt} tokens: {med['our_tg'] / med['lc_tg_d']:.2f})"
             if args.depth_decode else ""))

    def per_round(ours: str, theirs: str) -> float:  # each round against its neighbour: the load moves between rounds
        return statistics.median(a / b for a, b in zip(rows[ours], rows[theirs]))

    print(f"medians of per-round ratios: prefill {per_round('our_pp', 'lc_pp'):.2f}, "
          f"decode {per_round('our_tg', 'lc_tg'):.2f}"
          + (f" (after {args.prompt} tokens: {per_round('our_tg', 'lc_tg_d'):.2f})" if args.depth_decode else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
