"""Calibrates an int8 KV cache: runs a float-cache build over a text with ONNX Runtime and writes
each layer's key and value scales, per tensor and per channel, in onnxruntime-genai's
kv_cache_scale_file format (builder/kv_cache.py), which `--kv-cache-scales` reads.

A scale is the largest magnitude the layer's keys (values) reached over the text, divided by 128
(int8's calibration divisor, recorded as "qmax"), per tensor or per channel (kv_heads·head_size).

    python scripts/calibrate_kv_cache.py out/smollm2-fp32 calibration.txt -o kv_scales.json
    python -m builder -m HuggingFaceTB/SmolLM2-135M-Instruct -o out/smollm2-kv8 \\
        --kv-cache int8-per-channel --kv-cache-scales kv_scales.json

The build must have a float KV cache; any precision of the weights. Per-channel scales are written
as `scales`; `--per-tensor` writes the per-tensor ones instead (each scale a number).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

QMAX = 128


def token_windows(folder: Path, text: str, size: int, count: int) -> list[np.ndarray]:
    """`count` windows of `size` tokens of `text`, by the build's own tokenizer (onnxruntime-genai's)."""
    import onnxruntime_genai as og

    ids = np.asarray(og.Tokenizer(og.Model(str(folder))).encode(text), np.int64)
    return [ids[i: i + size] for i in range(0, len(ids) - size + 1, size)][:count]


def absmax_per_channel(folder: Path, windows: list[np.ndarray]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per layer, the largest |key| and |value| of each channel (kv_heads·head_size) over every
    window's prefill."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
    inputs = {i.name: i for i in session.get_inputs()}
    layers = sorted(int(n.split(".")[1]) for n in inputs if n.startswith("past_key_values.") and n.endswith(".key"))
    dtype = {"tensor(float)": np.float32, "tensor(float16)": np.float16}[inputs[f"past_key_values.{layers[0]}.key"].type]
    keys = {i: 0.0 for i in layers}
    values = {i: 0.0 for i in layers}
    names = [o.name for o in session.get_outputs()]
    for ids in windows:
        feed = {"input_ids": ids[None], "attention_mask": np.ones((1, len(ids)), np.int64)}
        for i in layers:
            for kind in ("key", "value"):
                _, heads, _, size = inputs[f"past_key_values.{i}.{kind}"].shape
                feed[f"past_key_values.{i}.{kind}"] = np.zeros((1, heads, 0, size), dtype)
        out = dict(zip(names, session.run(None, feed)))
        for i in layers:
            for kind, store in (("key", keys), ("value", values)):
                present = np.abs(out[f"present.{i}.{kind}"].astype(np.float32))  # (1, heads, S, size)
                store[i] = np.maximum(store[i], present.max(axis=(0, 2)).reshape(-1))  # per channel
    return [keys[i] for i in layers], [values[i] for i in layers]


def scales_file(keys: list[np.ndarray], values: list[np.ndarray], per_tensor: bool) -> dict:
    def scale(absmax: np.ndarray):
        s = np.maximum(absmax, 1e-6) / QMAX  # a channel that never moved still gets a positive scale
        return float(s.max()) if per_tensor else [float(v) for v in s]

    return {"scales": {"k_scales": [scale(k) for k in keys], "v_scales": [scale(v) for v in values]}, "qmax": QMAX}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, help="a build with a float KV cache")
    parser.add_argument("text", type=Path, help="calibration text (UTF-8)")
    parser.add_argument("-o", "--output", type=Path, required=True)
    parser.add_argument("--per-tensor", action="store_true", help="one scale per layer (else one per channel)")
    parser.add_argument("--window", type=int, default=256, help="tokens per prefill")
    parser.add_argument("--windows", type=int, default=16, help="prefills to run")
    args = parser.parse_args()
    windows = token_windows(args.folder, args.text.read_text(encoding="utf-8"), args.window, args.windows)
    if not windows:
        parser.error(f"{args.text} has fewer than {args.window} tokens")
    keys, values = absmax_per_channel(args.folder, windows)
    args.output.write_text(json.dumps(scales_file(keys, values, args.per_tensor)) + "\n")
    print(f"wrote {args.output}: {len(keys)} layers, {len(windows)} windows of {args.window} tokens")


if __name__ == "__main__":
    main()
