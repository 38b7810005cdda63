"""Writing the weights: each model's initializers streamed into its external data file by onnx_ir's
bounded parallel writer, every lazy weight computed as it is written, a value that an earlier model
of the build stored (the same `lazy_results.content_key`) referenced there instead of computed and
written again; and save(), which writes a crafted decoder as a complete output (published by
builder/publish.py).
"""

from __future__ import annotations

import gc
import os
import sys
import time
from collections.abc import Callable, Container, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import onnx_ir as ir

from builder.errors import BuildError
from builder.lazy_results import content_key
from builder.output_folder import RECORD_FILE
from builder.publish import staged_folder
from builder.target import Target
from builder.timing import timed

MODEL_STEM = "model"  # the decoder: model.onnx and model.onnx.data
# Bytes of materialized tensors the writer may hold at once (beyond the one being written).
MAX_IN_FLIGHT_BYTES = 512 * 1024 * 1024
# Initializers up to this size live in model.onnx itself (constants, not weights).
INLINE_BYTES = 1024
# Writer threads: casting and quantizing in numpy release the GIL, so each core computes a tensor.
MAX_WORKERS = os.cpu_count() or 1


class Progress:
    """Bytes done, rate and ETA on stderr: a live bar on a terminal, else a plain line per 10%."""

    def __init__(self, total: int, what: str):
        self.total, self.what, self.done = total, what, 0
        self.started = time.perf_counter()
        self.bar = None
        self.next_line = 0.1
        if sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total, unit="B", unit_scale=True, desc=what, file=sys.stderr, leave=False)

    def advance(self, nbytes: int) -> None:
        self.done += nbytes
        if self.bar is not None:
            self.bar.update(nbytes)
            return
        fraction = self.done / self.total if self.total else 1.0
        if fraction >= self.next_line or self.done == self.total:
            elapsed = time.perf_counter() - self.started
            eta = elapsed / fraction - elapsed if fraction else 0.0
            from builder.units import human

            print(f"{self.what}: {fraction:4.0%} ({human(self.done)} of {human(self.total)}), "
                  f"{elapsed:.0f} s, ETA {eta:.0f} s", file=sys.stderr, flush=True)
            while self.next_line <= fraction:
                self.next_line += 0.1

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def reuse_freed_memory() -> None:
    """Lets glibc keep freed tensor buffers (up to 1 GiB each) for the next tensor instead of
    returning them to the kernel, which would zero fresh pages again for every weight: a quarter
    less system time on a 1B build. Peak memory is unchanged: it is set by the largest tensors."""
    if sys.platform != "linux":
        return
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return
    m_trim_threshold, m_mmap_threshold = -1, -3
    libc.mallopt(m_mmap_threshold, 1 << 30)
    libc.mallopt(m_trim_threshold, 1 << 30)


def save_model(model: ir.Model, folder: Path, progress: bool = True, stem: str = MODEL_STEM) -> None:
    """ir.save to `stem`.onnx with every initializer in one external file (`stem`.onnx.data), each
    lazy weight computed as it is written."""
    save_models({stem: model}, folder, progress)


def save_models(models: dict[str, ir.Model], folder: Path, progress: bool = True) -> None:
    """save_model for each (file stem -> model), one after another, under one progress report."""
    reuse_freed_memory()
    # The writer reports the tensors it writes to the .onnx.data files (data_tensors).
    keys: set = set()
    total = 0
    for m in models.values():
        written = data_tensors(m, keys)
        total += sum(t.nbytes for t in written)
        keys |= content_keys(written)
    report = Progress(total, "reading, converting and writing weights") if progress else None

    def callback(tensor: ir.TensorProtocol, _info) -> None:
        if report is not None and tensor.nbytes > INLINE_BYTES:
            report.advance(tensor.nbytes)

    gc_was_enabled = gc.isenabled()
    gc.disable()  # the writer allocates no cycles; collections only cost time (6% in a profile)
    stored: dict[object, ir.ExternalTensor] = {}  # content key -> where an earlier model stored it
    try:
        for stem, model in models.items():
            _save_one(model, folder, stem, callback, stored)
    finally:
        if gc_was_enabled:
            gc.enable()
        if report is not None:
            report.close()


def _external(model: ir.Model, earlier: Container = ()) -> list[ir.Value]:
    """The initializers of `model` stored outside model.onnx (over INLINE_BYTES) whose value no
    earlier model of the build stored (`earlier`: their content keys)."""
    return [v for v in model.graph.initializers.values() if v.const_value is not None
            and v.const_value.nbytes > INLINE_BYTES and content_key(v.const_value) not in earlier]


