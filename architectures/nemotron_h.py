"""NVIDIA Nemotron-H (NemotronHForCausalLM: Nemotron-H 4B/8B/47B/56B, Nemotron Nano 9B/12B v2): one
mixer per layer, a Mamba-2 mixer, an attention or a plain relu² MLP, as `hybrid_override_pattern`
says ("M", "*", "-"; "E", the experts of Nemotron 3, is refused below).

Reference: transformers/models/nemotron_h/{configuration,modeling}_nemotron_h.py. Each layer is
x + mixer(norm(x)) with one RMSNorm (`layers.{i}.norm`); the Mamba-2 mixer is
builder.blocks.mamba2's with intermediate mamba_num_heads · mamba_head_dim (`expand` unused),
`use_bias` on in_proj and out_proj, and dt clamped to [time_step_min, ∞) in prefill only (as
transformers' chunked scan; its one-token update does not clamp); attention has no rotary at all
(NoPE), no biases, `head_dim` from config.json; the MLP is down_proj(relu(up_proj(x))²).
The embeddings are `embeddings`, the final norm `norm_f`, under `backbone.` in the hub's
checkpoints (`model.` where transformers saved them).

State contract: attention layers past_key_values.%d.key/value; Mamba layers past.%d.conv (batch,
conv_dim, conv_kernel − 1) and past.%d.recurrent (batch, mamba_num_heads, mamba_head_dim,
ssm_state_size), as Granite 4.0's; MLP layers carry nothing. onnxruntime-genai 0.18 knows no
nemotron_h type: genai_config.json declares the state handling it runs for granitemoehybrid.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

from builder.architecture import Weights, attention_weights, vocabulary
from builder.blocks import AttentionSpec, plain_mlp, self_attention
from builder.blocks.mamba2 import Mamba2Spec, Mamba2Weights, mamba2_mixer
from builder.blocks.short_conv import padding
from builder.decoder_config import DecoderConfig
from builder.errors import BuildError
from builder.family import Decoder, Family, parse, register
from builder.inputs.source import Checkpoint

VARIANTS: dict[str, dict[str, Any]] = {
    "NemotronHForCausalLM": dict(
        vocab_size=131072, hidden_size=4096, intermediate_size=21504,
        num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=4096,
        pad_token_id=0, bos_token_id=1, eos_token_id=2,
    ),
}
MAMBA, ATTENTION, MLP, MOE = "linear_attention", "full_attention", "mlp", "moe"
PATTERN = {"M": MAMBA, "*": ATTENTION, "-": MLP, "E": MOE}
# genai 0.18 has no nemotron_h type; its granitemoehybrid type runs the same state contract.
STRUCTURE: dict[str, dict[str, Any]] = {"NemotronHForCausalLM": dict(model_type="granitemoehybrid", sliding_window=None)}
LEGACY = {"mamba": MAMBA, "attention": ATTENTION}
# NemotronHConfig's older spellings of the Mamba keys.
RENAMED = {"mamba_n_groups": "n_groups", "mamba_d_conv": "conv_kernel", "mamba_dt_min": "time_step_min",
           "mamba_conv_bias": "use_conv_bias", "mamba_chunk_size": "chunk_size"}


@dataclass(frozen=True)
class NemotronHConfig(DecoderConfig):
    """config.json of Nemotron-H: the shared decoder keys and its own (NemotronHConfig's defaults);
    `layer_types` comes from hybrid_override_pattern or layers_block_type (parse_config)."""

    LAYER_TYPES: ClassVar[tuple[str, ...]] = (MAMBA, ATTENTION, MLP)

    mlp_hidden_act: str = "relu2"
    mlp_bias: bool = False
    ssm_state_size: int = 128
    mamba_num_heads: int = 128
    mamba_head_dim: int = 64
    mamba_hidden_act: str = "silu"
    n_groups: int = 8
    conv_kernel: int = 4
    time_step_min: float = 0.001
    use_conv_bias: bool = True
    chunk_size: int = 128
    use_bias: bool = False
    layer_norm_epsilon: float = 1e-5

    def __post_init__(self) -> None:
        object.__setattr__(self, "rms_norm_eps", self.layer_norm_epsilon)
        if self.mamba_num_heads % self.n_groups:
            raise ValueError(f"n_groups ({self.n_groups}) must divide mamba_num_heads ({self.mamba_num_heads})")
        if self.conv_kernel < 2:
            raise ValueError(f"conv_kernel {self.conv_kernel}: the convolution needs at least 2 taps")
        super().__post_init__()

    @property
    def mamba(self) -> Mamba2Spec:
        return Mamba2Spec(self.mamba_num_heads, self.mamba_head_dim, self.n_groups, self.ssm_state_size,
                          self.conv_kernel, self.layer_norm_epsilon, self.mamba_hidden_act,
                          (self.time_step_min, math.inf))

    @property
    def conv_layers(self) -> list[int]:
        """The Mamba layers: each carries a conv state and an SSM state."""
        return [i for i, kind in enumerate(self.layer_types) if kind == MAMBA]

    @property
    def stateless_layers(self) -> list[int]:
        return [i for i, kind in enumerate(self.layer_types) if kind == MLP]

    @property
    def conv_state(self) -> tuple[int, int]:
        return self.mamba.conv_state

    @property
    def recurrent_state(self) -> tuple[int, int, int]:
        return self.mamba.recurrent_state


def layer_types(raw: dict[str, Any]) -> list[str]:
    """The layers' kinds: config.json's layer_types / layers_block_type, else hybrid_override_pattern
    (M Mamba-2, * attention, - MLP, E experts), else NemotronHConfig's default."""
    types = raw.get("layer_types") or raw.get("layers_block_type")
    pattern = raw.get("hybrid_override_pattern")
    if types is None and pattern is not None:
        if not isinstance(pattern, str) or set(pattern) - set(PATTERN):
            raise BuildError(f"config.json: hybrid_override_pattern is {pattern!r}; expected a string of "
                             f"{', '.join(PATTERN)}")
        types = [PATTERN[ch] for ch in pattern]
    if types is None:
        types = [MAMBA, MOE, ATTENTION, MLP]
    if not isinstance(types, list) or not all(isinstance(t, str) for t in types) or not types:
        raise BuildError(f"config.json: layers_block_type is {types!r}; expected a list of layer kinds")
    types = [LEGACY.get(t, t) for t in types]
    if MOE in types:
        raise BuildError("Nemotron-H's mixture-of-experts layers ('E' in hybrid_override_pattern) are not built: "
                         "their experts are relu² MLPs, and ONNX Runtime 1.31's MoE and QMoE have no relu² activation")
    return types


def parse_config(family: Family, raw: dict[str, Any], architecture: str) -> NemotronHConfig:
    """`parse` with the layer kinds resolved (layer_types) and counted (num_hidden_layers: transformers
    derives it from them and ignores config.json's), the older Mamba key spellings renamed."""
    raw = {**{RENAMED.get(k, k): v for k, v in raw.items()}}
    types = layer_types(raw)
    raw.update(layer_types=types, num_hidden_layers=len(types))
    return parse(family, raw, architecture)


def mixer(d: Decoder, w: Weights, i: int, h):
    """NemotronHMamba2Mixer, NemotronHAttention or NemotronHMLP on the normed h; returns (output, state)."""
    g, c = d.g, d.c
    kind = c.layer_types[i]
    if kind == MAMBA:
        weights = Mamba2Weights.read(w, c.mamba, c.hidden_size, c.use_conv_bias, c.use_bias)
        y, conv, ssm = mamba2_mixer(g, h, weights, c.mamba, d.io.conv[i], d.io.recurrent[i], d.prepared, d.target)
        return y, (conv, ssm)
    if kind == ATTENTION:  # no rotary (NoPE), no biases
        spec = AttentionSpec(c.num_attention_heads, c.num_key_value_heads, c.head_dim)
        y, key, value = self_attention(g, h, d.past(i), d.lengths, None, attention_weights(w, c), spec, d.target)
        return y, (key, value)
    H, I = c.hidden_size, c.intermediate_size
    biases = (w("up_proj.bias", I), w("down_proj.bias", H)) if c.mlp_bias else (None, None)
    return plain_mlp(g, h, w("up_proj.weight", I, H), w("down_proj.weight", H, I), c.mlp_hidden_act, d.target,
                     biases), ()


def decoder_layer(d: Decoder, w: Weights, i: int):
    """NemotronHBlock.forward: x + mixer(norm(x)); returns the layer's present state."""
    with d.g.scope("norm"):
        h = d.stream.norm(w("norm.weight", d.c.hidden_size))
    with d.g.scope("mixer"):
        h, state = mixer(d, w.under("mixer."), i, h)
    d.stream.add(h)
    return state


def decoder_prefix(ckpt: Checkpoint) -> str:
    """backbone.* (the hub's checkpoints) or model.* (transformers' save_pretrained)."""
    for prefix in ("backbone.", "model."):
        if f"{prefix}embeddings.weight" in ckpt:
            return prefix
    raise BuildError("the checkpoint has no backbone.embeddings.weight (nor model.embeddings.weight)")


def nemotron_h_vocabulary(d: Decoder):
    embed = decoder_prefix(d.ckpt) + "embeddings.weight"
    return vocabulary(d.g, d.ckpt, d.target, (d.c.vocab_size, d.c.hidden_size), d.c.tie_word_embeddings, embed=embed)


def final_norm(d: Decoder):
    with d.g.scope("model", "norm_f"):
        return d.stream.norm(d.ckpt.weight(decoder_prefix(d.ckpt) + "norm_f.weight", (d.c.hidden_size,)))


def conv_padding(d: Decoder):
    """Where the new tokens' padding is (builder.blocks.short_conv.padding), shared by the Mamba layers."""
    return padding(d.g, d.io.token_input, d.io.attention_mask, d.target) if d.c.conv_layers else None


FAMILY = register(Family(
    "nemotron_h", NemotronHConfig, decoder_layer, VARIANTS, structure=STRUCTURE, parser=parse_config, rotary=lambda d: None,
    prepare=conv_padding, vocabulary=nemotron_h_vocabulary, final_norm=final_norm,
    prefix=lambda d: decoder_prefix(d.ckpt),
    ignored=("mtp.*",),  # the multi-token-prediction layers, which transformers skips too
))

__all__ = ["FAMILY", "VARIANTS", "NemotronHConfig", "decoder_layer"]
