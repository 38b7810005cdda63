"""python -m builder: command-line flags -> BuildOptions -> build(). Errors are one line and exit 2."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from builder.errors import BuildError
from builder.options import DEFAULT_PRECISION, EXECUTION_PROVIDERS, PRECISIONS, BuildOptions


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m builder",
        description="Build an ONNX Runtime / onnxruntime-genai model from a Hugging Face decoder checkpoint.",
    )
    p.add_argument("-m", "--model", help="Hugging Face id (org/name) or local folder")
    p.add_argument("-i", "--input", type=Path, help="local folder to read instead of downloading --model")
    p.add_argument("-o", "--output", type=Path, help="output folder (default: <model name>-<precision>-<ep>)")
    p.add_argument("-p", "--precision", choices=PRECISIONS, default=DEFAULT_PRECISION)
    p.add_argument("-e", "--execution-provider", choices=EXECUTION_PROVIDERS, default="cpu")
    p.add_argument("--revision", help="hub revision (branch, tag or commit)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing non-empty output folder")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    log = logging.getLogger("builder")
    log.handlers[:] = [handler]
    log.propagate = False
    log.setLevel(logging.WARNING if args.quiet else logging.INFO)
    try:
        if args.model is None and args.input is None:
            raise BuildError("give --model (a Hugging Face id or folder) or --input (a local folder)")
        from builder.build import build  # imported after argument parsing keeps --help instant

        options = BuildOptions(
            model=args.model or str(args.input),
            output=args.output,
            input=args.input,
            precision=args.precision,
            execution_provider=args.execution_provider,
            overwrite=args.overwrite,
            revision=args.revision,
        )
        out = build(options, progress=not args.quiet)
    except BuildError as e:
        if args.debug:
            raise
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if args.debug:
            raise
        print("error: interrupted; nothing was written", file=sys.stderr)
        return 130
    print(out)
    return 0
