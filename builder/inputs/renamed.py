"""A checkpoint read under the names a family reads: the hub's other spelling of a family
(EXAONE 3's `transformer.h.N.attn.attention.*` for Llama's `model.layers.N.self_attn.*`) renamed
as transformers' conversion rules rename it at load time, and fused tensors whose rows are several
of the family's (Sarvam-MoE's `query_key_value`) split into them, without touching a byte."""

from __future__ import annotations

import dataclasses
import fnmatch
import re
from collections.abc import Iterable

from builder.errors import BuildError
from builder.inputs.mapping import TensorInfo
from builder.inputs.source import Checkpoint
from builder.lazy import Weight

# (regular expression over a stored name, its replacement), applied in order: re.sub's semantics.
Renames = tuple[tuple[str, str], ...]
# (regular expression over a renamed name, ((its replacement for one part, that part's rows), ...)):
# the rows of a matching tensor, in order, are the parts'.
Splits = tuple[tuple[str, tuple[tuple[str, int], ...]], ...]


def renamed_name(name: str, renames: Renames) -> str:
    for pattern, replacement in renames:
        name = re.sub(pattern, replacement, name)
    return name


class RenamedCheckpoint:
    """`inner` (a format's checkpoint, before any adapter is merged) with every tensor under its
    renamed name; two stored tensors renamed to one name are refused (the rules would lose one)."""

    def __init__(self, inner: Checkpoint, renames: Renames, splits: Splits = ()):
        self.inner = inner
        self._stored: dict[str, str] = {}
        self._rows: dict[str, tuple[int, int]] = {}  # a split part -> its rows of the stored tensor
        for name in inner.tensors:
            new = renamed_name(name, renames)
            parts = next(((pattern, parts) for pattern, parts in splits if re.search(pattern, new)), None)
            for part, rows in self._parts(name, new, parts):
                if part in self._stored:
                    raise BuildError(f"the checkpoint's tensors {self._stored[part]!r} and {name!r} are both "
                                     f"{part!r} under its model type's names")
                self._stored[part] = name
                if rows is not None:
                    self._rows[part] = rows
        self.tensors: dict[str, TensorInfo] = {new: self._info(new) for new in self._stored}
        self._used: set[str] = set()

    def _parts(self, name: str, new: str, split):
        """(renamed name, rows or None) of stored tensor `name`; a split one's rows must add up."""
        if split is None:
            return [(new, None)]
        pattern, parts = split
        shape = self.inner.tensors[name].shape
        if not shape or sum(rows for _, rows in parts) != shape[0]:
            raise BuildError(f"{name} has shape {list(shape)}, not the {' + '.join(str(r) for _, r in parts)} rows "
                             "its model type splits it into (config.json's heads and head_dim)")
        out, start = [], 0
        for replacement, rows in parts:
            out.append((re.sub(pattern, replacement, new), (start, start + rows)))
            start += rows
        return out

    def _info(self, name: str) -> TensorInfo:
        info = self.inner.tensors[self._stored[name]]
        if name not in self._rows:
            return info
        start, stop = self._rows[name]
        row_bytes = info.nbytes // info.shape[0]
        return dataclasses.replace(info, name=name, shape=(stop - start, *info.shape[1:]),
                                   offset=info.offset + start * row_bytes, nbytes=(stop - start) * row_bytes)

    def _old(self, name: str) -> str:
        return self._stored.get(name, name)  # a name the rules do not know: the inner one refuses it

    def __contains__(self, name: str) -> bool:
        return name in self._stored

    def info(self, name: str) -> TensorInfo:
        if name in self._rows:
            return self.tensors[name]
        return self.inner.info(self._old(name))

    def weight(self, name: str, shape: Iterable[int] | None = None, packed: bool = False) -> Weight:
        self._used.add(name)
        if name not in self._rows:
            return self.inner.weight(self._old(name), shape, packed)
        start, stop = self._rows[name]
        w = self.inner.weight(self._old(name), None, packed).slice(0, start, stop)
        if shape is not None and tuple(w.shape) != tuple(shape):
            raise BuildError(f"{name} ({self._old(name)}'s rows {start}:{stop}) has shape {list(w.shape)}, "
                             f"expected {list(shape)}")
        return w

    def same_values(self, a: str, b: str, rows_per_chunk: int = 4096) -> bool:
        return self.inner.same_values(self._old(a), self._old(b), rows_per_chunk)

    def consume(self, name: str) -> None:
        self._used.add(name)
        self.inner.consume(self._old(name))

    def check_consumed(self, ignore: Iterable[str] = ()) -> None:
        """Fails naming, by the renamed names, every tensor no code used and no pattern of `ignore` covers."""
        renamed = {old: new for new, old in self._stored.items()}
        patterns = list(ignore)
        left = [renamed[old] for old in self.inner.unconsumed() if renamed[old] not in self._rows]
        left += [part for part in self._rows if part not in self._used]  # a split tensor's unread rows
        left = sorted(n for n in left if not any(fnmatch.fnmatchcase(n, p) for p in patterns))
        if left:
            shown = ", ".join(left[:8]) + (f" and {len(left) - 8} more" if len(left) > 8 else "")
            raise BuildError(f"the checkpoint has tensors this architecture does not use: {shown}")

    @property
    def nbytes(self) -> int:
        return self.inner.nbytes

    def __getattr__(self, name: str):  # what a format adds (its quantization facts, its files)
        return getattr(self.inner, name)
