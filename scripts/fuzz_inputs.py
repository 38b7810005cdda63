"""The fuzz test's cases (tests/fuzz_cases.py) at any size: malformed safetensors headers, shard
indexes, config.json, generation_config.json, GGUF headers and metadata, LoRA adapters and YAML build
files, made from valid tiny ones with a seed, each run through builder's CLI in-process.

Reports every case that ends in a traceback, hangs (past 10 s), takes more than 2 GB of address
space, prints more than one line, exits 0 where the input is certainly wrong, or exits 0 reading a
file otherwise than the format's own reader (or, for the cases that build, with a model ONNX Runtime
cannot run to finite logits). Each such case's input is saved with a case.json to reproduce it.

    python scripts/fuzz_inputs.py --cases 5000 --seed 7
    python scripts/fuzz_inputs.py --cases 336 --seed 21 --only config-092-json_value-max_position_embeddings-big
    python scripts/fuzz_inputs.py --cases 2000 --build-all     # also build every accepted input

Exit code 0 when no case failed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import fuzz_cases  # noqa: E402


def counts(total: int) -> dict[str, int]:
    """`total` cases spread over the parsers in the CI run's proportions."""
    ci = sum(fuzz_cases.CI_COUNTS.values())
    return {group: max(1, round(total * n / ci)) for group, n in fuzz_cases.CI_COUNTS.items()}


def save(outcome: fuzz_cases.Outcome, seed: int, cases: int, folder: Path) -> Path:
    """Copies the failing case's input into folder/<case id>/ with case.json (what was run, what went wrong)."""
    target = folder / outcome.case.id
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    if outcome.input is not None and outcome.input.exists():
        copy = shutil.copytree if outcome.input.is_dir() else shutil.copyfile
        copy(outcome.input, target / outcome.input.name)
    record = {"seed": seed, "case": {k: repr(v) for k, v in dataclasses.asdict(outcome.case).items()},
              "problem": outcome.problem, "exit_code": outcome.rc, "stderr": outcome.stderr,
              "seconds": round(outcome.seconds, 3),
              "reproduce": f"python scripts/fuzz_inputs.py --cases {cases} --seed {seed} --only {outcome.case.id}"}
    (target / "case.json").write_text(json.dumps(record, indent=2) + "\n")
    return target


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", type=int, default=2000, help="how many cases, spread over the parsers (default 2000)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--only", metavar="CASE_ID", help="run the one case of this id among those --cases and --seed "
                                                    "make (as a failure report names it)")
    p.add_argument("--build-all", action="store_true", help="build for real every input the dry run accepts")
    p.add_argument("--save", type=Path, default=Path("fuzz-failures"), help="where failing inputs are saved")
    args = p.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="fuzz-inputs-"))
    os.environ["XDG_CACHE_HOME"] = str(work / "cache")  # builder's digest cache: not the user's
    try:
        bases = fuzz_cases.make_bases(work / "bases")
        cases = fuzz_cases.generate(args.seed, counts(args.cases))
        if args.only:
            cases = [c for c in cases if c.id == args.only]
            if not cases:
                p.error(f"no case {args.only} among --cases {args.cases} with --seed {args.seed}")
        if args.build_all:
            cases = [dataclasses.replace(c, build=True) for c in cases]
        return run(cases, bases, work, args)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run(cases: list[fuzz_cases.Case], bases: dict[str, Path], work: Path, args: argparse.Namespace) -> int:
    started = time.perf_counter()
    tally: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    slowest = (0.0, "")
    failed = 0
    for i, case in enumerate(cases, 1):
        folder = work / "cases" / case.id
        outcome = fuzz_cases.run_case(case, bases, folder)
        slowest = max(slowest, (outcome.seconds, case.id))
        verdict = "failed" if outcome.problem else "refused" if outcome.rc == 2 else "accepted"
        tally[case.parser][verdict] += 1
        if outcome.problem:
            failed += 1
            where = save(outcome, args.seed, args.cases, args.save)
            print(f"FAILED {case.id}: {outcome.problem}\n  saved in {where}", flush=True)
        shutil.rmtree(folder, ignore_errors=True)
        if i % 500 == 0:
            print(f"{i}/{len(cases)} cases, {failed} failed, {time.perf_counter() - started:.0f} s", flush=True)
    for parser, counter in sorted(tally.items()):
        print(f"{parser:12s} " + ", ".join(f"{n} {verdict}" for verdict, n in sorted(counter.items())))
    print(f"{len(cases)} cases in {time.perf_counter() - started:.1f} s (slowest {slowest[0]:.2f} s: {slowest[1]}); "
          f"{failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
