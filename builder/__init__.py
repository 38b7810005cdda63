"""builder: Hugging Face decoder checkpoints -> ONNX Runtime models, lazily and exactly.

Two ways in. Build a supported model from options (what the command line does):

    >>> from builder import BuildOptions, build
    >>> build(BuildOptions(model="Qwen/Qwen3-0.6B", precision="fp16", execution_provider="cuda"))  # doctest: +SKIP

Or craft a decoder from blocks, with lazy weights from any safetensors files, and save it
(scripts/craft_gelu_llama.py is a worked example):

    >>> from builder import Checkpoint, DecoderIO, Graph, Target, blocks, save  # doctest: +SKIP
"""

from builder import blocks
from builder.errors import BuildError
from builder.graph import Graph
from builder.inputs.safetensors import SafetensorsCheckpoint as Checkpoint  # a safetensors folder's tensors
from builder.io import DecoderIO
from builder.lazy import Weight
from builder.options import BuildOptions
from builder.target import Quantization, Target
from builder.version import __version__
from builder.writer import save


def build(options: BuildOptions, progress: bool = True):
    """Builds the model `options` describe; returns the output folder (see builder.pipeline.build)."""
    from builder.pipeline import build as _build

    return _build(options, progress=progress)


__all__ = [
    "BuildError",
    "BuildOptions",
    "Checkpoint",
    "DecoderIO",
    "Graph",
    "Quantization",
    "Target",
    "Weight",
    "__version__",
    "blocks",
    "build",
    "save",
]
