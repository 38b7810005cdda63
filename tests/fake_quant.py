"""The int4/int8 reference: Hugging Face weights rounded by ONNX Runtime's own C++ quantizer, then
dequantized in torch (fake quantization), so transformers computes with exactly the values the
int4 ONNX model holds."""

from __future__ import annotations

import collections

import numpy as np
import onnx
import torch
import transformers
from helpers import OnnxDecoder, PROMPT, model_logits, relative_error
from onnxruntime.capi._pybind_state import quantize_matmul_4bits, quantize_matmul_8bits

from builder.options import PRECISION_DEFAULTS
from builder.quantize import dequantize, quantize
from builder.target import Quantization
from builder.verify_rounding import graph_linears


def fake_quantize(weight: torch.Tensor, bits: int, block_size: int, symmetric: bool) -> torch.Tensor:
    """dequantize(quantize(W)) for a Hugging Face [N, K] weight."""
    n, k = weight.shape
    k_blocks = -(-k // block_size)
    w_kn = np.zeros((k_blocks * block_size, n), np.float32)
    w_kn[:k] = weight.detach().float().numpy().T
    data = np.zeros((n, k_blocks, block_size * bits // 8), np.uint8)
    scales = np.zeros((n, k_blocks), np.float32)
    zp = np.zeros((n, -(-k_blocks * bits // 8)), np.uint8)
    (quantize_matmul_4bits if bits == 4 else quantize_matmul_8bits)(data, w_kn, scales, zp, block_size, n, k, symmetric)
    d = torch.from_numpy(data.astype(np.int32))
    codes = torch.stack([d & 0xF, d >> 4], dim=-1).reshape(n, k_blocks, block_size) if bits == 4 else d
    if symmetric:
        zeros = torch.full((n, k_blocks), 1 << (bits - 1), dtype=torch.int32)
    else:
        z = torch.from_numpy(zp.astype(np.int32))
        zeros = (torch.stack([z & 0xF, z >> 4], dim=-1).reshape(n, -1) if bits == 4 else z)[:, :k_blocks]
    w = (codes - zeros[:, :, None]).float() * torch.from_numpy(scales)[:, :, None]
    return w.reshape(n, -1)[:, :k].to(weight.dtype)


def fake_quantize_model(model: torch.nn.Module, bits: int = 4, block_size: int = 32, symmetric: bool = True,
                        lm_head: bool = True, method: str = "rtn", int8_layers: tuple[str, ...] = ()) -> None:
    """Rounds every decoder Linear (and lm_head) in place; a tied embedding follows its lm_head.
    RTN goes through ONNX Runtime's quantizer; other methods through builder.quantize. Layers an
    int8_layers pattern names (by the graph's module or its checkpoint modules) get 8 bits."""
    q = Quantization(bits, block_size, symmetric, int8_layers=tuple(int8_layers))
    with torch.no_grad():
        for name, module in model.named_modules():
            if not isinstance(module, torch.nn.Linear) or (not lm_head and name == "lm_head"):
                continue
            w = module.weight
            for graph_module, sources, rows in graph_linears(name, w.shape[0]):
                b = q.bits_for(graph_module, sources)
                if method == "rtn":
                    w[rows] = fake_quantize(w[rows], b, block_size, symmetric)
                else:
                    m = quantize(w[rows].detach().numpy(), b, block_size, symmetric, np.float32, method)
                    w[rows] = torch.from_numpy(dequantize(m, w.shape[1], b))


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.reshape(-1).astype(np.float64), b.reshape(-1).astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def reference(source, bits, block_size, symmetric=None, lm_head=True, ids=PROMPT, method=None, int8_layers=()):
    """transformers on fake-quantized weights; symmetric and method None: the precision's defaults."""
    defaults = PRECISION_DEFAULTS[f"int{bits}"]  # what a build does when not told
    symmetric = defaults["symmetric"] if symmetric is None else symmetric
    method = defaults["quant_method"] if method is None else method
    model = transformers.AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).eval()
    fake_quantize_model(model, bits, block_size, symmetric, lm_head, method, int8_layers)
    return model_logits(model, ids)


def op_histogram(folder):
    return collections.Counter(n.op_type for n in onnx.load(folder / "model.onnx", load_external_data=False).graph.node)


def assert_quantized_parity(source, out, bits=4, block_size=32, symmetric=None, lm_head=True, exact=False, ids=PROMPT,
                            method=None, int8_layers=()):
    """accuracy_level 4 (the cpu default) also rounds activations to int8 inside MatMulNBits, which
    the fake-quantized reference does not: cosine similarity is the measure (measured 0.99997 on
    the tiny Llama, against 0.988 for the unquantized reference). With accuracy_level 0 the
    arithmetic is float32 and the logits must equal the reference's to float32 precision."""
    ref_prefill, ref_step, next_id = reference(source, bits, block_size, symmetric, lm_head, ids, method, int8_layers)
    prefill, step = OnnxDecoder(out).prefill_and_step(ids, next_id)
    for name, got, want in (("prefill", prefill, ref_prefill), ("decode", step, ref_step)):
        c = cosine(got, want)
        assert c > 0.999, f"{name}: cosine {c:.5f}"
        if exact:
            err = relative_error(got, want)
            assert err < 1e-4, f"{name}: relative max error {err:.2e}"
