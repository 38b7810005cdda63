"""What an int8 KV cache costs a real model: perplexity and KL divergence from the same build with a
float cache, and the cache's bytes per token, on SmolLM2-135M-Instruct (scripts/int4_quality.py's
model and text).

The text (this Python's LICENSE.txt) is cut into windows of --window tokens; the first half
calibrates the scales (scripts/calibrate_kv_cache.py), the second half is scored, each window from
an empty cache in one prefill (GroupQueryAttention stores the prompt's keys and values in the int8
cache and attends over them, so the prefill already reads the rounded cache).

    python scripts/kv_cache_quality.py --work /tmp/int4q
    python scripts/decode_speed.py /tmp/int4q/kv/int4-float /tmp/int4q/kv/int4-int8-per-channel --runs 3
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sysconfig
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, HERE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Prefill:
    """One build run over a whole window from an empty cache (float or int8)."""

    def __init__(self, folder: Path):
        import onnxruntime as ort

        self.session = ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
        self.past = {i.name: ([1, i.shape[1], 0, i.shape[3]], np.int8 if i.type == "tensor(int8)" else np.float32)
                     for i in self.session.get_inputs() if i.name.startswith("past_key_values")}
        decoder = json.loads((folder / "genai_config.json").read_text())["model"]["decoder"]
        item = 1 if next(iter(self.past.values()))[1] == np.int8 else 4
        self.cache_bytes_per_token = 2 * decoder["num_hidden_layers"] * decoder["num_key_value_heads"] * decoder["head_size"] * item

    def logits(self, ids: np.ndarray) -> np.ndarray:
        feed = {"input_ids": ids[None].astype(np.int64), "attention_mask": np.ones((1, len(ids)), np.int64)}
        feed.update({name: np.zeros(shape, dtype) for name, (shape, dtype) in self.past.items()})
        return self.session.run(["logits"], feed)[0][0].astype(np.float32)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--work", type=Path, default=Path("/tmp/int4_quality"))
    p.add_argument("--text", type=Path, default=Path(sysconfig.get_paths()["stdlib"]) / "LICENSE.txt")
    p.add_argument("--window", type=int, default=512)
    p.add_argument("--precisions", nargs="+", default=["fp32", "int4"])
    args = p.parse_args()
    quality, calibrate = load("int4_quality"), load("calibrate_kv_cache")
    folder = quality.hf_folder(args.work)
    chunks = quality.windows(folder, args.text, args.window)
    half = len(chunks) // 2
    calibration, scored = chunks[:half], chunks[half:]
    print(f"{len(calibration)} calibration and {len(scored)} scored windows of {args.window} tokens", flush=True)
    rows = []
    for precision in args.precisions:
        base, _ = quality.build(folder, args.work / "kv" / f"{precision}-float", ["-p", precision])
        keys, values = calibrate.absmax_per_channel(base, calibration)
        models = {"float": Prefill(base)}
        for scheme, per_tensor in (("int8-per-tensor", True), ("int8-per-channel", False)):
            scales = args.work / "kv" / f"{precision}-{scheme}.json"
            scales.write_text(json.dumps(calibrate.scales_file(keys, values, per_tensor)))
            out, _ = quality.build(folder, args.work / "kv" / f"{precision}-{scheme}",
                                   ["-p", precision, "--kv-cache", scheme, "--kv-cache-scales", str(scales)])
            models[scheme] = Prefill(out)
        nll = dict.fromkeys(models, 0.0)
        kl = dict.fromkeys(models, 0.0)
        tokens = 0
        for ids in scored:
            target = ids[1:]
            tokens += len(target)
            ref = quality.log_softmax(models["float"].logits(ids))[:-1]
            for name, model in models.items():
                lp = ref if name == "float" else quality.log_softmax(model.logits(ids))[:-1]
                nll[name] -= lp[np.arange(len(target)), target].sum()
                kl[name] += (np.exp(ref) * (ref - lp)).sum()
        for name, model in models.items():
            rows.append((precision, name, float(np.exp(nll[name] / tokens)), kl[name] / tokens, model.cache_bytes_per_token))
    print(f"\n{tokens} tokens scored per model\n")
    print("| weights | KV cache | perplexity | KL from the float cache (nats/token) | cache bytes per token |")
    print("|---|---|---|---|---|")
    for precision, name, ppl, divergence, size in rows:
        print(f"| {precision} | {name} | {ppl:.3f} | {divergence:.5f} | {size} |")


if __name__ == "__main__":
    main()
