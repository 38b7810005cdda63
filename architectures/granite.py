"""IBM Granite 3 (GraniteForCausalLM) and Granite MoE (GraniteMoeForCausalLM): Llama's decoder with
four scalar multipliers.

Reference: transformers/models/granite{,moe}/modeling_granite{,moe}.py. Apart from Llama:
- the embeddings are multiplied by `embedding_multiplier`;
- each branch joins the residual scaled: x + h · `residual_multiplier`;
- the attention scale is `attention_multiplier` (not 1/√head_dim);
- the logits are divided by `logits_scaling`.
Granite MoE's MLP is Mixtral's sparse block (`block_sparse_moe`): softmax over the top-k router
logits, which is ONNX Runtime's MoE router exactly (builder/blocks/moe.py); its checkpoints stack
the experts (`input_linear` [E, 2I, H], gate rows then up rows; `output_linear` [E, H, I]).
Scales on activations stay in the graph (the weights are written as they are, so quantization
rounds the checkpoint's own values).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from architectures.moe import dense_mlp, pre_norm_layer
from builder.architecture import Weights, attention_weights
from builder.blocks import AttentionSpec, sparse_moe
from builder.blocks.moe import unstacked
from builder.decoder_config import DecoderConfig
from builder.family import Decoder, Family, register
from builder.io import logits_dtype

VARIANTS: dict[str, dict[str, Any]] = {"GraniteForCausalLM": {}, "GraniteMoeForCausalLM": dict(model_type="granitemoe")}

# What the modeling files fix: no sliding window; Granite MoE's experts. genai 0.18 has no
# "granitemoe"; "granite" is the same decoder contract (a plain KV-cache decoder).
STRUCTURE: dict[str, dict[str, Any]] = {
    "GraniteForCausalLM": dict(sliding_window=None),
    "GraniteMoeForCausalLM": dict(model_type="granite", moe=True, sliding_window=None),
}


@dataclass(frozen=True)
class GraniteConfig(DecoderConfig):
    """config.json of GraniteForCausalLM and GraniteMoeForCausalLM: the shared decoder keys and the
    four multipliers (`head_dim` is not a GraniteConfig key, but read when config.json has it)."""

    model_type: str = "granite"
    mlp_bias: bool = False
    embedding_multiplier: float = 1.0
    logits_scaling: float = 1.0
    residual_multiplier: float = 1.0
    attention_multiplier: float = 1.0
    num_local_experts: int = 8  # GraniteMoeConfig's
    num_experts_per_tok: int = 2
    moe: bool = False  # the modeling file's: a sparse block of experts in place of the MLP


def mlp(d: Decoder, h, w: Weights):
    """GraniteMLP.forward, or GraniteMoeMoE.forward (softmax over the top-k router logits)."""
    c = d.c
    H, I = c.hidden_size, c.intermediate_size
    if not c.moe:
        return dense_mlp(d, h, w.under("mlp."), I, c.mlp_bias)
    m, E = w.under("block_sparse_moe."), c.num_local_experts
    fused = m("input_linear.weight", E, 2 * I, H)  # (E, 2I, H): chunk(2) gives gate, then up
    return sparse_moe(d.g, h, m("router.layer.weight", E, H), unstacked(fused, 0, I), unstacked(fused, I),
                      unstacked(m("output_linear.weight", E, H, I)), c.num_experts_per_tok, True, c.hidden_act,
                      d.target, router_name="router")


def decoder_layer(d: Decoder, w: Weights, i: int):
    """GraniteDecoderLayer/GraniteMoeDecoderLayer.forward: x + attn(norm(x)) · m, then x + mlp(norm(x)) · m,
    with m the residual_multiplier; returns the layer's KV."""
    g, c = d.g, d.c
    def scaled(h):
        return h if c.residual_multiplier == 1 else g.op.Mul(h, g.constant(c.residual_multiplier, d.target.io_dtype))

    attention = attention_weights(w.under("self_attn."), c, c.attention_bias, c.attention_bias)
    spec = AttentionSpec(c.num_attention_heads, c.num_key_value_heads, c.head_dim, scale=c.attention_multiplier)
    return pre_norm_layer(d, w, i, attention, spec, lambda h: mlp(d, h, w),
                          "block_sparse_moe" if c.moe else "mlp", branch=scaled)


def embed(d: Decoder):
    """The embeddings times `embedding_multiplier`."""
    multiplier = d.c.embedding_multiplier
    return d.vocab.embed(d.g, d.io.input_ids, scale=multiplier if multiplier != 1 else None)


def logits(d: Decoder, h):
    """GraniteForCausalLM: lm_head(h) / logits_scaling."""
    logits = d.vocab.logits(d.g, h)
    if d.c.logits_scaling != 1:
        with d.g.scope("lm_head"):
            logits = d.g.op.Div(logits, d.g.constant(d.c.logits_scaling, logits_dtype(d.target.io_dtype)))
    return logits


FAMILY = register(Family(
    "granite", GraniteConfig, decoder_layer, VARIANTS, structure=STRUCTURE, embed=embed, logits=logits,
    
    ignored=("model.layers.*.self_attn.rotary_emb.inv_freq",),
))

__all__ = ["FAMILY", "STRUCTURE", "VARIANTS", "GraniteConfig", "decoder_layer"]
