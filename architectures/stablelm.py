"""StableLM (StableLmForCausalLM): StableLM-3B-4E1T, StableLM-2 1.6B/12B, Zephyr and Code variants.

Reference: transformers/models/stablelm/modeling_stablelm.py. Apart from Llama: LayerNorms with
bias; partial rotary (a quarter of the head by default); optional q/k/v biases (`use_qkv_bias`,
StableLM 2); optional per-head LayerNorms on q and k, one weight per head and no bias
(`qk_layernorm`, StableLM 2 12B); optionally parallel branches from the one input LayerNorm
(`use_parallel_residual`, StableLM 2 12B), with no post_attention_layernorm then.

Its LayerNorm layer is the one of the GPT-style families: Phi, StarCoder2 and Nemotron reuse it
with their own attention weights and MLP (`decoder_layer`'s `self_attn` and `mlp`); Cohere reuses
its LayerNorm stream and gated MLP.

onnxruntime-genai 0.18 knows no "stablelm" model type; its "llama" one runs the same contract
(input_ids, attention_mask, per-layer KV in and out, logits), so genai_config says "llama".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import onnx_ir as ir

from builder.architecture import Weights, attention_weights
from builder.blocks import AttentionSpec, AttentionWeights, ResidualStream, gated_mlp, plain_mlp, self_attention
from builder.decoder_config import DecoderConfig
from builder.errors import BuildError
from builder.family import Decoder, Family, parse, register
from builder.lazy import Weight

# StableLmConfig's defaults where they differ from the shared ones (partial_rotary_factor: for
# configs that omit it).
VARIANTS: dict[str, dict[str, Any]] = {"StableLmForCausalLM": dict(
    vocab_size=50304, hidden_size=2560, intermediate_size=6912, num_key_value_heads=32, max_position_embeddings=4096,
    bos_token_id=0, eos_token_id=0, partial_rotary_factor=0.25,
)}

# onnxruntime-genai's model type for the same decoder contract (see the module docstring); the
# attention's head is hidden_size / heads whatever config.json says, and no layer slides.
STRUCTURE: dict[str, dict[str, Any]] = {
    "StableLmForCausalLM": dict(model_type="llama", head_dim=None, sliding_window=None, layer_types=None),
}


@dataclass(frozen=True)
class StableLmConfig(DecoderConfig):
    """config.json of StableLmForCausalLM: the shared decoder keys and its own."""

    layer_norm_eps: float = 1e-5
    use_qkv_bias: bool = False
    qk_layernorm: bool = False
    use_parallel_residual: bool = False


def parse_config(family: Family, raw: dict[str, Any], architecture: str) -> Any:
    """`parse`, refusing what StableLM's and Phi's modeling files cannot run: they rotate
    int(head_dim · partial_rotary_factor) dimensions with cos/sin of ceil(that / 2) frequencies, so
    an odd count fails their forward ("The size of tensor a (25) must match the size of tensor b
    (26)"); and StableLM's attention splits heads of hidden_size / num_attention_heads while its
    rotary spans config.json's head_dim, so another head_dim fails it too."""
    c = parse(family, raw, architecture)
    given = raw.get("head_dim")
    if architecture == "StableLmForCausalLM" and given is not None and given != c.hidden_size // c.num_attention_heads:
        raise BuildError(f"config.json: head_dim {given} is not hidden_size / num_attention_heads "
                         f"({c.hidden_size // c.num_attention_heads}), which StableLM's attention uses: transformers "
                         "cannot run it")
    rotated = int(c.head_dim * c.rope_parameters.get("partial_rotary_factor", 1.0))
    if rotated % 2:
        raise BuildError(f"config.json: partial_rotary_factor {c.rope_parameters['partial_rotary_factor']} of a "
                         f"{c.head_dim}-wide head rotates {rotated} dimensions, an odd number, which transformers "
                         "cannot run")
    return c


class LayerNormWeights(Weights):
    """Weights of a module whose norms are LayerNorms with bias: `norm` reads (weight, bias)."""

    def norm(self, name: str, size: int) -> tuple[Weight, Weight]:
        return self(f"{name}.weight", size), self(f"{name}.bias", size)


def layer_norm_stream(d: Decoder, x: ir.Value) -> ResidualStream:
    """A residual stream whose norms are LayerNorms, at the config's `layer_norm_eps`."""
    return ResidualStream(d.g, x, d.c.layer_norm_eps, d.target, layer_norm=True)


def final_norm(d: Decoder, name: str = "norm", weights: type[LayerNormWeights] = LayerNormWeights) -> ir.Value:
    """The final LayerNorm `model.<name>` (Phi's is `final_layernorm`), read by `weights`."""
    with d.g.scope("model", name):
        return d.stream.norm(*weights(d.ckpt, "model.").norm(name, d.c.hidden_size))


def per_head_norm(a: Weights, name: str, heads: int, dim: int) -> Weight:
    """StableLmLayerNormPerHead's weights `<name>.norms.<h>.weight`, stacked to [heads, head_dim]."""
    return Weight.stack([a(f"{name}.norms.{h}.weight", dim) for h in range(heads)])


def self_attn_weights(a: Weights, c: StableLmConfig) -> AttentionWeights:
    """StableLmAttention's q/k/v/o_proj, q/k/v biases with use_qkv_bias, per-head q/k LayerNorms with qk_layernorm."""
    attention = attention_weights(a, c, c.use_qkv_bias, False)
    if not c.qk_layernorm:
        return attention
    return dataclasses.replace(attention, q_norm=per_head_norm(a, "q_layernorm", c.num_attention_heads, c.head_dim),
                               k_norm=per_head_norm(a, "k_layernorm", c.num_key_value_heads, c.head_dim))


def biased_self_attn(a: Weights, c: Any) -> AttentionWeights:
    """q/k/v/o_proj, with biases on all four when `c.attention_bias` (Nemotron; StarCoder2's use_bias)."""
    return attention_weights(a, c, c.attention_bias, c.attention_bias)


def gated(d: Decoder, m: Weights, h: ir.Value) -> ir.Value:
    """StableLmMLP (and CohereMLP): down_proj(act(gate_proj(h)) · up_proj(h)), no biases."""
    H, I = d.c.hidden_size, d.c.intermediate_size
    return gated_mlp(d.g, h, m("gate_proj.weight", I, H), m("up_proj.weight", I, H), m("down_proj.weight", H, I),
                     d.c.hidden_act, d.target)


def plain(d: Decoder, m: Weights, h: ir.Value, names: tuple[str, str], biased: bool) -> ir.Value:
    """The GPT-style MLP down(act(up(h))) under its checkpoint's `names` (Phi's fc1/fc2, StarCoder2's
    c_fc/c_proj, Nemotron's up_proj/down_proj), with biases when `biased`."""
    H, I = d.c.hidden_size, d.c.intermediate_size
    up, down = names
    biases = (m(f"{up}.bias", I), m(f"{down}.bias", H)) if biased else (None, None)
    return plain_mlp(d.g, h, m(f"{up}.weight", I, H), m(f"{down}.weight", H, I), d.c.hidden_act, d.target, biases,
                     names=names)


def decoder_layer(d: Decoder, w: LayerNormWeights, i: int,
                  self_attn: Callable[[Weights, Any], AttentionWeights] = self_attn_weights,
                  mlp: Callable[[Decoder, Weights, ir.Value], ir.Value] = gated) -> tuple[ir.Value, ir.Value]:
    """StableLmDecoderLayer.forward: x + attn(ln1(x)), then + mlp(ln2(x)); with use_parallel_residual
    x + attn(ln1(x)) + mlp(ln1(x)). Returns the layer's KV. `self_attn` reads the attention's
    weights and `mlp` records the MLP: the families that reuse this layer pass their own."""
    g, c = d.g, d.c
    with g.scope("input_layernorm"):
        h = d.stream.norm(*w.norm("input_layernorm", c.hidden_size))
    spec = AttentionSpec(c.num_attention_heads, c.num_key_value_heads, c.head_dim, window=c.window(i),
                         norm_eps=c.layer_norm_eps, qk_layer_norm=True)
    with g.scope("self_attn"):
        attn, key, value = self_attention(g, h, d.past(i), d.lengths, d.rotary, self_attn(w.under("self_attn."), c),
                                          spec, d.target)
    d.stream.add(attn)
    if not c.use_parallel_residual:
        with g.scope("post_attention_layernorm"):
            h = d.stream.norm(*w.norm("post_attention_layernorm", c.hidden_size))
    with g.scope("mlp"):
        d.stream.add(mlp(d, w.under("mlp."), h))
    return key, value


FAMILY = register(Family(
    "stablelm", StableLmConfig, decoder_layer, VARIANTS, structure=STRUCTURE,
    stream=layer_norm_stream, weights=LayerNormWeights, final_norm=final_norm, partial_rotary=True, parser=parse_config,
))

__all__ = ["FAMILY", "STRUCTURE", "VARIANTS", "LayerNormWeights", "StableLmConfig", "biased_self_attn", "decoder_layer",
           "final_norm", "gated", "layer_norm_stream", "per_head_norm", "plain", "self_attn_weights"]
