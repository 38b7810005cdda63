"""BuildOptions: the one schema of a build. Command-line flags and YAML keys both come from it.

Each field is an option: its YAML key is the field name (`execution_provider`), its flag the
same with dashes (`--execution-provider`), its kind, allowed values and help live in the field's
metadata. Validation runs when the options are made, before any file is read, and names the key.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

from builder.errors import BuildError
from builder.quantize import BLOCK_SIZES
from builder.kv_cache import SCHEMES as KV_SCHEMES
from builder.providers import PROVIDERS, canonical
from builder.target import BITS_DEFAULTS, Quantization, Target

PRECISIONS = ("int4", "int8", "fp16", "bf16", "fp32")
QUANTIZED = {"int4": 4, "int8": 8}
EXECUTION_PROVIDERS = tuple(PROVIDERS)
IO_DTYPES = ("fp32", "fp16", "bf16")
ACCURACY_LEVELS = (0, 1, 2, 3, 4)
DEFAULT_PRECISION = "int4"

_DTYPES = {"fp32": np.dtype(np.float32), "fp16": np.dtype(np.float16), "bf16": np.dtype(ml_dtypes.bfloat16)}
# Why a provider cannot run an activation dtype (builder.providers: each provider's io_dtypes).
_REFUSED = {
    ("bf16", "cpu"): "ONNX Runtime's CPU kernels have no bfloat16 GroupQueryAttention/MatMul; use fp32 or fp16 on cpu, bf16 on cuda",
    ("fp32", "cuda"): "GroupQueryAttention on CUDA needs fp16 or bf16 activations",
}
# Options that only mean something for int4/int8, and their defaults there (accuracy_level's
# default depends on the execution provider and is resolved in target()).
QUANTIZATION_DEFAULTS: dict[str, Any] = {
    "block_size": 32, "symmetric": None, "accuracy_level": None, "exclude_lm_head": False,
    "quantize_embeddings": False, "float_layers": [], "quant_method": None, "int8_layers": [], "mixed": False,
    "qdq": False,
}
# The defaults that depend on the precision: Quantization's own (builder.target.BITS_DEFAULTS), so
# a build from the command line and one from Python quantize alike.
PRECISION_DEFAULTS: dict[str, dict[str, Any]] = {
    precision: {"quant_method": BITS_DEFAULTS[bits]["method"], "symmetric": BITS_DEFAULTS[bits]["symmetric"]}
    for precision, bits in (("int4", 4), ("int8", 8))
}
QUANT_METHODS = ("rtn", "search")
# genai_config.json "search" keys a build may set, and their types.
SEARCH_KEYS: dict[str, tuple[type, ...]] = {
    "do_sample": (bool,), "temperature": (int, float), "top_k": (int,), "top_p": (int, float),
    "repetition_penalty": (int, float), "max_length": (int,), "min_length": (int,), "num_beams": (int,),
    "num_return_sequences": (int,), "length_penalty": (int, float), "no_repeat_ngram_size": (int,),
    "diversity_penalty": (int, float), "early_stopping": (bool,),
}


class OptionError(BuildError):
    """A bad option value; `key` names the option so each front end can point at it."""

    def __init__(self, key: str, message: str):
        super().__init__(f"{key}: {message}")
        self.key = key
        self.message = message


def option(default: Any, kind: type, help: str, choices: tuple | None = None, short: str | None = None,
           flag: str | None = None, flag_value: Any = None):
    """A field of BuildOptions. `flag`/`flag_value` make a boolean flag that sets another value
    (`--asymmetric` sets symmetric to False)."""
    meta = {"kind": kind, "help": help, "choices": choices, "short": short, "flag": flag, "flag_value": flag_value}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class BuildOptions:
    """Everything a build needs to know, validated before any weight is read.

    Example:
        >>> BuildOptions(model="Qwen/Qwen3-0.6B", precision="fp16", execution_provider="cuda").target().io_dtype
        dtype('float16')
    """

    model: str | None = option(None, str, "Hugging Face id (org/name), local folder or .gguf file", short="-m")
    input: str | None = option(None, str, "local folder to read instead of downloading --model", short="-i")
    output: str | None = option(None, str, "output folder (default: <model name>-<precision>-<ep>)", short="-o")
    precision: str | None = option(None, str, f"weights: {', '.join(PRECISIONS)} (default {DEFAULT_PRECISION})",
                                   PRECISIONS, short="-p")
    execution_provider: str = option("cpu", str, "where the model runs (onnxruntime-genai's spellings, such as "
                                     "NvTensorRtRtx for trt-rtx, are accepted)", EXECUTION_PROVIDERS, short="-e")
    revision: str | None = option(None, str, "hub revision (branch, tag or commit)")
    adapter: str | None = option(None, str, "PEFT LoRA adapter (folder or Hugging Face id) merged into the base "
                                 "weights before any quantization")
    overwrite: bool = option(False, bool, "replace a previous build's output folder (only one builder wrote: its "
                             "build.yaml record and nothing but files a build writes)")
    bits: int | None = option(None, int, "quantized weight bits (4 or 8); the same as -p int4 / int8", (4, 8))
    block_size: int | None = option(None, int, "int4/int8: elements of K per scale (default 32)", BLOCK_SIZES)
    symmetric: bool | None = option(None, bool, "int4/int8: per-block zero points (default: int4 asymmetric, int8 symmetric)",
                             flag="--asymmetric", flag_value=False)
    accuracy_level: int | None = option(None, int, "int4/int8: MatMulNBits accuracy_level (default 4 on cpu, 0 on cuda)",
                                        ACCURACY_LEVELS)
    exclude_lm_head: bool | None = option(None, bool, "int4/int8: keep lm_head in float")
    quantize_embeddings: bool | None = option(None, bool, "int4: quantize an untied embedding table too")
    float_layers: list[str] | None = option(None, list, "int4/int8: linear layers kept in float, fnmatch patterns "
                                            "on checkpoint module names such as '*.q_proj' or 'model.layers.0.*' "
                                            "(repeatable)")
    quant_method: str | None = option(None, str, "int4/int8: how each block's scale is chosen: rtn (round to "
                                      "nearest, bit-exact with ONNX Runtime's quantizer) or search (least squared "
                                      "error among candidate scales; with --asymmetric, int4's best) (default: int4 search, int8 rtn)",
                                      QUANT_METHODS)
    int8_layers: list[str] | None = option(None, list, "int4: layers quantized to 8 bits instead, fnmatch patterns "
                                           "like --float-layers ('lm_head', '*.down_proj') (repeatable)")
    mixed: bool | None = option(None, bool, "int4: the mixed-precision preset after llama.cpp's Q4_K_M: int8 "
                                "lm_head, embeddings, every o_proj, and v_proj/down_proj of the first and last "
                                "eighth of the layers and every third between")
    qdq: bool | None = option(None, bool, "int4/int8: weights as blocked DequantizeLinear + MatMul (the QDQ form "
                              "other runtimes and quantization tools read; ONNX Runtime fuses it back into "
                              "MatMulNBits on CPU) instead of MatMulNBits, same codes and scales")
    io_dtype: str | None = option(None, str, "int4/int8: activation dtype (default fp32 on cpu, fp16 on cuda)", IO_DTYPES)
    context_length: int | None = option(None, int, "positions the model supports (default: max_position_embeddings)")
    windowed_kv_cache: bool = option(False, bool, "sliding-window layers keep window-long ring-buffer KV "
                                     "caches: less memory, but onnxruntime-genai then needs max_length >= the "
                                     "window and batches of equal-length prompts (default: full-length caches)")
    kv_cache: str = option("float", str, "KV cache: float (the activation dtype), or int8 with static per-layer "
                           "scales per tensor or per channel (GroupQueryAttention on cpu and cuda; needs "
                           "--kv-cache-scales)", KV_SCHEMES)
    kv_cache_scales: str | None = option(None, str, "int8 KV cache: calibrated per-layer scales, onnxruntime-genai's "
                                         "kv_cache_scale_file JSON (scripts/calibrate_kv_cache.py writes one)")
    standard_ops: bool = option(False, bool, "only standard ONNX operators (opset 24: Attention with past/present KV, "
                                "RotaryEmbedding, RMSNormalization, DequantizeLinear weights): the model any conforming "
                                "runtime loads; cpu only, models with contrib-only parts (experts, linear attention) refused")
    prune_lm_head: bool = option(False, bool, "logits of each sequence's last token only, [batch, 1, vocab]: "
                                 "what onnxruntime-genai samples from, for a prefill lm_head over one row per "
                                 "sequence instead of every prompt token (get_output('logits') then holds that row "
                                 "alone; text decoders only)")
    mtp: bool = option(True, bool, "a checkpoint's multi-token-prediction head (Qwen3.5's mtp.*): built as mtp.onnx, "
                       "a draft model for speculative decoding (builder.speculative), sharing the decoder's "
                       "embedding and lm_head bytes", flag="--no-mtp", flag_value=False)
    mtp_precision: str | None = option(None, str, "the multi-token-prediction head's own layer and projection at "
                                       "this precision (default: the decoder's, --precision); its embedding and "
                                       "lm_head stay the decoder's", PRECISIONS)
    text_only: bool = option(False, bool, "image-and-text models (Gemma 3 4b/12b/27b): build the text decoder "
                             "alone instead of the multimodal package (vision, embedding and decoder models)")
    cache_dir: str | None = option(None, str, "Hugging Face cache folder for downloads (default: huggingface_hub's, "
                                   "HF_HOME / HF_HUB_CACHE)", short="-c")
    search: dict[str, Any] = option({}, dict, "genai_config.json search defaults (YAML only), e.g. {top_k: 40}")

    def __post_init__(self) -> None:
        if isinstance(self.execution_provider, str):
            object.__setattr__(self, "execution_provider", canonical(self.execution_provider))
        for f in dataclasses.fields(self):
            _check_kind(f, getattr(self, f.name))
        set_ = object.__setattr__
        for key in ("float_layers", "int8_layers"):
            if getattr(self, key) is not None:
                set_(self, key, list(getattr(self, key)))
        if self.model is None and self.input is None:
            raise OptionError("model", "give a Hugging Face id or folder (or an input folder)")
        precision = self.precision
        if self.bits is not None:
            implied = f"int{self.bits}"
            if precision not in (None, implied):
                raise OptionError("bits", f"{self.bits} contradicts precision {precision!r}")
            precision = implied
        set_(self, "precision", precision or DEFAULT_PRECISION)
        self._provider_requirements()
        self._resolve_quantization()
        if self.precision != "int4" and (self.int8_layers or self.mixed):
            raise OptionError("int8_layers" if self.int8_layers else "mixed",
                              f"applies to int4 builds only; -p {self.precision} quantizes every layer alike")
        if self.precision not in QUANTIZED and self.io_dtype not in (None, self.precision):
            raise OptionError("io_dtype", f"a {self.precision} model's activations are {self.precision}")
        io = self.resolved_io_dtype
        provider = PROVIDERS[self.execution_provider]
        reason = _REFUSED.get((io, provider.name)) or (
            None if io in provider.io_dtypes else
            f"onnxruntime-genai's attention on {provider.name} runs {' or '.join(provider.io_dtypes)} activations")
        if reason:
            what = f"-p {self.precision}" + (f" with io_dtype {io}" if self.precision in QUANTIZED else "")
            raise OptionError("precision", f"{what} -e {self.execution_provider} is not supported: {reason}")
        if self.context_length is not None and self.context_length <= 0:
            raise OptionError("context_length", f"{self.context_length} is not a positive number of positions")
        for key, value in self.search.items():
            if key not in SEARCH_KEYS:
                raise OptionError("search", f"unknown key {key!r}; allowed: {', '.join(SEARCH_KEYS)}")
            if isinstance(value, bool) != (SEARCH_KEYS[key] == (bool,)) or not isinstance(value, SEARCH_KEYS[key]):
                raise OptionError("search", f"{key} must be {' or '.join(t.__name__ for t in SEARCH_KEYS[key])}, got {value!r}")
            if isinstance(value, float) and not math.isfinite(value):  # NaN is not JSON: genai could not read it
                raise OptionError("search", f"{key} must be a finite number, got {value!r}")
            if isinstance(value, int) and not isinstance(value, bool) and not 0 <= value < 2**31:
                raise OptionError("search", f"{key} must be an integer from 0 to 2^31 - 1, got {value!r}")

    def _provider_requirements(self) -> None:
        """What the provider fixes: QDQ weights, symmetric, where it reads no other
        (builder.providers); a ring-buffer window cache where its attention keeps one."""
        provider = PROVIDERS[self.execution_provider]
        if provider.qdq and self.precision in QUANTIZED:
            for key in ("qdq", "symmetric"):
                if getattr(self, key) is False:
                    raise OptionError(key, f"-e {provider.name} reads quantized weights only as symmetric "
                                           "DequantizeLinear + MatMul (QDQ)")
                object.__setattr__(self, key, True)
        if self.standard_ops:
            if provider.name != "cpu":
                raise OptionError("standard_ops", f"builds a provider-neutral model: use -e cpu, not -e {provider.name}")
            if self.windowed_kv_cache:
                raise OptionError("windowed_kv_cache", "--standard-ops keeps full-length caches (ONNX's Attention "
                                                       "has no ring-buffer cache)")
            if self.precision in QUANTIZED:
                if self.qdq is False:
                    raise OptionError("qdq", "--standard-ops stores quantized weights as DequantizeLinear + MatMul")
                object.__setattr__(self, "qdq", True)
        if self.kv_cache != "float":
            if self.kv_cache_scales is None:
                raise OptionError("kv_cache", f"{self.kv_cache} needs --kv-cache-scales FILE (calibrated per-layer "
                                              "scales; scripts/calibrate_kv_cache.py writes one from a float build)")
            if provider.name not in ("cpu", "cuda") or self.standard_ops or self.windowed_kv_cache:
                raise OptionError("kv_cache", "an int8 KV cache is GroupQueryAttention's on cpu and cuda, with "
                                              "full-length caches (no --standard-ops, no --windowed-kv-cache)")
        elif self.kv_cache_scales is not None:
            raise OptionError("kv_cache_scales", "applies to an int8 KV cache (--kv-cache int8-per-tensor or "
                                                 "int8-per-channel) only")
        if self.windowed_kv_cache and not provider.windowed_kv_cache:
            raise OptionError("windowed_kv_cache", f"-e {provider.name}: onnxruntime-genai keeps full-length caches "
                                                   "there (its attention has no ring-buffer window cache)")

    def _resolve_quantization(self) -> None:
        """Quantization options default to None ("not given"): a quantized build fills in the
        defaults, a float build refuses any that was given, since it would change nothing."""
        for key, default in QUANTIZATION_DEFAULTS.items():
            value = getattr(self, key)
            if self.precision in QUANTIZED:
                if value is None:
                    default = PRECISION_DEFAULTS[self.precision].get(key, default)
                    object.__setattr__(self, key, type(default)(default) if isinstance(default, list) else default)
            elif value is not None:
                raise OptionError(key, f"applies to int4/int8 builds only; -p {self.precision} has no quantized weights")

    @property
    def resolved_io_dtype(self) -> str:
        if self.precision in QUANTIZED:
            return self.io_dtype or PROVIDERS[self.execution_provider].io_dtypes[0]
        return self.precision

    @property
    def output_folder(self) -> Path:
        if self.output is not None:
            return Path(self.output).expanduser()
        name = Path((self.model or str(self.input)).rstrip("/")).name.removesuffix(".gguf") or "model"
        return Path.cwd() / f"{name}-{self.precision}-{self.execution_provider}"

    def target(self) -> Target:
        ep = self.execution_provider
        provider = PROVIDERS[ep]
        quantization = None
        if self.precision in QUANTIZED:
            quantization = Quantization(
                bits=QUANTIZED[self.precision],
                block_size=self.block_size,
                symmetric=self.symmetric,
                accuracy_level=provider.accuracy_level if self.accuracy_level is None else self.accuracy_level,
                lm_head=not self.exclude_lm_head,
                embeddings=self.quantize_embeddings,
                float_layers=tuple(self.float_layers),
                method=self.quant_method,
                int8_layers=tuple(self.int8_layers),
                mixed=self.mixed,
                qdq=self.qdq,
                flat_lookup_zero_points=provider.flat_lookup_zero_points,
            )
        return Target(
            io_dtype=_DTYPES[self.resolved_io_dtype], execution_provider=ep, quantization=quantization,
            windowed_kv_cache=self.windowed_kv_cache, context_length=self.context_length,
            standard_ops=self.standard_ops, last_logits_only=self.prune_lm_head,
            narrow_float_matrices=quantization is not None,
        )

    def to_dict(self) -> dict[str, Any]:
        """The options as YAML keys (every key, defaults included, so a record is complete)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> BuildOptions:
        """Options from YAML-style keys; an unknown key fails listing the known ones."""
        known = {f.name for f in dataclasses.fields(cls)}
        for key in values:
            if key not in known:
                import difflib

                close = difflib.get_close_matches(str(key), known, n=1)
                raise OptionError(key, f"unknown key; did you mean '{close[0]}'?" if close
                                  else f"unknown key; known keys: {', '.join(sorted(known))}")
        return cls(**values)


def _check_kind(f: dataclasses.Field, value: Any) -> None:
    kind, choices = f.metadata["kind"], f.metadata["choices"]
    if value is None and f.default is None:
        return
    ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
    if kind is list:
        ok = ok and all(isinstance(v, str) for v in value)
    if kind is dict:
        ok = ok and all(isinstance(k, str) for k in value)
    if not ok:
        expected = {str: "a string", int: "an integer", bool: "true or false", list: "a list of strings",
                    dict: "a mapping"}[kind]
        raise OptionError(f.name, f"expected {expected}, got {value!r}")
    if choices is not None and value not in choices:
        raise OptionError(f.name, f"{value!r} is not one of: {', '.join(map(str, choices))}")


def fields() -> tuple[dataclasses.Field, ...]:
    return dataclasses.fields(BuildOptions)
