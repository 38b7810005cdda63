"""CUDA builds against transformers, on a machine with an NVIDIA GPU: the check CI cannot run.

Two steps, so that the GPU machine needs only onnxruntime-gpu and onnxruntime-genai-cuda:

    python scripts/cuda_check.py prepare WORK   # anywhere with the test extras: tiny checkpoints,
                                                # `-e cuda` builds, transformers' reference numbers
    python scripts/cuda_check.py run WORK       # on the GPU: ONNX Runtime's CUDA provider and
                                                # onnxruntime-genai-cuda; prints one line per check
    python scripts/cuda_check.py presets WORK   # on the GPU, with builder's dependencies: every
                                                # synthetic preset built and run, CUDA against CPU

Each model is built with `-e cuda` at fp16, bf16 and int4 and run by ONNX Runtime's CUDA provider
with no CPU fallback allowed (a node the CUDA provider lacks fails the session, and the check then
says which, and runs with fallback). Its prefill and one decode step are compared with
transformers' float32 logits (int4: with the same file on ONNX Runtime's CPU provider), beside
transformers' own error in that dtype (fp16/bf16 in torch) as the yardstick. onnxruntime-genai-cuda
then generates a right-padded batch of two prompts of different lengths, compared token by token
with transformers' greedy continuation (cut before near-ties).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from genai_batch import genai_generate  # noqa: E402

PROMPT = [5, 17, 33, 12, 99, 100, 7, 8, 61, 42]
RAGGED = [[7, 3, 11, 19, 23, 29, 31, 37, 41, 43, 47], [5, 17, 33, 12, 99]]
MAX_LENGTH = 32
NEAR_TIE = 1e-3  # as tests/test_genai.py: a top-2 gap where two correct implementations may differ
PRECISIONS = ("fp16", "bf16", "int4")


def families() -> dict:
    """name -> (make(folder), {label: build flags}, labels genai also runs): the test suite's tiny families."""
    from conftest import TINY
    from helpers import make_checkpoint
    from test_family_moe import make as make_moe
    from test_family_qwen3_5 import CONFIG as QWEN3_5
    from test_parity_gemma import make_gemma, make_loud_gemma

    every = {p: ["-p", p] for p in PRECISIONS}
    return {
        "llama": (lambda f: make_checkpoint(f, "LlamaConfig", **{**TINY, "eos_token_id": 255}), every, PRECISIONS),
        # window 4, shorter than both prompts: the ring-buffer cache of the local layers is used
        "gemma3": (lambda f: make_gemma(f, "gemma3"), every, PRECISIONS),
        # residual stream past 1e5: fp16 must keep it in float32
        "gemma3-loud": (lambda f: make_loud_gemma(f, "gemma3"), {p: every[p] for p in ("fp16", "int4")}, ("fp16",)),
        "qwen3-moe": (lambda f: make_moe(f, "qwen3_moe"), every, ("fp16", "int4")),
        "qwen3.5-hybrid": (lambda f: make_checkpoint(f, "Qwen3_5TextConfig", **QWEN3_5), every, ("fp16",)),
    }


def more() -> dict:
    """The hybrids (LFM2's short conv, Mamba-2 in Granite 4 and Nemotron-H) and the big families'
    attention and expert forms (gpt-oss, DeepSeek-V3's MLA, Gemma 4, Llama 4)."""
    from helpers import make_checkpoint
    from test_family_deepseek_v3 import make as make_deepseek
    from test_family_gemma4 import make as make_gemma4
    from test_family_gptoss import CONFIG as GPTOSS
    from test_family_granitemoehybrid import make as make_granite
    from test_family_lfm2 import make as make_lfm2
    from test_family_llama4 import make as make_llama4
    from test_family_nemotron_h import make as make_nemotron

    every = {p: ["-p", p] for p in PRECISIONS}
    # Tiny sizes CUDA's QMoE (multiples of 64) and MatMulNBits (whole blocks of 16) refuse: those
    # layers float, the rest int4.
    float_experts = {**every, "int4-float-experts": ["-p", "int4", "--float-layers", "*.experts"]}
    return {"lfm2": (make_lfm2, every, ("fp16",)), "granite4": (make_granite, float_experts, ("fp16",)),
            "nemotron-h": (make_nemotron, every, ("fp16",)),
            "gpt-oss": (lambda f: make_checkpoint(f, "GptOssConfig", **GPTOSS), every, ("fp16",)),
            "deepseek-v3": (make_deepseek, {**every, "int4-float-o": ["-p", "int4", "--float-layers", "*.o_proj",
                                                                 "--float-layers", "*.experts"]},
                            ("fp16",)),
            "gemma4": (make_gemma4, every, ("fp16",)), "llama4": (make_llama4, float_experts, ("fp16",))}


