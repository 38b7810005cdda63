"""gpt-oss's mixture of experts as one com.microsoft::MoE node (float experts) or QMoE node (int4 or
int8 block-wise experts), and the MXFP4 expert weights of the hub's gpt-oss checkpoints.

Reference: transformers/models/gpt_oss/modeling_gpt_oss.py (GptOssTopKRouter, GptOssExperts). ONNX
Runtime 1.31's CPU MoE/QMoE kernels compute exactly that layer (checked against numpy in
tests/test_family_gptoss.py):
- routing: the top-k of the router logits, and softmax over all experts renormalized over the k
  chosen (normalize_routing_weights=1), which is the softmax of the k chosen logits the router takes;
- swiglu_fusion=1: fc1's output rows interleave gate and up (gate_up_proj[..., ::2] is the gate);
  the gate clamped above at swiglu_limit, up to ±swiglu_limit, then gate·σ(alpha·gate)·(up + 1);
- a bias per expert after each of fc1 and fc2.
MoE/QMoE take [out, in] matrices per expert; transformers keeps gate_up_proj as [E, H, 2I] and
down_proj as [E, I, H] (x @ W), so each expert is transposed when written, one expert at a time.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from builder.blocks.linear import linear
from builder.graph import Graph
from builder.blocks.moe import expert_block_size, qmoe_node, quantized_experts, stacked
from builder.lazy import Weight
from builder.target import Target, source_modules

# FP4 e2m1 codes 0-15 (sign bit, 2 exponent bits, 1 mantissa bit), as transformers' FP4_VALUES.
FP4_VALUES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0],
                      np.float32)


def mxfp4_decode(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """float32 [..., G·32] from MXFP4 `blocks` uint8 [..., G, 16] (two e2m1 codes a byte, the low nibble
    first) and E8M0 `scales` uint8 [..., G] (2^(scale − 127) for each block of 32). Exact: every value
    is ±{0, .5, …, 6}·2^k, which float32 (and bfloat16) hold exactly."""
    codes = np.stack([blocks & 0x0F, blocks >> 4], axis=-1)  # (..., G, 16, 2): element 2j low, 2j+1 high
    values = FP4_VALUES[codes].reshape(*blocks.shape[:-1], 32)  # (..., G, 32)
    values = np.ldexp(values, scales.astype(np.int32)[..., None] - 127)
    return values.reshape(*blocks.shape[:-2], -1)


@dataclass(frozen=True)
class ExpertWeights:
    """Per expert [out, in] matrices (fc1: 2I interleaved gate/up rows over H; fc2: H over I), their
    biases [E, 2I] and [E, H], and the router's [E, H] weight and [E] bias."""

    fc1: list[Weight]
    fc1_bias: Weight
    fc2: list[Weight]
    fc2_bias: Weight
    router: Weight
    router_bias: Weight


def expert_matrices(experts, name: str, n: int, k: int, count: int) -> list[Weight]:
    """`name` of a GptOssExperts module (`experts.under(...)`) as `count` lazy [n, k] matrices: from
    MXFP4 `<name>_blocks` [E, n, k/32, 16] and `<name>_scales` [E, n, k/32] (already [out, in]) when
    the checkpoint has them, else from the float `<name>` [E, k, n] transposed."""
    if experts.prefix + f"{name}_blocks" not in experts.ckpt:
        stacked = experts(name, count, k, n)
        return [_one(stacked, e, (n, k), lambda x: x.T) for e in range(count)]
    blocks = experts.ckpt.weight(experts.prefix + f"{name}_blocks", (count, n, k // 32, 16), packed=True)
    scales = experts.ckpt.weight(experts.prefix + f"{name}_scales", (count, n, k // 32), packed=True)
    return [_mxfp4_expert(blocks, scales, e, (n, k)) for e in range(count)]


def _one(stacked: Weight, e: int, shape: tuple[int, int], layout) -> Weight:
    """Expert `e` of a stacked [E, …] weight, `layout` applied (a copy of that expert only)."""
    one = stacked.slice(0, e, e + 1)
    return Weight(shape, stacked.dtype, lambda _: one.apply(lambda x: np.ascontiguousarray(layout(x[0]))),
                  stacked.sources)


def _mxfp4_expert(blocks: Weight, scales: Weight, e: int, shape: tuple[int, int]) -> Weight:
    b, s = blocks.slice(0, e, e + 1), scales.slice(0, e, e + 1)
    return Weight(shape, np.float32, lambda _: mxfp4_decode(b.numpy()[0], s.numpy()[0]),
                  blocks.sources + scales.sources)


def gpt_oss_experts(g: Graph, x: ir.Value, w: ExpertWeights, top_k: int, alpha: float, limit: float,
                    target: Target) -> ir.Value:
    """GptOssMLP.forward on x (B, S, H): router (kept in float) and experts as MoE or QMoE."""
    hidden, count = w.router.shape[1], w.router.shape[0]
    with g.scope("router"):  # routing is discontinuous: its gate stays float whatever the precision
        logits = linear(g, x, w.router, dataclasses.replace(target, quantization=None), w.router_bias)
        logits = g.op.Reshape(logits, g.constant([-1, count], "int64"))  # (B, S, E) -> (B·S, E)
    attributes = dict(k=top_k, activation_type="swiglu", swiglu_fusion=1, activation_alpha=float(alpha),
                      activation_beta=1.0, swiglu_limit=float(limit), normalize_routing_weights=1)
    with g.scope("experts"):
        module = g.path.strip("/").replace("/", ".")
        sources = source_modules(tuple(s for m in w.fc1 + w.fc2 for s in m.sources))
        g.linears[module] = sources
        fc1_bias = g.weight("gate_up_proj_bias", w.fc1_bias.astype(target.io_dtype))
        fc2_bias = g.weight("down_proj_bias", w.fc2_bias.astype(target.io_dtype))
        if not target.quantizes(module, sources):
            fc1 = g.weight("gate_up_proj", stacked(w.fc1, target.io_dtype))  # (E, 2I, H)
            fc2 = g.weight("down_proj", stacked(w.fc2, target.io_dtype))  # (E, H, I)
            return g.ms.MoE(x, logits, fc1, fc1_bias, fc2, fc2_bias, **attributes)
        q = target.quantization
        inter = w.fc2[0].shape[1]
        if not q.symmetric:  # proved without zero points only (architectures/gpt_oss.py says so once)
            q = dataclasses.replace(q, symmetric=True)
        q = dataclasses.replace(q, block_size=expert_block_size(hidden, inter, q))  # one that divides both, if any
        # Each expert quantized alone, as MatMulNBits' weights are (builder.quantize), and streamed.
        scale_dtype = np.dtype(target.io_dtype)
        fc1_sources, fc2_sources = (tuple(s for m in fc for s in m.sources) for fc in (w.fc1, w.fc2))
        with g.scope("gate_up_proj"):
            fc1, fc1_scales, _ = quantized_experts(g, (w.fc1,), q, scale_dtype, fc1_sources)
        with g.scope("down_proj"):
            fc2, fc2_scales, _ = quantized_experts(g, (w.fc2,), q, scale_dtype, fc2_sources)
        return qmoe_node(g, [x, logits, fc1, fc1_scales, fc1_bias, fc2, fc2_scales, fc2_bias], attributes, q, target,
                         hidden, inter)


__all__ = ["FP4_VALUES", "ExpertWeights", "expert_matrices", "gpt_oss_experts", "mxfp4_decode"]
