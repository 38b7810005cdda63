"""The execution providers a build can target, and what each needs of the graph.

One table, read once by the options (defaults, refused dtypes), the Target (which blocks read) and
genai_config.json (provider options). No block or architecture names a provider; they read these
properties. The rules follow what onnxruntime-genai 0.18's own builder writes for each provider
(its builders/base.py provider branches and expansions/*.py, read for facts) and ONNX Runtime's
kernels per provider (builder.provider_kernels):

- cuda: GroupQueryAttention with its fused rotary and packed QKV, Skip/SimplifiedLayerNormalization,
  MatMulNBits at accuracy level 0 (the input's own type), fp16 I/O for quantized builds.
- dml (DirectML): GroupQueryAttention cannot rotate: q and k go through com.microsoft's
  RotaryEmbedding first, reading the `position_ids` input onnxruntime-genai then feeds; Q, K and V
  projected apart (no packed QKV); no If node; no GatherBlockQuantized; GELU in plain ops (no
  kernel for ONNX's Gelu); fp16 only.
- webgpu: as cuda, MatMulNBits at accuracy level 4, no FusedMatMul.
- trt-rtx (NVIDIA TensorRT-RTX, `NvTensorRtRtx` to onnxruntime-genai): no Skip/Simplified layer
  norm (RMSNorm written in standard ops), q/k norms apart from the attention, quantized weights in
  the QDQ form (symmetric int4 DequantizeLinear + MatMul), no GatherBlockQuantized (a tied
  vocabulary's lookup reads a float table), no If node; fp16 or bf16.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Provider:
    """One execution provider.

    Attributes:
        name: builder's spelling (`-e`), also the output folder's suffix.
        genai_name: the provider's key in genai_config.json's provider_options.
        options: the provider options written there (onnxruntime-genai's builder's defaults).
        io_dtypes: activation dtypes its attention kernels run, the first the default of a
            quantized build.
        accuracy_level: MatMulNBits' default compute type.
        fused_rotary: GroupQueryAttention rotates q and k itself (do_rotary=1).
        position_ids: the model reads a `position_ids` input for its rotary embedding.
        packed_qkv: one projection for q, k and v.
        fused_norms: ONNX Runtime's (Skip)SimplifiedLayerNormalization and SkipLayerNormalization.
        qdq: quantized weights only as DequantizeLinear + MatMul, symmetric.
        quantized_gather: GatherBlockQuantized (a tied vocabulary's lookup from lm_head's codes).
        if_op: the If operator (LongRoPE's table choice).
        windowed_kv_cache: GroupQueryAttention's ring-buffer sliding-window cache.
        fused_matmul: com.microsoft's FusedMatMul: every float linear (lm_head and a tied
            vocabulary included) reads its weight as stored, [out, in], with transB; without it a
            MatMul reads the weight transposed at build time.
        gelu_op: ONNX's Gelu (opset 20); without it, GELU in plain ops.
        needs_every_kernel: a node the provider has no kernel for is refused, not left to ONNX
            Runtime's CPU fallback (DirectML captures the graph, which a CPU node breaks).
        qmoe_k_tile: CUDA's QMoE (ONNX Runtime 1.31): the node must say its weights are in the raw
            [E, N, K/pack] layout (weights_prepacked=0), which the kernel repacks at load; left
            out, the kernel reads them as already repacked and returns wrong numbers without an
            error (measured on an H200). Hidden and expert intermediate sizes must be multiples of
            this tile. 0: no such kernel (the CPU's QMoE takes the raw layout without the attribute).
        linear_attention: com.microsoft's LinearAttention (the gated DeltaNet's and Mamba-2's scans,
            rules gated_delta and gated), a kernel ONNX Runtime has on the CPU only; elsewhere the
            recurrence runs as a standard-op Scan (builder/blocks/linear_recurrence.py).
        flat_lookup_zero_points: its GatherBlockQuantized reads 4-bit zero points packed over the
            flattened [N·k_blocks] table (CUDA's kernel, ONNX Runtime 1.31: block = flat index /
            block_size), where MatMulNBits' rows, whose zero points a tied lookup shares, start each
            on a byte: with an odd number of blocks a row the lookup gets its own repacked copy
            (logits off by more than their size on an H200 before).
    """

    name: str
    genai_name: str
    options: dict[str, str] = field(default_factory=dict)
    io_dtypes: tuple[str, ...] = ("fp16",)
    accuracy_level: int = 0
    fused_rotary: bool = True
    position_ids: bool = False
    packed_qkv: bool = True
    fused_norms: bool = True
    qdq: bool = False
    quantized_gather: bool = True
    if_op: bool = True
    windowed_kv_cache: bool = False
    fused_matmul: bool = True
    gelu_op: bool = True
    needs_every_kernel: bool = False
    qmoe_k_tile: int = 0
    flat_lookup_zero_points: bool = False
    linear_attention: bool = False

    def provider_options(self) -> list[dict[str, Any]]:
        """genai_config.json's session_options.provider_options (empty: the CPU)."""
        return [] if self.name == "cpu" else [{self.genai_name: dict(self.options)}]


PROVIDERS: dict[str, Provider] = {p.name: p for p in (
    # fp32 first: MatMulNBits' fastest CPU path; bf16 has no CPU GroupQueryAttention kernel.
    Provider("cpu", "cpu", io_dtypes=("fp32", "fp16"), accuracy_level=4, windowed_kv_cache=True, linear_attention=True),
    Provider("cuda", "cuda", {"enable_cuda_graph": "0"}, io_dtypes=("fp16", "bf16"), windowed_kv_cache=True,
             qmoe_k_tile=64, flat_lookup_zero_points=True),
    # DirectML has no GatherBlockQuantized kernel (docs/OperatorKernels.md; onnxruntime-genai's builder
    # writes one for a tied int4 vocabulary all the same): its lookup reads a float table.
    Provider("dml", "dml", {"enable_graph_capture": "1"}, fused_rotary=False, position_ids=True, packed_qkv=False,
             if_op=False, quantized_gather=False, gelu_op=False, needs_every_kernel=True),
    Provider("webgpu", "webgpu", {"enableGraphCapture": "0", "validationMode": "basic"}, io_dtypes=("fp16", "fp32"),
             accuracy_level=4, fused_matmul=False),
    Provider("trt-rtx", "NvTensorRtRtx", {"enable_cuda_graph": "1"}, io_dtypes=("fp16", "bf16"), fused_norms=False,
             qdq=True, quantized_gather=False, if_op=False, fused_matmul=False),
)}

# Other spellings `-e` accepts: onnxruntime-genai's builder's (`NvTensorRtRtx`) and ONNX Runtime's
# provider names, any case.
ALIASES = {
    "nvtensorrtrtx": "trt-rtx", "trt_rtx": "trt-rtx", "tensorrt-rtx": "trt-rtx", "nvtensorrtrtxexecutionprovider": "trt-rtx",
    "directml": "dml", "dmlexecutionprovider": "dml", "webgpuexecutionprovider": "webgpu",
    "cudaexecutionprovider": "cuda", "cpuexecutionprovider": "cpu",
}


def canonical(name: str) -> str:
    """builder's name for a provider spelling (`NvTensorRtRtx` -> `trt-rtx`); unknown names unchanged."""
    lowered = name.lower()
    return lowered if lowered in PROVIDERS else ALIASES.get(lowered, name)
