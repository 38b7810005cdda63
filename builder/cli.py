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
    q = p.add_argument_group("int4 / int8 quantization")
    q.add_argument("--block-size", type=int, default=32, help="elements of K per scale: 16, 32, 64, 128, 256 (default 32)")
    q.add_argument("--asymmetric", action="store_true", help="per-block zero points (default: symmetric)")
    q.add_argument("--accuracy-level", type=int, help="MatMulNBits accuracy_level 0-4 (default: 4 on cpu, 0 on cuda)")
    q.add_argument("--exclude-lm-head", action="store_true", help="keep lm_head in float")
    q.add_argument("--quantize-embeddings", action="store_true", help="quantize an untied embedding table too")
    q.add_argument("--float-layers", action="append", default=[], metavar="PATTERN",
                   help="module paths to keep in float, fnmatch style (e.g. 'model.layers.0.*'); repeatable")
    p.add_argument("--full-kv-cache", action="store_true",
                   help="sliding-window layers get a context-long KV cache (default: window-long ring buffers)")
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
            block_size=args.block_size,
            symmetric=not args.asymmetric,
            accuracy_level=args.accuracy_level,
            exclude_lm_head=args.exclude_lm_head,
            quantize_embeddings=args.quantize_embeddings,
            float_layers=tuple(args.float_layers),
            full_kv_cache=args.full_kv_cache,
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
