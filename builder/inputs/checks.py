"""The checks a format's reader makes on the files beside the weights, before anything is written:
a quantization config builder does not read, and tokenizer files that would be copied broken
(builder.preflight lists them with the checks the build makes after)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from builder.config_checks import config_object
from builder.errors import BuildError
from builder.hf_config import load_json

log = logging.getLogger("builder")

# onnxruntime-genai's tokenizer reads tokenizer.json (with tokenizer_config.json), or a
# SentencePiece tokenizer.model; without one of them beside the model it fails to load it.
TOKENIZER_MODELS = ("tokenizer.json", "tokenizer.model")
# The JSON files beside it that transformers and genai read as objects.
TOKENIZER_OBJECTS = ("tokenizer_config.json", "special_tokens_map.json", "added_tokens.json")


def check_not_prequantized(raw: dict[str, Any], path: Path, accepted: tuple[str, ...] = ()) -> None:
    """A checkpoint whose weights are already quantized (bitsandbytes, HQQ, mxfp4, ...) holds packed
    integers and scales under other tensor names: refused until builder reads those formats, except
    the quant_methods in `accepted`: AWQ and GPTQ (builder/inputs/awq_gptq.py), FP8 (builder/inputs/fp8.py) and
    those the architecture reads itself (gpt-oss: mxfp4)."""
    for where, cfg in (("", raw), ("text_config.", config_object(raw, "text_config"))):
        q = cfg.get("quantization_config")
        if q:
            method = q.get("quant_method", "unknown") if isinstance(q, dict) else "unknown"
            if method in accepted:
                continue
            raise BuildError(f"{path}: {where}quantization_config says the weights are already quantized "
                             f"(quant_method {method!r}); builder reads float checkpoints only (bf16, fp16, fp32)")


def check_tokenizer_files(folder: Path) -> None:
    """Refuses, before anything is written, tokenizer files that would be copied beside the model
    broken: a tokenizer.json that is not a Hugging Face tokenizers file (valid JSON, an object
    with a "model" object), or a tokenizer_config.json (special_tokens_map.json,
    added_tokens.json) that is not a JSON object; warns when there is no tokenizer at all."""
    tokenizer = folder / "tokenizer.json"
    if tokenizer.is_file():
        data = load_json(tokenizer)
        if not isinstance(data, dict) or not isinstance(data.get("model"), dict):
            raise BuildError(f'{tokenizer}: not a Hugging Face tokenizer (no "model" object); onnxruntime-genai '
                             "could not load it")
    for path in (folder / name for name in TOKENIZER_OBJECTS):
        if path.is_file() and not isinstance(load_json(path), dict):
            raise BuildError(f"{path}: expected a JSON object")
    warn_if_no_tokenizer(folder)


def warn_if_no_tokenizer(folder: Path) -> None:
    """The model is still built (a tokenizer can be copied in later), but onnxruntime-genai will not load it."""
    if not any((folder / name).is_file() for name in TOKENIZER_MODELS):
        log.warning("warning: %s has no tokenizer.json or tokenizer.model: the model is built, but "
                    "onnxruntime-genai's tokenizer needs tokenizer.json (with tokenizer_config.json) or "
                    "tokenizer.model beside it", folder)
