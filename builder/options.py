"""BuildOptions: the one schema of a build, shared by the command line and YAML files."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import ml_dtypes

from builder.errors import BuildError
from builder.quantize import BLOCK_SIZES
from builder.target import Quantization, Target

PRECISIONS = ("int4", "int8", "fp16", "bf16", "fp32")
QUANTIZED = {"int4": 4, "int8": 8}
EXECUTION_PROVIDERS = ("cpu", "cuda")
DEFAULT_PRECISION = "int4"
ACCURACY_LEVELS = (0, 1, 2, 3, 4)

_FLOAT = {"fp32": np.dtype(np.float32), "fp16": np.dtype(np.float16), "bf16": np.dtype(ml_dtypes.bfloat16)}
# Quantized models keep float activations: fp32 on CPU (MatMulNBits' fastest CPU path), fp16 on CUDA.
_QUANTIZED_IO = {"cpu": np.dtype(np.float32), "cuda": np.dtype(np.float16)}
# MatMulNBits compute type: int8 activations on CPU (4), the input's own type on CUDA (0).
_DEFAULT_ACCURACY = {"cpu": 4, "cuda": 0}

# Why a pair is refused, for the pairs ONNX Runtime cannot run well.
_REFUSED = {
    ("bf16", "cpu"): "ONNX Runtime's CPU kernels have no bfloat16 GroupQueryAttention/MatMul; use fp32 on cpu or bf16 on cuda",
    ("fp32", "cuda"): "GroupQueryAttention on CUDA needs fp16 or bf16; use -p fp16 or -p bf16 with -e cuda",
}


@dataclass(frozen=True)
class BuildOptions:
    """Everything a build needs to know, validated before any weight is read.

    Attributes:
        model: a Hugging Face id (org/name) or a local folder.
        output: the folder to write; default `<model name>-<precision>-<ep>` in the current folder.
        input: a local folder to read instead of downloading `model`.
        precision: weights' format: fp32, fp16 or bf16.
        execution_provider: cpu or cuda.
        overwrite: replace an existing, non-empty output folder.
        revision: the hub revision (branch, tag or commit) to download.
        block_size: int4/int8: elements of K per scale (16, 32, 64, 128, 256).
        symmetric: int4/int8: no zero points (False: per-block zero points).
        accuracy_level: int4/int8: MatMulNBits accuracy_level; None picks 4 on cpu, 0 on cuda.
        exclude_lm_head: int4/int8: keep lm_head in float.
        quantize_embeddings: int4: quantize an untied embedding table (GatherBlockQuantized).
        float_layers: int4/int8: fnmatch patterns of module paths kept in float.
        full_kv_cache: give sliding-window layers a context-long KV cache like the others
            (default: a window-long ring buffer; see the README's I/O section).
    """

    model: str
    output: Path | None = None
    input: Path | None = None
    precision: str = DEFAULT_PRECISION
    execution_provider: str = "cpu"
    overwrite: bool = False
    revision: str | None = None
    block_size: int = 32
    symmetric: bool = True
    accuracy_level: int | None = None
    exclude_lm_head: bool = False
    quantize_embeddings: bool = False
    float_layers: tuple[str, ...] = ()
    full_kv_cache: bool = False

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise BuildError(f"precision {self.precision!r} is not one of: {', '.join(PRECISIONS)}")
        if self.execution_provider not in EXECUTION_PROVIDERS:
            raise BuildError(
                f"execution provider {self.execution_provider!r} is not one of: {', '.join(EXECUTION_PROVIDERS)}"
            )
        reason = _REFUSED.get((self.precision, self.execution_provider))
        if reason:
            raise BuildError(f"-p {self.precision} -e {self.execution_provider} is not supported: {reason}")
        if self.block_size not in BLOCK_SIZES:
            raise BuildError(f"block size {self.block_size} is not one of: {', '.join(map(str, BLOCK_SIZES))}")
        if self.accuracy_level is not None and self.accuracy_level not in ACCURACY_LEVELS:
            raise BuildError(f"accuracy level {self.accuracy_level} is not one of: {', '.join(map(str, ACCURACY_LEVELS))}")
        object.__setattr__(self, "float_layers", tuple(self.float_layers))

    @property
    def output_folder(self) -> Path:
        if self.output is not None:
            return Path(self.output)
        name = Path(self.model.rstrip("/")).name or "model"
        return Path.cwd() / f"{name}-{self.precision}-{self.execution_provider}"

    def target(self) -> Target:
        ep = self.execution_provider
        windowed = not self.full_kv_cache
        if self.precision not in QUANTIZED:
            return Target(io_dtype=_FLOAT[self.precision], execution_provider=ep, windowed_kv_cache=windowed)
        quantization = Quantization(
            bits=QUANTIZED[self.precision],
            block_size=self.block_size,
            symmetric=self.symmetric,
            accuracy_level=_DEFAULT_ACCURACY[ep] if self.accuracy_level is None else self.accuracy_level,
            lm_head=not self.exclude_lm_head,
            embeddings=self.quantize_embeddings,
            float_layers=self.float_layers,
        )
        return Target(io_dtype=_QUANTIZED_IO[ep], execution_provider=ep, quantization=quantization,
                      windowed_kv_cache=windowed)

    def replace(self, **changes) -> BuildOptions:
        return dataclasses.replace(self, **changes)
