"""Qwen3.5's text decoder: gated DeltaNet linear-attention layers interleaved with gated full attention.

Reference: transformers/models/qwen3_5/modeling_qwen3_5.py. `layer_types` (default: every
`full_attention_interval`-th layer attends) says which layers are "linear_attention"
(Qwen3_5GatedDeltaNet: in_proj_qkv -> a depthwise causal conv of linear_conv_kernel_dim taps and
silu -> q, k, v; the gated delta rule (builder.blocks.gated_deltanet) with β = sigmoid(in_proj_b)
and g = −exp(A_log)·softplus(in_proj_a + dt_bias); a per-head RMSNorm gated by silu(in_proj_z);
out_proj) and which "full_attention" (Qwen3_5Attention: q_proj gives each head's query and its
output gate, q/k RMSNorm, partial rotary; builder.blocks.gated_attention). Every RMSNorm but the
DeltaNet's gated one scales by (1 + weight). Text-only positions make the three M-RoPE streams
equal, so the rotary is the ordinary one over the first partial_rotary_factor of the head.

State contract (onnxruntime-genai 0.18's, from its builder's builders/qwen.py Qwen35TextModel and
base.py): attention layers past_key_values.%d.key/value and present.%d.key/value; linear-attention
layers past.%d.conv / present.%d.conv, (batch, 2·key_dim + value_dim, linear_conv_kernel_dim − 1),
and past.%d.recurrent / present.%d.recurrent, (batch, value_heads, key_head_dim, value_head_dim),
both in the activation dtype; genai_config.json declares past/present_conv_names and
past/present_recurrent_names beside the KV names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from builder.architecture import Weights, prefix_holding
from builder.blocks import AttentionSpec, AttentionWeights, gated_mlp
from builder.blocks.float_ops import in_op_dtype
from builder.blocks.gated_attention import gated_self_attention, split_query_gate
from builder.blocks.gated_deltanet import DeltaHeads, gated_delta_rule
from builder.blocks.linear import linear
from builder.blocks.mlp import activation
from builder.blocks.norm import rms_norm
from builder.blocks.short_conv import causal_conv
from builder.decoder_config import DecoderConfig
from builder.draft_head import DraftHead, full_attention_layer
from builder.state import Conv, LayerState, Recurrent
from builder.family import Decoder, Family, conv_padding, parse, register
from builder.hf_config import text_config
from builder.inputs.source import Checkpoint

# Qwen3_5TextConfig's defaults where they differ from the shared ones.
VARIANTS: dict[str, dict[str, Any]] = {
    "Qwen3_5ForCausalLM": dict(
        model_type="qwen3_5_text", vocab_size=248320, hidden_size=4096, intermediate_size=12288,
        num_hidden_layers=32, num_attention_heads=16, num_key_value_heads=4, head_dim=256,
        max_position_embeddings=32768, bos_token_id=None, eos_token_id=None, partial_rotary_factor=0.25,
    ),
}
# Every hub checkpoint is the multimodal class: its text decoder is built from model.language_model.*
# with config.json's text_config (the vision tower is not part of the text build).
VARIANTS["Qwen3_5ForConditionalGeneration"] = VARIANTS["Qwen3_5ForCausalLM"]
TEXT_CONFIG = {"Qwen3_5ForConditionalGeneration": "text_config"}
LINEAR, ATTENTION = "linear_attention", "full_attention"


@dataclass(frozen=True)
class Qwen3_5Config(DecoderConfig):
    """config.json of Qwen3.5's text decoder: the shared decoder keys and the DeltaNet's."""

    LAYER_TYPES: ClassVar[tuple[str, ...]] = (LINEAR, ATTENTION)

    linear_conv_kernel_dim: int = 4
    linear_key_head_dim: int = 128
    linear_value_head_dim: int = 128
    linear_num_key_heads: int = 16
    linear_num_value_heads: int = 32
    full_attention_interval: int = 4

    def __post_init__(self) -> None:
        if self.linear_conv_kernel_dim < 2:
            raise ValueError(f"linear_conv_kernel_dim {self.linear_conv_kernel_dim}: the convolution needs 2 taps")
        if self.linear_num_value_heads % self.linear_num_key_heads:
            raise ValueError(f"linear_num_value_heads ({self.linear_num_value_heads}) is not a multiple of "
                             f"linear_num_key_heads ({self.linear_num_key_heads})")
        super().__post_init__()

    def default_layer_types(self) -> list[str]:
        """Qwen3_5TextConfig's rule: every full_attention_interval-th layer attends, the others are linear."""
        every = self.full_attention_interval
        return [ATTENTION if (i + 1) % every == 0 else LINEAR for i in range(self.num_hidden_layers)]

    @property
    def heads(self) -> DeltaHeads:
        return DeltaHeads(self.linear_num_key_heads, self.linear_num_value_heads, self.linear_key_head_dim,
                          self.linear_value_head_dim)

    @property
    def conv_layers(self) -> list[int]:
        """The linear-attention layers: each carries a conv state and a recurrent state, no KV."""
        return [i for i, kind in enumerate(self.layer_types) if kind == LINEAR]

    @property
    def conv_dim(self) -> int:
        h = self.heads
        return 2 * h.key_heads * h.key_dim + h.value_heads * h.value_dim

    def layer_state(self, layer: int) -> LayerState:
        """A linear-attention layer carries its conv's last inputs and the DeltaNet's state
        (value heads, key_dim, value_dim), no KV."""
        if self.layer_types[layer] != LINEAR:
            return super().layer_state(layer)
        h = self.heads
        return LayerState(conv=Conv(self.conv_dim, self.linear_conv_kernel_dim - 1),
                          recurrent=Recurrent((h.value_heads, h.key_dim, h.value_dim)), kind=LINEAR)


