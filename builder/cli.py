"""python -m builder: flags (and a YAML file) -> BuildOptions -> build(). Errors are one line, exit 2."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from builder import config_file
from builder.errors import BuildError
from builder.options import fields
from builder.version import __version__


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


# The spellings of onnxruntime-genai's builder (src/python/py/models/builder.py), so its users'
# scripts run unchanged; --precision, --output and --input are already the same.
GENAI_FLAGS = {"model": "--model_name", "execution_provider": "--execution_provider", "cache_dir": "--cache_dir"}


def parser() -> argparse.ArgumentParser:
    """Every BuildOptions field but `search` is a flag; only flags given on the line override the YAML."""
    p = argparse.ArgumentParser(
        prog="python -m builder",
        description="Build an ONNX Runtime / onnxruntime-genai model from a Hugging Face decoder checkpoint.",
        argument_default=argparse.SUPPRESS,
        allow_abbrev=False,  # `--quant` must not silently mean --quantize-embeddings
    )
    p.add_argument("--config", metavar="FILE.yaml", help="read options from a YAML file; flags override it")
    for f in fields():
        m, kind = f.metadata, f.metadata["kind"]
        if kind is dict:
            continue
        names = [n for n in (m["short"], m["flag"] or _flag(f.name), GENAI_FLAGS.get(f.name)) if n]
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
        if kind is bool and m["flag"]:  # --asymmetric's opposite, to override a YAML file or a default
            p.add_argument(_flag(f.name), dest=f.name, action="store_const", const=not m["flag_value"],
                           help=f"the opposite of {m['flag']}")
    p.add_argument("--extra_options", nargs="+", metavar="KEY=VALUE",
                   help="onnxruntime-genai builder's options, mapped onto ours where one exists "
                        "(block_size, accuracy_level, is_symmetric, ...); any other is refused")
    p.add_argument("--dry-run", action="store_true", default=False,
                   help="read config.json and the safetensors headers, print the plan, write nothing")
    p.add_argument("--verify", action="store_true", default=False,
                   help="after building, compare the model's logits with transformers' (needs the test extras)")
    p.add_argument("-q", "--quiet", action="store_true", default=False,
                   help="warnings and errors only (no progress, no verify report; the exit code tells)")
    p.add_argument("-v", "--verbose", action="store_true", default=False,
                   help="also print the plan and the time of each stage")
    p.add_argument("--debug", action="store_true", default=False, help="tracebacks instead of one-line errors")
    p.add_argument("--list-architectures", action="store_true", default=False,
                   help="print the supported config.json architectures, one per line with its module, and exit")
    p.add_argument("--version", action="version", version=f"builder {__version__}")
    return p


CLI_ONLY = ("config", "extra_options", "dry_run", "verify", "quiet", "verbose", "debug", "list_architectures")
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
    if flags["list_architectures"]:
        print(list_architectures())
        return 0
    try:
        if "extra_options" in flags:
            args = genai_extra_options(flags["extra_options"], args)
        if flags["verify"] and flags["dry_run"]:
            raise BuildError("--verify and --dry-run together: a dry run builds nothing to verify")
        options = config_file.options(flags.get("config"), args, _describe)
        if flags["verify"]:
            from builder.verify import check_verifiable

            check_verifiable(options)  # before building: a refusal after a long build wastes it
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

            verdicts = verify(options, out, source_folder(options), quiet=flags["quiet"])
            if not flags["quiet"]:
                for verdict in verdicts:
                    print(verdict, file=sys.stderr)
            if not all(v.passed for v in verdicts):
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


def list_architectures() -> str:
    """`architectures` names in config.json that builder reads, each with the module that builds it."""
    import architectures

    return "\n".join(f"{name}\tarchitectures/{module}.py" for name, module in architectures.ARCHITECTURES.items())


def _bool(text: str) -> bool:
    # onnxruntime-genai's spellings of a boolean extra option
    if text in ("true", "True", "1"):
        return True
    if text in ("false", "False", "0"):
        return False
    raise ValueError(text)


# onnxruntime-genai's --extra_options keys that mean one of our options: key -> (option, parse).
# Its `int4_` names are the deprecated spellings of the same keys.
EXTRA_OPTIONS = {
    "block_size": ("block_size", int), "int4_block_size": ("block_size", int),
    "accuracy_level": ("accuracy_level", int), "int4_accuracy_level": ("accuracy_level", int),
    "is_symmetric": ("symmetric", _bool), "int4_is_symmetric": ("symmetric", _bool),
    "windowed_kv_cache": ("windowed_kv_cache", _bool),
}
# Keys accepted only at the value that is what builder does anyway (its default there).
EXTRA_OPTIONS_AS_DEFAULT = {
    "exclude_embeds": False,  # genai: take inputs_embeds instead of input_ids
    "exclude_lm_head": False,  # genai: output hidden_states instead of logits (not ours: lm_head in float)
    "include_hidden_states": False, "prune_lm_head": False, "use_qdq": False, "disable_qkv_fusion": False,
    "enable_cuda_graph": False, "use_cuda_bf16": False,
    "hf_remote": False,  # builder never runs a checkpoint's own code
    "filename": "model.onnx",
}


def genai_extra_options(pairs: list[str], args: dict) -> dict:
    """onnxruntime-genai's `--extra_options k=v ...` as our options; a key with no counterpart (or a
    value builder cannot honour) is refused in one line naming it."""
    args = dict(args)
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep:
            raise BuildError(f"--extra_options {pair}: expected KEY=VALUE")
        try:
            if key in EXTRA_OPTIONS:
                name, parse = EXTRA_OPTIONS[key]
                value = parse(text)
                if name in args and args[name] != value:
                    raise BuildError(f"--extra_options {pair} contradicts {_describe(name)} {args[name]}")
                args[name] = value
                continue
            if key in EXTRA_OPTIONS_AS_DEFAULT:
                default = EXTRA_OPTIONS_AS_DEFAULT[key]
                if (_bool(text) if isinstance(default, bool) else text) == default:
                    continue
                raise BuildError(f"--extra_options {pair}: builder does not do this; only "
                                 f"{key}={str(default).lower()} (what it always does) is accepted")
        except ValueError:
            raise BuildError(f"--extra_options {pair}: not a valid value for {key}") from None
        raise BuildError(f"--extra_options {key}: builder has no such option; it maps "
                         f"{', '.join(EXTRA_OPTIONS)} and accepts "
                         f"{', '.join(EXTRA_OPTIONS_AS_DEFAULT)} at their defaults")
    return args


def _setup_logging(quiet: bool, verbose: bool) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    log = logging.getLogger("builder")
    log.handlers[:] = [handler]
    log.propagate = False
    log.setLevel(logging.WARNING if quiet else logging.DEBUG if verbose else logging.INFO)