def data_tensors(model: ir.Model, earlier: Container = ()) -> list[ir.TensorProtocol]:
    """The tensors `model`'s .onnx.data holds, given the content keys earlier models of the build
    stored: what save_models writes and report.estimate counts."""
    return [v.const_value for v in _external(model, earlier)]


def content_keys(tensors: Iterable[ir.TensorProtocol]) -> set:
    """The content keys among `tensors` (lazy_results.content_key)."""
    return {key for t in tensors if (key := content_key(t)) is not None}


def _save_one(model: ir.Model, folder: Path, stem: str, callback, stored: dict[object, ir.ExternalTensor]) -> None:
    """`stem`.onnx with its weights in `stem`.onnx.data, except a weight an earlier model of the
    build already stored (the same `content_key`): that one points into the earlier model's file.
    What ir.save(external_data=...) does, in its two steps, so that the second can leave those
    references alone; every initializer is given back its lazy tensor afterwards."""
    values = _external(model)
    lazy = {v: v.const_value for v in values}
    fresh = [v for v in values if content_key(v.const_value) not in stored]
    try:
        if fresh:
            written = ir.external_data.convert_tensors_to_external(
                [v.const_value for v in fresh], folder, f"{stem}.onnx.data", callback=callback,
                max_workers=MAX_WORKERS, max_in_flight_bytes=MAX_IN_FLIGHT_BYTES)
            for v, tensor in zip(fresh, written, strict=True):
                if (key := content_key(v.const_value)) is not None:
                    stored[key] = tensor
                v.const_value = tensor
        for v in set(values) - set(fresh):  # an earlier model stored their values
            earlier = stored[content_key(lazy[v])]
            v.const_value = ir.ExternalTensor(earlier.location, earlier.offset, earlier.length, earlier.dtype,
                                              shape=earlier.shape, name=v.name, base_dir=folder)
        # Shapes and axes stay inline, where ONNX Runtime's shape inference reads them.
        ir.save(model, folder / f"{stem}.onnx")
    except Exception as e:
        found = _build_error(e)
        if found is None or found is e:
            raise
        raise found from None
    finally:
        for v, tensor in lazy.items():
            v.const_value = tensor


def save(
    model: ir.Model, folder: str | os.PathLike, overwrite: bool = False, progress: bool = False, *,
    source: str | os.PathLike | None = None, target: Target | None = None, search: dict[str, Any] | None = None,
) -> Path:
    """Writes a crafted decoder as a folder onnxruntime-genai runs, atomically: model.onnx,
    model.onnx.data, genai_config.json, the tokenizer files of `source` and build.yaml.

    genai_config.json takes the layer count, KV heads, head size and vocabulary from the graph's
    inputs and outputs (the DecoderIO contract) and the query heads and sliding windows from its
    GroupQueryAttention nodes; model type, token ids and context length come from `source`'s
    config.json and generation_config.json (the checkpoint the weights came from).

    Args:
        model: the graph, e.g. `g.model(io.inputs, io.outputs(logits, vocab_size, presents))`.
        folder: the output folder; an existing one is replaced only with `overwrite`, and only
            when it holds a previous output (builder's build.yaml and only the files a build writes).
        source: the checkpoint folder: its config, generation config and tokenizer.
        target: the Target the graph was made for (its execution provider and context length).
        search: genai_config.json's search settings to override (max_length, do_sample, ...).

    Example:
        >>> from builder import save
        >>> save(model, "out/my-model", source="path/to/checkpoint")  # doctest: +SKIP
    """
    from builder.config_file import RECORD_KEY
    from builder.genai_config import genai_config
    from builder.version import __version__

    folder = Path(folder)
    source = Path(source).expanduser() if source is not None else None
    target = target or Target(io_dtype=np.dtype(np.float32))
    config, generation = _source_configs(source)
    config_json = genai_config(crafted_info(model, config, target), target, generation, search)
    crafted = {"builder_version": __version__, "crafted": True, "source": str(source.resolve()) if source else None}
    return write_output(folder, {MODEL_STEM: model}, config_json, source, lambda: {RECORD_KEY: crafted},
                        overwrite=overwrite, inputs=[source] if source else [], progress=progress,
                        flag="save(..., overwrite=True)")


