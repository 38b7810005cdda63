"""The decoder stack every supported family shares: embeddings → N × (norm, attention, norm, MLP) →
final norm, with the residual stream carried through ONNX Runtime's fused skip-norms.

Pre-norm layers (Llama, Mistral, Qwen, Phi-3, Gemma 1):
    h = attn(norm₁(x)); x = x + h; h = mlp(norm₂(x)); x = x + h
Sandwich layers (Gemma 2/3) also normalize each branch before it joins the residual:
    h = norm₂(attn(norm₁(x))); x = x + h; h = norm₄(mlp(norm₃(x))); x = x + h
Each `x + h` is fused into the SkipSimplifiedLayerNormalization of the norm that follows it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import onnx_ir as ir

from builder.blocks.attention import (
    AttentionSpec,
    AttentionWeights,
    SequenceLengths,
    self_attention,
)
from builder.blocks.mlp import gated_mlp
from builder.blocks.norm import rms_norm, skip_rms_norm
from builder.graph import Graph
from builder.io import DecoderIO
from builder.lazy import Weight
from builder.target import Target


@dataclass(frozen=True)
class DecoderLayer:
    """One layer's weights (Hugging Face [out, in] layout) and attention settings.

    With `pre_feedforward_norm` set the layer is a sandwich: `post_attention_norm` then normalizes
    the attention output, `pre_feedforward_norm` the MLP input, `post_feedforward_norm` its output.
    """

    input_norm: Weight
    attention: AttentionWeights
    spec: AttentionSpec
    rotary: tuple[ir.Value, ir.Value]
    post_attention_norm: Weight
    gate: Weight
    up: Weight
    down: Weight
    activation: str
    pre_feedforward_norm: Weight | None = None
    post_feedforward_norm: Weight | None = None
    mlp_biases: tuple[Weight, Weight, Weight] | None = None  # gate, up, down


def decoder_stack(
    g: Graph, x: ir.Value, layers: Iterable[DecoderLayer], final_norm: Weight,
    io: DecoderIO, lengths: SequenceLengths, eps: float, target: Target,
) -> tuple[ir.Value, list[tuple[ir.Value, ir.Value]]]:
    """Runs the layers on the embeddings `x`; returns (final normalized hidden states, presents)."""
    residual, branch, presents = x, None, []
    for i, layer in enumerate(layers):
        with g.scope("model", f"layers.{i}"):
            with g.scope("input_layernorm"):
                if branch is None:
                    h = rms_norm(g, x, layer.input_norm, eps, target)
                else:
                    h, residual = skip_rms_norm(g, branch, residual, layer.input_norm, eps, target)
            with g.scope("self_attn"):
                attn, key, value = self_attention(g, h, io.past[i], lengths, layer.rotary, layer.attention, layer.spec, target)
            presents.append((key, value))
            if layer.pre_feedforward_norm is not None:
                with g.scope("post_attention_layernorm"):
                    attn = rms_norm(g, attn, layer.post_attention_norm, eps, target)
                with g.scope("pre_feedforward_layernorm"):
                    h, residual = skip_rms_norm(g, attn, residual, layer.pre_feedforward_norm, eps, target)
            else:
                with g.scope("post_attention_layernorm"):
                    h, residual = skip_rms_norm(g, attn, residual, layer.post_attention_norm, eps, target)
            with g.scope("mlp"):
                branch = gated_mlp(g, h, layer.gate, layer.up, layer.down, layer.activation, target, layer.mlp_biases)
            if layer.post_feedforward_norm is not None:
                with g.scope("post_feedforward_layernorm"):
                    branch = rms_norm(g, branch, layer.post_feedforward_norm, eps, target)
    with g.scope("model", "norm"):
        h, _ = skip_rms_norm(g, branch, residual, final_norm, eps, target)
    return h, presents
