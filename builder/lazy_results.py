"""The lazy tensors the writer meets at write time, beside the plain `ir.LazyTensor`s.

`ir.save` writes the lazy tensors from several threads. A `StreamedTensor` gives its bytes piece by
piece (through onnx_ir's private `_write_tensor_at`, which calls the tensor's `tofile`); a
`SharedResult` or `StackedResult` runs one computation that several tensors come out of (a quantized
weight's codes, scales and zero points), whichever of them is asked for first; `write_order` puts
each such by-product later, so that the threads start the next computations meanwhile; `content_key`
names a value that several models of one build hold, for the writer to store once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Sequence

import numpy as np
import onnx_ir as ir


class ByProductTensor(ir.LazyTensor):
    """A lazy tensor that comes out of the computation of another one registered before it (a
    quantized weight's scales or zero points, beside its codes): `write_order` writes it later."""

    __slots__ = ()


def write_order(initializers: Iterable[ir.Value]) -> list[ir.Value]:
    """Initializers in registration order, each by-product moved after as many bytes of the main
    tensors that follow as its own main tensor has (and at least one of them), so that while one
    writer thread computes a weight the other starts the next ones instead of waiting on this
    computation for its by-product. (A lm_head is 1.3 s of quantizing: placed a layer-norm weight
    later, its scales kept the second of two threads idle that long.) The order does not depend on
    the machine: outputs are the same bytes everywhere."""
    ordered: list[ir.Value] = []
    waiting: list[list] = []  # [bytes of main tensors still to pass, the by-products], oldest first
    group: list | None = None  # the by-products of the latest main tensor, as they come
    latest = 0  # the latest main tensor's bytes
    for value in initializers:
        if isinstance(value.const_value, ByProductTensor):
            if group is None:
                group = [latest, []]
                waiting.append(group)
            group[1].append(value)
            continue
        group = None
        latest = value.const_value.nbytes if value.const_value is not None else 0
        ordered.append(value)
        for g in waiting:
            g[0] -= latest
        ordered.extend(v for g in waiting if g[0] <= 0 for v in g[1])
        waiting = [g for g in waiting if g[0] > 0]
    return ordered + [v for g in waiting for v in g[1]]


# The tensor metadata (onnx_ir's `meta`, never serialized) that names a lazy tensor's value across
# the models of one build: tensors with equal keys hold equal bytes (`content_key`).
CONTENT_KEY = "builder.content"


def content_key(tensor: ir.TensorProtocol | None) -> object | None:
    """The key of a lazy tensor whose value another model of the build may hold too (a tied
    vocabulary's 4-bit codes, in the decoder's lm_head and a package's embedding model), else None:
    the writer stores such a value once and points the later model at it (writer.save_models)."""
    meta = getattr(tensor, "meta", None)
    return None if meta is None else meta.get(CONTENT_KEY)


class SharedResult:
    """One computation feeding several lazy tensors (a quantized weight's data, scales and zero
    points): whichever tensor the writer asks for first runs it; each part is dropped once taken.
    The parts other than `main` are by-products (see `write_order`). `key`: what determines the
    result entirely (its input's `Weight.origin_key` and every setting), when it is known; each part
    then carries (key, part) as its `content_key`."""

    def __init__(self, compute: Callable[[], dict[str, np.ndarray]], main: str = "data", key: tuple | None = None):
        self._compute = compute
        self._main = main
        self._key = key
        self._lock = threading.Lock()
        self._parts: dict[str, np.ndarray] | None = None
        self._taken: set[str] = set()

    def take(self, part: str) -> np.ndarray:
        with self._lock:
            if part in self._taken:
                raise RuntimeError(f"part {part!r} of a shared lazy result was already written")
            if self._parts is None:
                self._parts = self._compute()
            self._taken.add(part)
            value = self._parts.pop(part)
            if not self._parts:
                self._parts = None  # a later writer of the same model recomputes from scratch
                self._taken.clear()
            return value

    def tensor(self, part: str, shape: Sequence[int], dtype: np.dtype | type | ir.DataType, name: str) -> ir.LazyTensor:
        """The part as a lazy tensor of `shape` and `dtype`; a 4-bit part's array holds its packed
        bytes (two codes a byte, ONNX's order)."""
        kind = ir.LazyTensor if part == self._main else ByProductTensor
        dtype = dtype if isinstance(dtype, ir.DataType) else ir.DataType.from_numpy(np.dtype(dtype))
        if dtype in (ir.DataType.INT4, ir.DataType.UINT4):
            def value() -> ir.TensorProtocol:
                return ir.PackedTensor(self.take(part), dtype, shape=shape, name=name)
        else:
            def value() -> ir.TensorProtocol:
                return ir.Tensor(self.take(part), name=name)
        tensor = kind(value, dtype=dtype, shape=ir.Shape(shape), name=name)
        if self._key is not None:
            tensor.meta[CONTENT_KEY] = (self._key, part)
        return tensor


class StreamedTensor(ir.LazyTensor):
    """An `ir.LazyTensor` that `ir.save` writes piece by piece: onnx_ir's external-data writer seeks
    to the tensor's offset and calls its `tofile(file)` (onnx_ir/external_data.py, `_write_tensor_at`,
    onnx_ir 1.1), so only one piece (one expert of a stack) is in memory at a time. `pieces()`
    yields C-contiguous arrays whose bytes, one after another, are the tensor's: each is written by
    `ir.Tensor.tofile`, as the whole array would be. `whole()` is the tensor for any other reader.
    `held`: the bytes it holds while written, where known before (a block of rows: report.estimate)."""

    __slots__ = ("_pieces", "held")

    def __init__(self, whole: Callable[[], ir.TensorProtocol], pieces: Callable[[], Iterator[np.ndarray]],
                 dtype: np.dtype, shape: Sequence[int], name: str, held: int | None = None):
        super().__init__(whole, dtype=ir.DataType.from_numpy(np.dtype(dtype)), shape=ir.Shape(shape), name=name)
        self._pieces = pieces
        self.held = held

    def tofile(self, file) -> None:
        for piece in self._pieces():
            ir.Tensor(piece).tofile(file)
            del piece  # before the next one is computed


# Seconds a by-product of a StackedResult waits for its main part's stream to begin before
# computing everything at once itself (the writer's threads start both within milliseconds).
STREAM_START_WAIT = 2.0


class StackedResult:
    """One computation per expert feeding several stacked tensors (a QMoE's codes, scales and zero
    points, each [E, ...]): `compute(e)` returns expert e's piece of every part. The `main` part
    (the codes, by far the largest) streams into the file one expert at a time; the pieces of the
    other parts are kept as they go by and handed over when the writer asks for them (waiting for a
    stream under way). Asked for a by-product first, or for the whole main tensor, it computes all
    experts at once instead and keeps the main part whole until taken."""

    def __init__(self, count: int, compute: Callable[[int], dict[str, np.ndarray]],
                 parts: dict[str, tuple[Sequence[int], np.dtype]], main: str = "data"):
        self._count, self._compute, self._parts, self._main = count, compute, parts, main
        self._state = threading.Condition()
        self._streaming = False
        self._failed: BaseException | None = None
        self._ready: dict[str, np.ndarray] | None = None  # parts computed, not yet taken
        self._taken: set[str] = set()

    def tensor(self, part: str, name: str) -> ir.LazyTensor:
        shape, dtype = self._parts[part]
        if part == self._main:
            return StreamedTensor(lambda: ir.Tensor(self._take(part), name=name), self._stream, dtype, shape, name)
        return ByProductTensor(lambda: ir.Tensor(self._take(part), name=name),
                               dtype=ir.DataType.from_numpy(np.dtype(dtype)), shape=ir.Shape(shape), name=name)

    def _empty(self, part: str) -> np.ndarray:
        shape, dtype = self._parts[part]
        return np.empty(tuple(shape), dtype)

    def _stream(self) -> Iterator[np.ndarray]:
        with self._state:
            self._state.wait_for(lambda: not self._streaming)
            whole = self._take_locked(self._main) if self._ready is not None else None
            if whole is None:
                self._streaming, self._failed = True, None
                self._state.notify_all()  # a by-product waiting for the stream to begin
        if whole is not None:  # already computed whole (a by-product was asked for first)
            yield from whole
            return
        kept = {p: self._empty(p) for p in self._parts if p != self._main}
        try:
            for e in range(self._count):
                result = self._compute(e)
                for p, array in kept.items():
                    array[e] = result[p]
                yield result.pop(self._main)
                del result
        except BaseException as error:
            with self._state:
                self._streaming, self._failed = False, error
                self._state.notify_all()
            raise
        with self._state:
            self._streaming, self._ready = False, kept
            self._taken.add(self._main)
            self._reset_if_done()
            self._state.notify_all()

    def _take(self, part: str) -> np.ndarray:
        with self._state:
            if part != self._main and self._ready is None and self._main not in self._taken:
                # The writer asks for the main part first (write_order), but another thread may
                # reach this by-product before the main part's stream has begun: give it a moment
                # to begin rather than computing every expert at once (the whole codes in memory).
                self._state.wait_for(lambda: self._streaming or self._ready is not None, STREAM_START_WAIT)
            self._state.wait_for(lambda: not self._streaming)
            if self._failed is not None:
                raise RuntimeError(f"the computation of part {part!r} failed") from self._failed
            if self._ready is None:
                self._ready = self._compute_all()
            return self._take_locked(part)

    def _take_locked(self, part: str) -> np.ndarray:
        if part in self._taken:
            raise RuntimeError(f"part {part!r} of a stacked lazy result was already written")
        value = self._ready.pop(part)
        self._taken.add(part)
        self._reset_if_done()
        return value

    def _reset_if_done(self) -> None:
        if self._taken == set(self._parts):  # a later writer of the same model recomputes from scratch
            self._ready, self._taken = None, set()

    def _compute_all(self) -> dict[str, np.ndarray]:
        out = {p: self._empty(p) for p in self._parts}
        for e in range(self._count):
            for p, array in self._compute(e).items():
                out[p][e] = array
        return out