def kprobe() -> dict:
    """MatMulNBits on CUDA by K (hidden 80 went wrong in LFM2's tiny model): Llamas of 16-wide heads."""
    from helpers import make_checkpoint
    from test_family_lfm2 import make as make_lfm2

    def llama(hidden):
        return lambda f: make_checkpoint(f, "LlamaConfig", vocab_size=256, hidden_size=hidden, intermediate_size=2 * hidden,
                                         num_hidden_layers=2, num_attention_heads=hidden // 16, num_key_value_heads=1,
                                         head_dim=16, max_position_embeddings=128, eos_token_id=255)

    int4 = {"int4": ["-p", "int4"], "int4-b16": ["-p", "int4", "--block-size", "16"],
            "int4-sym": ["-p", "int4", "--symmetric"], "int8": ["-p", "int8"]}
    out = {f"llama-h{h}": (llama(h), int4, ()) for h in (80, 96, 112, 128)}
    out["lfm2"] = (make_lfm2, {"int4": ["-p", "int4"], "int4-float-head": ["-p", "int4", "--float-layers", "lm_head"],
                               "int4-fp32-io": ["-p", "int4", "--io-dtype", "fp32"], "fp16": ["-p", "fp16"]}, ())
    return out


def qmoe() -> dict:
    """QMoE's CUDA kernel against its CPU kernel: expert sizes, block sizes, bits, zero points."""
    from helpers import make_checkpoint

    def moe(hidden, inter, experts=4, layers=1):
        config = dict(vocab_size=256, hidden_size=hidden, intermediate_size=2 * inter, moe_intermediate_size=inter,
                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                      num_experts=experts,
                      num_experts_per_tok=2, max_position_embeddings=128, eos_token_id=255)
        return lambda f: make_checkpoint(f, "Qwen3MoeConfig", **config)

    def variants(*blocks):
        out = {}
        for bits in ("int4", "int8"):
            for block in blocks:
                out[f"{bits}-b{block}-asym"] = ["-p", bits, "--block-size", str(block)]
                out[f"{bits}-b{block}-sym"] = ["-p", bits, "--block-size", str(block), "--symmetric"]
        return out

    return {"moe-64x64": (moe(64, 64, 8, 2), variants(32), ()),
            "moe-256x256": (moe(256, 256), variants(32, 128), ()),
            "moe-512x768": (moe(512, 768), variants(32, 64, 128), ("int4-b32-asym", "int4-b128-sym"))}


def cpu_session(path: Path):
    """The model on ONNX Runtime's CPU provider, as --verify runs a CUDA build there (a lookup's
    zero points packed for CUDA's kernel read from the rows the CPU's kernel expects)."""
    import onnxruntime as ort

    from builder.verify import _cpu_model

    options = ort.SessionOptions()
    return ort.InferenceSession(_cpu_model(path, options), options, providers=["CPUExecutionProvider"])


