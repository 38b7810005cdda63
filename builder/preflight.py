"""Checks a plan makes before anything is written: each refuses in one line, or warns in one line."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

from builder.errors import BuildError
from builder.target import Target, matches

log = logging.getLogger("builder")

# onnxruntime-genai's tokenizer reads tokenizer.json (with tokenizer_config.json), or a
# SentencePiece tokenizer.model; without one of them beside the model it fails to load it.
TOKENIZER_MODELS = ("tokenizer.json", "tokenizer.model")


def check_not_prequantized(raw: dict[str, Any], path: Path, accepted: tuple[str, ...] = ()) -> None:
    """A checkpoint whose weights are already quantized (bitsandbytes, HQQ, mxfp4, ...) holds packed
    integers and scales under other tensor names: refused until builder reads those formats, except
    the quant_methods in `accepted`: AWQ and GPTQ (builder/awq_gptq.py), FP8 (builder/fp8.py) and
    those the architecture reads itself (gpt-oss: mxfp4)."""
    for where, cfg in (("", raw), ("text_config.", raw.get("text_config") or {})):
        q = cfg.get("quantization_config")
        if q:
            method = q.get("quant_method", "unknown") if isinstance(q, dict) else "unknown"
            if method in accepted:
                continue
            raise BuildError(f"{path}: {where}quantization_config says the weights are already quantized "
                             f"(quant_method {method!r}); builder reads float checkpoints only (bf16, fp16, fp32)")


def check_context_length(target: Target, max_position_embeddings: int) -> None:
    """Positions past max_position_embeddings were never trained: the model's output there is garbage."""
    if target.context_length and target.context_length > max_position_embeddings:
        raise BuildError(f"--context-length {target.context_length} is past the model's maximum of "
                         f"{max_position_embeddings} positions (max_position_embeddings)")


def check_float_layers(patterns: tuple[str, ...], linears: dict[str, tuple[str, ...]],
                       flag: str = "--float-layers") -> None:
    """Every --float-layers (--int8-layers) pattern must name a linear layer (by graph path or checkpoint
    module); --int8-layers may also name the embedding table."""
    candidates = {"lm_head": ()} | ({"model.embed_tokens": ()} if flag == "--int8-layers" else {}) | linears
    for pattern in patterns:
        if not any(matches(pattern, (module, *sources)) for module, sources in candidates.items()):
            examples = [m for sources in linears.values() for m in sources][:3] or list(linears)[:3]
            raise BuildError(f"{flag} {pattern!r} matches no linear layer of the checkpoint "
                             f"(module names look like {', '.join(examples)})")


def warn_if_no_tokenizer(folder: Path) -> None:
    """The model is still built (a tokenizer can be copied in later), but onnxruntime-genai will not load it."""
    if not any((folder / name).is_file() for name in TOKENIZER_MODELS):
        log.warning("warning: %s has no tokenizer.json or tokenizer.model: the model is built, but "
                    "onnxruntime-genai's tokenizer needs tokenizer.json (with tokenizer_config.json) or "
                    "tokenizer.model beside it", folder)


def warn_if_bf16_rounds_stored_scales(prequantized: bool, target: Target) -> None:
    """A pre-quantized input (AWQ/GPTQ, GGUF blocks) keeps its exact values in MatMulNBits only while
    its fp16 scales survive the activation dtype: bfloat16 keeps 8 of their 11 significant bits."""
    if prequantized and target.quantization is not None and np.dtype(target.io_dtype) == ml_dtypes.bfloat16:
        log.warning("warning: bf16 activations round the checkpoint's fp16 quantization scales to bf16, so the "
                    "quantized weights are no longer exactly the checkpoint's; --io-dtype fp16 keeps them exact")


@contextlib.contextmanager
def timed(stage: str) -> Iterator[None]:
    """Logs the stage's wall time at -v."""
    started = time.perf_counter()
    yield
    log.debug("%-20s %.2f s", stage, time.perf_counter() - started)
