"""What the graph is built for: the activation (IO) dtype, the execution provider, the weight format."""

from __future__ import annotations

import dataclasses
import fnmatch
from dataclasses import dataclass, field

import numpy as np

from builder.providers import PROVIDERS, Provider


# What each bit width gets unless told otherwise, from the CLI and the Python API alike: int4
# searches each block's scale with zero points (0.47x round-to-nearest's perplexity increase on
# SmolLM2-135M at 1.024x its size, docs/BENCHMARKS.md); int8 rounds to nearest, symmetric (its
# rounding error is already small, and the search would cost time for nothing measurable).
BITS_DEFAULTS: dict[int, dict[str, object]] = {
    4: {"method": "search", "symmetric": False},
    8: {"method": "rtn", "symmetric": True},
}


@dataclass(frozen=True)
class KVCacheQuantization:
    """Per-channel or per-tensor int8 scales for each KV layer's keys and values."""

    per_channel: bool
    k_scales: dict[int, np.ndarray]  # layer -> float32 [1] or [num_kv_heads · head_size]
    v_scales: dict[int, np.ndarray]

    @property
    def quant_type(self) -> str:
        return "PER_CHANNEL" if self.per_channel else "PER_TENSOR"


@dataclass(frozen=True)
class Quantization:
    """Block-wise weight quantization of linear layers into com.microsoft::MatMulNBits.

    Attributes:
        bits: 4 or 8.
        block_size: elements of K sharing one scale (16, 32, 64, 128, 256).
        symmetric: no zero points (ONNX Runtime's default) or per-block zero points.
        accuracy_level: MatMulNBits' compute type (0 unset, 1 fp32, 2 fp16, 3 bf16, 4 int8).
        lm_head: quantize the output projection too.
        embeddings: quantize the embedding table when it is not tied to lm_head (tied ones share
            lm_head's quantized matrix whenever lm_head is quantized to 4 bits).
        float_layers: fnmatch patterns of module paths kept in float (`model.layers.0.*`, `*.q_proj`),
            matched against the graph's module path and the checkpoint modules the linear is made of.
        method: how each block's scale is chosen: "rtn" (round-to-nearest, ONNX Runtime's) or
            "search" (least squared error among candidate scales; builder.quantize).
        int8_layers: fnmatch patterns, like float_layers, of layers quantized to 8 bits in a 4-bit
            build (`lm_head`, `model.embed_tokens` name the vocabulary matrices).
        mixed: the mixed-precision preset (mixed_int8_layers), resolved by with_layers once the
            number of decoder layers is known.
        qdq: the weights as blocked DequantizeLinear + MatMul (the QDQ form) instead of
            MatMulNBits: the same codes and scales (blocks.linear's QDQ layout).
        flat_lookup_zero_points: a quantized lookup's 4-bit zero points also packed over the
            flattened table, for the provider's GatherBlockQuantized (Provider.flat_lookup_zero_points).
    """

    bits: int = 4
    block_size: int = 32
    symmetric: bool | None = None  # None: the default for `bits` (BITS_DEFAULTS)
    accuracy_level: int = 4
    lm_head: bool = True
    embeddings: bool = False
    float_layers: tuple[str, ...] = field(default_factory=tuple)
    method: str | None = None  # None: the default for `bits` (BITS_DEFAULTS)
    int8_layers: tuple[str, ...] = field(default_factory=tuple)
    mixed: bool = False
    qdq: bool = False
    flat_lookup_zero_points: bool = False

    def __post_init__(self) -> None:
        for name, value in BITS_DEFAULTS.get(self.bits, {}).items():
            if getattr(self, name) is None:
                object.__setattr__(self, name, value)

    def with_layers(self, num_layers: int) -> Quantization:
        """The preset's int8 layers added to int8_layers, for a model of `num_layers` decoder layers."""
        if not self.mixed:
            return self
        return dataclasses.replace(self, mixed=False, int8_layers=self.int8_layers + mixed_int8_layers(num_layers))

    def applies_to(self, module: str, sources: tuple[str, ...] = ()) -> bool:
        """Whether the linear layer at `module` (dotted graph path) is quantized. `sources` are the
        checkpoint modules it is made of (`...q_proj`, `...k_proj`, `...v_proj` for a fused qkv_proj):
        a pattern matching any of them keeps the whole fused layer in float."""
        if module == "lm_head" and not self.lm_head:
            return False
        return not any(matches(p, (module, *sources)) for p in self.float_layers)

    def bits_for(self, module: str, sources: tuple[str, ...] = ()) -> int:
        """The bits of the quantized layer at `module`: 8 where an int8_layers pattern matches."""
        return 8 if any(matches(p, (module, *sources)) for p in self.int8_layers) else self.bits


