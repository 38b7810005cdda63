"""What a build reads, in whichever form the user has it: config.json and safetensors, a GGUF file,
AWQ/GPTQ or FP8 safetensors. Each is a Source (builder/inputs/source.py) whose checkpoint maps
Hugging Face tensor names to lazy Weights, so neither the pipeline nor the architectures know
which they read; a LoRA adapter wraps any of them (builder/inputs/lora.py)."""

from __future__ import annotations

from pathlib import Path

from builder.hf_config import read_json
from builder.inputs import trust
from builder.inputs.awq_gptq import QuantizedSource, quant_format
from builder.inputs.fp8 import FP8Source, fp8_format
from builder.inputs.gguf.checkpoint import GGUFSource, find
from builder.inputs.safetensors import SafetensorsSource
from builder.inputs.source import Source


def read_input(folder: Path) -> Source:
    """The Source of `folder` (a model folder, or a GGUF file or a folder holding one): its config
    read, config.json or a GGUF header, no tensor. First of all, a folder's links are checked:
    nothing outside it is read (builder/inputs/trust.py)."""
    if folder.is_dir():
        trust.check_folder(folder)
    gguf = find(folder)
    if gguf is not None:
        return GGUFSource(gguf)
    config_path = folder / "config.json"
    raw = read_json(config_path, "model")
    quantized = quant_format(raw, config_path)  # AWQ/GPTQ, when quantization_config names one
    if quantized is not None:
        return QuantizedSource(folder, raw, quantized)
    float8 = fp8_format(raw, config_path)
    if float8 is not None:
        return FP8Source(folder, raw, float8)
    return SafetensorsSource(folder, raw)