def lookup() -> dict:
    """Tied int4 lookups whose rows hold an odd number of zero-point blocks (CUDA's
    GatherBlockQuantized reads them packed over the whole table), and an even one."""
    from helpers import make_checkpoint
    from test_family_lfm2 import make as make_lfm2

    def tied(hidden):
        return lambda f: make_checkpoint(f, "LlamaConfig", vocab_size=256, hidden_size=hidden, intermediate_size=128,
                                         num_hidden_layers=2, num_attention_heads=hidden // 16, num_key_value_heads=1,
                                         head_dim=16, max_position_embeddings=128, eos_token_id=255,
                                         tie_word_embeddings=True)

    int4 = {"int4": ["-p", "int4"], "int4-b128": ["-p", "int4", "--block-size", "128"],
            "int4-sym": ["-p", "int4", "--symmetric"]}
    return {"tied-h96": (tied(96), int4, ("int4",)), "tied-h80": (tied(80), int4, ()),
            "tied-h576": (tied(576), int4, ()), "tied-h64": (tied(64), int4, ()),
            "lfm2": (make_lfm2, {"int4": ["-p", "int4"]}, ("int4",))}


def prepare(work: Path, which: str) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    import torch
    import transformers
    from helpers import build, model_logits
    from test_sliding_windows import continuation

    cases = []
    new_tokens = MAX_LENGTH - max(map(len, RAGGED))
    for name, (make, variants, genai) in {"families": families, "more": more, "kprobe": kprobe, "lookup": lookup, "qmoe": qmoe}[which]().items():
        source = make(work / "src" / name)
        model = transformers.AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).eval()
        prefill, step, next_id = model_logits(model, PROMPT)
        refs = {"fp32.prefill": prefill, "fp32.step": step}
        rows = {"fp32": [continuation(model, ids, new_tokens) for ids in RAGGED]}
        for dtype in ("fp16", "bf16"):  # the yardstick: transformers' own error in half precision
            if not any(label.startswith(dtype) for label in variants):
                continue
            same = transformers.AutoModelForCausalLM.from_pretrained(
                source, dtype={"fp16": torch.float16, "bf16": torch.bfloat16}[dtype]).eval()
            refs[f"{dtype}.prefill"], refs[f"{dtype}.step"] = model_logits_float(same, PROMPT, next_id)
            rows[f"torch-{dtype}"] = [agreement(w, continuation(same, ids, new_tokens))
                                      for w, ids in zip(rows["fp32"], RAGGED)]
        for label, flags in variants.items():
            try:
                out = build(source, work / "out" / f"{name}-{label}", "-e", "cuda", *flags)
            except AssertionError as e:  # a build refused: the refusal is the result
                print(f"{name} {label}: not built ({e})", flush=True)
                continue
            (out / "build.yaml").unlink(missing_ok=True)  # paths of this machine
            case = dict(model=name, label=label, folder=str(out.relative_to(work)), next_id=next_id,
                        genai=label in genai, reference="fp32", continuations=rows)
            if label.startswith("int"):
                # The reference for the CUDA kernels: the same file on ONNX Runtime's CPU provider
                # (which the test suite proves against transformers on the same rounded weights).
                cpu = Decoder(cpu_session(out / "model.onnx"), out)
                refs[f"{label}.prefill"], refs[f"{label}.step"] = cpu.prefill_and_step(PROMPT, next_id)
                case.update(reference=label, continuations={**rows, label: [cpu.greedy(ids, new_tokens) for ids in RAGGED]})
            cases.append(case)
        np.savez(work / f"{name}.npz", **refs)
        print(f"prepared {name}", flush=True)
    (work / "cases.json").write_text(json.dumps(cases, indent=1))


def model_logits_float(model, ids, next_id):
    """Prefill and one step of a half-precision torch model, as float32."""
    import torch

    with torch.no_grad():
        prefill = model(torch.tensor([ids]), use_cache=True)
        step = model(torch.tensor([[next_id]]), past_key_values=prefill.past_key_values, use_cache=True)
    return prefill.logits[0].float().numpy(), step.logits[0].float().numpy()


# ---- the GPU side: numpy, onnxruntime-gpu, onnxruntime-genai-cuda, ml_dtypes only ----

