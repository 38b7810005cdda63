"""Test helpers: tiny random Hugging Face checkpoints, building them with the CLI, running them."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

from builder.cli import main

PROMPT = [5, 17, 33, 12, 99, 100, 7, 8, 61, 42]
# For greedy generation to 30 tokens: a prompt whose continuations, with these seeded random
# tiny models, have no near-tie (see test_genai.NEAR_TIE) early on.
GENAI_PROMPT = [7, 3, 11, 19, 23, 29, 31, 37]
EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "tiny-llama"


def add_example_tokenizer(folder: Path) -> Path:
    """The shipped tiny model's tokenizer files copied into `folder`, as a hub folder has them (no
    missing-tokenizer warning beside a one-line error)."""
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(EXAMPLE / name, folder / name)
    return folder


def make_checkpoint(folder: Path, config_class: str, seed: int = 0, dtype=None, **config) -> Path:
    """Saves a randomly initialized transformers model (safetensors) into `folder`."""
    import torch
    import transformers

    torch.manual_seed(seed)
    cfg = getattr(transformers, config_class)(**config)
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad():
        # Random norm weights, so a norm that ignored its weight (or added 1 twice) would show.
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
    if dtype is not None:
        model = model.to(dtype)
    model.save_pretrained(folder)
    return folder


def build(source: Path, out: Path, *flags: str) -> Path:
    """Builds with the CLI, then opens every model file of the output in ONNX Runtime: whatever
    builder writes, ONNX Runtime must load (assert_sessions_open)."""
    rc = main(["-m", str(source), "-o", str(out), "-q", *flags])
    assert rc == 0, f"build failed with exit code {rc}"
    assert_sessions_open(out)
    return out


def assert_sessions_open(out: Path) -> None:
    """Every *.onnx of a build opens in an ONNX Runtime CPU session. A kernel the CPU lacks (a
    bfloat16 or CUDA build's) is no failure: the graph was read and checked before kernels are
    looked for; an invalid graph, type or attribute is."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # checks, not speed
    for model in sorted(out.glob("*.onnx")):
        try:
            ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
        except ort.capi.onnxruntime_pybind11_state.NotImplemented:
            pass


def model_logits(model, ids: list[int], next_id: int | None = None):
    """A transformers model's logits for a prefill of `ids`, then for one decode step of `next_id`
    (default: the prefill's greedy choice); returns (prefill, step, next_id) as numpy."""
    import torch

    with torch.no_grad():
        prefill = model(torch.tensor([ids]), use_cache=True)
        logits = prefill.logits[0].numpy()
        if next_id is None:
            next_id = int(logits[-1].argmax())
        step = model(torch.tensor([[next_id]]), past_key_values=prefill.past_key_values, use_cache=True)
    return logits, step.logits[0].numpy(), next_id


def reference(source: Path, ids: list[int], next_id: int | None = None):
    """transformers' fp32 logits for a prefill of `ids`, then for one decode step of `next_id`."""
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).eval()
    return model_logits(model, ids, next_id)


