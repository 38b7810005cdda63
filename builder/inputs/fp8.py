"""FP8 checkpoints read as a Checkpoint: each quantized linear layer's float8 `<module>.weight`
and its scale become one lazy float32 `<module>.weight`, so architectures need no change.

Two layouts, as the hub ships them (transformers reads both: integrations/finegrained_fp8.py and
integrations/compressed_tensors.py):

- `quant_method` "fp8" (DeepSeek-V3, Qwen3-FP8; transformers' FineGrainedFP8Config): W [N, K]
  float8_e4m3fn and `<module>.weight_scale_inv` float32 [ceil(N/bn), ceil(K/bk)] for
  `weight_block_size` [bn, bk] (a scalar when weight_block_size is null): w = fp8 · scale_inv over
  each bn×bk block (transformers' _dequantize_fp8_weight).
- `quant_method` "compressed-tensors" with format "float-quantized" or "naive-quantized" and
  float 8-bit symmetric weights (llm-compressor's FP8 / FP8_DYNAMIC / FP8_BLOCK schemes): W [N, K]
  float8 and `<module>.weight_scale` per tensor ([1]), per output channel ([N, 1]) or per block
  ([ceil(N/bn), ceil(K/bk)]): w = fp8 · weight_scale.

The product is computed in float32, a block of rows at a time inside the lazy tensor: the same IEEE
product transformers computes, and exact whenever the scale has at most 20 significant bits
(a bf16 or fp16 scale, a power of two); a float32 scale times a 4-bit e4m3 significand is
rounded once, to float32. The build's precision then applies: fp16/bf16/fp32 a cast, int4/int8
a re-quantization of these float32 values (e4m3 codes times a block scale are not int4 codes
times a MatMulNBits scale: the round trip loses accuracy, measured in tests/test_fp8.py).

Activations are not quantized: "dynamic" activation scales are computed at run time by the FP8
kernels and simply not applied (the float build is the dequantized model); a stored
`input_scale` of such a layer is read past. Static activation quantization (activation_scheme
"static", compressed-tensors input_activations with dynamic false), FP8 KV-cache schemes, ue8m0
scales and every other compressed-tensors format are refused in one line.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from builder.errors import BuildError
from builder.inputs.mapping import TensorInfo, mapped
from builder.inputs.safetensors import DTYPES, ReadQuantizationSource, SafetensorsCheckpoint, read_headers
from builder.lazy import Weight
from builder.mapped_pages import release
from builder.materialize import ComputedRows

METHODS = ("fp8", "compressed-tensors")
FP8_DTYPES = (DTYPES["F8_E4M3"], DTYPES["F8_E5M2"])
FLOAT_FORMATS = ("float-quantized", "naive-quantized")  # compressed-tensors formats with float8 weights
STRATEGIES = ("tensor", "channel", "block")
IGNORED_PARTS = ("input_scale", "activation_scale")  # dynamic activations: scales computed at run time


@dataclass(frozen=True)
class FP8Format:
    """What config.json's quantization_config says about the float8 tensors."""

    method: str  # "fp8" or "compressed-tensors"
    scale: str  # the scale tensor's suffix: "weight_scale_inv" or "weight_scale"
    block: tuple[int, int] | None  # [bn, bk] of a block-wise scale, None: per tensor or per channel


