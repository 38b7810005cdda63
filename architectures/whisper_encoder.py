"""Whisper's audio encoder, and the cross-attention keys and values every decoder layer reads from
it, as one model: `audio_features` (B, num_mel_bins, 3000) -> `encoder_hidden_states`
(B, 1500, d_model) and `present_key_cross_%d` / `present_value_cross_%d` (B, heads, 1500, head_dim).

Reference: transformers/models/whisper/modeling_whisper.py (WhisperEncoder, WhisperEncoderLayer,
WhisperAttention). Two 1-D convolutions with GELU (the second strides by 2: 3000 frames -> 1500),
the stored positional table added (sinusoids, kept in the checkpoint), pre-LayerNorm layers with
biased projections except k_proj, attention over every frame in both directions, a final LayerNorm.
The decoder's cross-attention projects the encoder's output to the same keys and values at every
step; onnxruntime-genai's whisper type has them computed once, here, and feeds them back as the
decoder's `past_key_cross_%d` / `past_value_cross_%d` (src/models/whisper.cpp: CrossCache).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from architectures.whisper_config import FRAMES, WhisperConfig
from builder.architecture import Weights
from builder.blocks import ResidualStream, linear, plain_mlp
from builder.blocks.float_ops import op_dtype, to_dtype
from builder.graph import Graph
from builder.inputs.source import Checkpoint
from builder.io import BATCH, tensor_type
from builder.target import Target

__all__ = ["AUDIO_FEATURES", "CROSS_KEY", "CROSS_VALUE", "ENCODER_HIDDEN_STATES", "FRAMES", "encoder_model",
           "feed_forward", "projection", "queries_keys_values"]

AUDIO_FEATURES, ENCODER_HIDDEN_STATES = "audio_features", "encoder_hidden_states"
CROSS_KEY, CROSS_VALUE = "present_key_cross_%d", "present_value_cross_%d"
LAYER_NORM_EPS = 1e-5  # nn.LayerNorm's default, which every Whisper norm uses


def projection(g: Graph, x: ir.Value, w: Weights, name: str, d: int, target: Target, bias: bool = True) -> ir.Value:
    """One of WhisperAttention's d x d projections (k_proj has no bias)."""
    with g.scope(name):
        return linear(g, x, w(f"{name}.weight", d, d), target, w(f"{name}.bias", d) if bias else None)


def queries_keys_values(g: Graph, h: ir.Value, a: Weights, d: int, target: Target) -> list[ir.Value]:
    """WhisperAttention's q_proj, k_proj (no bias) and v_proj of `h`, each (B, T, d)."""
    return [projection(g, h, a, name, d, target, bias=name != "k_proj") for name in ("q_proj", "k_proj", "v_proj")]


def split_heads(g: Graph, x: ir.Value, heads: int, head_dim: int) -> ir.Value:
    x = g.op.Reshape(x, g.constant([0, 0, heads, head_dim], np.int64))  # (B, T, H*D) -> (B, T, H, D)
    return g.op.Transpose(x, perm=[0, 2, 1, 3])  # -> (B, H, T, D)


def encoder_layer(g: Graph, stream: ResidualStream, w: Weights, c: WhisperConfig, target: Target) -> None:
    """WhisperEncoderLayer.forward: x + self_attn(self_attn_layer_norm(x)), then
    x + fc2(gelu(fc1(final_layer_norm(x))))."""
    d = c.d_model
    with g.scope("self_attn_layer_norm"):
        h = stream.norm(w("self_attn_layer_norm.weight", d), w("self_attn_layer_norm.bias", d))
    a = w.under("self_attn.")
    with g.scope("self_attn"):
        q, k, v = queries_keys_values(g, h, a, d, target)
        # Every frame attends to every frame (no mask); scaling q by 1/√head_dim, as WhisperAttention does.
        h = g.ms.MultiHeadAttention(q, k, v, num_heads=c.encoder_attention_heads, scale=c.encoder_head_dim ** -0.5)
        stream.add(projection(g, h, a, "out_proj", d, target))
    feed_forward(g, stream, w, d, c.encoder_ffn_dim, c.activation_function, target)


def feed_forward(g: Graph, stream: ResidualStream, w: Weights, d: int, ffn: int, act: str, target: Target) -> None:
    """An encoder or decoder layer's last block: final_layer_norm, then fc2(act(fc1(·))) added to the stream."""
    with g.scope("final_layer_norm"):
        h = stream.norm(w("final_layer_norm.weight", d), w("final_layer_norm.bias", d))
    stream.add(plain_mlp(g, h, w("fc1.weight", ffn, d), w("fc2.weight", d, ffn), act, target,
                         (w("fc1.bias", ffn), w("fc2.bias", d)), names=("fc1", "fc2")))


