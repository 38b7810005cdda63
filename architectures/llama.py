"""Llama and the decoders that are its math with other data, each a row of VARIANTS and STRUCTURE.

Reference: transformers/models/<model_type>/modeling_*.py. Mistral: a sliding window; Qwen2: q/k/v
biases, optional sliding layers; Qwen3: per-head q/k RMSNorm; Seed-OSS: q/k/v biases apart from
o_proj's (`attention_out_bias`); ERNIE 4.5: `use_bias` on every projection, interleaved rotary
pairs. Ministral and Ministral 3 are rows of architectures/ministral.py on this decoder.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from builder.architecture import Weights, attention_weights
from builder.blocks import AttentionSpec, gated_mlp, self_attention
from builder.blocks.attention_positions import attention_temperature
from builder.decoder_config import DecoderConfig
from builder.errors import BuildError
from builder.family import Decoder, Family, ModelType, parse, register

QWEN = dict(vocab_size=151936, intermediate_size=22016, num_key_value_heads=32, max_position_embeddings=32768,
            bos_token_id=None, eos_token_id=None, use_sliding_window=False, sliding_window=4096, max_window_layers=28)
# Per architecture: transformers' config defaults where they differ from Llama's, and the
# structural facts its modeling file hard-codes.
VARIANTS: dict[str, dict[str, Any]] = {
    "LlamaForCausalLM": dict(model_type="llama"),
    "MistralForCausalLM": dict(
        model_type="mistral", intermediate_size=14336, num_key_value_heads=8,
        max_position_embeddings=4096 * 32, sliding_window=4096,
    ),
    "Qwen2ForCausalLM": dict(model_type="qwen2", **QWEN),
    "Qwen3ForCausalLM": dict(model_type="qwen3", head_dim=128, **QWEN),
    "SeedOssForCausalLM": dict(
        model_type="seed_oss", vocab_size=155136, intermediate_size=27648, num_hidden_layers=64,
        num_attention_heads=80, num_key_value_heads=8, head_dim=128, max_position_embeddings=524288,
        pad_token_id=1, bos_token_id=0, eos_token_id=2, attention_bias=True, attention_out_bias=False,
    ),
    "Ernie4_5ForCausalLM": dict(
        model_type="ernie4_5", vocab_size=103424, hidden_size=1024, intermediate_size=3072, num_hidden_layers=18,
        num_attention_heads=16, num_key_value_heads=2, head_dim=128, max_position_embeddings=131072,
        rms_norm_eps=1e-5, pad_token_id=0, eos_token_id=2, tie_word_embeddings=True, default_theta=500_000.0,
    ),
    # The hub's model types transformers builds as Llama (MODEL_TYPES below), each with its config
    # class's defaults: InternLM3, IQuest-Coder, EXAONE 3.
    "InternLM3ForCausalLM": dict(
        model_type="internlm3", vocab_size=128512, intermediate_size=10240, num_hidden_layers=48,
        num_key_value_heads=2, head_dim=128, max_position_embeddings=32768, rms_norm_eps=1e-5, pad_token_id=2,
    ),
    "IQuestCoderForCausalLM": dict(
        model_type="iquestcoder", vocab_size=76800, hidden_size=5120, intermediate_size=27648, num_hidden_layers=80,
        num_attention_heads=40, num_key_value_heads=8, head_dim=128, max_position_embeddings=131072,
        rms_norm_eps=1e-5,
    ),
    "ExaoneForCausalLM": dict(
        model_type="exaone", vocab_size=102400, intermediate_size=14336, num_key_value_heads=8,
        max_position_embeddings=4096, rms_norm_eps=1e-5, pad_token_id=0, eos_token_id=361, default_theta=500_000.0,
    ),
}
# config.json's model_type -> the row transformers 5.25 builds it as (models/auto: LlamaForCausalLM),
# with its config class's attribute_map and its conversion rules (conversion_mapping.py) as data.
MODEL_TYPES: dict[str, ModelType] = {
    "internlm3": ModelType("InternLM3ForCausalLM", keys={"qkv_bias": "attention_bias", "bias": "mlp_bias"}),
    "iquestcoder": ModelType("IQuestCoderForCausalLM"),
    "exaone": ModelType(
        "ExaoneForCausalLM",
        keys={"num_layers": "num_hidden_layers", "layer_norm_epsilon": "rms_norm_eps",
              "activation_function": "hidden_act"},
        renames=(
            (r"^transformer\.wte\.", "model.embed_tokens."), (r"^transformer\.h\.", "model.layers."),
            (r"^transformer\.ln_f\.", "model.norm."), (r"\.attn\.attention\.", ".self_attn."),
            (r"\.self_attn\.out_proj\.", ".self_attn.o_proj."), (r"\.ln_1\.", ".input_layernorm."),
            (r"\.ln_2\.", ".post_attention_layernorm."), (r"\.mlp\.c_fc_0\.", ".mlp.gate_proj."),
            (r"\.mlp\.c_fc_1\.", ".mlp.up_proj."), (r"\.mlp\.c_proj\.", ".mlp.down_proj."),
        ),
    ),
}

# What each modeling file fixes whatever config.json says: Llama has no window (its config ignores
# `sliding_window`); Qwen2 has q/k/v biases and no o_proj bias; Qwen3 a per-head q/k RMSNorm.
STRUCTURE: dict[str, dict[str, Any]] = {
    "LlamaForCausalLM": dict(sliding_window=None),
    "Qwen2ForCausalLM": dict(qkv_bias=True, attention_bias=False),
    "Qwen3ForCausalLM": dict(qk_norm=True),
    # onnxruntime-genai 0.18 knows no "seed_oss": the same contract as Llama's (a plain decoder).
    "SeedOssForCausalLM": dict(model_type="llama"),
    "Ernie4_5ForCausalLM": dict(rotary_interleaved=True, attention_bias=False, mlp_bias=False),
    **{row: dict(sliding_window=None, model_type="llama") for row in ("InternLM3ForCausalLM", "IQuestCoderForCausalLM",
                                                                      "ExaoneForCausalLM")},
}


@dataclass(frozen=True)
class LlamaConfig(DecoderConfig):
    """config.json of the Llama family: the shared decoder keys and Llama's own."""

    attention_out_bias: bool | None = None  # Seed-OSS: o_proj's bias; None: attention_bias
    use_bias: bool = False  # ERNIE 4.5: biases on q, k, v, o and the MLP
    mlp_bias: bool = False
    use_sliding_window: bool | None = None  # Qwen2/3: the window applies only when this is true
    max_window_layers: int | None = None  # Qwen2/3: layers from this index on slide
    # Structure the modeling file fixes per architecture (not config.json keys).
    qkv_bias: bool = False
    qk_norm: bool = False
    rotary_interleaved: bool = False
    llama_4_scaling: bool = False

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        if self.use_bias:
            set_(self, "attention_bias", True)
            set_(self, "mlp_bias", True)
        if self.attention_out_bias is None:
            set_(self, "attention_out_bias", self.attention_bias)
        if self.use_sliding_window is False:
            set_(self, "sliding_window", None)
        if self.attention_bias:
            set_(self, "qkv_bias", True)  # Llama/Qwen3: attention_bias covers q, k, v (and o)
        temperature = ("llama_4_scaling_beta", "original_max_position_embeddings")
        if self.llama_4_scaling and any(self.rope_parameters.get(k) is None for k in temperature):
            raise ValueError(f"Ministral 3's attention temperature needs rope_parameters' {' and '.join(temperature)}")
        super().__post_init__()

    def default_layer_types(self) -> list[str]:
        """Mistral slides in every layer; Qwen2/3 from max_window_layers on."""
        first_sliding = self.max_window_layers or 0
        return ["sliding_attention" if self.sliding_window is not None and i >= first_sliding else "full_attention"
                for i in range(self.num_hidden_layers)]