class OnnxDecoder:
    """Runs a built model with ONNX Runtime's CPU provider: prefill, then decode steps with the KV it returns."""

    def __init__(self, folder: Path):
        import json

        import onnxruntime as ort

        # Sliding-window layers built with a ring-buffer cache take a past exactly the window
        # long (zeros before the first token); genai_config.json names them.
        from builder.genai_config import config_entries

        genai = folder / "genai_config.json"
        decoder = json.loads(genai.read_text())["model"]["decoder"] if genai.is_file() else {}
        window = decoder.get("sliding_window")
        self.window_layers = set(window["layers"]) if window else set()
        self.window = window["window_size"] if window else 0

        options = ort.SessionOptions()
        for key, value in config_entries(decoder.get("session_options", {})).items():  # as genai sets them
            options.add_session_config_entry(key, value)
        self.session = ort.InferenceSession(str(folder / "model.onnx"), options, providers=["CPUExecutionProvider"])
        self.inputs = {i.name: i for i in self.session.get_inputs()}
        self.output_names = [o.name for o in self.session.get_outputs()]
        key = self.inputs["past_key_values.0.key"]
        self.layers = sum(1 for n in self.inputs if n.endswith(".key"))
        self.kv_heads, self.head_size = key.shape[1], key.shape[3]
        self.io_dtype = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(int8)": np.int8}[key.type]

    def run(self, ids: list[int], past: dict | None, total: int) -> tuple[np.ndarray, dict]:
        feed = {"input_ids": np.array([ids], np.int64), "attention_mask": np.ones((1, total), np.int64)}
        if "position_ids" in self.inputs:  # a provider whose rotary reads them (DirectML's)
            feed["position_ids"] = np.arange(total - len(ids), total, dtype=np.int64)[None]
        for i in range(self.layers):
            for kind in ("key", "value"):
                capacity = self.window if i in self.window_layers else 0
                feed[f"past_key_values.{i}.{kind}"] = (
                    past[f"present.{i}.{kind}"] if past
                    else np.zeros((1, self.kv_heads, capacity, self.head_size), self.io_dtype)
                )
        outs = dict(zip(self.output_names, self.session.run(None, feed)))
        return outs["logits"][0].astype(np.float32), outs

    def prefill_and_step(self, ids: list[int], next_id: int) -> tuple[np.ndarray, np.ndarray]:
        prefill, present = self.run(ids, None, len(ids))
        step, _ = self.run([next_id], present, len(ids) + 1)
        return prefill, step


def gguf_reference(path: Path):
    """transformers' tokenizer and float32 model for a GGUF file, read and dequantized by its own
    GGUF loader: what the opt-in real-model tests compare builds with."""
    import torch
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    return tokenizer, model.eval()


def relative_error(actual: np.ndarray, expected: np.ndarray) -> float:
    return float(np.abs(actual - expected).max() / np.abs(expected).max())


def perplexity(logits: np.ndarray, ids: list[int]) -> float:
    """exp of the mean negative log-likelihood of ids[1:] under a prefill's logits (float64)."""
    x = logits[:-1].astype(np.float64)
    x = x - x.max(-1, keepdims=True)
    logp = x - np.log(np.exp(x).sum(-1, keepdims=True))
    return float(np.exp(-logp[np.arange(len(ids) - 1), ids[1:]].mean()))


def agreement(got: np.ndarray, want: np.ndarray, ids: list[int]) -> tuple[float, float, float]:
    """A prefill's logits against the reference's: (relative max error, share of equal top-1
    choices, perplexity ratio)."""
    top1 = float((got.argmax(-1) == want.argmax(-1)).mean())
    return relative_error(got, want), top1, perplexity(got, ids) / perplexity(want, ids)


def assert_parity(folder: Path, source: Path, tolerance: float, ids: list[int] = PROMPT) -> None:
    """Prefill and one decode step agree with transformers within `tolerance` (relative max error),
    and pick the same next token at every position."""
    ref_prefill, ref_step, next_id = reference(source, ids)
    prefill, step = OnnxDecoder(folder).prefill_and_step(ids, next_id)
    for name, got, want in (("prefill", prefill, ref_prefill), ("decode", step, ref_step)):
        err = relative_error(got, want)
        assert err < tolerance, f"{name}: relative max error {err:.2e} >= {tolerance:.0e}"
        assert (got.argmax(-1) == want.argmax(-1)).all(), f"{name}: argmax differs from transformers"


def mapped_rss(path: Path) -> int:
    """The bytes of `path`'s memory mappings resident in this process (Linux's /proc/self/smaps):
    what reading a mapped checkpoint tensor holds until its pages are handed back."""
    total, ours = 0, False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            head = line.split(maxsplit=5)  # address, perms, offset, device, inode, the path (spaces kept)
            if head and "-" in head[0] and len(head) >= 5 and not head[0].endswith(":"):  # a mapping's header
                ours = len(head) == 6 and head[5].rstrip("\n").removesuffix(" (deleted)") == str(path)
            elif ours and head[:1] == ["Rss:"]:
                total += int(head[1]) * 1024
    return total