def fp8_format(raw: dict[str, Any], path: Path) -> FP8Format | None:
    """The FP8 layout of a config.json, None for any other quantization_config (or none); an FP8
    variant builder does not read exactly is refused in one line, by name."""
    q = raw.get("quantization_config")
    if not isinstance(q, dict) or q.get("quant_method") not in METHODS:
        return None
    where = f"{path}: quantization_config"
    if q["quant_method"] == "fp8":
        scheme = str(q.get("activation_scheme", "dynamic")).lower()
        if scheme != "dynamic":
            raise BuildError(f"{where}: FP8 activation_scheme {scheme!r} is not supported; static activation "
                             "scales quantize activations to fp8, which a float build does not (builder reads 'dynamic')")
        if q.get("scale_fmt", "float") != "float":
            raise BuildError(f"{where}: FP8 scale_fmt {q['scale_fmt']!r} is not supported; builder reads float32 "
                             "weight_scale_inv ('float')")
        if q.get("expert_dtype", "fp8") != "fp8":
            raise BuildError(f"{where}: FP8 expert_dtype {q['expert_dtype']!r} is not supported; builder reads 'fp8'")
        block = q.get("weight_block_size")
        return FP8Format("fp8", "weight_scale_inv", None if block is None else _block(block, where))
    groups = q.get("config_groups") or {}
    if not groups:
        raise BuildError(f"{where}: compressed-tensors without config_groups is not supported")
    if q.get("kv_cache_scheme"):
        raise BuildError(f"{where}: a compressed-tensors kv_cache_scheme (a quantized KV cache) is not supported")
    blocks = set()
    for name, group in groups.items():
        fmt = group.get("format") or q.get("format")
        if fmt not in FLOAT_FORMATS:
            raise BuildError(f"{where}: compressed-tensors format {fmt!r} is not supported; builder reads FP8 "
                             f"weights in {' or '.join(map(repr, FLOAT_FORMATS))}")
        w = group.get("weights") or {}
        kind = (w.get("type"), w.get("num_bits"), w.get("symmetric", True), w.get("dynamic", False))
        if kind != ("float", 8, True, False):
            raise BuildError(f"{where}: config_groups.{name}.weights (type {kind[0]!r}, num_bits {kind[1]}, "
                             f"symmetric {kind[2]}, dynamic {kind[3]}) is not supported; builder reads symmetric "
                             "static float 8-bit weights")
        if w.get("strategy") not in STRATEGIES:
            raise BuildError(f"{where}: compressed-tensors FP8 strategy {w.get('strategy')!r} is not supported; "
                             f"builder reads {', '.join(STRATEGIES)}")
        if w["strategy"] == "block":
            blocks.add(_block(w.get("block_structure"), where))
        activations = group.get("input_activations")
        if activations and not activations.get("dynamic", False):
            raise BuildError(f"{where}: config_groups.{name}.input_activations is static (dynamic false): static "
                             "activation scales quantize activations to fp8, which a float build does not")
        if group.get("output_activations"):
            raise BuildError(f"{where}: config_groups.{name}.output_activations (quantized outputs) is not supported")
    if len(blocks) > 1:
        raise BuildError(f"{where}: compressed-tensors groups with different block_structure {sorted(blocks)} "
                         "are not supported")
    return FP8Format("compressed-tensors", "weight_scale", next(iter(blocks), None))


def _block(value: Any, where: str) -> tuple[int, int]:
    if not (isinstance(value, (list, tuple)) and len(value) == 2 and all(isinstance(v, int) and v > 0 for v in value)):
        raise BuildError(f"{where}: FP8 block size {value!r} is not two positive integers")
    return int(value[0]), int(value[1])