def parse_config(family: Family, raw: dict[str, Any], architecture: str) -> LlamaConfig:
    """The config of `architecture`, a row of the family's VARIANTS and STRUCTURE (this module's, or
    those of a family that reuses this decoder with its own rows, as architectures/ministral.py does)."""
    defaults = family.variants[architecture]
    if architecture == "InternLM3ForCausalLM" and raw.get("attention_bias", False) != raw.get("mlp_bias", False):
        # InternLM3Config.validate_architecture: Llama's layer has one bias setting for q, k, v, o
        raise BuildError(f"config.json: InternLM3 with qkv_bias {raw.get('attention_bias', False)} and bias "
                         f"{raw.get('mlp_bias', False)}: transformers builds it as Llama, whose layer takes one "
                         "bias setting for both, and refuses it")
    if "rope_parameters" in defaults and not (raw.get("rope_scaling") or raw.get("rope_parameters")):
        raw = dict(raw, rope_parameters=defaults["rope_parameters"])
    return parse(family, raw, architecture)


def mlp(d: Decoder, m: Weights, h):
    """LlamaMLP.forward: down_proj(act(gate_proj(h)) * up_proj(h)), with biases where mlp_bias."""
    c = d.c
    H, I = c.hidden_size, c.intermediate_size
    biases = (m("gate_proj.bias", I), m("up_proj.bias", I), m("down_proj.bias", H)) if c.mlp_bias else None
    return gated_mlp(d.g, h, m("gate_proj.weight", I, H), m("up_proj.weight", I, H), m("down_proj.weight", H, I),
                     c.hidden_act, d.target, biases)


