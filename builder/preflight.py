"""The checks a build makes before anything is written, each refusing (or warning) in one line.

In the order a build meets them: the options' own types and pairs (`BuildOptions.__post_init__`,
at parsing), --verify's needs (`verify.check_verifiable`, before any work), the output path
(`output_folder.check_output`), the input folder's links (`inputs.trust`), the format's own
header checks (`builder.inputs`: quantization configs and tokenizer files, builder.inputs.checks),
then these: quantization configs, the layer count and sizes
against the tensors, the context length, the windowed cache, --float/--int8-layers, and last the disk and memory the plan needs (`check_room`)."""

from __future__ import annotations

import logging
import math
import os
import re
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

from builder.errors import BuildError
from builder.target import Target, matches
from builder.units import human

log = logging.getLogger("builder")

# A decoder layer's tensors: model.layers.N.*, or a multimodal checkpoint's language model's
# (both layouts); a vision tower's encoder.layers.N.* are not the decoder's.
# Whisper's num_hidden_layers is its encoder_layers (WhisperConfig's alias): model.encoder.layers.N.
DECODER_LAYER = re.compile(r"(?:model\.|language_model\.model\.|model\.language_model\.|backbone\.|model\.encoder\.)"
                           r"layers\.(\d+)\.")


def check_layer_count(raw: dict[str, Any], tensor_names: Iterable[str]) -> None:
    """Refuses a num_hidden_layers (top level or text_config's) past the layers the checkpoint's
    tensors hold, before anything is made per layer: a config saying 10^9 layers would otherwise
    allocate per-layer lists for minutes before the first missing tensor is noticed. A count that
    is not a positive integer is left to the config's own checks (config_checks.config_value)."""
    text = raw.get("text_config")
    counts = [c.get("num_hidden_layers") for c in (raw, text if isinstance(text, dict) else {})]
    counts = [n for n in counts if isinstance(n, int) and not isinstance(n, bool) and n > 0]
    if not counts:
        return
    held = max((int(m.group(1)) + 1 for name in tensor_names if (m := DECODER_LAYER.match(name))), default=0)
    if max(counts) > held:
        have = f"layers 0 to {held - 1}" if held else "no decoder layer (model.layers.N.*)"
        raise BuildError(f"config.json says num_hidden_layers {max(counts)}, but the checkpoint's tensors hold "
                         f"{have}: a truncated checkpoint, or a config.json of another model")


# Sizes a config gives that the graph makes tables or shapes of before reading the tensors that
# would contradict them (the rotary tables are sized by head_dim).
# (Not intermediate_size: a family that builds no dense MLP, as Qwen3.5-MoE, never reads it, and a
# dense one checks it against its projections' shapes.)
TENSOR_SIZES = ("head_dim", "hidden_size")


def check_sizes_fit(config: Any, tensors: dict[str, Any]) -> None:
    """Refuses a head_dim or hidden_size larger than the checkpoint's largest
    tensor holds elements: no such model exists, and the rotary tables it sizes (built before the
    first projection's shape is checked) would exhaust memory first (head_dim 10^9)."""
    largest = max((math.prod(t.shape) for t in tensors.values()), default=0)
    for name in TENSOR_SIZES:
        value = getattr(config, name, None)
        if isinstance(value, int) and value > largest:
            raise BuildError(f"config.json: {name} is {value}, larger than any tensor of the checkpoint "
                             f"(the largest holds {largest} values): a config.json of another model")


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


def warn_if_bf16_rounds_stored_scales(prequantized: bool, target: Target) -> None:
    """A pre-quantized input (AWQ/GPTQ, GGUF blocks) keeps its exact values in MatMulNBits only while
    its fp16 scales survive the activation dtype: bfloat16 keeps 8 of their 11 significant bits."""
    if prequantized and target.quantization is not None and np.dtype(target.io_dtype) == ml_dtypes.bfloat16:
        log.warning("warning: bf16 activations round the checkpoint's fp16 quantization scales to bf16, so the "
                    "quantized weights are no longer exactly the checkpoint's; --io-dtype fp16 keeps them exact")


def check_windowed_cache(info: Any, windowed_kv_cache: bool, search: dict[str, Any]) -> None:
    """Refuses a ring-buffer KV cache its own genai_config.json could not run: onnxruntime-genai
    sizes the buffer min(window + slack, max_length), and GroupQueryAttention's ring buffer
    (sliding_window_cache=1) fails when that is shorter than the window."""
    if not (windowed_kv_cache and info.sliding_window_layers):
        return
    max_length = search.get("max_length", info.context_length)
    if max_length < info.sliding_window:
        raise BuildError(
            f"--windowed-kv-cache needs max_length >= the sliding window ({info.sliding_window}), "
            f"but the build's max_length is {max_length}; drop --windowed-kv-cache (full-length caches "
            "work at any max_length)"
        )


def physical_memory() -> int | None:
    """This machine's RAM in bytes, where the OS says (None elsewhere)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def check_room(output: Path, disk_bytes: int, peak_rss: int, context_length: int) -> None:
    """Refuses to start a build the output's file system has no room for, or whose predicted peak
    cannot fit in this machine's memory: tensors made by code (rotary tables of one row per
    position) are computed whole, so an absurd context would end in a MemoryError halfway through."""
    parent = Path(os.path.realpath(output)).parent  # Path.resolve() raises on a link loop
    while not parent.exists():
        parent = parent.parent
    free = shutil.disk_usage(parent).free
    if free < disk_bytes:
        raise BuildError(f"{parent} has {human(free)} free but the build writes {human(disk_bytes)}")
    ram = physical_memory()
    if ram is not None and peak_rss > ram:
        raise BuildError(f"the build would hold ~{human(peak_rss)} in memory at its peak, more than this "
                         f"machine's {human(ram)} (rotary tables have one row per position: --context-length caps "
                         f"the {context_length} positions)")
