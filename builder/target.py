"""What the graph is built for: the activation (IO) dtype, the execution provider, the weight format."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Target:
    """Decided once from the build options; blocks read it instead of branching on flags.

    Attributes:
        io_dtype: dtype of activations, KV cache and float weights (float32, float16 or bfloat16).
        execution_provider: "cpu" or "cuda".
    """

    io_dtype: np.dtype
    execution_provider: str = "cpu"