# The modules that play llama.cpp's attn_v and ffn_down roles, by the families' own names: a gated
# MLP's down_proj, Phi's fc2 and StarCoder2's c_proj (plain MLPs).
VALUE_PROJECTIONS = ("v_proj",)
DOWN_PROJECTIONS = ("down_proj", "mlp.fc2", "mlp.c_proj")


def mixed_int8_layers(num_layers: int) -> tuple[str, ...]:
    """The int8 layers of the mixed preset: llama.cpp's Q4_K_M choice (llama-quant.cpp,
    `use_more_bits`: lm_head, the embedding table, and v_proj and down_proj of the first and last
    eighth of the layers and of every third layer between), plus every layer's o_proj. A fused
    qkv_proj holding v_proj goes to 8 bits whole.

    o_proj was added by measurement (docs/BENCHMARKS.md, SmolLM2-135M): Q4_K_M's choice alone gave
    +5.7% perplexity over fp32, with every o_proj +4.0% and a lower KL divergence from fp32, for
    4.5% more data; every down_proj or every v_proj/k_proj instead did less for perplexity."""
    eighth = num_layers // 8
    more = [i for i in range(num_layers)
            if i < eighth or i >= 7 * num_layers // 8 or (i - eighth) % 3 == 2]
    return ("lm_head", "*embed_tokens", *(f"*layers.{i}.*{m}" for i in more for m in (*VALUE_PROJECTIONS, *DOWN_PROJECTIONS)),
            "*.o_proj")


def matches(pattern: str, modules: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatchcase(m, pattern) for m in modules)


def source_modules(tensors: tuple[str, ...]) -> tuple[str, ...]:
    """Checkpoint module names of tensor names: `model.layers.0.self_attn.q_proj.weight` -> `...q_proj`."""
    return tuple(dict.fromkeys(t.rsplit(".", 1)[0] for t in tensors))


@dataclass(frozen=True)
class Target:
    """Decided once from the build options; blocks read it instead of branching on flags.

    Attributes:
        io_dtype: dtype of activations, KV cache and float weights (float32, float16 or bfloat16).
        execution_provider: a name of builder.providers.PROVIDERS (cpu, cuda, dml, webgpu, trt-rtx).
        quantization: how linear layers are quantized, or None for float weights.
        windowed_kv_cache: sliding-window layers keep a KV cache only the window long (a ring
            buffer GroupQueryAttention manages, `sliding_window_cache=1`) instead of one as long as
            the sequence. Off by default: onnxruntime-genai 0.18 with ONNX Runtime 1.31 cannot run
            such a cache for max_length below the window or for right-padded batches.
        context_length: positions to support instead of the model's max_position_embeddings.
        standard_ops: only operators of the default ONNX domain (opset 24): RMSNormalization,
            RotaryEmbedding and Attention with past and present KV, QDQ weights.
        kv_cache: an int8 KV cache's per-layer scales (builder.kv_cache), or None for a float cache.
        last_logits_only: logits of each sequence's last real token alone, [batch, 1, vocab]
            (--prune-lm-head): onnxruntime-genai samples from nothing else, and lm_head then
            multiplies one row per sequence in a prefill instead of every prompt token.
        narrow_float_matrices: float matrices read by float32 activations on the CPU stay in the
            checkpoint's bfloat16 or float16, widened by a Cast ONNX Runtime folds when it loads
            the model (blocks.stored_float): half the bytes on disk, 0.5 to 1 s more per GB of
            float32 at every session start. Set for a quantized build's float layers and the vision
            tower beside a quantized or bfloat16 decoder; an fp32 build keeps float32 matrices.
    """

    io_dtype: np.dtype
    execution_provider: str = "cpu"
    quantization: Quantization | None = None
    windowed_kv_cache: bool = False
    context_length: int | None = None
    standard_ops: bool = False
    kv_cache: KVCacheQuantization | None = None
    last_logits_only: bool = False
    narrow_float_matrices: bool = False

    @property
    def provider(self) -> Provider:
        """What the execution provider needs of the graph (builder.providers)."""
        return PROVIDERS[self.execution_provider]

    def lookup_bits(self, bits: int) -> int:
        """The bits a quantized token lookup gathers at: 8 in a standard-ops model (ONNX's Gather has
        no 4-bit type, so it reads 8-bit codes and a DequantizeLinear), else `bits`."""
        return 8 if self.standard_ops else bits

    def positions(self, max_position_embeddings: int) -> int:
        """Rows of the rotary tables: the context length asked for, else the model's."""
        return self.context_length or max_position_embeddings

    def with_layers(self, num_layers: int) -> Target:
        """The target with the quantization's per-layer choices resolved (Quantization.with_layers)."""
        if self.quantization is None:
            return self
        return dataclasses.replace(self, quantization=self.quantization.with_layers(num_layers))

    def quantizes(self, module: str, sources: tuple[str, ...] = ()) -> bool:
        return self.quantization is not None and self.quantization.applies_to(module, sources)