def to_numpy(value) -> np.ndarray:
    """An OrtValue on the CPU as float32 numpy; bfloat16 (which numpy lacks) read from its memory."""
    if value.data_type() != "tensor(bfloat16)":
        return value.numpy()
    import ctypes

    import ml_dtypes

    shape = value.shape()
    raw = (ctypes.c_uint16 * int(np.prod(shape))).from_address(value.data_ptr())
    return np.frombuffer(raw, np.uint16).copy().view(ml_dtypes.bfloat16).reshape(shape).astype(np.float32)


KINDS = {"tensor(float)": (np.float32, 1), "tensor(float16)": (np.float16, 10), "tensor(bfloat16)": (np.uint16, 16),
         "tensor(int64)": (np.int64, 7), "tensor(int32)": (np.int32, 6), "tensor(int8)": (np.int8, 3)}


def zeros(shape, onnx_type: str):
    import onnxruntime as ort

    dtype, code = KINDS[onnx_type]
    return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(np.zeros(shape, dtype), code)


def from_float(values: np.ndarray, onnx_type: str):
    """float values as an OrtValue of `onnx_type` (bfloat16 through ml_dtypes' bits)."""
    import onnxruntime as ort

    if onnx_type == "tensor(bfloat16)":
        import ml_dtypes

        return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(
            np.ascontiguousarray(values.astype(ml_dtypes.bfloat16).view(np.uint16)), 16)
    return ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(values.astype(KINDS[onnx_type][0])))


def session(path: Path):
    """A CUDA session of the model, and the nodes ONNX Runtime placed on the CPU ("op name" each),
    read from its verbose log of node placements."""
    import os
    import tempfile

    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = options.log_verbosity_level = 0
    saved = os.dup(2)
    with tempfile.TemporaryFile() as log:
        os.dup2(log.fileno(), 2)
        try:
            sess = ort.InferenceSession(str(path), options, providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        log.seek(0)
        lines = log.read().decode(errors="replace").splitlines()
    on_cpu, current = [], None
    for line in lines:
        if "placed on [" in line:
            current = line.split("placed on [")[1].split("]")[0]
            if line.strip().startswith("All") or "All nodes" in line:
                current = None
        elif current == "CPUExecutionProvider" and "VerifyEachNodeIsAssignedToAnEp]" in line:
            on_cpu.append(line.split("VerifyEachNodeIsAssignedToAnEp]")[1].strip())
    return sess, on_cpu


class Decoder:
    """A built decoder in an ONNX Runtime session: prefill or step on one row, every present.*
    fed back as past.* (a sliding-window layer's past starts as zeros the window long)."""

    def __init__(self, sess, folder: Path):
        decoder = json.loads((folder / "genai_config.json").read_text())["model"]["decoder"]
        self.window = decoder.get("sliding_window") or {}
        self.sess = sess
        self.inputs = {i.name: i for i in sess.get_inputs()}
        self.outputs = [o.name for o in sess.get_outputs()]

    def run(self, tokens: list[int], past: dict | None, total: int) -> tuple[np.ndarray, dict]:
        import onnxruntime as ort

        f = {"attention_mask": ort.OrtValue.ortvalue_from_numpy(np.ones((1, total), np.int64))}
        if "input_ids" in self.inputs:
            f["input_ids"] = ort.OrtValue.ortvalue_from_numpy(np.array([tokens], np.int64))
        else:  # a package's decoder: each token's embedding drawn from a generator seeded by its id
            meta = self.inputs["inputs_embeds"]
            rows = np.stack([np.random.default_rng(t).standard_normal(meta.shape[-1]) for t in tokens])[None]
            f["inputs_embeds"] = from_float(rows, meta.type)
        if "position_ids" in self.inputs:
            positions = np.arange(total - len(tokens), total)[None]
            if len(self.inputs["position_ids"].shape) == 3:  # M-RoPE: (3, batch, sequence)
                positions = np.repeat(positions[None], 3, axis=0)
            f["position_ids"] = ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(positions))
        for name, meta in self.inputs.items():
            if name in f:
                continue
            if past is not None:
                f[name] = past[name.replace("past_key_values", "present").replace("past.", "present.")]
                continue
            layer = int(name.split(".")[1])
            length = self.window.get("window_size", 0) if layer in self.window.get("layers", []) else 0
            shape = [(1 if "batch" in d else length) if isinstance(d, str) else d for d in meta.shape]
            f[name] = zeros(shape, meta.type)
        quiet = ort.RunOptions()
        quiet.log_severity_level = 3  # the session logs verbosely (see session)
        out = dict(zip(self.outputs, self.sess.run_with_ort_values(self.outputs, f, quiet)))
        return to_numpy(out["logits"])[0].astype(np.float32), out

    def prefill_and_step(self, ids: list[int], next_id: int) -> tuple[np.ndarray, np.ndarray]:
        prefill, present = self.run(ids, None, len(ids))
        step, _ = self.run([next_id], present, len(ids) + 1)
        return prefill, step

    def greedy(self, ids: list[int], new_tokens: int) -> list[int]:
        """Greedy continuation, cut before a step whose top two logits are within NEAR_TIE."""
        tokens, present = list(ids), None
        logits, present = self.run(tokens, None, len(tokens))
        out = []
        for _ in range(new_tokens):
            top2 = np.sort(logits[-1])[-2:]
            if top2[1] - top2[0] < NEAR_TIE:
                break
            out.append(int(logits[-1].argmax()))
            tokens.append(out[-1])
            logits, present = self.run(tokens[-1:], present, len(tokens))
        return out


