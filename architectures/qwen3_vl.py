"""The text decoder of Qwen3-VL (Qwen3VLForConditionalGeneration, dense): Qwen3's decoder (per-head
q/k RMSNorm, no biases) with interleaved multimodal rotary positions and DeepStack.

Reference: transformers/models/qwen3_vl/modeling_qwen3_vl.py (Qwen3VLTextModel,
Qwen3VLTextRotaryEmbedding). Apart from Qwen2.5-VL's decoder (architectures/qwen2_5_vl.py): the
M-RoPE frequencies take the temporal, height and width positions interleaved (t, h, w, t, h, w, …),
and DeepStack adds k more image features, from inner vision blocks, to the residual stream at the
image tokens after decoder layers 0 … k − 1 (Qwen3VLTextModel._deepstack_process).

onnxruntime-genai 0.18 has no input for DeepStack features, so they ride in the embeddings: the
package's inputs_embeds is (batch, sequence, (1 + k) · hidden), [embeddings | ds 0 | … | ds k−1],
zeros beside text tokens; the decoder takes the first `hidden` as its input and adds slice j + 1
after layer j (adding zeros elsewhere changes nothing). Built alone (--text-only) it is a `qwen3`
decoder: text positions make M-RoPE plain rotary, and text has no DeepStack features.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx_ir as ir

from architectures import qwen2_5_vl
from architectures.llama import LlamaConfig, decoder_layer
from builder.architecture import Weights
from builder.family import Decoder, Family, register

__all__ = ["FAMILY", "VARIANTS"]

# Qwen3VLTextConfig's defaults where they differ from Llama's.
VARIANTS: dict[str, dict[str, Any]] = {
    "Qwen3VLForConditionalGeneration": dict(
        model_type="qwen3", vocab_size=151936, hidden_size=4096, intermediate_size=22016, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=32, head_dim=128, max_position_embeddings=128000,
        rms_norm_eps=1e-6, bos_token_id=None, eos_token_id=None, default_theta=500_000.0,
    ),
}
STRUCTURE = {"Qwen3VLForConditionalGeneration": dict(qk_norm=True, model_type="qwen3")}


def add_deepstack(d: Decoder, j: int) -> None:
    """DeepStack feature j, inputs_embeds' slice j + 1 of width hidden (B, S, H), added to the
    stream after layer j; nothing past the ones inputs_embeds carries (or without a package)."""
    embeds, H = d.io.inputs_embeds, d.c.hidden_size
    if embeds is None or (j + 2) * H > embeds.shape[-1]:
        return
    with d.g.scope("deepstack"):
        features = d.g.op.Slice(embeds, d.g.constant([(j + 1) * H], np.int64), d.g.constant([(j + 2) * H], np.int64),
                                d.g.constant([-1], np.int64))
    d.stream.add(features)


def embed(d: Decoder) -> ir.Value:
    """The embeddings: inputs_embeds' first `hidden` (the package), else the token embeddings."""
    embeds = qwen2_5_vl.embed(d)
    if d.io.inputs_embeds is None or embeds.shape[-1] == d.c.hidden_size:
        return embeds
    with d.g.scope("model", "deepstack"):
        return d.g.op.Slice(embeds, d.g.constant([0], np.int64), d.g.constant([d.c.hidden_size], np.int64),
                            d.g.constant([-1], np.int64))  # (B, S, (1 + k)·H) -> (B, S, H)


def layer(d: Decoder, w: Weights, i: int):
    """Qwen3VLTextDecoderLayer (Qwen3's), then layer i's DeepStack features added to the stream."""
    presents = decoder_layer(d, w, i)
    add_deepstack(d, i)
    return presents


FAMILY = register(Family(
    "qwen3_vl", LlamaConfig, layer, VARIANTS, structure=STRUCTURE,
    parser=qwen2_5_vl.vl_parser([24, 20, 20], interleaved=True, text_ties=False),
    rotary=qwen2_5_vl.mrope, embed=embed,
    prefix=qwen2_5_vl.decoder_prefix,
    ignored=("visual.*", "model.visual.*"),
))
