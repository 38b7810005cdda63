"""python -m builder: flags (and a YAML file) -> BuildOptions -> build(). Errors are one line, exit 2."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from builder import config_file
from builder.errors import BuildError
from builder.options import fields


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def parser() -> argparse.ArgumentParser:
    """Every BuildOptions field but `search` is a flag; only flags given on the line override the YAML."""
    p = argparse.ArgumentParser(
        prog="python -m builder",
        description="Build an ONNX Runtime / onnxruntime-genai model from a Hugging Face decoder checkpoint.",
        argument_default=argparse.SUPPRESS,
    )
    p.add_argument("--config", metavar="FILE.yaml", help="read options from a YAML file; flags override it")
    for f in fields():
        m, kind = f.metadata, f.metadata["kind"]
        if kind is dict:
            continue
        names = [n for n in (m["short"], m["flag"] or _flag(f.name)) if n]
        kwargs = dict(dest=f.name, help=m["help"])
        if kind is bool:
            kwargs.update(action="store_const", const=m["flag_value"] if m["flag"] else True)
        elif kind is list:
            kwargs.update(action="append", metavar="PATTERN")
        else:
            kwargs.update(type=kind)
            if m["choices"]:
                kwargs["choices"] = m["choices"]
        p.add_argument(*names, **kwargs)
    p.add_argument("--dry-run", action="store_true", default=False,
                   help="read config.json and the safetensors headers, print the plan, write nothing")
    p.add_argument("--verify", action="store_true", default=False,
                   help="after building, compare the model's logits with transformers' (needs the test extras)")
    p.add_argument("-q", "--quiet", action="store_true", default=False, help="errors only")
    p.add_argument("-v", "--verbose", action="store_true", default=False, help="more detail")
    p.add_argument("--debug", action="store_true", default=False, help="tracebacks instead of one-line errors")
    return p


CLI_ONLY = ("config", "dry_run", "verify", "quiet", "verbose", "debug")
VERIFY_FAILED = 3


def _describe(key: str) -> str:
    for f in fields():
        if f.name == key:
            return f.metadata["flag"] or _flag(key)
    return _flag(key)


def main(argv: Sequence[str] | None = None) -> int:
    args = vars(parser().parse_args(argv))
    flags = {k: args.pop(k) for k in CLI_ONLY if k in args}
    _setup_logging(flags["quiet"], flags["verbose"])
    try:
        options = config_file.options(flags.get("config"), args, _describe)
        from builder.pipeline import (  # after parsing, so --help stays instant
            build,
            dry_run,
        )

        if flags["dry_run"]:
            print(dry_run(options))
            return 0
        out = build(options, progress=not flags["quiet"])
        if flags["verify"]:
            from builder.pipeline import source_folder
            from builder.verify import verify

            verdict = verify(options, out, source_folder(options))
            print(verdict, file=sys.stderr)
            if not verdict.passed:
                print(out)
                return VERIFY_FAILED
    except BuildError as e:
        if flags["debug"]:
            raise
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if flags["debug"]:
            raise
        print("error: interrupted; nothing was written", file=sys.stderr)
        return 130
    print(out)
    return 0


def _setup_logging(quiet: bool, verbose: bool) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    log = logging.getLogger("builder")
    log.handlers[:] = [handler]
    log.propagate = False
    log.setLevel(logging.WARNING if quiet else logging.DEBUG if verbose else logging.INFO)
