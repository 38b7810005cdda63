"""What the pipeline needs from an architecture module (see architectures/llama.py for one)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Protocol

import onnx_ir as ir

from builder.checkpoint import Checkpoint
from builder.graph import Graph
from builder.hf_config import token_ids
from builder.io import DecoderIO
from builder.lazy import Weight
from builder.target import Target

log = logging.getLogger("builder")


@dataclass(frozen=True)
class DecoderInfo:
    """The facts about a decoder that its I/O, genai_config.json and build records need."""

    model_type: str  # onnxruntime-genai's model type ("llama", "qwen3", ...)
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_size: int
    context_length: int
    bos_token_id: int | None
    eos_token_ids: list[int]
    pad_token_id: int | None
    sliding_window: int | None = None
    sliding_window_layers: list[int] = field(default_factory=list)


def decoder_info(c: Any, windows: list[int | None]) -> DecoderInfo:
    """DecoderInfo from a config dataclass with Hugging Face's key names; `windows[i]` is layer
    i's sliding window (None for global layers)."""
    sliding = [i for i, w in enumerate(windows) if w]
    return DecoderInfo(
        model_type=c.model_type, vocab_size=c.vocab_size, hidden_size=c.hidden_size,
        num_layers=c.num_hidden_layers, num_attention_heads=c.num_attention_heads,
        num_kv_heads=c.num_key_value_heads, head_size=c.head_dim,
        context_length=c.max_position_embeddings, bos_token_id=c.bos_token_id,
        eos_token_ids=token_ids(c.eos_token_id), pad_token_id=c.pad_token_id,
        sliding_window=windows[sliding[0]] if sliding else None, sliding_window_layers=sliding,
    )


class Architecture(Protocol):
    """A module in architectures/: a config parser, the graph, and what to ignore."""

    IGNORED: tuple[str, ...]  # fnmatch patterns of checkpoint tensors deliberately left unused

    def parse_config(self, raw: dict[str, Any], architecture: str) -> Any: ...

    def info(self, config: Any) -> DecoderInfo: ...

    def build(
        self, g: Graph, io: DecoderIO, ckpt: Checkpoint, config: Any, target: Target
    ) -> tuple[ir.Value, list[tuple[ir.Value, ir.Value]]]: ...


def output_embedding(
    ckpt: Checkpoint, embed: Weight, tied: bool, shape: tuple[int, int], name: str = "lm_head.weight"
) -> tuple[Weight, bool]:
    """lm_head's weight, and whether it is the embedding (tied).

    As transformers 5 loads them: with `tie_word_embeddings` and no stored lm_head, or a stored
    copy equal to the embedding, lm_head is the embedding; a stored lm_head that differs is used
    as is, untied (transformers warns and does the same).
    """
    if name not in ckpt or not tied:
        return (embed, True) if tied else (ckpt.weight(name, shape), False)
    if ckpt.same_values(name, embed.sources[0]):
        ckpt.consume(name)
        return embed, True
    log.warning("%s differs from the embedding although tie_word_embeddings is set: using it untied, "
                "as transformers does", name)
    return ckpt.weight(name, shape), False
