"""BuildOptions: the one schema of a build, shared by the command line and YAML files."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import ml_dtypes

from builder.errors import BuildError
from builder.target import Target

PRECISIONS = ("fp32", "fp16", "bf16")
EXECUTION_PROVIDERS = ("cpu", "cuda")
DEFAULT_PRECISION = "fp32"

_IO_DTYPES = {"fp32": np.dtype(np.float32), "fp16": np.dtype(np.float16), "bf16": np.dtype(ml_dtypes.bfloat16)}

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
    """

    model: str
    output: Path | None = None
    input: Path | None = None
    precision: str = DEFAULT_PRECISION
    execution_provider: str = "cpu"
    overwrite: bool = False
    revision: str | None = None

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

    @property
    def output_folder(self) -> Path:
        if self.output is not None:
            return Path(self.output)
        name = Path(self.model.rstrip("/")).name or "model"
        return Path.cwd() / f"{name}-{self.precision}-{self.execution_provider}"

    def target(self) -> Target:
        return Target(io_dtype=_IO_DTYPES[self.precision], execution_provider=self.execution_provider)

    def replace(self, **changes) -> BuildOptions:
        return dataclasses.replace(self, **changes)
