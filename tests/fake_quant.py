"""The int4/int8 reference: Hugging Face weights rounded by ONNX Runtime's own C++ quantizer, then
dequantized in torch (fake quantization), so transformers computes with exactly the values the
int4 ONNX model holds."""

from __future__ import annotations

import numpy as np
import torch
from onnxruntime.capi._pybind_state import quantize_matmul_4bits, quantize_matmul_8bits


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
                        lm_head: bool = True) -> None:
    """Rounds every decoder Linear (and lm_head) in place; a tied embedding follows its lm_head."""
    with torch.no_grad():
        for name, module in model.named_modules():
            if isinstance(module, torch.nn.Linear) and (lm_head or name != "lm_head"):
                module.weight.copy_(fake_quantize(module.weight, bits, block_size, symmetric))
