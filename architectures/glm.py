"""GLM-4 (GlmForCausalLM: glm-4-9b-chat-hf) and GLM-4-0414 (Glm4ForCausalLM: GLM-4-9B/32B-0414).

Reference: transformers/models/glm/modeling_glm.py and glm4/modeling_glm4.py. Apart from Llama:
q/k/v biases (`attention_bias`, o_proj never has one); `gate_up_proj` holds gate then up (split
lazily here); partial rotary (`partial_rotary_factor`, 0.5 unless given) on the first dims of
each head, in interleaved pairs (x0, x1), (x2, x3), … — apply_rotary_pos_emb repeats each
frequency twice and rotates with rotate_every_two. Glm4: sandwich norms, each branch normalized
(post_self_attn_layernorm, post_mlp_layernorm) before it joins the residual.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from builder.architecture import Weights, attention_weights
from builder.blocks import AttentionSpec, gated_mlp, self_attention
from builder.decoder_config import DecoderConfig
from builder.family import Decoder, Family, parse, register

# GlmConfig's and Glm4Config's defaults (the same) where they differ from the shared ones.
GLM_DEFAULTS: dict[str, Any] = dict(vocab_size=151552, intermediate_size=13696, num_hidden_layers=40,
                                    num_key_value_heads=2, head_dim=128, max_position_embeddings=131072,
                                    rms_norm_eps=0.00000015625, pad_token_id=151329, eos_token_id=None,
                                    bos_token_id=None, attention_bias=True)
VARIANTS: dict[str, dict[str, Any]] = {
    "GlmForCausalLM": dict(GLM_DEFAULTS, model_type="glm"),
    "Glm4ForCausalLM": dict(GLM_DEFAULTS, model_type="glm4"),
}

# What each modeling file fixes: no sliding window; Glm4's sandwich norms. onnxruntime-genai names
# the GLM family "chatglm" (its decoder contract is Llama's: same inputs, outputs and KV cache
# layout); it knows neither glm nor glm4.
STRUCTURE: dict[str, dict[str, Any]] = {
    "GlmForCausalLM": dict(model_type="chatglm", sandwich_norms=False, sliding_window=None),
    "Glm4ForCausalLM": dict(model_type="chatglm", sandwich_norms=True, sliding_window=None),
}


@dataclass(frozen=True)
class GlmConfig(DecoderConfig):
    """config.json of Glm and Glm4 (the same keys and defaults): the shared decoder keys."""

    # Structure the modeling files fix per architecture (not a config.json key).
    sandwich_norms: bool = False

    def __post_init__(self) -> None:
        if self.eos_token_id is None:  # GlmConfig.__post_init__
            object.__setattr__(self, "eos_token_id", [151329, 151336, 151338])
        super().__post_init__()


def parse_config(family: Family, raw: dict[str, Any], architecture: str) -> GlmConfig:
    c = parse(family, raw, architecture)
    rope = dict(c.rope_parameters)
    rope.setdefault("partial_rotary_factor", 0.5)  # GlmConfig's default "for BC"
    return dataclasses.replace(c, rope_parameters=rope)


def post_norm(d: Decoder, h, w: Weights, name: str) -> None:
    """residual + h, or with Glm4's sandwich norms residual + name(h)."""
    if not d.c.sandwich_norms:
        d.stream.add(h)
        return
    with d.g.scope(name):
        d.stream.add(h, w(f"{name}.weight", d.c.hidden_size))


def decoder_layer(d: Decoder, w: Weights, i: int):
    """GlmDecoderLayer / Glm4DecoderLayer.forward; Glm4 normalizes each branch before the residual add."""
    g, c = d.g, d.c
    H, D, I = c.hidden_size, c.head_dim, c.intermediate_size
    with g.scope("input_layernorm"):
        h = d.stream.norm(w("input_layernorm.weight", H))
    attention = attention_weights(w.under("self_attn."), c, c.attention_bias, o_bias=False)
    spec = AttentionSpec(c.num_attention_heads, c.num_key_value_heads, D, rotary_interleaved=True)
    with g.scope("self_attn"):
        h, key, value = self_attention(g, h, d.past(i), d.lengths, d.rotary, attention, spec, d.target)
    post_norm(d, h, w, "post_self_attn_layernorm")
    with g.scope("post_attention_layernorm"):
        h = d.stream.norm(w("post_attention_layernorm.weight", H))
    gate_up = w("mlp.gate_up_proj.weight", 2 * I, H)  # gate rows, then up rows (GlmMLP: chunk(2))
    with g.scope("mlp"):
        h = gated_mlp(g, h, gate_up.slice(0, 0, I), gate_up.slice(0, I, 2 * I), w("mlp.down_proj.weight", H, I),
                      c.hidden_act, d.target)
    post_norm(d, h, w, "post_mlp_layernorm")
    return key, value


FAMILY = register(Family(
    "glm", GlmConfig, decoder_layer, VARIANTS, structure=STRUCTURE, parser=parse_config, partial_rotary=True,
    ignored=("model.layers.*.self_attn.rotary_emb.inv_freq",),
))

__all__ = ["FAMILY", "STRUCTURE", "VARIANTS", "GlmConfig", "decoder_layer", "parse_config"]
