"""Whisper (WhisperForConditionalGeneration): speech to text, as onnxruntime-genai 0.18's `whisper`
type runs it.

Two models and a processor file:
- encoder.onnx (architectures/whisper_encoder.py): audio_features -> encoder_hidden_states and
  every decoder layer's cross-attention keys and values, computed once per audio;
- model.onnx, the text decoder below: int32 `input_ids` (genai's type for this model), the self-
  attention cache `past_key_self_%d` / `past_value_self_%d` and the encoder's cross cache fed back
  as `past_key_cross_%d` / `past_value_cross_%d` -> `logits`, `present_key_self_%d` /
  `present_value_self_%d`. No attention mask and no position input: genai feeds neither
  (src/models/whisper.cpp), so the learned positional embedding starts at the self cache's length;
- audio_processor_config.json (builder/audio_processor.py): the log-mel features.

Reference: transformers/models/whisper/modeling_whisper.py (WhisperDecoder, WhisperDecoderLayer,
WhisperAttention, WhisperForConditionalGeneration: proj_out tied to the token embedding). The
decoder does not scale its embeddings whatever `scale_embedding` says (transformers 5 defines
embed_scale but never applies it), so neither does this one.

Attention is com.microsoft MultiHeadAttention, not GroupQueryAttention: GroupQueryAttention needs
the attention mask genai's whisper type does not send. MultiHeadAttention (ONNX Runtime has CPU
and CUDA kernels) appends the new keys and values to `past_key`/`past_value` and returns the
concatenation, which `unidirectional=1` masks causally from the past length on; the cross
attention reads the cached (B, heads, 1500, head_dim) keys and values as they are. That is what
genai's `past_present_share_buffer: false` expects: a present one token longer than its past.

Precision: the decoder follows the build (int4 quantizes its linear layers and the tied
vocabulary); the encoder, and the cross keys and values it computes, stay in float (the IO dtype).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx_ir as ir

from architectures import whisper_encoder
from architectures.whisper_config import MODEL_TYPE, WhisperConfig
from architectures.whisper_encoder import LAYER_NORM_EPS, feed_forward, projection, queries_keys_values
from builder.architecture import Weights, vocabulary
from builder.audio_processor import AUDIO_PROCESSOR_FILE, whisper_processor
from builder.blocks import ResidualStream
from builder.family import Family, register
from builder.graph import Graph
from builder.hf_config import from_dict
from builder.inputs.source import Checkpoint
from builder.io import BATCH, PAST, SEQUENCE, TOTAL, graph_value, logits_dtype, tensor_type
from builder.package import Package, PackageModel, preprocessor_config, register_package
from builder.target import Target

ENCODER_FILE = "encoder"
PAST_KEY, PAST_VALUE = "past_key_self_%d", "past_value_self_%d"
PRESENT_KEY, PRESENT_VALUE = "present_key_self_%d", "present_value_self_%d"
CROSS_PAST_KEY, CROSS_PAST_VALUE = "past_key_cross_%d", "past_value_cross_%d"


def parse_config(family: Family, raw: dict[str, Any], architecture: str) -> WhisperConfig:
    return from_dict(WhisperConfig, raw)


@dataclass
class WhisperIO:
    """The decoder's graph inputs and outputs, as onnxruntime-genai's whisper type names them."""

    input_ids: ir.Value
    past: list[tuple[ir.Value, ir.Value]]  # the self-attention cache, by layer
    cross: list[tuple[ir.Value, ir.Value]]  # the encoder's keys and values, by layer

    @classmethod
    def create(cls, c: WhisperConfig, dtype: np.dtype) -> WhisperIO:
        heads, size, frames = c.decoder_attention_heads, c.head_dim, c.max_source_positions

        def cache(pattern: str, i: int, length: str | int) -> ir.Value:
            return graph_value(pattern % i, dtype, (BATCH, heads, length, size))

        return cls(
            input_ids=graph_value("input_ids", np.int32, (BATCH, SEQUENCE)),
            past=[(cache(PAST_KEY, i, PAST), cache(PAST_VALUE, i, PAST)) for i in range(c.decoder_layers)],
            cross=[(cache(CROSS_PAST_KEY, i, frames), cache(CROSS_PAST_VALUE, i, frames))
                   for i in range(c.decoder_layers)],
        )

    @property
    def inputs(self) -> list[ir.Value]:
        return [self.input_ids, *(v for pair in self.past for v in pair), *(v for pair in self.cross for v in pair)]

    def outputs(self, logits: ir.Value, c: WhisperConfig, dtype: np.dtype,
                presents: list[tuple[ir.Value, ir.Value]]) -> list[ir.Value]:
        logits.name = "logits"
        logits.type = tensor_type(logits_dtype(dtype))
        logits.shape = ir.Shape((BATCH, SEQUENCE, c.vocab_size))
        for i, pair in enumerate(presents):
            for v, pattern in zip(pair, (PRESENT_KEY, PRESENT_VALUE)):
                v.name, v.type = pattern % i, tensor_type(dtype)
                v.shape = ir.Shape((BATCH, c.decoder_attention_heads, TOTAL, c.head_dim))
        return [logits, *(v for pair in presents for v in pair)]



def decoder_layer(g: Graph, stream: ResidualStream, w: Weights, io: WhisperIO, i: int, c: WhisperConfig,
                  target: Target) -> tuple[ir.Value, ir.Value]:
    """WhisperDecoderLayer.forward: causal self-attention over the cache, cross-attention over the
    encoder's keys and values, the MLP; each pre-LayerNorm and residual. Returns the present self
    key and value (B, heads, past + S, head_dim)."""
    d, heads = c.d_model, c.decoder_attention_heads
    with g.scope("self_attn_layer_norm"):
        h = stream.norm(w("self_attn_layer_norm.weight", d), w("self_attn_layer_norm.bias", d))
    a = w.under("self_attn.")
    with g.scope("self_attn"):
        q, k, v = queries_keys_values(g, h, a, d, target)
        # Inputs 3-5 (bias, key_padding_mask, attention_bias) unused; the new keys and values are
        # appended to the past, the output masked causally from the past length on.
        h, key, value = g.ms.MultiHeadAttention(q, k, v, None, None, None, *io.past[i], _outputs=3,
                                                num_heads=heads, scale=c.head_dim ** -0.5, unidirectional=1)
        stream.add(projection(g, h, a, "out_proj", d, target))
    with g.scope("encoder_attn_layer_norm"):
        h = stream.norm(w("encoder_attn_layer_norm.weight", d), w("encoder_attn_layer_norm.bias", d))
    a = w.under("encoder_attn.")
    with g.scope("encoder_attn"):
        q = projection(g, h, a, "q_proj", d, target)
        # Keys and values (B, heads, 1500, head_dim) as the encoder computed them; every query sees all.
        h = g.ms.MultiHeadAttention(q, *io.cross[i], num_heads=heads, scale=c.head_dim ** -0.5)
        stream.add(projection(g, h, a, "out_proj", d, target))
    feed_forward(g, stream, w, d, c.decoder_ffn_dim, c.activation_function, target)
    return key, value


def decoder_model(g: Graph, ckpt: Checkpoint, c: WhisperConfig,
                  target: Target) -> tuple[list[ir.Value], list[ir.Value]]:
    """The text decoder recorded on `g`: returns its graph inputs and outputs (Package.decoder)."""
    io = WhisperIO.create(c, target.io_dtype)
    d, dtype = c.d_model, target.io_dtype
    vocab = vocabulary(g, ckpt, target, (c.vocab_size, d), c.tie_word_embeddings,
                       embed="model.decoder.embed_tokens.weight", head="proj_out.weight")
    x = vocab.embed(g, io.input_ids)  # (B, S, d)
    with g.scope("model", "decoder", "embed_positions"):
        table = g.weight("weight", ckpt.weight("model.decoder.embed_positions.weight",
                                               (c.max_target_positions, d)).astype(dtype))
        past = g.op.Shape(io.past[0][0], start=2, end=3)  # (1,): the tokens already cached
        end = g.op.Add(past, g.op.Shape(io.input_ids, start=1, end=2))
        x = g.op.Add(x, g.op.Slice(table, past, end, g.constant([0], np.int64)))  # (B, S, d) + (S, d)
    # fp16 builds keep the residual stream and its norms in float32, as the encoder does.
    residual = np.float32 if dtype == np.float16 else None
    stream = ResidualStream(g, x, LAYER_NORM_EPS, target, residual, layer_norm=True)
    presents = []
    for i in range(c.decoder_layers):
        with g.scope("model", "decoder", f"layers.{i}"):
            presents.append(decoder_layer(g, stream, Weights(ckpt, f"model.decoder.layers.{i}."), io, i, c, target))
    with g.scope("model", "decoder", "layer_norm"):
        h = stream.norm(ckpt.weight("model.decoder.layer_norm.weight", (d,)),
                        ckpt.weight("model.decoder.layer_norm.bias", (d,)))
    logits = vocab.logits(g, h)
    return io.inputs, io.outputs(logits, c, dtype, presents)


@register_package("WhisperForConditionalGeneration")
def package(raw: dict[str, Any], folder: Path, ckpt: Checkpoint, c: WhisperConfig, target: Target) -> Package:
    """Whisper as onnxruntime-genai's whisper type reads it: the encoder (and its cross-cache
    outputs), this module's decoder with its self and cross caches, the speech processor file, and a
    cache that grows by concatenation (MultiHeadAttention's presents: no shared buffer)."""
    g = Graph()
    encoder = PackageModel(ENCODER_FILE, whisper_encoder.encoder_model(ckpt, c, target, g), g.sources, "encoder", {
        "head_size": c.encoder_head_dim,
        "hidden_size": c.d_model,
        "inputs": {"audio_features": whisper_encoder.AUDIO_FEATURES},
        "outputs": {"encoder_hidden_states": whisper_encoder.ENCODER_HIDDEN_STATES,
                    "cross_present_key_names": whisper_encoder.CROSS_KEY,
                    "cross_present_value_names": whisper_encoder.CROSS_VALUE},
        "num_attention_heads": c.encoder_attention_heads,
        "num_hidden_layers": c.encoder_layers,
        "num_key_value_heads": c.encoder_attention_heads,
    })
    decoder = {
        "inputs": {"input_ids": "input_ids", "past_key_names": PAST_KEY, "past_value_names": PAST_VALUE,
                   "cross_past_key_names": CROSS_PAST_KEY, "cross_past_value_names": CROSS_PAST_VALUE},
        "outputs": {"logits": "logits", "present_key_names": PRESENT_KEY, "present_value_names": PRESENT_VALUE},
    }
    return Package(MODEL_TYPE, [encoder], whisper_processor(preprocessor_config(folder), c.num_mel_bins),
                   AUDIO_PROCESSOR_FILE, decoder_fields=decoder, search={"past_present_share_buffer": False},
                   sections={"speech": {"config_filename": AUDIO_PROCESSOR_FILE}}, decoder=decoder_model)


FAMILY = register(Family(  # no layer for the shared body: the package's decoder_model records the decoder
    "whisper", WhisperConfig, None, {"WhisperForConditionalGeneration": {}}, parser=parse_config,
))