class Qwen3_5Weights(Weights):
    """Weights of a Qwen3.5 module; `norm` folds the (1 + weight) RMSNorm scale into the weight."""

    def norm(self, name: str, size: int):
        return self(name, size).map(lambda x: x.astype(np.float32) + 1, np.float32)


def gated_deltanet(d: Decoder, w: Qwen3_5Weights, i: int, h):
    """Qwen3_5GatedDeltaNet.forward; returns (output, present conv state, present recurrent state)."""
    g, c, target = d.g, d.c, d.target
    H, heads, dtype = c.hidden_size, c.heads, target.io_dtype
    key_dim, value_dim = heads.key_heads * heads.key_dim, heads.value_heads * heads.value_dim
    Hv = heads.value_heads
    with g.scope("in_proj_qkv"):
        mixed = linear(g, h, w("in_proj_qkv.weight", c.conv_dim, H), target)
    with g.scope("in_proj_z"):
        z = linear(g, h, w("in_proj_z.weight", value_dim, H), target)
    # The small per-head projections stay float in every precision (quantizing them moves the logits).
    with g.scope("in_proj_b"):
        b = g.op.MatMul(h, g.weight("weight", w("in_proj_b.weight", Hv, H).transpose().astype(dtype)))
    with g.scope("in_proj_a"):
        a = g.op.MatMul(h, g.weight("weight", w("in_proj_a.weight", Hv, H).transpose().astype(dtype)))
    kernel = w("conv1d.weight", c.conv_dim, 1, c.linear_conv_kernel_dim)
    mixed, present_conv = causal_conv(g, mixed, d.io.conv[i], kernel, None, d.prepared, target)
    mixed = activation(g, mixed, c.hidden_act)
    q, k, v = g.op.Split(mixed, g.constant([key_dim, key_dim, value_dim], "int64"), axis=-1, _outputs=3)
    q = g.op.Reshape(q, g.constant([0, 0, heads.key_heads, heads.key_dim], "int64"))
    k = g.op.Reshape(k, g.constant([0, 0, heads.key_heads, heads.key_dim], "int64"))
    v = g.op.Reshape(v, g.constant([0, 0, Hv, heads.value_dim], "int64"))
    beta = g.op.Sigmoid(b)
    neg_a = g.weight("neg_exp_A_log", w("A_log", Hv).map(lambda x: -np.exp(x.astype(np.float32)), np.float32)
                     .astype(dtype))
    shifted = g.op.Add(a, g.weight("dt_bias", w("dt_bias", Hv).astype(dtype)))
    decay = g.op.Mul(neg_a, in_op_dtype(g, shifted, dtype, g.op.Softplus))
    # ONNX Runtime's LinearAttention on CPU (measured 8× the Scan's speed); the standard-op Scan elsewhere.
    out, present_state = gated_delta_rule(g, q, k, v, decay, beta, d.prepared.keep, d.io.recurrent[i], heads, dtype,
                                          fused=target.provider.linear_attention)
    with g.scope("norm"):  # Qwen3_5RMSNormGated: weight · RMSNorm(out) · silu(z), per value head
        z = g.op.Reshape(z, g.constant([0, 0, Hv, heads.value_dim], "int64"))
        out = g.op.Mul(rms_norm(g, out, w("norm.weight", heads.value_dim), c.rms_norm_eps, target),
                       activation(g, z, "silu"))
        out = g.op.Reshape(out, g.constant([0, 0, value_dim], "int64"))
    with g.scope("out_proj"):
        out = linear(g, out, w("out_proj.weight", H, value_dim), target)
    return out, present_conv, present_state