def agreement(want: list[int], got: list[int]) -> int:
    """How many leading tokens of `want` `got` repeats."""
    n = 0
    while n < len(want) and n < len(got) and want[n] == got[n]:
        n += 1
    return n


def rel(a, b) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


def check(work: Path) -> list[dict]:
    results = []
    cases = json.loads((work / "cases.json").read_text())
    for case in cases:
        folder = work / case["folder"]
        refs = np.load(work / f"{case['model']}.npz")
        r = dict(model=case["model"], label=case["label"])
        want, half = case["reference"], case["label"][:4] if case["label"][:4] in ("fp16", "bf16") else None
        start = time.perf_counter()
        try:
            sess, on_cpu = session(folder / "model.onnx")
            r["providers"] = sess.get_providers()
            r["nodes_on_cpu"] = on_cpu
            prefill, step = Decoder(sess, folder).prefill_and_step(PROMPT, case["next_id"])
            for part, got in (("prefill", prefill), ("step", step)):
                expected = refs[f"{want}.{part}"]
                r[f"{part}_vs_{'fp32' if want == 'fp32' else 'cpu'}"] = rel(got, expected)
                r[f"{part}_argmax_equal"] = bool((got.argmax(-1) == expected.argmax(-1)).all())
                r[f"{part}_finite"] = bool(np.isfinite(got).all())
                if half:  # transformers' own error in that dtype
                    r[f"{part}_torch_{half}_vs_fp32"] = rel(refs[f"{half}.{part}"], refs[f"fp32.{part}"])
        except Exception as e:  # noqa: BLE001
            r["error"] = f"{type(e).__name__}: {str(e)[:400]}"
        if case["genai"]:
            try:
                rows = genai_generate(folder, RAGGED, MAX_LENGTH)
                expected = case["continuations"][want]
                r["genai_agree"] = [agreement(w, g) for w, g in zip(expected, rows)]
                r["genai_expected"] = [len(w) for w in expected]
                if half:
                    r[f"genai_torch_{half}_agree"] = case["continuations"][f"torch-{half}"]
            except Exception as e:  # noqa: BLE001
                r["genai_error"] = f"{type(e).__name__}: {str(e)[:400]}"
        r["seconds"] = round(time.perf_counter() - start, 2)
        print(json.dumps(r), flush=True)
        results.append(r)
    return results