def convolutions(g: Graph, features: ir.Value, e: Weights, c: WhisperConfig, target: Target) -> ir.Value:
    """conv1 (kernel 3, padding 1) and conv2 (kernel 3, stride 2, padding 1), each followed by GELU,
    then the positional table: (B, mels, 3000) -> (B, 1500, d)."""
    d, dtype = c.d_model, target.io_dtype
    conv = op_dtype(dtype)
    x = to_dtype(g, features, dtype, conv)
    for name, inputs, stride in (("conv1", c.num_mel_bins, 1), ("conv2", d, 2)):
        with g.scope(name):
            weight = g.weight("weight", e(f"{name}.weight", d, inputs, 3).astype(conv))
            bias = g.weight("bias", e(f"{name}.bias", d).astype(conv))
            x = g.op.Gelu(g.op.Conv(x, weight, bias, kernel_shape=[3], pads=[1, 1], strides=[stride]))
    x = g.op.Transpose(to_dtype(g, x, conv, dtype), perm=[0, 2, 1])  # (B, d, 1500) -> (B, 1500, d)
    with g.scope("embed_positions"):
        positions = g.weight("weight", e("embed_positions.weight", c.max_source_positions, d).astype(dtype))
    return g.op.Add(x, positions)


def cross_keys_values(g: Graph, hidden: ir.Value, ckpt: Checkpoint, c: WhisperConfig,
                      target: Target) -> list[tuple[ir.Value, ir.Value]]:
    """Each decoder layer's encoder_attn k_proj and v_proj of the encoder's output, in heads:
    (B, 1500, d) -> (B, heads, 1500, head_dim), named as genai's cross cache."""
    presents = []
    for i in range(c.decoder_layers):
        a = Weights(ckpt, f"model.decoder.layers.{i}.encoder_attn.")
        with g.scope("model", "decoder", f"layers.{i}", "encoder_attn"):
            k = projection(g, hidden, a, "k_proj", c.d_model, target, bias=False)
            v = projection(g, hidden, a, "v_proj", c.d_model, target)
        pair = []
        for value, pattern in ((k, CROSS_KEY), (v, CROSS_VALUE)):
            value = split_heads(g, value, c.decoder_attention_heads, c.head_dim)
            value.name, value.type = pattern % i, tensor_type(target.io_dtype)
            value.shape = ir.Shape((BATCH, c.decoder_attention_heads, c.max_source_positions, c.head_dim))
            pair.append(value)
        presents.append(tuple(pair))
    return presents


def encoder_model(ckpt: Checkpoint, c: WhisperConfig, target: Target, g: Graph | None = None) -> ir.Model:
    """The encoder model, in the target's IO dtype and never quantized (a quantized target's
    quantization is ignored here); recorded on `g`."""
    target = Target(io_dtype=target.io_dtype, execution_provider=target.execution_provider)
    g = g or Graph()
    d, dtype = c.d_model, tensor_type(target.io_dtype)
    features = ir.Value(name=AUDIO_FEATURES, type=dtype, shape=ir.Shape((BATCH, c.num_mel_bins, FRAMES)))
    e = Weights(ckpt, "model.encoder.")
    with g.scope("model", "encoder"):
        x = convolutions(g, features, e, c, target)
    # fp16 builds keep the residual stream and its norms in float32, as the decoders here do.
    residual = np.float32 if target.io_dtype == np.float16 else None
    stream = ResidualStream(g, x, LAYER_NORM_EPS, target, residual, layer_norm=True)
    for i in range(c.encoder_layers):
        with g.scope("model", "encoder", f"layers.{i}"):
            encoder_layer(g, stream, e.under(f"layers.{i}."), c, target)
    with g.scope("model", "encoder", "layer_norm"):
        hidden = stream.norm(e("layer_norm.weight", d), e("layer_norm.bias", d))  # (B, 1500, d)
    hidden.name, hidden.type = ENCODER_HIDDEN_STATES, dtype
    hidden.shape = ir.Shape((BATCH, c.max_source_positions, d))
    cross = cross_keys_values(g, hidden, ckpt, c, target)
    return g.model([features], [hidden, *(v for pair in cross for v in pair)])

