"""What a build reads, in whichever form the user has it: config.json and safetensors, a GGUF file,
AWQ/GPTQ or FP8 safetensors, and optionally a LoRA adapter on top. Each becomes a Checkpoint that
maps Hugging Face tensor names to lazy Weights, so architectures never know which they read."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from builder import awq_gptq, fp8, gguf_checkpoint, hub, lora, trust
from builder.checkpoint import Checkpoint
from builder.hf_config import read_json
from builder.options import BuildOptions
from builder.preflight import check_not_prequantized

log = logging.getLogger("builder")


@dataclass
class Input:
    """A model folder's config (config.json, or one derived from a GGUF file's metadata) and what
    is known of its format before any tensor header is read (a GGUF's header already is)."""

    folder: Path
    config: dict[str, Any]
    gguf: Path | None = None
    gguf_checkpoint: Any = None
    gguf_metadata: Any = None
    quantized: Any = None  # an AWQ/GPTQ format, when config.json's quantization_config names one
    float8: Any = None  # an FP8 format, likewise

    @property
    def config_path(self) -> Path:
        return self.gguf or self.folder / "config.json"


def read_input(folder: Path) -> Input:
    """The config and the format of `folder`; reads config.json or a GGUF header, no tensor.
    First of all, a folder's links are checked: nothing outside it is read (builder/trust.py)."""
    if folder.is_dir():
        trust.check_folder(folder)
    gguf = gguf_checkpoint.find(folder)
    if gguf is not None:
        raw, checkpoint, metadata = gguf_checkpoint.GGUFCheckpoint.open_file(gguf)
        return Input(folder, raw, gguf, checkpoint, metadata)
    raw = read_json(folder / "config.json", "model")
    return Input(folder, raw, quantized=awq_gptq.quant_format(raw, folder / "config.json"),
                 float8=fp8.fp8_format(raw, folder / "config.json"))


def check_quantization(inp: Input, accepted: tuple[str, ...]) -> None:
    """Refuses a pre-quantized config nothing here reads (`accepted`: the architecture's own
    quant methods, such as gpt-oss's mxfp4). AWQ/GPTQ/FP8 are read at the top level only (a
    text_config's would belong to other tensor names)."""
    raw = inp.config
    read = inp.quantized is not None or inp.float8 is not None
    check_not_prequantized({**raw, "quantization_config": None} if read else raw, inp.folder / "config.json", accepted)


def open_checkpoint(inp: Input, options: BuildOptions) -> tuple[Any, lora.Adapter | None]:
    """The input's Checkpoint (safetensors headers read now), wrapped by the --adapter's LoRA merge."""
    if inp.gguf_checkpoint is not None:
        checkpoint = inp.gguf_checkpoint
    elif inp.quantized is not None:
        checkpoint = awq_gptq.QuantizedCheckpoint.open_quantized(inp.folder, inp.quantized)
    elif inp.float8 is not None:
        checkpoint = fp8.FP8Checkpoint.open_fp8(inp.folder, inp.float8)
    else:
        checkpoint = Checkpoint.open(inp.folder)
    if options.adapter is None:
        return checkpoint, None
    adapter = lora.Adapter.open(adapter_folder(options))
    trained_on = str(adapter.config.get("base_model_name_or_path") or "")
    given = options.model or str(options.input)
    if trained_on and Path(trained_on.rstrip("/")).name != Path(given.rstrip("/")).name:
        log.warning("the adapter was trained on %s, not %s; building anyway", trained_on, given)
    return lora.LoraCheckpoint(checkpoint, adapter), adapter


def adapter_folder(options: BuildOptions) -> Path | None:
    """The local folder of --adapter (the folder itself, or its hub snapshot), None without one."""
    if options.adapter is None:
        return None
    return hub.resolve(options.adapter, None, options.cache_dir, hub.ADAPTER_PATTERNS)
