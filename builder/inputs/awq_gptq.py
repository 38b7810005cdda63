"""AWQ and GPTQ checkpoints read as a Checkpoint: each quantized linear layer's packed integers
(`<module>.qweight`, `.qzeros`, `.scales`, GPTQ's `.g_idx`) become one lazy `<module>.weight`.

Both store W [N, K] (Hugging Face's [out, in]) as integer codes q, per group of `group_size`
input rows (along K) one scale s and one integer zero point z per output column: w = (q − z)·s.

- AWQ, GEMM packing (AutoAWQ's WQLinear_GEMM; transformers' integrations/awq.py reads it):
  qweight int32 [K, N/8], eight 4-bit codes of one input row per word, nibble i (bits 4i..4i+3)
  holding column 8c + [0, 2, 4, 6, 1, 3, 5, 7][i]; qzeros int32 [K/g, N/8] packed the same way;
  scales fp16 [K/g, N]; the zero point is stored as is.
- GPTQ (AutoGPTQ's QuantLinear, gptqmodel, optimum): qweight int32 [K·bits/32, N] packed along K,
  word i of a column holding rows 32i/bits + j from its low bits up; qzeros int32 [K/g, N·bits/32]
  packed along N the same way; scales fp16 [K/g, N]; g_idx int32 [K], the group of each input row.
  `checkpoint_format` "gptq" (v1, every checkpoint before gptqmodel's v2) stores z − 1: the reader
  masks the field to `bits` bits, then adds 1 (AutoGPTQ's dequantization), so a stored all-ones
  field is z = 2^bits, which a 4-bit zero point cannot hold: such a weight is written as 8-bit
  codes (exact). "gptq_v2" stores z.

A quantized build writes the codes into MatMulNBits as stored — GPTQ's bytes are MatMulNBits'
B transposed, AWQ's nibbles reordered — with block_size = the group size (a larger group: its
scale and zero point repeated over blocks of 128 or less) and explicit uint8 zero points: the
dequantized weights equal the checkpoint's bit for bit. A float build computes (q − z)·s in
float32, exactly (a code times an fp16 scale fits float32's mantissa), then takes the build's
precision.

Act-order GPTQ (`desc_act`: g_idx is a permutation of row // group_size, the rows quantized in
order of decreasing Hessian diagonal) is exact too: MatMulNBits needs each block contiguous along
K, so K is permuted — a stable sort of g_idx, after which every group's rows must be exactly
group_size consecutive rows (checked; refused in one line otherwise) — the codes are written in
that order (scales and zero points are already in group order), and the activation is gathered
in the same order before the MatMulNBits (`<module>.input_order`): x[..., order] · W[:, order]ᵀ
= x · Wᵀ, the same terms summed.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from builder.errors import BuildError
from builder.inputs.mapping import TensorInfo, mapped
from builder.inputs.safetensors import ReadQuantizationSource, SafetensorsCheckpoint, read_headers
from builder.lazy import Weight
from builder.mapped_pages import release
from builder.materialize import ComputedRows
from builder.quantize import BLOCK_SIZES
from builder.stored_blocks import BlockArrays, Blocks

METHODS = ("awq", "gptq")
AWQ_ORDER = np.array([0, 2, 4, 6, 1, 3, 5, 7])  # nibble i of a word holds column 8c + AWQ_ORDER[i]
PARTS = ("qweight", "qzeros", "scales", "g_idx")


@dataclass(frozen=True)
class QuantFormat:
    """What config.json's quantization_config says about the packed tensors."""

    method: str  # "awq" or "gptq"
    bits: int
    group_size: int  # -1: one group over all of K
    zero_offset: int  # 1 for GPTQ v1 (stored z − 1), else 0


