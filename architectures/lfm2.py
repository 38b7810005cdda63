"""LFM2 (Liquid AI): short gated convolutions interleaved with GQA attention layers.

Reference: transformers/models/lfm2/modeling_lfm2.py. `layer_types` (or `full_attn_idxs`) says
which layers attend ("full_attention": q/k RMSNorm, rotary) and which convolve ("conv":
in_proj -> B, C, x; C · conv(B · x) -> out_proj, a depthwise causal conv of `conv_L_cache` taps
carrying the last conv_L_cache−1 inputs). Each layer is operator_norm -> attention or conv ->
residual, then ffn_norm -> SwiGLU (w1, w3, w2) -> residual; the final norm is `embedding_norm`.

State contract (onnxruntime-genai 0.18's, from its builder's builders/lfm2.py and base.py):
attention layers have past_key_values.%d.key/value and present.%d.key/value; conv layers only
past.%d.conv / present.%d.conv, (batch, hidden_size, conv_L_cache−1) in the activation dtype;
genai_config.json's decoder lists `layer_types` and `conv_cache_size` (builder/genai_config.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from builder.architecture import Weights
from builder.blocks import AttentionSpec, AttentionWeights, gated_mlp, self_attention
from builder.blocks.linear import linear
from builder.blocks.short_conv import causal_conv
from builder.decoder_config import DecoderConfig
from builder.family import Decoder, Family, conv_padding, register
from builder.state import Conv, LayerState

VARIANTS: dict[str, dict[str, Any]] = {
    "Lfm2ForCausalLM": dict(
        model_type="lfm2", vocab_size=65536, hidden_size=2560, intermediate_size=12288, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=128_000, pad_token_id=0,
        bos_token_id=1, eos_token_id=2, tie_word_embeddings=True, default_theta=1_000_000.0,
    ),
}
CONV, ATTENTION = "conv", "full_attention"


@dataclass(frozen=True)
class Lfm2Config(DecoderConfig):
    """config.json of LFM2: the shared decoder keys and LFM2's own (Lfm2Config's defaults)."""

    LAYER_TYPES: ClassVar[tuple[str, ...]] = (ATTENTION, CONV)  # what config.json's layer_types may name

    norm_eps: float = 1e-5
    conv_bias: bool = False
    conv_L_cache: int = 3
    block_multiple_of: int = 256
    block_ffn_dim_multiplier: float | None = 1.0
    block_auto_adjust_ff_dim: bool = True
    full_attn_idxs: list[int] | None = None
    # Older spellings Lfm2Config still reads: they win over tie_word_embeddings / intermediate_size.
    tie_embedding: bool | None = None
    block_ff_dim: int | None = None

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        if self.tie_embedding is not None:
            set_(self, "tie_word_embeddings", self.tie_embedding)
        if self.block_ff_dim is not None:
            set_(self, "intermediate_size", self.block_ff_dim)
        set_(self, "rms_norm_eps", self.norm_eps)
        if self.conv_L_cache < 2:
            raise ValueError(f"conv_L_cache {self.conv_L_cache}: the convolution needs at least 2 taps")
        super().__post_init__()

    def default_layer_types(self) -> list[str]:
        """Lfm2Config's rule: the layers full_attn_idxs names attend (every layer without it), the others convolve."""
        attending = range(self.num_hidden_layers) if self.full_attn_idxs is None else set(self.full_attn_idxs)
        return [ATTENTION if i in attending else CONV for i in range(self.num_hidden_layers)]

    @property
    def feed_forward_size(self) -> int:
        """Lfm2MLP's width: intermediate_size, or with block_auto_adjust_ff_dim two thirds of it times
        block_ffn_dim_multiplier, rounded up to a multiple of block_multiple_of."""
        size = self.intermediate_size
        if self.block_auto_adjust_ff_dim:
            size = int(2 * size / 3)
            if self.block_ffn_dim_multiplier is not None:
                size = int(self.block_ffn_dim_multiplier * size)
                size = self.block_multiple_of * ((size + self.block_multiple_of - 1) // self.block_multiple_of)
        return size

    @property
    def conv_layers(self) -> list[int]:
        return [i for i, kind in enumerate(self.layer_types) if kind == CONV]

    def layer_state(self, layer: int) -> LayerState:
        """A conv layer carries its last conv_L_cache − 1 inputs (hidden_size channels), no KV."""
        if self.layer_types[layer] == CONV:
            return LayerState(conv=Conv(self.hidden_size, self.conv_L_cache - 1), kind=CONV)
        return super().layer_state(layer)


def short_conv(d: Decoder, w: Weights, i: int, h):
    """Lfm2ShortConv.forward: B, C, x = in_proj(h); out_proj(C · conv(B · x)), the conv carrying its state."""
    g, c = d.g, d.c
    H = c.hidden_size
    with g.scope("in_proj"):
        bcx = linear(g, h, w("in_proj.weight", 3 * H, H), d.target, w("in_proj.bias", 3 * H) if c.conv_bias else None)
    b, gate, x = g.op.Split(bcx, g.constant([H, H, H], "int64"), axis=-1, _outputs=3)
    conv_bias = w("conv.bias", H) if c.conv_bias else None
    y, present = causal_conv(g, g.op.Mul(b, x), d.io.conv[i], w("conv.weight", H, 1, c.conv_L_cache), conv_bias,
                             d.prepared, d.target)
    with g.scope("out_proj"):
        out_bias = w("out_proj.bias", H) if c.conv_bias else None
        y = linear(g, g.op.Mul(gate, y), w("out_proj.weight", H, H), d.target, out_bias)
    return y, present


def attention(d: Decoder, a: Weights, i: int, h):
    """Lfm2Attention.forward: GQA with per-head q/k RMSNorm (q_layernorm, k_layernorm) before the rotary."""
    c = d.c
    H, D = c.hidden_size, c.head_dim
    q_dim, kv_dim = c.num_attention_heads * D, c.num_key_value_heads * D
    weights = AttentionWeights(
        q=a("q_proj.weight", q_dim, H), k=a("k_proj.weight", kv_dim, H), v=a("v_proj.weight", kv_dim, H),
        o=a("out_proj.weight", H, q_dim), q_norm=a("q_layernorm.weight", D), k_norm=a("k_layernorm.weight", D),
    )
    spec = AttentionSpec(c.num_attention_heads, c.num_key_value_heads, D, norm_eps=c.norm_eps)
    out, key, value = self_attention(d.g, h, d.past(i), d.lengths, d.rotary, weights, spec, d.target)
    return out, (key, value)


def dense_feed_forward(d: Decoder, f: Weights, i: int, h):
    """Lfm2MLP.forward: SwiGLU w2(silu(w1(h)) · w3(h)) of width feed_forward_size."""
    H, I = d.c.hidden_size, d.c.feed_forward_size
    return gated_mlp(d.g, h, f("w1.weight", I, H), f("w3.weight", I, H), f("w2.weight", H, I), "silu", d.target)


def decoder_layer(d: Decoder, w: Weights, i: int, feed_forward=dense_feed_forward, attend=None,
                  sandwich: bool = False):
    """Lfm2DecoderLayer.forward; returns the layer's present state: (key, value), or (conv state,).
    `feed_forward(d, weights under feed_forward., i, h)`: the MLP (LFM2-MoE's sparse block);
    `attend(d, weights under self_attn., i, h)`: the attention (LFM3's); `sandwich`: each branch
    normed (post_operator_norm, post_ffn_norm) before it joins the residual (LFM3's)."""
    g, c = d.g, d.c
    H = c.hidden_size

    def add(h, norm: str) -> None:
        if not sandwich:
            d.stream.add(h)
            return
        with g.scope(norm):
            d.stream.add(h, w(f"{norm}.weight", H))

    with g.scope("operator_norm"):
        h = d.stream.norm(w("operator_norm.weight", H))
    if c.layer_types[i] == CONV:
        with g.scope("conv"):
            h, conv_state = short_conv(d, w.under("conv."), i, h)
        state = (conv_state,)
    else:
        with g.scope("self_attn"):
            h, state = (attend or attention)(d, w.under("self_attn."), i, h)
    add(h, "post_operator_norm")
    with g.scope("ffn_norm"):
        h = d.stream.norm(w("ffn_norm.weight", H))
    with g.scope("feed_forward"):
        h = feed_forward(d, w.under("feed_forward."), i, h)
        if not sandwich:
            d.stream.add(h)
    if sandwich:
        add(h, "post_ffn_norm")
    return state


def final_norm(d: Decoder):
    """model.embedding_norm: LFM2's name for the norm after the last layer."""
    with d.g.scope("model", "embedding_norm"):
        return d.stream.norm(d.ckpt.weight("model.embedding_norm.weight", (d.c.hidden_size,)))



FAMILY = register(Family("lfm2", Lfm2Config, decoder_layer, VARIANTS, prepare=conv_padding, final_norm=final_norm))

__all__ = ["FAMILY", "VARIANTS", "Lfm2Config", "decoder_layer", "dense_feed_forward"]
