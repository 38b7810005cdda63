"""Writes a float checkpoint's decoder projections as an FP8 checkpoint (quant_method "fp8",
float8_e4m3fn weights with 128×128 block `weight_scale_inv`, as DeepSeek-V3 and Qwen3-FP8 ship),
one tensor at a time; every other tensor (embeddings, norms, lm_head) is copied as stored.

    python scripts/make_synthetic_checkpoint.py Llama-3.2-1B /data/llama1b
    python scripts/fp8_checkpoint.py /data/llama1b /data/llama1b-fp8

Each block's scale maps its largest magnitude to 448 (e4m3's largest); codes round to nearest.
For benchmarks of FP8 input (docs/BENCHMARKS.md); the encoding the tests check is their own.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import struct
import sys
from pathlib import Path

import ml_dtypes
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from builder.inputs.mapping import mapped  # noqa: E402
from builder.inputs.safetensors import read_headers  # noqa: E402

BLOCK = 128
E4M3_MAX = 448.0
PROJECTION = re.compile(r".*\.layers\.\d+\..*_proj\.weight")
NAMES = {np.dtype(ml_dtypes.float8_e4m3fn): "F8_E4M3", np.dtype(np.float32): "F32",
         np.dtype(ml_dtypes.bfloat16): "BF16", np.dtype(np.float16): "F16"}


def encoded(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(float8 codes [N, K], float32 scales [ceil(N/128), ceil(K/128)]) of a float [N, K]."""
    n, k = w.shape
    rows, cols = -(-n // BLOCK), -(-k // BLOCK)
    padded = np.zeros((rows * BLOCK, cols * BLOCK), np.float32)
    padded[:n, :k] = w
    blocks = padded.reshape(rows, BLOCK, cols, BLOCK)
    scales = np.maximum(np.abs(blocks).max(axis=(1, 3)) / E4M3_MAX, 1e-12).astype(np.float32)
    codes = (blocks / scales[:, None, :, None]).reshape(rows * BLOCK, cols * BLOCK)[:n, :k]
    return np.clip(codes, -E4M3_MAX, E4M3_MAX).astype(ml_dtypes.float8_e4m3fn), scales


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("source", type=Path)
    p.add_argument("output", type=Path)
    args = p.parse_args()
    tensors = read_headers(args.source)
    plan = []  # (name, dtype, shape, how to make it)
    for name, info in tensors.items():
        if PROJECTION.fullmatch(name) and len(info.shape) == 2:
            n, k = info.shape
            plan.append((name, np.dtype(ml_dtypes.float8_e4m3fn), info.shape, (info, 0)))
            plan.append((name.removesuffix(".weight") + ".weight_scale_inv", np.dtype(np.float32),
                         (-(-n // BLOCK), -(-k // BLOCK)), (info, 1)))
        else:
            plan.append((name, info.dtype, info.shape, (info, None)))
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, dtype, shape, _ in plan:
        size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        header[name] = {"dtype": NAMES[dtype], "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    args.output.mkdir(parents=True)
    pending = {}
    with open(args.output / "model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        for name, _, _, (info, part) in plan:
            with mapped(info) as view:
                if part is None:
                    f.write(np.ascontiguousarray(view).tobytes())
                    continue
                if part == 0:
                    codes, pending[info.name] = encoded(np.asarray(view, np.float32))
                    f.write(codes.tobytes())
                else:
                    f.write(pending.pop(info.name).tobytes())
    config = json.loads((args.source / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3",
                                     "weight_block_size": [BLOCK, BLOCK]}
    (args.output / "config.json").write_text(json.dumps(config, indent=2))
    for extra in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        if (args.source / extra).is_file():
            shutil.copy(args.source / extra, args.output / extra)


if __name__ == "__main__":
    main()