def quant_format(raw: dict[str, Any], path: Path) -> QuantFormat | None:
    """The AWQ/GPTQ format of a config.json, None for any other (float, or refused elsewhere);
    a variant builder cannot read exactly is refused in one line."""
    q = raw.get("quantization_config")
    if not isinstance(q, dict) or q.get("quant_method") not in METHODS:
        return None
    method, bits, group = q["quant_method"], q.get("bits", q.get("w_bit", 4)), q.get("group_size", q.get("q_group_size", 128))
    where = f"{path}: quantization_config"
    if method == "awq":
        version = str(q.get("version", "gemm")).lower()
        if version != "gemm":
            raise BuildError(f"{where}: AWQ version {version!r} is not supported; builder reads the GEMM packing "
                             "(version 'gemm')")
        if bits != 4:
            raise BuildError(f"{where}: AWQ with {bits} bits is not supported; builder reads 4-bit AWQ")
        if q.get("zero_point", True) is False:
            raise BuildError(f"{where}: AWQ without zero points (zero_point false) is not supported")
        return QuantFormat(method, 4, int(group), 0)
    checkpoint_format = q.get("checkpoint_format", "gptq")
    if checkpoint_format not in ("gptq", "gptq_v2"):
        raise BuildError(f"{where}: GPTQ checkpoint_format {checkpoint_format!r} is not supported; builder reads "
                         "'gptq' and 'gptq_v2'")
    if bits not in (4, 8):
        raise BuildError(f"{where}: GPTQ with {bits} bits is not supported; builder reads 4- and 8-bit GPTQ")
    return QuantFormat(method, int(bits), int(group), 1 if checkpoint_format == "gptq" else 0)


def block_size(group: int) -> int | None:
    """The largest MatMulNBits block size (≤ 128) that a group is a whole number of, or None."""
    return next((b for b in sorted(BLOCK_SIZES, reverse=True) if b <= 128 and group % b == 0), None)


def _fields(packed: np.ndarray, bits: int) -> np.ndarray:
    """int32 words [..., m] -> uint8 [..., m·32/bits], each word's fields from its low bits up."""
    raw = np.ascontiguousarray(packed).view(np.uint8)  # little-endian: byte b holds fields 2b, 2b+1 (4-bit)
    if bits == 8:
        return raw
    return np.stack([raw & 0x0F, raw >> 4], axis=-1).reshape(*raw.shape[:-1], -1)