@dataclass(frozen=True)
class FP8Linear:
    """One layer's float8 weight and its scale."""

    weight: TensorInfo
    scale: TensorInfo
    block: tuple[int, int] | None  # None: a per-tensor or per-channel scale

    def float32(self, stack) -> ComputedRows:
        """fp8 · scale as float32 [N, K] (transformers' _dequantize_fp8_weight), computed a block of
        rows at a time as they are written or quantized: never the whole float32 matrix (4 bytes a
        weight against the file's 1) beside its result."""
        n, k = self.weight.shape
        codes = stack.enter_context(mapped(self.weight))
        s = np.asarray(stack.enter_context(mapped(self.scale)), np.float32)

        def rows(start: int, stop: int) -> np.ndarray:
            piece = codes[start:stop]
            w = np.asarray(piece).astype(np.float32)
            release(piece)
            if self.block is None:  # [1] or [] per tensor, [N, 1] per channel
                w *= s.reshape(()) if s.size == 1 else s.reshape(n, 1)[start:stop]
                return w
            bn, bk = self.block
            grid = s[start // bn : -(-stop // bn)]  # the scale rows these rows fall in
            scales = np.repeat(grid, bn, axis=0)[start - start // bn * bn :][: stop - start]
            for j in range(scales.shape[1]):  # in place, a block column at a time
                w[:, j * bk:(j + 1) * bk] *= scales[:, j:j + 1]
            return w

        return ComputedRows(rows, (n, k))


class FP8Checkpoint(SafetensorsCheckpoint):
    """A safetensors checkpoint whose linear layers are FP8: `<module>.weight` reads as the float32
    product of the float8 weight and its scale (see the module's docstring); every other tensor
    reads as usual.

    Example:
        >>> ckpt = FP8Checkpoint.open_fp8("path/to/Qwen3-0.6B-FP8", fmt)        # doctest: +SKIP
        >>> ckpt.weight("model.layers.0.mlp.down_proj.weight").dtype              # doctest: +SKIP
        dtype('float32')
    """

    def __init__(self, tensors: dict[str, TensorInfo], layers: dict[str, FP8Linear]):
        super().__init__(tensors)
        self.layers = layers

    @classmethod
    def open_fp8(cls, folder, fmt: FP8Format) -> FP8Checkpoint:
        raw = read_headers(folder)
        suffix = f".{fmt.scale}"
        modules = sorted(name[: -len(suffix)] for name in raw if name.endswith(suffix))
        if not modules:
            raise BuildError(f"{folder}: quantization_config says {fmt.method}, but no tensor is named *{suffix}")
        parts = (fmt.scale, *IGNORED_PARTS)
        tensors = {name: info for name, info in raw.items() if name.rsplit(".", 1)[-1] not in parts}
        layers = {}
        for module in modules:
            layer = _layer(raw, module, fmt)
            name = f"{module}.weight"
            layers[name] = layer
            tensors[name] = TensorInfo(name, np.dtype(np.float32), layer.weight.shape, layer.weight.path,
                                       layer.weight.offset, layer.weight.nbytes + layer.scale.nbytes)
        for name, info in raw.items():
            if info.dtype in FP8_DTYPES and name not in layers:
                raise BuildError(f"{name} is {info.dtype.name} but has no {fmt.scale} ({fmt.method} scales every "
                                 "float8 weight)")
            last = name.rsplit(".", 1)
            if len(last) == 2 and last[1] in parts and f"{last[0]}.weight" not in layers:
                raise BuildError(f"{name} belongs to no FP8 layer (no {last[0]}.{fmt.scale})")
        return cls(tensors, layers)

    def weight(self, name: str, shape=None, packed: bool = False) -> Weight:
        layer = self.layers.get(name)
        if layer is None:
            return super().weight(name, shape, packed)
        if shape is not None and tuple(shape) != layer.weight.shape:
            raise BuildError(f"{name} (fp8) has shape {list(layer.weight.shape)} but config.json implies {list(shape)}")
        self._consumed.add(name)
        return Weight(layer.weight.shape, np.float32, layer.float32, (name,), by_rows=True)

    def same_values(self, a: str, b: str, rows_per_chunk: int = 4096) -> bool:
        if a in self.layers or b in self.layers:
            return False  # a float8 lm_head is not compared with the float embedding
        return super().same_values(a, b, rows_per_chunk)


class FP8Source(ReadQuantizationSource):
    """A model folder whose config.json's quantization_config says FP8 (a Source). Its weights read
    as float32 products, so a quantized build rounds them again: no stored blocks."""

    def open_checkpoint(self) -> FP8Checkpoint:
        """The folder's safetensors headers, each float8 weight paired with its scale."""
        return FP8Checkpoint.open_fp8(self.folder, self.fmt)


def _layer(raw: dict[str, TensorInfo], module: str, fmt: FP8Format) -> FP8Linear:
    """One layer's tensors, the scale's shape checked against the weight's and the format."""
    weight, scale = raw.get(f"{module}.weight"), raw[f"{module}.{fmt.scale}"]
    if weight is None:
        raise BuildError(f"{module} has a {fmt.scale} but no weight")
    if weight.dtype not in FP8_DTYPES or len(weight.shape) != 2:
        raise BuildError(f"{module}.weight is {weight.dtype.name}{list(weight.shape)}; an FP8 layer's weight is a "
                         "float8_e4m3fn (or float8_e5m2) matrix")
    if scale.dtype.kind != "f" and scale.dtype != DTYPES["BF16"]:
        raise BuildError(f"{module}.{fmt.scale} is {scale.dtype.name}; builder reads float scales")
    n, k = weight.shape
    per_tensor = math.prod(scale.shape) == 1
    per_channel = scale.shape in ((n, 1), (n,))
    if fmt.block is not None:
        bn, bk = fmt.block
        want = (-(-n // bn), -(-k // bk))
        if scale.shape == want:
            return FP8Linear(weight, scale, fmt.block)
        if fmt.method == "fp8" or not (per_tensor or per_channel):  # compressed-tensors groups may mix strategies
            raise BuildError(f"{module}.{fmt.scale} has shape {list(scale.shape)}; blocks of {list(fmt.block)} over "
                             f"{list(weight.shape)} need {list(want)}")
    elif fmt.method == "fp8" and not per_tensor:
        raise BuildError(f"{module}.{fmt.scale} has shape {list(scale.shape)}; without weight_block_size the scale is "
                         "one number")
    if per_tensor or per_channel:
        return FP8Linear(weight, scale, None)
    raise BuildError(f"{module}.{fmt.scale} has shape {list(scale.shape)}; over {list(weight.shape)} a scale is per "
                     f"tensor [1] or per channel [{n}, 1]")
