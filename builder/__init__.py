"""builder: Hugging Face decoder checkpoints -> ONNX Runtime models, lazily and exactly.

The public surface: build a model from options, or craft one from blocks.

Example:
    >>> from builder import BuildOptions, build
    >>> build(BuildOptions(model="Qwen/Qwen3-0.6B", precision="fp16", execution_provider="cuda"))  # doctest: +SKIP
"""

from builder.checkpoint import Checkpoint
from builder.errors import BuildError
from builder.graph import Graph
from builder.io import DecoderIO
from builder.lazy import Weight
from builder.options import BuildOptions
from builder.target import Target

__version__ = "0.1.0"


def build(options: BuildOptions, progress: bool = True):
    """Builds the model `options` describe; returns the output folder (see builder.build.build)."""
    from builder.build import build as _build

    return _build(options, progress=progress)


__all__ = ["BuildError", "BuildOptions", "Checkpoint", "DecoderIO", "Graph", "Target", "Weight", "__version__", "build"]