def write_output(
    folder: Path, models: dict[str, ir.Model], genai: dict[str, Any], source: Path | None,
    record: Callable[[], dict[str, Any]], *, overwrite: bool, inputs: Iterable[Path], progress: bool = True,
    flag: str = "--overwrite", more_files: Callable[[Path], None] | None = None,
    on_published: Callable[[Path], None] | None = None,
) -> Path:
    """The one way an output is written, by the command line and the Python API alike: the models
    (file stem -> model), genai_config.json, `source`'s tokenizer files, `more_files(staging)`
    (a package's processor file, a GGUF's tokenizer) and build.yaml (`record()`, called last so
    input hashing overlaps the writing), staged and published atomically (builder.publish; it
    calls `on_published(folder)` the moment the output is complete)."""
    from builder.genai_config import write_genai_files
    from builder.record import write

    try:
        with staged_folder(folder, overwrite, inputs, flag=flag, on_published=on_published) as staging:
            with timed("write weights"):
                save_models(models, staging, progress=progress)
            with timed("genai files"):
                write_genai_files(source or staging, staging, genai)  # no source: no tokenizer files to copy
                if more_files is not None:
                    more_files(staging)
            write(staging / RECORD_FILE, record())
    except OSError as e:  # a full disk, a vanished mount: the staging folder is already gone
        raise BuildError(f"writing {folder} failed: {e.strerror or e}; nothing was written") from None
    return folder


def _build_error(e: BaseException) -> BuildError | None:
    """The BuildError a lazy tensor raised while onnx_ir serialized it inline (a small weight
    refused as it is written: onnx_ir wraps it in a SerdeError per level), else None."""
    while e is not None and not isinstance(e, BuildError):
        e = e.__cause__ or (None if e.__suppress_context__ else e.__context__)
    return e


def _source_configs(source: Path | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """config.json (a multimodal one's text_config filling the gaps) and generation_config.json."""
    from builder.hf_config import read_json

    if source is None:
        return {}, {}
    if not source.is_dir():
        raise BuildError(f"source {source}: no such folder")
    config = read_json(source / "config.json", "model") if (source / "config.json").is_file() else {}
    config = {**config.get("text_config", {}), **config}
    generation_path = source / "generation_config.json"
    return config, read_json(generation_path, "model") if generation_path.is_file() else {}


def crafted_info(model: ir.Model, config: dict[str, Any], target: Target):
    """The DecoderInfo genai_config.json needs, read from a graph that follows the DecoderIO contract."""
    from builder.architecture import DecoderInfo
    from builder.config_checks import token_ids
    from builder.io import PAST_KEY, PAST_WINDOW
    from builder.state import KV, LayerState

    inputs = {v.name: v for v in model.graph.inputs}
    outputs = {v.name: v for v in model.graph.outputs}
    past = [inputs[PAST_KEY % i] for i in range(len(inputs)) if PAST_KEY % i in inputs]
    if not past or "logits" not in outputs:
        raise BuildError("save() writes decoders with DecoderIO's inputs and outputs (past_key_values.*, logits)")
    _, kv_heads, _, head_size = past[0].shape.dims  # (B, Hkv, P, D)
    vocab = outputs["logits"].shape.dims[2]  # (B, S, V)
    attention = {n.inputs[3].name: n for n in model.graph if n.op_type == "GroupQueryAttention" and len(n.inputs) > 3}
    if not attention:
        raise BuildError("save() found no GroupQueryAttention reading past_key_values.*: not a decoder it can describe")
    first = next(iter(attention.values()))
    heads = first.attributes["num_heads"].as_int()
    windowed = [i for i, v in enumerate(past) if v.shape.dims[2] == PAST_WINDOW]
    window = attention[past[windowed[0]].name].attributes["local_window_size"].as_int() if windowed else None
    context = target.context_length or config.get("max_position_embeddings")
    if context is None:  # the rotary table's rows: the positions the graph supports
        cos = first.inputs[7] if len(first.inputs) > 7 else None
        context = cos.shape.dims[0] if cos is not None and cos.shape is not None else None
    if not isinstance(context, int):
        raise BuildError("save() needs the context length: pass source= (its config.json) or a Target with context_length")
    return DecoderInfo(
        model_type=config.get("model_type", "llama"), vocab_size=vocab,
        hidden_size=config.get("hidden_size", heads * head_size), num_layers=len(past), num_attention_heads=heads,
        num_kv_heads=kv_heads, head_size=head_size, context_length=context,
        bos_token_id=config.get("bos_token_id"), eos_token_ids=token_ids(config.get("eos_token_id")),
        pad_token_id=config.get("pad_token_id"),
        layers=tuple(LayerState(kv=KV(kv_heads, head_size, window if i in windowed else None)) for i in range(len(past))),
    )