def attention(d: Decoder, a: Qwen3_5Weights, i: int, h):
    """Qwen3_5Attention.forward: GQA with (1 + weight) q/k RMSNorm, partial rotary and a sigmoid output gate."""
    c = d.c
    H, D, heads = c.hidden_size, c.head_dim, c.num_attention_heads
    query, gate = split_query_gate(a("q_proj.weight", 2 * heads * D, H), heads, D)
    kv_dim = c.num_key_value_heads * D
    weights = AttentionWeights(
        q=query, k=a("k_proj.weight", kv_dim, H), v=a("v_proj.weight", kv_dim, H), o=a("o_proj.weight", H, heads * D),
        q_norm=a.norm("q_norm.weight", D), k_norm=a.norm("k_norm.weight", D),
    )
    spec = AttentionSpec(heads, c.num_key_value_heads, D, norm_eps=c.rms_norm_eps)
    out, key, value = gated_self_attention(d.g, h, d.past(i), d.lengths, d.rotary, weights, gate, spec, d.target)
    return out, (key, value)


def decoder_layer(d: Decoder, w: Qwen3_5Weights, i: int):
    """Qwen3_5DecoderLayer.forward; returns the layer's present state: (key, value), or (conv, recurrent)."""
    g, c = d.g, d.c
    H, I = c.hidden_size, c.intermediate_size
    with g.scope("input_layernorm"):
        h = d.stream.norm(w.norm("input_layernorm.weight", H))
    if c.layer_types[i] == LINEAR:
        with g.scope("linear_attn"):
            h, conv, recurrent = gated_deltanet(d, w.under("linear_attn."), i, h)
        state = (conv, recurrent)
    else:
        with g.scope("self_attn"):
            h, state = attention(d, w.under("self_attn."), i, h)
    d.stream.add(h)
    with g.scope("post_attention_layernorm"):
        h = d.stream.norm(w.norm("post_attention_layernorm.weight", H))
    m = w.under("mlp.")
    with g.scope("mlp"):
        d.stream.add(gated_mlp(g, h, m("gate_proj.weight", I, H), m("up_proj.weight", I, H),
                               m("down_proj.weight", H, I), c.hidden_act, d.target))
    return state


def parse_config(family: Family, raw: dict[str, Any], architecture: str) -> Qwen3_5Config:
    """The config of `architecture`: config.json's, or a multimodal one's `text_config`."""
    if architecture in TEXT_CONFIG:
        raw = {**text_config(raw, TEXT_CONFIG[architecture]), "architectures": [architecture]}
    return parse(family, raw, architecture)


def decoder_prefix(ckpt: Checkpoint) -> str:
    """Where the decoder's tensors are: model.* (Qwen3_5ForCausalLM) or model.language_model.*
    (Qwen3_5ForConditionalGeneration)."""
    return prefix_holding(ckpt, "embed_tokens.weight", ("model.", "model.language_model."))


def final_norm(d: Decoder):
    """model.norm, its (1 + weight) scale folded."""
    with d.g.scope("model", "norm"):
        return d.stream.norm(Qwen3_5Weights(d.ckpt, d.prefix).norm("norm.weight", d.c.hidden_size))



FAMILY = register(Family(
    "qwen3_5", Qwen3_5Config, decoder_layer, VARIANTS, parser=parse_config, prepare=conv_padding, partial_rotary=True,
    final_norm=final_norm, weights=Qwen3_5Weights,
    prefix=lambda d: decoder_prefix(d.ckpt),
    # transformers skips these too: the multi-token-prediction head (built as mtp.onnx unless --no-mtp)
    # and (text build) the vision tower.
    ignored=("mtp.*", "model.visual.*"),
    mtp=DraftHead(layer_config=full_attention_layer, norm=Qwen3_5Weights.norm),
))

__all__ = ["FAMILY", "VARIANTS", "Qwen3_5Config", "decoder_layer"]