def decoder_layer(d: Decoder, w: Weights, i: int, mlp=mlp, norms=("input_layernorm", "post_attention_layernorm")):
    """LlamaDecoderLayer.forward: x + attn(norm(x)), then x + mlp(norm(x)); returns the layer's KV.
    `mlp(d, weights under "mlp.", h)`: the family's MLP (Llama's gated one by default); `norms`:
    the module names of the two norms (Apertus: attention_layernorm, feedforward_layernorm)."""
    g, c = d.g, d.c
    H, D = c.hidden_size, c.head_dim
    with g.scope(norms[0]):
        h = d.stream.norm(w(f"{norms[0]}.weight", H))
    a = w.under("self_attn.")
    attention = attention_weights(a, c, c.qkv_bias, c.attention_out_bias, a if c.qk_norm else None)
    spec = AttentionSpec(c.num_attention_heads, c.num_key_value_heads, D, window=c.window(i), norm_eps=c.rms_norm_eps,
                         rotary_interleaved=c.rotary_interleaved)
    with g.scope("self_attn"):
        h, key, value = self_attention(g, h, d.past(i), d.lengths, d.rotary, attention, spec, d.target, d.prepared)
    d.stream.add(h)
    with g.scope(norms[1]):
        h = d.stream.norm(w(f"{norms[1]}.weight", H))
    with g.scope("mlp"):
        d.stream.add(mlp(d, w.under("mlp."), h))
    return key, value


def query_temperature(d: Decoder):
    """Ministral 3 (llama_4_scaling): each query times its position's temperature; None elsewhere."""
    p = d.c.rope_parameters
    if not d.c.llama_4_scaling:
        return None
    return attention_temperature(d.g, d.io.input_ids, d.lengths, p["llama_4_scaling_beta"],
                                 p["original_max_position_embeddings"], d.target)


FAMILY = register(Family(
    "llama", LlamaConfig, decoder_layer, VARIANTS, structure=STRUCTURE, parser=parse_config, prepare=query_temperature,
    model_types=MODEL_TYPES,
    # Older checkpoints saved the rotary buffer; it is recomputed from the config.
    ignored=("model.layers.*.self_attn.rotary_emb.inv_freq",),
))

__all__ = ["FAMILY", "MODEL_TYPES", "STRUCTURE", "VARIANTS", "LlamaConfig", "decoder_layer", "mlp", "parse_config"]