def _awq_columns(fields: np.ndarray) -> np.ndarray:
    """[rows, N] nibbles in AWQ's packing order -> columns in order."""
    rows, n = fields.shape
    return fields.reshape(rows, n // 8, 8)[:, :, np.argsort(AWQ_ORDER)].reshape(rows, n)


def _columns(words: np.ndarray, bits: int, start: int, stop: int, awq: bool) -> np.ndarray:
    """Columns [start, stop) of int32 words [R, C] packed along their columns (32/bits fields a
    word; AWQ's order): uint8 [R, stop − start], decoding only the words those columns lie in."""
    per = 32 // bits
    first = start // per
    fields = _fields(words[:, first:-(-stop // per)], bits)
    if awq:
        fields = _awq_columns(fields)
    return fields[:, start - first * per:stop - first * per]


# qweight's bytes decoded between two releases of their mapped pages (QuantizedLinear.float32).
PACKED_ROWS_BYTES = 4 * 2**20


@dataclass(frozen=True)
class QuantizedLinear:
    """The packed tensors of one layer and what they decode to."""

    fmt: QuantFormat
    qweight: TensorInfo
    qzeros: TensorInfo
    scales: TensorInfo
    g_idx: TensorInfo | None
    n: int
    k: int
    # Act-order: g_idx's values (each input row's group), and the row order that makes each group
    # one run of rows (a stable sort of them); None when g_idx is row // group_size.
    row_groups: np.ndarray | None = field(default=None, compare=False)
    input_order: np.ndarray | None = field(default=None, compare=False)

    @property
    def group(self) -> int:
        return self.k if self.fmt.group_size == -1 else self.fmt.group_size

    def codes(self, stack, ordered: bool = False) -> np.ndarray:
        """uint8 [N, K]; `ordered`: its columns in input_order (act-order's groups contiguous)."""
        fields = self._codes(stack.enter_context(mapped(self.qweight)), 0, self.n)
        return fields[:, self.input_order] if ordered and self.input_order is not None else fields

    def _codes(self, qweight: np.ndarray, start: int, stop: int) -> np.ndarray:
        """uint8 [stop − start, K]: rows [start, stop) of the codes, from the mapped qweight."""
        if self.fmt.method == "awq":  # [K, N/8] words -> [K, N/8, 8] nibbles -> columns in order
            return _columns(qweight, 4, start, stop, awq=True).T
        return _fields(qweight[:, start:stop].T, self.fmt.bits)  # [N, K·bits/32] words -> [N, K]

    def zeros(self, stack) -> np.ndarray:
        """The zero points, uint8-or-wider [K/g, N] (v1 GPTQ: masked field + 1)."""
        return self._zeros(stack.enter_context(mapped(self.qzeros)), 0, self.n)

    def _zeros(self, qzeros: np.ndarray, start: int, stop: int) -> np.ndarray:
        """Columns [start, stop) of the zero points, from the mapped qzeros."""
        if self.fmt.method == "awq":
            return _columns(qzeros, 4, start, stop, awq=True)
        return _columns(qzeros, self.fmt.bits, start, stop, awq=False).astype(np.int16) + self.fmt.zero_offset

    def float32(self, stack) -> ComputedRows:
        """(q − z)·s as float32 [N, K], exact, a block of rows (output columns) at a time as the
        writer or a quantizer asks: the whole matrix computed at once held four float32 copies of
        it (codes, zero points and scales widened to [N, K], and the result)."""
        group = np.arange(self.k) // self.group if self.row_groups is None else self.row_groups  # [K]
        qweight = stack.enter_context(mapped(self.qweight))
        qzeros = stack.enter_context(mapped(self.qzeros))
        scales = stack.enter_context(mapped(self.scales))

        # A block of output rows is a stripe of qweight's columns, which touches a page of each of
        # its rows: it is decoded a run of qweight's rows at a time, each run's pages handed back,
        # or the whole packed tensor would be resident (112 MB for a 70B MLP matrix).
        per = 1 if self.fmt.method == "awq" else 32 // self.fmt.bits  # input rows a qweight row holds
        if qweight.shape[0] * per != self.k:
            raise ValueError(f"{self.qweight.name}: {qweight.shape[0]} rows of {per} inputs, not {self.k}")
        step = max(1, PACKED_ROWS_BYTES // max(1, qweight[:1].nbytes))

        def rows(start: int, stop: int) -> np.ndarray:
            zeros = self._zeros(qzeros, start, stop).astype(np.float32)
            scale = np.asarray(scales[:, start:stop], np.float32)
            w = np.empty((stop - start, self.k), np.float32)
            for r in range(0, qweight.shape[0], step):
                packed = qweight[r : r + step]
                k0, k1 = r * per, min(self.k, (r + len(packed)) * per)
                part, g = w[:, k0:k1], group[k0:k1]
                np.copyto(part, self._codes(packed, start, stop))
                part -= zeros[g].T
                part *= scale[g].T
                release(packed)
            release(qzeros)
            release(scales)
            return w

        return ComputedRows(rows, (self.n, self.k))

    def blocks(self, bits: int) -> Blocks:
        """The codes as MatMulNBits blocks at `bits` (the format's, or 8 for wide v1 zero points)."""
        block = block_size(self.group)
        repeat = self.group // block
        k_blocks = self.k // block

        as_stored = bits == self.fmt.bits and self.fmt.method == "gptq" and self.input_order is None

        def compute(stack):
            codes = None if as_stored else self.codes(stack, ordered=True)  # [N, K], each group's rows a block
            zeros = self.zeros(stack).T  # [N, K/g]
            scales = np.asarray(stack.enter_context(mapped(self.scales))).T  # [N, K/g]
            if repeat > 1:  # one group over several blocks: its scale and zero point on each
                zeros, scales = np.repeat(zeros, repeat, axis=1), np.repeat(scales, repeat, axis=1)
            if bits > self.fmt.bits:  # 4-bit codes as 8-bit: both shifted by 120, differences kept
                codes, zeros = codes + np.uint8(120), zeros + 120
            zeros = zeros.astype(np.uint8)
            if as_stored:
                # GPTQ's words, little-endian, are MatMulNBits' bytes: column n's codes along K,
                # element 2j in the low nibble. Only the transpose is left.
                data = np.ascontiguousarray(stack.enter_context(mapped(self.qweight)).T).view(np.uint8)
            elif bits == 4:
                data = codes[:, 0::2] | (codes[:, 1::2] << 4)
            else:
                data = codes
            if bits == 4:
                if k_blocks % 2:
                    zeros = np.concatenate([zeros, np.full((self.n, 1), 8, np.uint8)], axis=1)
                zeros = zeros[:, 0::2] | (zeros[:, 1::2] << 4)
            return BlockArrays(data.reshape(self.n, k_blocks, -1), scales, zeros)

        return Blocks(bits, block, compute, self.fmt.method, zero_points=True, input_order=self.input_order)


class QuantizedCheckpoint(SafetensorsCheckpoint):
    """A safetensors checkpoint whose linear layers are AWQ or GPTQ: `<module>.weight` names the
    layer's packed tensors (see the module's docstring); every other tensor reads as usual.

    Example:
        >>> ckpt = QuantizedCheckpoint.open_quantized("path/to/awq", fmt)            # doctest: +SKIP
        >>> ckpt.weight("model.layers.0.mlp.down_proj.weight").blocks.zero_points    # doctest: +SKIP
        True
    """

    def __init__(self, tensors: dict[str, TensorInfo], layers: dict[str, QuantizedLinear]):
        super().__init__(tensors)
        self.layers = layers

    @classmethod
    def open_quantized(cls, folder, fmt: QuantFormat) -> QuantizedCheckpoint:
        raw = read_headers(folder)
        modules = sorted(name[: -len(".qweight")] for name in raw if name.endswith(".qweight"))
        if not modules:
            raise BuildError(f"{folder}: quantization_config says {fmt.method}, but no tensor is named *.qweight")
        layers = {}
        tensors = {name: info for name, info in raw.items() if name.rsplit(".", 1)[-1] not in PARTS}
        for module in modules:
            layer = _layer(raw, module, fmt)
            name = f"{module}.weight"
            if name in raw:
                raise BuildError(f"{module} has both a float weight and AWQ/GPTQ tensors")
            layers[name] = layer
            parts = [layer.qweight, layer.qzeros, layer.scales] + ([layer.g_idx] if layer.g_idx else [])
            tensors[name] = TensorInfo(name, np.dtype(np.float32), (layer.n, layer.k), layer.qweight.path,
                                       layer.qweight.offset, sum(p.nbytes for p in parts))
        strays = sorted(n for n in raw if n.rsplit(".", 1)[-1] in PARTS and f"{n.rsplit('.', 1)[0]}.weight" not in layers)
        if strays:
            raise BuildError(f"{strays[0]} belongs to no quantized layer (no {strays[0].rsplit('.', 1)[0]}.qweight)")
        return cls(tensors, layers)

    def weight(self, name: str, shape=None, packed: bool = False) -> Weight:
        layer = self.layers.get(name)
        if layer is None:
            return super().weight(name, shape, packed)
        if shape is not None and tuple(shape) != (layer.n, layer.k):
            raise BuildError(f"{name} ({layer.fmt.method}) has shape {[layer.n, layer.k]} but config.json implies "
                             f"{list(shape)}")
        self._consumed.add(name)
        # Its source is the layer's `.weight` (whose TensorInfo counts the packed tensors' bytes), so
        # --float-layers patterns and build records name the module as for a float checkpoint.
        return Weight((layer.n, layer.k), np.float32, layer.float32, (name,), layer.blocks(_bits(layer)), by_rows=True)

    def same_values(self, a: str, b: str, rows_per_chunk: int = 4096) -> bool:
        if a in self.layers or b in self.layers:
            return False  # a quantized lm_head is never the float embedding
        return super().same_values(a, b, rows_per_chunk)


class QuantizedSource(ReadQuantizationSource):
    """A model folder whose config.json's quantization_config says AWQ or GPTQ (a Source)."""

    stores_blocks = True  # its codes, written into MatMulNBits as stored by a quantized build

    def open_checkpoint(self) -> QuantizedCheckpoint:
        """The folder's safetensors headers, its packed layers checked against the format."""
        return QuantizedCheckpoint.open_quantized(self.folder, self.fmt)


def _layer(raw: dict[str, TensorInfo], module: str, fmt: QuantFormat) -> QuantizedLinear:
    """One layer's tensors, their shapes checked against the format; act-order's row order."""
    def get(part: str) -> TensorInfo:
        if f"{module}.{part}" not in raw:
            raise BuildError(f"{module} has a qweight but no {part} ({fmt.method} needs qweight, qzeros, scales)")
        return raw[f"{module}.{part}"]

    qweight, qzeros, scales = get("qweight"), get("qzeros"), get("scales")
    g_idx = raw.get(f"{module}.g_idx")
    if fmt.method == "awq":
        k, n = qweight.shape[0], qweight.shape[1] * 8
        if g_idx is not None:
            raise BuildError(f"{module}.g_idx: an AWQ checkpoint has no g_idx")
    else:
        k, n = qweight.shape[0] * 32 // fmt.bits, qweight.shape[1]
    group = k if fmt.group_size == -1 else fmt.group_size
    per_word = 32 // fmt.bits
    expected = {"qweight": (qweight.shape, np.int32), "scales": (scales.shape, np.float16),
                "qzeros": (qzeros.shape, np.int32)}
    want = {"qweight": (k, n // 8) if fmt.method == "awq" else (k // per_word, n), "scales": (k // group, n),
            "qzeros": (k // group, n // per_word)}
    for part, (got_shape, dtype) in expected.items():
        info = raw[f"{module}.{part}"]
        if got_shape != want[part] or info.dtype != dtype:
            raise BuildError(f"{module}.{part} is {info.dtype.name}{list(got_shape)}; {fmt.method} with "
                             f"{fmt.bits} bits and group size {group} needs {np.dtype(dtype).name}{list(want[part])}")
    if k % group or block_size(group) is None:
        raise BuildError(f"{module}: group size {group} over {k} input features has no MatMulNBits block size "
                         f"(a multiple of 16, dividing K)")
    row_groups = order = None
    if g_idx is not None:
        with mapped(g_idx) as g:
            row_groups = np.array(g, np.int64)
        if row_groups.shape != (k,):
            raise BuildError(f"{module}.g_idx has shape {list(row_groups.shape)}; GPTQ needs one group per input "
                             f"row, [{k}]")
        if np.array_equal(row_groups, np.arange(k) // group):
            row_groups = None
        else:  # act-order: each group's rows, in a stable sort of g_idx, must fill exactly one group
            counts = np.bincount(np.clip(row_groups, 0, k // group), minlength=k // group + 1)
            if row_groups.min() < 0 or counts[-1] or (counts[:-1] != group).any():
                raise BuildError(f"{module}.g_idx does not give each of its {k // group} groups exactly "
                                 f"{group} input rows (GPTQ act-order must), so its groups are not blocks")
            order = np.argsort(row_groups, kind="stable")
    return QuantizedLinear(fmt, qweight, qzeros, scales, g_idx, n, k, row_groups, order)


def _bits(layer: QuantizedLinear) -> int:
    """The layer's MatMulNBits bits: its own, or 8 when a v1 GPTQ zero point is 2^bits (a stored
    all-ones field) that a 4-bit zero point cannot hold."""
    if layer.fmt.zero_offset:
        with contextlib.ExitStack() as stack:
            top = int(layer.zeros(stack).max())
        if top > 255:
            raise BuildError(f"{layer.qzeros.name}: a v1 GPTQ 8-bit zero point of 256 (a stored 0xFF) is not "
                             "representable in MatMulNBits' uint8 zero points")
        if top > 15 and layer.fmt.bits == 4:
            return 8
    return layer.fmt.bits
