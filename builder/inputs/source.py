"""The one interface every input format implements, and the bookkeeping their checkpoints share.

A `Source` is what the pipeline asks of a model folder or file: its config, its checkpoint and
what the format adds or leaves out around them (builder/inputs/read.py picks the format). A
`Checkpoint` is what the architectures read: Hugging Face tensor names -> lazy Weights, whichever
format stores them and however (float, AWQ/GPTQ codes, GGUF blocks, float8 with scales, a LoRA
adapter merged in).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol

from builder.errors import BuildError
from builder.inputs.mapping import TensorInfo
from builder.lazy import Weight


class Checkpoint(Protocol):
    """A checkpoint's tensors by Hugging Face name, and which of them were used."""

    tensors: dict[str, TensorInfo]  # every tensor's name, dtype, shape and bytes, as stored

    def __contains__(self, name: str) -> bool: ...

    def info(self, name: str) -> TensorInfo:
        """Where tensor `name` lies; a missing one is a BuildError naming it."""

    def weight(self, name: str, shape: Iterable[int] | None = None, packed: bool = False) -> Weight:
        """A lazy recipe for tensor `name` (its shape checked if given), marked consumed; `packed`
        accepts integer tensors an architecture unpacks itself (gpt-oss's MXFP4 blocks)."""

    def same_values(self, a: str, b: str, rows_per_chunk: int = 4096) -> bool:
        """Whether tensors `a` and `b` hold the same values (a tied lm_head's copy of the embedding)."""

    def consume(self, name: str) -> None:
        """Marks a tensor as deliberately unused."""

    def check_consumed(self, ignore: Iterable[str] = ()) -> None:
        """Fails naming every tensor no code used and no pattern of `ignore` covers."""

    @property
    def nbytes(self) -> int:
        """The bytes the tensors take as stored."""


class Source(Protocol):
    """One input format, as the pipeline sees it; it never asks which format it is."""

    config: dict[str, Any]  # config.json, or the one a GGUF file's metadata implies
    config_path: Path  # the file `config` comes from, for messages
    stores_blocks: bool  # holds quantized blocks a quantized build keeps as stored (AWQ/GPTQ, GGUF)
    can_package: bool  # may hold a multimodal package's other models (architectures.PACKAGES)

    def check_quantization(self, accepted: tuple[str, ...]) -> None:
        """Refuses a quantization_config that neither the format nor the architecture (its
        quant methods, `accepted`) reads."""

    def open_checkpoint(self) -> Checkpoint:
        """The tensors by Hugging Face name; reads headers, never a weight."""

    def check_tokenizer(self) -> None:
        """Refuses, before anything is written, tokenizer files the output would carry broken."""

    def generation_config(self, vocab_size: int) -> dict[str, Any]:
        """generation_config.json's search defaults, as genai_config.json takes them."""

    def write_files(self, folder: Path) -> None:
        """Writes into the output `folder` the files the format makes itself (a GGUF's tokenizer)."""

    def files_memory(self) -> int:
        """The bytes `write_files` holds in memory (report.estimate's predicted peak adds them)."""


class NamedTensors:
    """The bookkeeping every format's checkpoint shares: tensors by name, the ones consumed, and
    the refusal of any left over (each format adds `weight` and `same_values`)."""

    def __init__(self, tensors: dict[str, TensorInfo]):
        self.tensors = tensors
        self._consumed: set[str] = set()

    def __contains__(self, name: str) -> bool:
        return name in self.tensors

    def info(self, name: str) -> TensorInfo:
        """Where tensor `name` lies; a missing one is a BuildError naming it."""
        try:
            return self.tensors[name]
        except KeyError:
            raise BuildError(f"the checkpoint lacks tensor {name!r}, which this architecture needs") from None

    def consume(self, name: str) -> None:
        """Marks a tensor as deliberately unused (for example a tied lm_head duplicate)."""
        self.info(name)
        self._consumed.add(name)

    def unconsumed(self, ignore: Iterable[str] = ()) -> list[str]:
        """The tensors no code used and no pattern of `ignore` covers, sorted."""
        patterns = list(ignore)
        return sorted(
            n for n in self.tensors
            if n not in self._consumed and not any(fnmatch.fnmatchcase(n, p) for p in patterns)
        )

    def check_consumed(self, ignore: Iterable[str] = ()) -> None:
        """Fails naming every tensor that no code used and no ignore pattern covers."""
        left = self.unconsumed(ignore)
        if left:
            shown = ", ".join(left[:8]) + (f" and {len(left) - 8} more" if len(left) > 8 else "")
            raise BuildError(f"the checkpoint has tensors this architecture does not use: {shown}")

    @property
    def nbytes(self) -> int:
        """The bytes the tensors take as stored."""
        return sum(t.nbytes for t in self.tensors.values())
