"""build(options): model folder -> config -> lazy graph -> saved ONNX folder. One direction, no loops back."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx_ir as ir
from onnx_ir.passes.common import RemoveUnusedNodesPass, TopologicalSortPass

import architectures
from builder import gguf_tokenizer, hub, lora, record
from builder.architecture import DecoderInfo, decoder_info
from builder.checkpoint import Checkpoint
from builder.errors import BuildError
from builder.genai_config import genai_config, write_genai_files
from builder.graph import Graph
from builder.hf_config import read_json
from builder.hub import TOKENIZER_FILES
from builder.inputs import (
    check_quantization,
    open_checkpoint,
    read_input,
)
from builder.io import DecoderIO
from builder.options import BuildOptions
from builder.preflight import (
    check_context_length,
    check_float_layers,
    timed,
    warn_if_no_tokenizer,
)
from builder.record import hash_inputs
from builder.report import Estimate, estimate
from builder.units import human
from builder.version import __version__
from builder.writer import check_output, save_model, staged_folder

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
    estimate: Estimate
    graph_sources: dict[str, tuple[str, ...]]  # initializer -> the checkpoint tensors it reads
    gguf_metadata: dict[str, Any] | None = None  # a GGUF source's metadata (its tokenizer)
    adapter: lora.Adapter | None = None  # a LoRA adapter merged into the weights

    @property
    def parameters(self) -> int:
        """Parameters the model uses (a multimodal checkpoint's vision tower is not counted)."""
        used = {n for names in self.graph_sources.values() for n in names}
        return sum(math.prod(self.checkpoint.info(n).shape) for n in used)


def source_folder(options: BuildOptions) -> Path:
    """The local folder (or GGUF file) to build from."""
    if options.input is not None:
        folder = Path(options.input).expanduser()
        if not folder.is_dir() and not (folder.is_file() and folder.suffix == ".gguf"):
            raise BuildError(f"--input {folder}: no such folder")
        return folder
    return hub.resolve(options.model, options.revision, options.cache_dir)


def local_inputs(options: BuildOptions) -> list[Path]:
    """The input folders known before any hub lookup (which source_folder may do)."""
    named = [Path(options.input).expanduser()] if options.input is not None else []
    paths = [Path(p).expanduser() for p in (options.model, options.adapter) if p]
    return named + [p for p in paths if p.exists()]


def plan(options: BuildOptions, folder: Path) -> Plan:
    """Reads config.json and the safetensors headers (or a GGUF file's header) and records the
    graph; reads no weight."""
    inp = read_input(folder)
    raw = inp.config
    names = raw.get("architectures") or []
    if not names:
        raise BuildError(f"{folder / 'config.json'} names no architecture (the 'architectures' key)")
    if raw.get("auto_map") and names[0] not in architectures.ARCHITECTURES:
        raise BuildError(
            f"{names[0]} needs the checkpoint's own Python code (auto_map / trust_remote_code), which "
            f"builder never runs; supported: {', '.join(sorted(architectures.ARCHITECTURES))}"
        )
    known = names[0] in architectures.ARCHITECTURES
    check_quantization(inp, getattr(architectures.load(names[0]), "QUANT_METHODS", ()) if known else ())
    module = architectures.load(names[0])
    config = module.parse_config(raw, names[0])
    info = decoder_info(config)
    target = options.target().with_layers(info.num_layers)
    check_context_length(target, info.context_length)
    if target.context_length:
        info = dataclasses.replace(info, context_length=target.context_length)
    checkpoint, adapter = open_checkpoint(inp, options)

    g = Graph()
    check_windowed_cache(info, options)
    windowed = info.sliding_window_layers if target.windowed_kv_cache else []
    io = DecoderIO.create(info.num_layers, info.num_kv_heads, info.head_size, target.io_dtype, windowed)
    logits, presents = module.build(g, io, checkpoint, config, target)
    checkpoint.check_consumed(module.IGNORED)
    if target.quantization is not None:
        check_float_layers(target.quantization.float_layers, g.linears)
        check_float_layers(tuple(options.int8_layers), g.linears, "--int8-layers")
    if inp.gguf is None:
        warn_if_no_tokenizer(folder)
    model = g.model(io.inputs, io.outputs(logits, info.vocab_size, presents))
    RemoveUnusedNodesPass()(model)
    TopologicalSortPass()(model)

    generation_path = folder / "generation_config.json"
    generation = read_json(generation_path, "model") if inp.gguf is None and generation_path.is_file() else {}
    source_bytes = {name: [checkpoint.info(s).nbytes for s in srcs] for name, srcs in g.sources.items()}
    return Plan(folder, names[0], config, info, checkpoint, model, generation,
                estimate(model, source_bytes), dict(g.sources), inp.gguf_metadata, adapter)


def check_windowed_cache(info: DecoderInfo, options: BuildOptions) -> None:
    """Refuses a ring-buffer KV cache its own genai_config.json could not run: onnxruntime-genai
    sizes the buffer min(window + slack, max_length), and GroupQueryAttention's ring buffer
    (sliding_window_cache=1) fails when that is shorter than the window."""
    if not (options.windowed_kv_cache and info.sliding_window_layers):
        return
    max_length = options.search.get("max_length", info.context_length)
    if max_length < info.sliding_window:
        raise BuildError(
            f"--windowed-kv-cache needs max_length >= the sliding window ({info.sliding_window}), "
            f"but the build's max_length is {max_length}; drop --windowed-kv-cache (full-length caches "
            "work at any max_length)"
        )


def describe(p: Plan, options: BuildOptions) -> str:
    """The plan in words: what --dry-run prints."""
    e = p.estimate
    genai = len(json.dumps(genai_config(p.info, options.target(), p.generation, options.search), indent=4))
    tokenizer = {n: (p.source / n).stat().st_size for n in TOKENIZER_FILES if (p.source / n).is_file()}
    lines = [
        f"architecture     {p.architecture} ({p.info.model_type}), {p.info.num_layers} layers, "
        f"hidden {p.info.hidden_size}, heads {p.info.num_attention_heads}/{p.info.num_kv_heads}, head {p.info.head_size}",
        f"parameters       {p.parameters:,} in {len(p.checkpoint.tensors)} checkpoint tensors "
        f"({human(p.checkpoint.nbytes)})",
        f"build            {options.precision}, {options.execution_provider}, activations {options.resolved_io_dtype}, "
        f"context {p.info.context_length}",
        "operators        " + ", ".join(f"{op} {n}" for op, n in e.ops.items()),
        f"output           {options.output_folder}",
        f"  model.onnx       ~{human(e.proto_bytes)}",
        f"  model.onnx.data  {human(e.data_bytes)}",
        f"  genai_config.json ~{human(genai)}",
        *(f"  {n:16s} {human(size)}" for n, size in tokenizer.items()),
        f"disk needed      {human(disk_need(p, options))}",
        f"peak memory      ~{human(e.peak_rss)} (predicted)",
    ]
    return "\n".join(lines)


def disk_need(p: Plan, options: BuildOptions) -> int:
    tokenizer = sum((p.source / n).stat().st_size for n in TOKENIZER_FILES if (p.source / n).is_file())
    return p.estimate.data_bytes + p.estimate.proto_bytes + tokenizer + 64 * 1024


def check_disk(p: Plan, options: BuildOptions) -> None:
    """Refuses to start a build the output's file system has no room for."""
    parent = options.output_folder.resolve().parent
    while not parent.exists():
        parent = parent.parent
    free = shutil.disk_usage(parent).free
    need = disk_need(p, options)
    if free < need:
        raise BuildError(f"{parent} has {human(free)} free but the build writes {human(need)}")


def dry_run(options: BuildOptions) -> str:
    """Reads config.json and the safetensors headers only; returns the plan's description."""
    return describe(plan(options, source_folder(options)), options)


def build(options: BuildOptions, progress: bool = True) -> Path:
    """Builds the model `options` describe and returns the output folder.

    Example:
        >>> from builder import BuildOptions, build
        >>> build(BuildOptions(model="./tiny-llama", output="out/tiny", precision="fp32"))  # doctest: +SKIP
    """
    started = time.perf_counter()
    output = options.output_folder
    check_output(output, options.overwrite, local_inputs(options))  # fail before downloading or reading anything
    with timed("resolve"):
        folder = source_folder(options)
    check_output(output, options.overwrite, [folder])  # a hub model's snapshot folder is known only now
    with timed("plan"):
        p = plan(options, folder)
    log.debug("%s", describe(p, options))
    check_disk(p, options)
    log.info("%s: %d layers, %s parameters, %s of weights", p.architecture, p.info.num_layers,
             f"{p.parameters:,}", human(p.checkpoint.nbytes))
    inputs = [folder] if folder.is_file() else [f for f in folder.iterdir() if f.is_file() and not f.name.startswith(".")]
    hashes = hash_inputs(inputs)
    adapter_hashes = hash_inputs(p.adapter.files()) if p.adapter is not None else None
    try:
        with staged_folder(output, options.overwrite, [folder]) as staging:
            with timed("write weights"):
                save_model(p.model, staging, progress=progress)
            with timed("genai files"):
                write_genai_files(folder, staging, genai_config(p.info, options.target(), p.generation, options.search))
                if p.gguf_metadata is not None:
                    gguf_tokenizer.write_tokenizer(p.gguf_metadata, staging)
            with timed("hashing inputs"):
                digests = hashes.result()
                adapter = None if p.adapter is None else (p.adapter.folder, adapter_hashes.result())
            record.write(staging / "build.yaml", record.build_record(options, folder, digests, __version__, adapter))
    except OSError as e:  # a full disk, a vanished mount: the staging folder is already gone
        raise BuildError(f"writing {output} failed: {e.strerror or e}; nothing was written") from None
    log.info("wrote %s in %.1f s", output, time.perf_counter() - started)
    return output
