"""An int8 KV cache: GroupQueryAttention's quantized past and present (ONNX Runtime 1.31's CPU and
CUDA kernels: `kv_cache_bit_width` 8, `k_quant_type` / `v_quant_type` PER_TENSOR or PER_CHANNEL,
float32 `k_scale` / `v_scale` inputs), with static per-layer scales calibrated beforehand.

The scales file is onnxruntime-genai's builder's `kv_cache_scale_file` format, so one file serves
both tools: `{"scales": {"k_scales": [...], "v_scales": [...]}, "layer_ids": [...], "qmax": q}`,
one entry per KV layer (a number per tensor, or num_kv_heads·head_size numbers per channel), the
optional `layer_ids` naming the layers (default 0, 1, …), the optional `qmax` the divisor the
scales were calibrated with (the value `threshold / qmax` is rescaled to int8's 128). ONNX Runtime
stores clamp(round(x / scale), −128, 127). scripts/calibrate_kv_cache.py writes such a file from a
float build and a text.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from builder.errors import BuildError
from builder.hf_config import parse_json
from builder.target import KVCacheQuantization

SCHEMES = ("float", "int8-per-tensor", "int8-per-channel")
INT8_QMAX = 128  # onnxruntime-genai's calibration divisor for int8 (builders/base.py, KV_CACHE_CALIBRATION_QMAX)
MAX_FILE_BYTES = 64 << 20


def read_scales(path: str | Path, scheme: str, kv_layers: list[int], kv_heads: int, head_size: int) -> KVCacheQuantization:
    """The scales of `path` for the layers that have a KV cache, checked: one clear line for a file
    that is missing, not JSON, shaped otherwise, or holds a scale that is not finite and positive."""
    path = Path(path)
    where = f"--kv-cache-scales {path}"
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            raise BuildError(f"{where}: larger than {MAX_FILE_BYTES >> 20} MB, not a scales file")
        raw = path.read_bytes()
    except OSError as e:
        raise BuildError(f"{where}: cannot read it ({e.strerror or e})") from None
    data = parse_json(raw, where, "not JSON")  # one line for any malformed JSON, too deep a nesting included
    if isinstance(data, dict) and "model" in data and "scales" not in data:  # a section per model file
        data = data["model"]
    scales = data.get("scales") if isinstance(data, dict) else None
    if not isinstance(scales, dict) or not isinstance(scales.get("k_scales"), list) or not isinstance(scales.get("v_scales"), list):
        raise BuildError(f"{where}: expected {{\"scales\": {{\"k_scales\": [...], \"v_scales\": [...]}}}}")
    layer_ids = data.get("layer_ids", list(range(len(kv_layers))))
    if (not isinstance(layer_ids, list) or not all(type(i) is int for i in layer_ids)
            or sorted(layer_ids) != sorted(set(layer_ids))):
        raise BuildError(f"{where}: layer_ids must be a list of distinct layer numbers")
    if "layer_ids" in data and sorted(layer_ids) != sorted(kv_layers):
        raise BuildError(f"{where}: layer_ids {sorted(layer_ids)} are not the model's KV layers {kv_layers}")
    if "layer_ids" not in data:
        layer_ids = kv_layers
    qmax = data.get("qmax", INT8_QMAX)
    if isinstance(qmax, bool) or not isinstance(qmax, (int, float)) or not math.isfinite(qmax) or qmax <= 0:
        raise BuildError(f"{where}: qmax must be a positive number, got {qmax!r}")
    per_channel = scheme == "int8-per-channel"
    size = kv_heads * head_size if per_channel else 1
    out: dict[str, dict[int, np.ndarray]] = {}
    for side in ("k_scales", "v_scales"):
        entries = scales[side]
        if len(entries) != len(layer_ids):
            raise BuildError(f"{where}: {side} has {len(entries)} entries for {len(layer_ids)} KV layers")
        out[side] = {}
        for layer, entry in zip(layer_ids, entries):
            value = _scale(entry, size, f"{where}: {side} of layer {layer}")
            out[side][layer] = (value.astype(np.float64) * (qmax / INT8_QMAX)).astype(np.float32)
    return KVCacheQuantization(per_channel, out["k_scales"], out["v_scales"])


def _scale(entry, size: int, what: str) -> np.ndarray:
    values = entry if isinstance(entry, list) else [entry]
    if len(values) != size or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        raise BuildError(f"{what}: expected {'a number' if size == 1 else f'{size} numbers'}")
    array = np.asarray(values, np.float64)
    if not np.all(np.isfinite(array)) or np.any(array <= 0) or np.any(array > np.finfo(np.float32).max):
        raise BuildError(f"{what}: scales must be finite, positive float32 numbers")
    return array.astype(np.float32)
