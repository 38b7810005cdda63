"""MiniMax-M2 (MiniMaxM2ForCausalLM): Mixtral's layer with whole-projection q/k norms, a partial
rotary and a sigmoid router with a correction bias.

Reference: transformers/models/minimax_m2/modular_minimax_m2.py. Apart from Mixtral
(architectures/moe.py: its pre-norm layer, imported):
- q_norm/k_norm: RMSNorms over the whole q and k projections, all heads at once, before the
  rotary (FlexOlmoAttention's, OLMoE's); no biases; `head_dim` its own key (128); no sliding window;
- a partial rotary on the first dims of each head, in rotate_half halves: the hub's configs say
  `rotary_dim`, which MiniMaxM2Config turns into partial_rotary_factor = rotary_dim / head_dim
  where config.json gives no factor;
- the router (MiniMaxM2TopKRouter, in float32): s = sigmoid(x · gateᵀ); the experts are the top k
  of s + e_score_correction_bias (a buffer of the sparse block, not of the gate), weighted by s
  renormalized over them: GLM-4.5's router with one group, normalized, unscaled
  (builder/blocks/moe.py grouped_sigmoid_router), feeding ONNX Runtime's MoE/QMoE (routed_experts)
  with Mixtral's experts (`w1` gate, `w3` up, `w2` down); every layer sparse, no shared expert.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from architectures.moe import pre_norm_layer
from builder.architecture import Weights, attention_weights
from builder.blocks import AttentionSpec
from builder.blocks.moe import grouped_sigmoid_router, routed_experts
from builder.config_checks import config_value, rope_sources
from builder.decoder_config import DecoderConfig
from builder.errors import BuildError
from builder.family import Decoder, Family, parse, register

# MiniMaxM2Config's defaults where they differ from the shared ones (builder/decoder_config.py).
VARIANTS: dict[str, dict[str, Any]] = {
    "MiniMaxM2ForCausalLM": dict(model_type="minimax_m2", vocab_size=200064, hidden_size=3072, intermediate_size=1536,
                                 num_hidden_layers=62, num_attention_heads=48, num_key_value_heads=8, head_dim=128,
                                 max_position_embeddings=196608, bos_token_id=200034, eos_token_id=200020,
                                 default_theta=5_000_000.0),
}

# onnxruntime-genai 0.18 knows no minimax_m2; "mistral" is Mixtral's type there (a plain decoder:
# Llama's inputs, outputs and KV cache). The modeling file has no window, whatever config.json says.
STRUCTURE: dict[str, dict[str, Any]] = {
    "MiniMaxM2ForCausalLM": dict(model_type="mistral", sliding_window=None, layer_types=None),
}


@dataclass(frozen=True)
class MiniMaxM2Config(DecoderConfig):
    """config.json of MiniMaxM2ForCausalLM: the shared decoder keys (head_dim and the KV heads
    integers, as MiniMaxM2Config types them) and the experts'."""

    num_key_value_heads: int = 8
    head_dim: int = 128
    num_local_experts: int = 256
    num_experts_per_tok: int = 8
    num_mtp_modules: int = 0  # the hub's config.json (its remote code's key); transformers ignores it

    def __post_init__(self) -> None:
        if self.hidden_act != "silu":
            raise ValueError(f"hidden_act {self.hidden_act!r}: the experts run as SwiGLU (silu) only")
        if self.num_experts_per_tok > self.num_local_experts:  # transformers' topk fails
            raise ValueError(f"num_experts_per_tok={self.num_experts_per_tok} of {self.num_local_experts} experts")
        super().__post_init__()


def parse_config(family: Family, raw: dict[str, Any], architecture: str) -> MiniMaxM2Config:
    """The shared parse, with MiniMaxM2Config.convert_rope_params_to_dict's reading of `rotary_dim`:
    partial_rotary_factor rotary_dim / head_dim where neither config.json nor its rotary settings
    give a factor (a null one included)."""
    scaling, given = rope_sources(raw)
    rotary_dim = config_value("rotary_dim", raw.get("rotary_dim"), float | None)
    if rotary_dim is not None and "partial_rotary_factor" not in {**raw, **(scaling or given)}:
        head_dim = config_value("head_dim", raw.get("head_dim", family.variants[architecture]["head_dim"]), int)
        if not 0 < rotary_dim <= head_dim:  # transformers rotates nothing at 0, fails past the head
            raise BuildError(f"config.json: rotary_dim is {rotary_dim}; expected a positive number up to "
                             f"head_dim ({head_dim})")
        raw = dict(raw, partial_rotary_factor=rotary_dim / head_dim)
    return parse(family, raw, architecture)


def sparse_moe_block(d: Decoder, h, m: Weights):
    """MiniMaxM2SparseMoeBlock.forward: the router (`gate` and the block's correction bias), then
    the chosen experts, weighted."""
    g, c = d.g, d.c
    H, I, E, k = c.hidden_size, c.intermediate_size, c.num_local_experts, c.num_experts_per_tok
    with g.scope("gate"):
        logits, index, weight = grouped_sigmoid_router(g, h, m("gate.weight", E, H), m("e_score_correction_bias", E),
                                                       k, 1, 1, True, 1.0, d.target)
    experts = [m.under(f"experts.{e}.") for e in range(E)]
    gate, up, down = ([x(f"{name}.weight", *shape) for x in experts]
                      for name, shape in (("w1", (I, H)), ("w3", (I, H)), ("w2", (H, I))))
    return routed_experts(g, h, logits, index, weight, k, gate, up, down, d.target)


def decoder_layer(d: Decoder, w: Weights, i: int):
    """MiniMaxM2DecoderLayer.forward: x + attn(norm(x)), then x + moe(norm(x)); returns the layer's KV."""
    c, D, a = d.c, d.c.head_dim, w.under("self_attn.")
    attention = replace(attention_weights(a, c), q_norm=a("q_norm.weight", c.num_attention_heads * D),
                        k_norm=a("k_norm.weight", c.num_key_value_heads * D))
    spec = AttentionSpec(c.num_attention_heads, c.num_key_value_heads, D, norm_eps=c.rms_norm_eps, qk_norm_whole=True)
    return pre_norm_layer(d, w, i, attention, spec, lambda h: sparse_moe_block(d, h, w.under("block_sparse_moe.")),
                          "block_sparse_moe")


def skip_prediction_modules(d: Decoder) -> None:
    """Marks the multi-token-prediction modules the hub's checkpoints may carry after the last layer
    (model.layers.{num_hidden_layers + j}.*, j < num_mtp_modules, as sglang reads them) deliberately
    unused: transformers builds no module for them and leaves them unread."""
    c = d.c
    prefixes = tuple(f"model.layers.{c.num_hidden_layers + j}." for j in range(c.num_mtp_modules))
    for name in list(d.ckpt.tensors) if prefixes else ():
        if name.startswith(prefixes):
            d.ckpt.consume(name)


FAMILY = register(Family(
    "minimax_m2", MiniMaxM2Config, decoder_layer, VARIANTS, structure=STRUCTURE, parser=parse_config,
    prepare=skip_prediction_modules, partial_rotary=True, ignored=("model.layers.*.self_attn.rotary_emb.inv_freq",),
))

__all__ = ["FAMILY", "STRUCTURE", "VARIANTS", "MiniMaxM2Config", "decoder_layer", "parse_config", "sparse_moe_block"]