def presets(work: Path) -> list[dict]:
    """Every preset of make_synthetic_checkpoint.py, shrunk, built here with `-e cuda` at fp16, bf16
    and int4 (this machine needs builder's own dependencies): every model file must get a CUDA
    session, and each decoder's prefill and decode step on CUDA must match the CPU provider's on
    the same file (fp16, int4; bf16 has no CPU kernels: finite, and against the fp16 build)."""
    import contextlib
    import io

    import onnxruntime as ort

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from make_synthetic_checkpoint import PRESETS, shrunk, write_checkpoint

    from builder.cli import main as build

    results = []
    for name in sorted(PRESETS):
        source = work / "src" / name
        write_checkpoint(source, shrunk(PRESETS[name]))
        fp16 = truth = None
        for precision in ("fp32",) + PRECISIONS:
            r = dict(model=name, label=precision)
            out = work / "out" / f"{name}-{precision}"
            err = io.StringIO()
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                ep = "cpu" if precision == "fp32" else "cuda"  # fp32 on the CPU: the truth the others are held to
                code = build(["-m", str(source), "-o", str(out), "-e", ep, "-p", precision, "-q", "--overwrite"])
            if code:
                r["build_error"] = err.getvalue().strip()[-300:]
                results.append(r)
                print(json.dumps(r), flush=True)
                continue
            if precision == "fp32":
                try:
                    cpu = Decoder(ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"]), out)
                    truth = cpu.prefill_and_step(PROMPT, PROMPT[0])
                except Exception:  # noqa: BLE001  (Whisper's decoder: no truth, sessions only)
                    truth = None
                continue
            for model in sorted(out.glob("*.onnx")):
                try:
                    sess, on_cpu = session(model)
                    r[f"{model.stem}_nodes_on_cpu"] = sorted({n.split(" ")[0] for n in on_cpu})
                    if model.name != "model.onnx" or "past_key_self_0" in {i.name for i in sess.get_inputs()}:
                        continue  # encoders, vision and embedding models: a session is the check
                    prefill, step = Decoder(sess, out).prefill_and_step(PROMPT, PROMPT[0])
                    r["finite"] = bool(np.isfinite(prefill).all() and np.isfinite(step).all())
                    if truth is not None:
                        r["prefill_vs_fp32"], r["step_vs_fp32"] = rel(prefill, truth[0]), rel(step, truth[1])
                    if precision == "bf16":
                        if fp16 is not None:
                            r["prefill_vs_fp16"], r["step_vs_fp16"] = rel(prefill, fp16[0]), rel(step, fp16[1])
                        continue
                    if precision == "fp16":
                        fp16 = (prefill, step)
                    cpu = Decoder(ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]), out)
                    want = cpu.prefill_and_step(PROMPT, PROMPT[0])
                    r["prefill_vs_cpu"], r["step_vs_cpu"] = rel(prefill, want[0]), rel(step, want[1])
                    r["argmax_equal"] = bool((prefill.argmax(-1) == want[0].argmax(-1)).all()
                                             and (step.argmax(-1) == want[1].argmax(-1)).all())
                except Exception as e:  # noqa: BLE001
                    r[f"{model.stem}_error"] = f"{type(e).__name__}: {str(e)[:300]}"
            results.append(r)
            print(json.dumps(r), flush=True)
    return results


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("step", choices=("prepare", "run", "presets"))
    p.add_argument("work", type=Path)
    p.add_argument("--set", choices=("families", "more", "kprobe", "lookup", "qmoe"), default="families",
                   help="prepare: tiny families at fp16/bf16/int4 (two sets), MatMulNBits by K, tied int4 lookups, or QMoE's sizes, bits and block sizes")
    p.add_argument("--json", type=Path, help="run: also write the results here")
    args = p.parse_args()
    if args.step == "prepare":
        args.work.mkdir(parents=True, exist_ok=True)
        prepare(args.work, args.set)
        return
    import onnxruntime as ort

    if hasattr(ort, "preload_dlls"):
        ort.preload_dlls()  # CUDA and cuDNN from the nvidia-* wheels, where they are installed
    print("onnxruntime", ort.__version__, ort.get_available_providers(), flush=True)
    results = presets(args.work) if args.step == "presets" else check(args.work)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
