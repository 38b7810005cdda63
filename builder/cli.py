"""python -m builder: flags (and a YAML file) -> BuildOptions -> build(). Errors are one line, exit 2."""

from __future__ import annotations

import argparse
import difflib
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NoReturn

from builder import config_file
from builder.errors import BuildError
from builder.options import fields
from builder.providers import canonical
from builder.version import __version__


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


# The spellings of onnxruntime-genai's builder (src/python/py/models/builder.py), so its users'
# scripts run unchanged; --precision, --output and --input are already the same.
GENAI_FLAGS = {"model": "--model_name", "execution_provider": "--execution_provider", "cache_dir": "--cache_dir"}


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors: a BuildError instead of the usage block and exit, and a
    mistyped flag answered with the closest one. --help is argparse's own."""

    def error(self, message: str) -> NoReturn:
        unrecognized = "unrecognized arguments: "
        if message.startswith(unrecognized):
            message = self._unrecognized(message[len(unrecognized):].split(" "))
        raise BuildError(message)

    def _unrecognized(self, words: list[str]) -> str:
        # `--precison fp32` leaves both words over: name the flag, not its value.
        flags = [w for w in words if w.startswith("-") and not w.lstrip("-").replace(".", "", 1).isdigit()] or words
        message = f"unrecognized argument{'s' if len(flags) > 1 else ''} {' '.join(flags)}"
        known = sorted(self._option_string_actions)
        for flag in flags:
            typed = flag.partition("=")[0]
            # An abbreviation (refused: allow_abbrev=False) names what it abbreviates; a typo, the closest.
            close = [o for o in known if o.startswith(typed) and typed.startswith("--")] or \
                difflib.get_close_matches(typed, known, n=1)
            if close:
                return f"{message}; did you mean {' or '.join(close[:3])}?"
        return message


def parser() -> argparse.ArgumentParser:
    """Every BuildOptions field but `search` is a flag; only flags given on the line override the YAML."""
    p = Parser(
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
            # a provider's other spellings (onnxruntime-genai's NvTensorRtRtx) name the same choice
            kwargs.update(type=canonical if f.name == "execution_provider" else kind)
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


# 128 + SIGPIPE: how a shell reports a writer whose reader left (`--dry-run | head -1`).
BROKEN_PIPE = 141


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; returns the exit code (0, 2 for an error, 3 for a failed --verify, 128 +
    the signal for an interruption)."""
    received: list[int] = []
    published: list[Path] = []  # the output, once it is complete (an interruption after it says so)
    restore = _interrupts_raise(received)
    try:
        return _main(argv, received, published)
    except KeyboardInterrupt as e:  # one outside _main's own handling: while parsing, or printing the path
        return _interrupted(e, None, received, published)
    except BrokenPipeError:
        # stdout's reader is gone: stop quietly, as a process killed by SIGPIPE would. Pointing
        # stdout at /dev/null keeps Python's own flush at exit from failing again.
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):
            pass  # a stdout without a descriptor (captured): nothing is flushed to a pipe at exit
        return BROKEN_PIPE
    finally:
        restore()


def _interrupts_raise(received: list[int]) -> Callable[[], None]:
    """SIGTERM (kill, a service manager, a scheduler's time limit) becomes what Ctrl-C is: a
    KeyboardInterrupt, which removes the staging folder. The signal's number goes to `received`
    for the exit code. A signal the caller ignores stays ignored (`nohup`, a background job's
    SIGINT). Returns what restores the previous handlers."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def interrupt(signum: int, _frame) -> None:
        received.append(signum)
        raise KeyboardInterrupt

    previous = {}
    for signum in (signal.SIGINT, signal.SIGTERM):
        if signal.getsignal(signum) not in (None, signal.SIG_IGN):
            previous[signum] = signal.signal(signum, interrupt)

    def restore() -> None:
        for signum, handler in previous.items():
            signal.signal(signum, handler)

    return restore


def _say(text: str) -> None:
    """Prints to stdout now, so that a closed pipe is found here (BrokenPipeError), not at exit."""
    print(text)
    sys.stdout.flush()


def _main(argv: Sequence[str] | None, received: list[int], published: list[Path]) -> int:
    try:
        args = vars(parser().parse_args(argv))
    except BuildError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    flags = {k: args.pop(k) for k in CLI_ONLY if k in args}
    _setup_logging(flags["quiet"], flags["verbose"])
    if flags["list_architectures"]:
        _say(list_architectures())
        return 0
    out = None
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
            _say(dry_run(options))
            return 0
        out = build(options, progress=not flags["quiet"], on_published=published.append)
        if flags["verify"] and not _verified(options, out, flags["quiet"]):
            _say(str(out))
            return VERIFY_FAILED
    except BuildError as e:
        if flags["debug"]:
            raise
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        if flags["debug"]:
            raise
        return _interrupted(e, out, received, published)
    except Exception as e:
        # The signal handler's KeyboardInterrupt can surface as another exception when it is raised
        # inside the interpreter's own code: in threading.Condition.wait between releasing and
        # re-taking its lock, `with` then fails with "RuntimeError: release unlocked lock". A signal
        # received means the build was interrupted (the staging folder is gone all the same).
        if flags["debug"] or not received:
            raise
        return _interrupted(e, out, received, published)
    _say(str(out))
    return 0


def _verified(options, out: Path, quiet: bool) -> bool:
    """--verify: compares the build with transformers, prints the verdicts (unless `quiet`) and
    returns whether all passed."""
    from builder.pipeline import source_folder
    from builder.verify import verify

    verdicts = verify(options, out, source_folder(options), quiet=quiet)
    if not quiet:
        for verdict in verdicts:
            print(verdict, file=sys.stderr)
    return all(v.passed for v in verdicts)


def _interrupted(e: BaseException, out: Path | None, received: list[int], published: list[Path] = ()) -> int:
    """Says what an interruption left (publish.InterruptedAfterPublishing, or an output published
    before it came: a finished build) and returns 128 + the signal."""
    complete = getattr(e, "folder", None) or (published[-1] if published else None)
    if out is not None and complete == out:  # interrupted while verifying a published build
        complete = None
    if complete is not None:
        print(f"error: interrupted; {complete} was already complete", file=sys.stderr)
    elif out is not None:
        print(f"error: interrupted while verifying; {out} is built but not verified", file=sys.stderr)
    else:
        print("error: interrupted; nothing was written", file=sys.stderr)
    return 128 + (received[-1] if received else signal.SIGINT)


def list_architectures() -> str:
    """`architectures` names in config.json that builder reads, each with the module that builds it."""
    from builder import registry

    return "\n".join(f"{name}\tarchitectures/{module}.py" for name, module in registry.architectures().items())


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
    "use_qdq": ("qdq", _bool),
    "prune_lm_head": ("prune_lm_head", _bool),
    "kv_cache_quant_scheme": ("kv_cache", lambda v: {"none": "float", "int8_per_tensor": "int8-per-tensor",
                                                     "int8_per_channel": "int8-per-channel"}[v.lower()]),
    "kv_cache_scale_file": ("kv_cache_scales", str),
    "exclude_mtp": ("mtp", lambda v: not _bool(v)), "enable_mtp": ("mtp", _bool),
}
# Keys accepted only at the value that is what builder does anyway (its default there).
EXTRA_OPTIONS_AS_DEFAULT = {
    "exclude_embeds": False,  # genai: take inputs_embeds instead of input_ids
    "exclude_lm_head": False,  # genai: output hidden_states instead of logits (not ours: lm_head in float)
    "include_hidden_states": False, "disable_qkv_fusion": False,
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
        except (ValueError, KeyError):
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
