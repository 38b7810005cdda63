"""build(options): model folder -> config -> lazy graph -> saved ONNX folder. One direction, no loops back."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx_ir as ir
from onnx_ir.passes.common import RemoveUnusedNodesPass, TopologicalSortPass

import architectures
from builder import hub
from builder.architecture import DecoderInfo
from builder.checkpoint import Checkpoint
from builder.errors import BuildError
from builder.genai_config import genai_config, write_genai_files
from builder.graph import Graph
from builder.hf_config import read_json
from builder.io import DecoderIO
from builder.options import BuildOptions
from builder.save import check_output, save_model, staged_folder

log = logging.getLogger("builder")


@dataclass
class Plan:
    """A model ready to be written: the graph with lazy weights and everything said about it."""

    source: Path
    architecture: str
    config: Any
    info: DecoderInfo
    checkpoint: Checkpoint
    model: ir.Model
    generation: dict[str, Any]


def source_folder(options: BuildOptions) -> Path:
    if options.input is not None:
        folder = Path(options.input).expanduser()
        if not folder.is_dir():
            raise BuildError(f"--input {folder}: no such folder")
        return folder
    return hub.resolve(options.model, options.revision)


def plan(options: BuildOptions, folder: Path) -> Plan:
    """Reads config.json and the safetensors headers and records the graph; reads no weight."""
    raw = read_json(folder / "config.json", "model")
    names = raw.get("architectures") or []
    if not names:
        raise BuildError(f"{folder / 'config.json'} names no architecture (the 'architectures' key)")
    module = architectures.load(names[0])
    config = module.parse_config(raw, names[0])
    info = module.info(config)
    checkpoint = Checkpoint.open(folder)
    target = options.target()

    g = Graph()
    windowed = info.sliding_window_layers if target.windowed_kv_cache else []
    io = DecoderIO.create(info.num_layers, info.num_kv_heads, info.head_size, target.io_dtype, windowed)
    logits, presents = module.build(g, io, checkpoint, config, target)
    checkpoint.check_consumed(module.IGNORED)
    model = g.model(io.inputs, io.outputs(logits, info.vocab_size, presents))
    RemoveUnusedNodesPass()(model)
    TopologicalSortPass()(model)

    generation_path = folder / "generation_config.json"
    generation = read_json(generation_path, "model") if generation_path.is_file() else {}
    return Plan(folder, names[0], config, info, checkpoint, model, generation)


def build(options: BuildOptions, progress: bool = True) -> Path:
    """Builds the model `options` describe and returns the output folder.

    Example:
        >>> from builder import BuildOptions, build
        >>> build(BuildOptions(model="./tiny-llama", output=Path("out/tiny"), precision="fp32"))  # doctest: +SKIP
    """
    started = time.perf_counter()
    output = options.output_folder
    check_output(output, options.overwrite)  # fail before downloading or reading anything
    folder = source_folder(options)
    p = plan(options, folder)
    log.info("%s: %d layers, %d tensors, %.1f MB of weights", p.architecture, p.info.num_layers,
             len(p.checkpoint.tensors), p.checkpoint.nbytes / 1e6)
    with staged_folder(output, options.overwrite) as staging:
        save_model(p.model, staging, progress=progress)
        write_genai_files(folder, staging, genai_config(p.info, options.target(), p.generation))
    log.info("wrote %s in %.1f s", output, time.perf_counter() - started)
    return output
