"""The sha256 of every output file of every synthetic preset's build: the proof that a refactor
leaves the models byte-identical.

    python scripts/output_digests.py --work /tmp/digests > before.json    # on the old commit
    python scripts/output_digests.py --work /tmp/digests --compare before.json   # on the new one

Each preset of make_synthetic_checkpoint.py is written shrunk (the tests' size: layouts, fused
tensors, rope settings and the multimodal package kept) and built at each precision, in-process.
build.yaml is left out: it records paths and hashes of the inputs, not the model.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from make_synthetic_checkpoint import PRESETS, shrunk, write_checkpoint  # noqa: E402

from builder.cli import main as builder_main  # noqa: E402

SKIPPED = {"build.yaml"}


def digests(folder: Path) -> dict[str, str]:
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest()
            for f in sorted(folder.iterdir()) if f.is_file() and f.name not in SKIPPED}


def build_all(work: Path, precisions: list[str], names: list[str]) -> dict[str, dict[str, str]]:
    result = {}
    for name in names:
        source = work / "src" / name
        if not (source / "config.json").is_file():
            write_checkpoint(source, shrunk(PRESETS[name]))
        for precision in precisions:
            out = work / "out" / f"{name}-{precision}"
            err = io.StringIO()
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                code = builder_main(["-m", str(source), "-o", str(out), "-p", precision, "--overwrite", "-q"])
            key = f"{name} {precision}"
            result[key] = digests(out) if code == 0 else {"error": err.getvalue().strip()}
            print(f"{key}: {'ok' if code == 0 else err.getvalue().strip()}", file=sys.stderr)
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, required=True, help="a scratch folder for checkpoints and builds")
    ap.add_argument("--precision", action="append", help="precisions to build (default: fp32 and int4)")
    ap.add_argument("--preset", action="append", help="presets to build (default: all)")
    ap.add_argument("--compare", type=Path, help="a JSON file of an earlier run: exit 1 on any difference")
    args = ap.parse_args(argv)
    result = build_all(args.work, args.precision or ["fp32", "int4"], args.preset or sorted(PRESETS))
    if args.compare is None:
        print(json.dumps(result, indent=1, sort_keys=True))
        return 0
    before = json.loads(args.compare.read_text())
    differ = sorted(k for k in result if before.get(k) != result[k])  # the builds asked for (--preset/--precision)
    for key in differ:
        print(f"DIFFERS {key}: {before.get(key)} -> {result.get(key)}")
    print(f"{len(result) - len(differ)} of {len(result)} builds byte-identical")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
