"""Differential config checks at scale: builder against transformers on thousands of configs that
transformers' own config classes accept (tests/differential.py says how each is drawn and judged).

    python scripts/differential_configs.py --per-family 50            # about 3,000 cases
    python scripts/differential_configs.py --per-family 5 --family llama,qwen3_5 --seed 3

Prints one line per case that breaks the rule, then per family: cases tried, refused by
transformers, built and matched, and each kind of failure. Needs the test extras.
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from differential import bases, cases, run_case  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-family", type=int, default=50, help="cases per family base")
    parser.add_argument("--seed", type=int, default=1, help="0 is the sample CI runs")
    parser.add_argument("--family", default="", help="comma-separated base names (default: all)")
    args = parser.parse_args()
    chosen = [b for b in bases() if not args.family or b.name in args.family.split(",")]
    counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    start = time.time()
    for case in cases(chosen, args.per_family, args.seed):
        with tempfile.TemporaryDirectory() as folder:
            outcome = run_case(case, Path(folder))
        tally = counts[case.base.name]
        tally["tried"] += 1
        tally["refused by transformers"] += not outcome.transformers_ok
        tally[outcome.verdict] += 1
        if outcome.problem:
            print(f"{outcome.problem}: {case.label}: {outcome.detail[:300]}", flush=True)
    total = collections.Counter()
    print(f"\n{'family':28s} {'tried':>6s} {'tf refused':>10s} {'matched':>8s} failures")
    for name, tally in sorted(counts.items()):
        total.update(tally)
        failures = {k: v for k, v in tally.items() if k not in ("tried", "refused by transformers",
                                                                "built and matched", "refused by both")}
        print(f"{name:28s} {tally['tried']:6d} {tally['refused by transformers']:10d} "
              f"{tally['built and matched']:8d} {failures or ''}")
    failures = {k: v for k, v in total.items() if k not in ("tried", "refused by transformers", "built and matched",
                                                            "refused by both")}
    print(f"{'all':28s} {total['tried']:6d} {total['refused by transformers']:10d} {total['built and matched']:8d} "
          f"{failures or ''}  ({time.time() - start:.0f} s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
