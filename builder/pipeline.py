"""build(options): model folder -> config -> lazy graph -> saved ONNX folder. One direction, no loops back."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx_ir as ir
from onnx_ir.passes.common import RemoveUnusedNodesPass, TopologicalSortPass

from builder import hub, record, registry
from builder.architecture import DecoderInfo, decoder_info
from builder.digests import hash_inputs
from builder.errors import BuildError
from builder.genai_config import genai_config
from builder.graph import Graph
from builder.hub import TOKENIZER_FILES
from builder.inputs.lora import Adapter, with_adapter
from builder.inputs.read import read_input
from builder.inputs.renamed import RenamedCheckpoint
from builder.inputs.source import Checkpoint, Source
from builder.draft_head import HIDDEN_STATES, with_draft_head
from builder.io import DecoderIO, hidden_output
from builder.kv_cache import read_scales
from builder.lazy import Weight
from builder.providers import Provider
from builder.options import BuildOptions
from builder.output_folder import check_output
from builder.package import Package
from builder.preflight import (
    check_context_length,
    check_float_layers,
    check_layer_count,
    check_room,
    check_windowed_cache,
    check_sizes_fit,
    warn_if_bf16_rounds_stored_scales,
)
from builder.report import Estimate, combined, estimate
from builder.units import human
from builder.version import __version__
from builder.timing import timed
from builder.writer import MODEL_STEM, write_output

log = logging.getLogger("builder")


@dataclass
class Plan:
    """A model ready to be written: the graph with lazy weights and everything said about it."""

    folder: Path  # the model folder (or GGUF file)
    architecture: str
    config: Any
    info: DecoderInfo
    checkpoint: Checkpoint
    model: ir.Model
    generation: dict[str, Any]
    estimate: Estimate
    graph_sources: dict[str, tuple[str, ...]]  # initializer -> the checkpoint tensors it reads
    source: Source  # what `folder` holds, in its format (and the files that format writes into the output)
    adapter: Adapter | None = None  # a LoRA adapter merged into the weights
    package: Package | None = None  # the models beside the decoder and their genai_config sections, or None
    estimates: dict[str, Estimate] | None = None  # each model's own (file stem -> estimate)
    target: Any = None  # the Target the model was built for (the options' with what the checkpoint decided)

    @property
    def parameters(self) -> int:
        """Parameters the models use (a text-only build of a multimodal checkpoint: the decoder's)."""
        used = {n for names in self.graph_sources.values() for n in names}
        return sum(math.prod(self.checkpoint.info(n).shape) for n in used)


def source_folder(options: BuildOptions) -> Path:
    """The local folder (or GGUF file) to build from."""
    if options.input is not None:
        folder = Path(options.input).expanduser()
        if folder.is_dir() or (folder.is_file() and folder.suffix == ".gguf"):
            return folder
        if folder.exists():
            raise BuildError(f"--input {folder} is a file; --input takes a folder or a .gguf file")
        raise BuildError(f"--input {folder}: no such {'file' if folder.suffix == '.gguf' else 'folder'}")
    return hub.resolve(options.model, options.revision, options.cache_dir)


def local_inputs(options: BuildOptions) -> list[Path]:
    """The input folders known before any hub lookup (which source_folder may do)."""
    named = [Path(options.input).expanduser()] if options.input is not None else []
    paths = [Path(p).expanduser() for p in (options.model, options.adapter) if p]
    return named + [p for p in paths if p.exists()]


def plan(options: BuildOptions, folder: Path) -> Plan:
    """Reads config.json and the safetensors headers (or a GGUF file's header) and records the
    graph; reads no weight. The checks first (the architecture, the config against the tensors,
    the options against the package), then each model recorded, checked and estimated."""
    inp = read_input(folder)
    raw = inp.config
    name = _architecture(raw, inp.config_path)
    known = name in registry.architectures()
    inp.check_quantization(registry.load(name).quant_methods if known else ())
    family = registry.load(name)
    checkpoint = stored = inp.open_checkpoint()
    alias = family.model_type(name)  # the hub's other names for the family's tensors
    if alias is not None and alias.renames:
        checkpoint = RenamedCheckpoint(stored, alias.renames)
    check_layer_count(raw, checkpoint.tensors)  # before the config makes anything per layer
    config = family.parse_config(raw, name)
    if alias is not None and alias.splits is not None:  # fused rows, split by the config's sizes
        checkpoint = RenamedCheckpoint(stored, alias.renames, alias.splits(config))
    checkpoint, adapter = with_adapter(checkpoint, options)
    check_sizes_fit(config, checkpoint.tensors)
    info = decoder_info(config)
    target = options.target().with_layers(info.num_layers)
    check_context_length(target, info.context_length)
    if target.context_length:
        info = dataclasses.replace(info, context_length=target.context_length)
    warn_if_bf16_rounds_stored_scales(inp.stores_blocks, target)
    packager = registry.load_package(name) if inp.can_package and not options.text_only else None
    package = packager(raw, folder, checkpoint, config, target) if packager is not None else None
    check_windowed_cache(info, options.windowed_kv_cache, options.search)
    _check_package_options(name, family, package, options, target)
    package, ignored = with_draft_head(name, family, checkpoint, config, info, package, options, target)

    g = Graph()
    inputs, outputs, target = _record_decoder(g, family, checkpoint, config, info, package, options, target)
    checkpoint.check_consumed(ignored)
    if target.quantization is not None:
        check_float_layers(target.quantization.float_layers, g.linears)
        check_float_layers(tuple(options.int8_layers), g.linears, "--int8-layers")
    inp.check_tokenizer()
    model = g.model(inputs, outputs, standard=target.standard_ops)
    _finish(model, name, target)
    generation = inp.generation_config(info.vocab_size)
    sources = dict(g.sources)
    stored: set = set()  # the values the models before store (a tied vocabulary: writer.save_models)
    estimates = {MODEL_STEM: estimate(model, _source_bytes(checkpoint, g.sources), g.members, stored, g.quantizes)}
    for part in package.models if package is not None else ():
        _finish(part.model, f"{name}'s {part.stem} model", target)
        sources.update({f"{part.stem}:{n}": srcs for n, srcs in part.sources.items()})
        estimates[part.stem] = estimate(part.model, _source_bytes(checkpoint, part.sources), stored=stored)
    total = combined(list(estimates.values()))
    total = dataclasses.replace(total, peak_rss=total.peak_rss + inp.files_memory())  # a GGUF's tokenizer
    return Plan(folder, name, config, info, checkpoint, model, generation, total,
                sources, inp, adapter, package, estimates, target)


def _architecture(raw: dict, config_path: Path) -> str:
    """config.json's first architecture, as the registry names it (or the row its model_type maps to,
    Family.model_types); refused when malformed or when it needs the checkpoint's own code."""
    given = raw.get("architectures")
    if not (isinstance(given, list) and given and all(isinstance(n, str) for n in given)):
        raise BuildError(f"{config_path}: 'architectures' must be a list of class names (transformers' model "
                         f"classes), got {json.dumps(given)[:80]}")
    name = registry.resolve(raw)  # the row its model_type maps to, as transformers' auto classes do
    known = registry.architectures()
    if raw.get("auto_map") and name not in known:
        raise BuildError(
            f"{name} needs the checkpoint's own Python code (auto_map / trust_remote_code), which "
            f"builder never runs; supported: {', '.join(sorted(known))}"
        )
    return name


def _check_package_options(name: str, family, package: Package | None, options: BuildOptions, target) -> None:
    """Options a package (several models) or a decoder with I/O of its own does not take."""
    own_decoder = family.layer is None  # recorded by its package (Package.decoder), not the shared body
    if target.last_logits_only and (package is not None or own_decoder):
        raise BuildError(f"--prune-lm-head: {name}'s package (encoder and decoder models) is not proved "
                         "with last-position logits; build it without --prune-lm-head"
                         + (" or build the text decoder alone (--text-only)" if not own_decoder else ""))
    if own_decoder:  # a decoder with I/O of its own (an encoder-decoder's)
        if package is None or package.decoder is None:
            raise BuildError(f"{name}'s decoder runs only beside its encoder: build the whole package "
                             "(without --text-only, from a safetensors folder)")
        if options.kv_cache != "float" or target.standard_ops:
            raise BuildError(f"{name}: --kv-cache and --standard-ops apply to decoders of the shared I/O "
                             "contract, not its encoder-decoder package")


def _record_decoder(g: Graph, family, checkpoint, config, info: DecoderInfo, package, options: BuildOptions,
                    target) -> tuple[list[ir.Value], list[ir.Value], object]:
    """The decoder recorded on `g`, its inputs and outputs from the layers' declared states
    (DecoderIO.from_states), or by the package's own recorder (Package.decoder); returns (inputs,
    outputs, the target, with the int8 KV cache's scales where asked)."""
    if package is not None and package.decoder is not None:
        return (*package.decoder(g, checkpoint, config, target), target)
    windowed = info.sliding_window_layers if target.windowed_kv_cache else []
    embeds = package is not None and package.embeds
    io = DecoderIO.from_states(info.layers, target.io_dtype, windowed,
                               embeds_width=(package.embeds_width or info.hidden_size) if embeds else None,
                               position_ids=target.provider.position_ids,
                               kv_dtype=np.int8 if options.kv_cache != "float" else None,
                               position_rows=package.position_rows if package is not None else None)
    # The provider's positions (batch, sequence) feed explicit rotary; Qwen-VL's M-RoPE rows its own tables.
    g.position_ids = io.position_ids if io.position_ids is not None and len(io.position_ids.shape) == 2 else None
    if options.kv_cache != "float":
        target = _with_kv_scales(g, io, info, target, options)
    logits, presents, hidden = family.build(g, io, checkpoint, config, target)
    outputs = io.outputs(logits, info.vocab_size, presents, target.last_logits_only)
    if package is not None and HIDDEN_STATES in package.decoder_outputs:  # what a draft head reads
        outputs.append(hidden_output(g, hidden, HIDDEN_STATES, target.io_dtype, info.hidden_size))
    return io.inputs, outputs, target


def _finish(model: ir.Model, what: str, target) -> None:
    """A model checked against the target's operator set and the provider's kernels, then its
    unused nodes removed and the rest sorted."""
    if target.standard_ops:
        check_standard_ops(model, what)
    check_provider_kernels(model, target.provider, what)
    RemoveUnusedNodesPass()(model)
    TopologicalSortPass()(model)


def _with_kv_scales(g: Graph, io: DecoderIO, info: DecoderInfo, target, options: BuildOptions):
    """The target with the int8 KV cache's scales, each layer's registered as the initializers
    `model.layers.N.attn.k_scale` / `v_scale` (the reference's names) its GroupQueryAttention reads."""
    shapes = {(s.kv.heads, s.kv.head_size) for s in info.layers if s.kv is not None}
    if info.stateless_layers or len(shapes) > 1:
        raise BuildError(f"--kv-cache {options.kv_cache}: layers whose KV is shaped apart or shared by another "
                         "layer are not supported; build with a float KV cache")
    layers = [i for i, past in enumerate(io.past) if past is not None]
    scales = read_scales(options.kv_cache_scales, options.kv_cache, layers, info.num_kv_heads, info.head_size)
    for i in layers:
        with g.scope("model", f"layers.{i}", "attn"):
            g.kv_scales[io.past[i][0]] = (g.weight("k_scale", Weight.constant(scales.k_scales[i])),
                                          g.weight("v_scale", Weight.constant(scales.v_scales[i])))
    return dataclasses.replace(target, kv_cache=scales)


def check_provider_kernels(model: ir.Model, provider: Provider, what: str) -> None:
    """Nodes the provider has no ONNX Runtime kernel for (builder.provider_kernels): refused where the
    provider needs every kernel (DirectML's captured graph), else a warning that ONNX Runtime runs
    them on the CPU. A node handed bfloat16 that neither the provider nor the CPU has a bfloat16
    kernel for is refused: ONNX Runtime would refuse the session."""
    if provider.name == "cpu":
        return
    # 142 KB of JSON, read once, for other providers only (5 ms)
    from builder.provider_kernels import TYPES, bfloat16_missing, missing, ops_of

    no_bf16 = bfloat16_missing(model, provider.name)
    nowhere = [op for op in no_bf16 if "bfloat16" not in TYPES["cpu"].get(op, ())]  # nor the CPU's fallback
    if nowhere:
        raise BuildError(f"-e {provider.name} bf16: ONNX Runtime has no bfloat16 kernel for {', '.join(nowhere)} on "
                         f"{provider.name} or the CPU, which {what} hands bfloat16 (its session would be refused); "
                         "build fp16 (this is builder's gap: please report it)")
    if no_bf16:
        log.warning(f"warning: -e {provider.name} bf16: ONNX Runtime's {provider.name} provider has no bfloat16 kernel "
                    f"for {', '.join(no_bf16)}, which {what} uses; ONNX Runtime will run those nodes on the CPU")
    gone = missing(ops_of(model), provider.name)
    if not gone:
        return
    line = f"-e {provider.name}: ONNX Runtime's {provider.name} provider has no kernel for {', '.join(gone)}, which {what} uses"
    if provider.needs_every_kernel:
        raise BuildError(f"{line} (its captured graph cannot fall back to the CPU); build for another provider")
    log.warning(f"warning: {line}; ONNX Runtime will run those nodes on the CPU")


def check_standard_ops(model: ir.Model, architecture: str) -> None:
    """Refuses, before anything is written, a --standard-ops model with a node ONNX does not define
    (a com.microsoft operator, or one ONNX Runtime registers in the default domain) at the model's opset."""
    import onnx.defs

    opset = model.opset_imports[""]
    for node in model.graph.all_nodes():
        if node.domain not in ("", "ai.onnx") or not onnx.defs.has(node.op_type, opset, ""):
            name = f"{node.domain}::{node.op_type}" if node.domain else node.op_type
            raise BuildError(f"--standard-ops: {architecture} needs {name} ({node.name}), which is not a standard "
                             f"ONNX operator (opset {opset}); build it without --standard-ops")


def _source_bytes(checkpoint: Checkpoint, sources: dict[str, tuple[str, ...]]) -> dict[str, list[int]]:
    """The bytes of each checkpoint tensor each initializer reads, each tensor once: a stack of
    experts sliced from one stored [E, ...] tensor maps it once, not once per expert."""
    return {name: [checkpoint.info(s).nbytes for s in dict.fromkeys(srcs)] for name, srcs in sources.items()}


def genai_json(p: Plan, options: BuildOptions) -> dict[str, Any]:
    """genai_config.json: the decoder's, or a package's (the package rewrites the decoder's)."""
    config = genai_config(p.info, p.target or options.target(), p.generation, options.search,
                          inputs_embeds=p.package is not None and p.package.decoder is None and p.package.embeds)
    return config if p.package is None else p.package.genai_config(config)


def describe(p: Plan, options: BuildOptions) -> str:
    """The plan in words: what --dry-run prints."""
    e = p.estimate
    genai = len(json.dumps(genai_json(p, options), indent=4))
    parts = [f"  {stem + '.onnx.data':16s} {human(part.data_bytes)}" for stem, part in (p.estimates or {}).items()
             if stem != MODEL_STEM and part.data_bytes]  # a model whose weights all lie in another's writes none
    tokenizer = {n: (p.folder / n).stat().st_size for n in TOKENIZER_FILES if (p.folder / n).is_file()}
    lines = [
        f"architecture     {p.architecture} ({p.info.model_type}), {p.info.num_layers} layers, "
        f"hidden {p.info.hidden_size}, heads {p.info.num_attention_heads}/{p.info.num_kv_heads}, head {p.info.head_size}",
        f"parameters       {p.parameters:,} in {len(p.checkpoint.tensors)} checkpoint tensors "
        f"({human(p.checkpoint.nbytes)})",
        f"build            {options.precision}, {options.execution_provider}, activations {options.resolved_io_dtype}, "
        f"context {p.info.context_length}",
        "operators        " + ", ".join(f"{op} {n}" for op, n in e.ops.items()),
        f"output           {options.output_folder}",
        f"  model.onnx       ~{human(e.proto_bytes)}" + (" (all the .onnx files)" if parts else ""),
        f"  model.onnx.data  {human((p.estimates or {MODEL_STEM: e})[MODEL_STEM].data_bytes)}",
        *parts,
        f"  genai_config.json ~{human(genai)}",
        *(f"  {n:16s} {human(size)}" for n, size in tokenizer.items()),
        f"disk needed      {human(disk_need(p, options))}",
        f"peak memory      ~{human(e.peak_rss)} (predicted)",
    ]
    return "\n".join(lines)


def disk_need(p: Plan, options: BuildOptions) -> int:
    tokenizer = sum((p.folder / n).stat().st_size for n in TOKENIZER_FILES if (p.folder / n).is_file())
    return p.estimate.data_bytes + p.estimate.proto_bytes + tokenizer + 64 * 1024


def dry_run(options: BuildOptions) -> str:
    """Reads config.json and the safetensors headers only; returns the plan's description."""
    return describe(plan(options, source_folder(options)), options)


def build(options: BuildOptions, progress: bool = True, on_published: Callable[[Path], None] | None = None) -> Path:
    """Builds the model `options` describe and returns the output folder (`on_published(folder)`
    is called the moment it is complete: see builder.publish.staged_folder).

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
    check_room(options.output_folder, disk_need(p, options), p.estimate.peak_rss, p.info.context_length)
    log.info("%s: %d layers, %s parameters, %s of weights", p.architecture, p.info.num_layers,
             f"{p.parameters:,}", human(p.checkpoint.nbytes))
    inputs = [folder] if folder.is_file() else [f for f in folder.iterdir() if f.is_file() and not f.name.startswith(".")]
    hashes = hash_inputs(inputs)
    adapter_hashes = hash_inputs(p.adapter.files()) if p.adapter is not None else None
    def record_now() -> dict:
        with timed("hashing inputs"):
            adapter = None if p.adapter is None else (p.adapter.folder, adapter_hashes.result())
            return record.build_record(options, folder, hashes.result(), __version__, adapter)

    def package_files(staging: Path) -> None:
        if p.package is not None and p.package.processor:
            (staging / p.package.processor_file).write_text(json.dumps(p.package.processor, indent=2) + "\n")
        p.source.write_files(staging)

    write_output(output, {MODEL_STEM: p.model, **{m.stem: m.model for m in (p.package.models if p.package else ())}},
                 genai_json(p, options), folder, record_now, overwrite=options.overwrite,
                 inputs=[folder] if p.adapter is None else [folder, p.adapter.folder],  # a hub adapter's snapshot too
                 progress=progress, more_files=package_files, on_published=on_published)
    log.info("wrote %s in %.1f s", output, time.perf_counter() - started)
    return output
