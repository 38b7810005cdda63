"""A checkpoint read under the names a family reads: the hub's other spelling of a family
(EXAONE 3's `transformer.h.N.attn.attention.*` for Llama's `model.layers.N.self_attn.*`) renamed
as transformers' conversion rules rename it at load time, without touching a byte."""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable

from builder.errors import BuildError
from builder.inputs.mapping import TensorInfo
from builder.inputs.source import Checkpoint
from builder.lazy import Weight

# (regular expression over a stored name, its replacement), applied in order: re.sub's semantics.
Renames = tuple[tuple[str, str], ...]


def renamed_name(name: str, renames: Renames) -> str:
    for pattern, replacement in renames:
        name = re.sub(pattern, replacement, name)
    return name


class RenamedCheckpoint:
    """`inner` (a format's checkpoint, before any adapter is merged) with every tensor under its
    renamed name; two stored tensors renamed to one name are refused (the rules would lose one)."""

    def __init__(self, inner: Checkpoint, renames: Renames):
        self.inner = inner
        self._stored: dict[str, str] = {}
        for name in inner.tensors:
            new = renamed_name(name, renames)
            if new in self._stored:
                raise BuildError(f"the checkpoint's tensors {self._stored[new]!r} and {name!r} are both "
                                 f"{new!r} under its model type's names")
            self._stored[new] = name
        self.tensors: dict[str, TensorInfo] = {new: inner.tensors[old] for new, old in self._stored.items()}

    def _old(self, name: str) -> str:
        return self._stored.get(name, name)  # a name the rules do not know: the inner one refuses it

    def __contains__(self, name: str) -> bool:
        return name in self._stored

    def info(self, name: str) -> TensorInfo:
        return self.inner.info(self._old(name))

    def weight(self, name: str, shape: Iterable[int] | None = None, packed: bool = False) -> Weight:
        return self.inner.weight(self._old(name), shape, packed)

    def same_values(self, a: str, b: str, rows_per_chunk: int = 4096) -> bool:
        return self.inner.same_values(self._old(a), self._old(b), rows_per_chunk)

    def consume(self, name: str) -> None:
        self.inner.consume(self._old(name))

    def check_consumed(self, ignore: Iterable[str] = ()) -> None:
        """Fails naming, by the renamed names, every tensor no code used and no pattern of `ignore` covers."""
        renamed = {old: new for new, old in self._stored.items()}
        patterns = list(ignore)
        left = [renamed[old] for old in self.inner.unconsumed()]
        left = sorted(n for n in left if not any(fnmatch.fnmatchcase(n, p) for p in patterns))
        if left:
            shown = ", ".join(left[:8]) + (f" and {len(left) - 8} more" if len(left) > 8 else "")
            raise BuildError(f"the checkpoint has tensors this architecture does not use: {shown}")

    @property
    def nbytes(self) -> int:
        return self.inner.nbytes

    def __getattr__(self, name: str):  # what a format adds (its quantization facts, its files)
        return getattr(self.inner, name)
