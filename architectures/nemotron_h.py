"""NVIDIA Nemotron-H (NemotronHForCausalLM: Nemotron-H 4B/8B/47B/56B, Nemotron Nano 9B/12B v2,
Nemotron 3): one mixer per layer, a Mamba-2 mixer, an attention, a plain relu² MLP or a mixture of
relu² experts, as `hybrid_override_pattern` says ("M", "*", "-", "E").

Reference: transformers/models/nemotron_h/{configuration,modeling}_nemotron_h.py. Each layer is
x + mixer(norm(x)) with one RMSNorm (`layers.{i}.norm`); the Mamba-2 mixer is
builder.blocks.mamba2's with intermediate mamba_num_heads · mamba_head_dim (`expand` unused),
`use_bias` on in_proj and out_proj, and dt clamped to `time_step_limit` (default [0, ∞): no clamp) in
prefill only (as transformers' chunked scan; its one-token update does not clamp). transformers 5.25
reads time_step_limit (older configs: mamba_dt_limit), as NVIDIA's original code; 5.23 clamped to
[time_step_min, ∞) instead, and builder follows 5.25; attention has no rotary at all
(NoPE), no biases, `head_dim` from config.json; the MLP is down_proj(relu(up_proj(x))²). The
experts (NemotronHMoE) are such MLPs, `moe_intermediate_size` wide, chosen by GLM-4.5's grouped
sigmoid router with its correction bias (builder.blocks.moe.grouped_sigmoid_router), between the
optional latent projections `fc1_latent_proj` / `fc2_latent_proj`, plus the shared relu² MLP
`shared_experts`. ONNX Runtime's MoE/QMoE have no relu² and, on CPU, no FC3: the experts run as
its SwiGLU with the up matrix as both gate and up and a steep sigmoid (builder.blocks.moe's
RELU_SQUARED_ALPHA: relu(u)² to 5e-9), which stores each expert's up matrix twice.
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

from architectures.granitemoehybrid import MambaStates, time_step_limit
from builder.architecture import Weights, attention_weights, prefix_holding, vocabulary
from builder.blocks import AttentionSpec, plain_mlp, self_attention
from builder.blocks.linear import linear
from builder.blocks.mamba2 import Mamba2Spec, Mamba2Weights, mamba2_mixer
from builder.blocks.moe import RELU_SQUARED_ALPHA, grouped_sigmoid_router, routed_experts, unstacked
from builder.decoder_config import DecoderConfig
from builder.errors import BuildError
from builder.family import conv_padding, Decoder, Family, parse, register, strip_partial_rotary
from builder.inputs.source import Checkpoint
from builder.state import LayerState

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
           "mamba_conv_bias": "use_conv_bias", "mamba_chunk_size": "chunk_size", "mamba_dt_limit": "time_step_limit"}


@dataclass(frozen=True)
class NemotronHConfig(MambaStates, DecoderConfig):
    """config.json of Nemotron-H: the shared decoder keys and its own (NemotronHConfig's defaults);
    `layer_types` comes from hybrid_override_pattern or layers_block_type (parse_config)."""

    LAYER_TYPES: ClassVar[tuple[str, ...]] = (MAMBA, ATTENTION, MLP, MOE)

    mlp_hidden_act: str = "relu2"
    mlp_bias: bool = False
    ssm_state_size: int = 128
    mamba_num_heads: int = 128
    mamba_head_dim: int = 64
    mamba_hidden_act: str = "silu"
    n_groups: int = 8
    conv_kernel: int = 4
    time_step_min: float = 0.001  # the dt bias's initialization only (transformers 5.25)
    # transformers writes an infinite limit as {"__float__": "Infinity"}, the hub as Infinity.
    time_step_limit: list[float | dict[str, str]] | None = None
    use_conv_bias: bool = True
    chunk_size: int = 128
    use_bias: bool = False
    layer_norm_epsilon: float = 1e-5
    n_routed_experts: int = 8
    num_experts_per_tok: int = 2
    moe_intermediate_size: int = 7688
    moe_shared_expert_intermediate_size: int = 7688
    moe_latent_size: int | None = None
    routed_scaling_factor: float = 1.0
    n_group: int = 1
    topk_group: int = 1
    norm_topk_prob: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "rms_norm_eps", self.layer_norm_epsilon)
        if self.mamba_num_heads % self.n_groups:
            raise ValueError(f"n_groups ({self.n_groups}) must divide mamba_num_heads ({self.mamba_num_heads})")
        if self.conv_kernel < 2:
            raise ValueError(f"conv_kernel {self.conv_kernel}: the convolution needs at least 2 taps")
        if self.n_routed_experts % self.n_group or not 0 < self.topk_group <= self.n_group:
            raise ValueError(f"n_group ({self.n_group}) must divide n_routed_experts ({self.n_routed_experts}) "
                             f"and topk_group ({self.topk_group}) be 1 to n_group")
        if self.num_experts_per_tok > self.n_routed_experts:
            raise ValueError(f"num_experts_per_tok ({self.num_experts_per_tok}) is more than n_routed_experts "
                             f"({self.n_routed_experts})")
        if self.time_step_limit is not None:
            object.__setattr__(self, "time_step_limit", time_step_limit(self.time_step_limit))
        super().__post_init__()

    @property
    def mamba(self) -> Mamba2Spec:
        return Mamba2Spec(self.mamba_num_heads, self.mamba_head_dim, self.n_groups, self.ssm_state_size,
                          self.conv_kernel, self.layer_norm_epsilon, self.mamba_hidden_act,
                          self.time_step_limit or (0.0, math.inf))

    @property
    def conv_layers(self) -> list[int]:
        """The Mamba layers: each carries a conv state and an SSM state."""
        return [i for i, kind in enumerate(self.layer_types) if kind == MAMBA]

    def layer_state(self, layer: int) -> LayerState:
        """Mamba layers carry the mixer's states (MambaStates), attention layers a KV cache, MLP and
        expert layers nothing."""
        if self.layer_types[layer] in (MLP, MOE):
            return LayerState(kind=self.layer_types[layer])
        return super().layer_state(layer)


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
    return [LEGACY.get(t, t) for t in types]


def parse_config(family: Family, raw: dict[str, Any], architecture: str) -> NemotronHConfig:
    """`parse` with the layer kinds resolved (layer_types) and counted (num_hidden_layers: transformers
    derives it from them and ignores config.json's), the older Mamba key spellings renamed."""
    raw = strip_partial_rotary({RENAMED.get(k, k): v for k, v in raw.items()})  # no rotary at all
    types = layer_types(raw)
    raw.update(layer_types=types, num_hidden_layers=len(types))
    return parse(family, raw, architecture)


def mixer(d: Decoder, w: Weights, i: int, h):
    """NemotronHMamba2Mixer, NemotronHAttention, NemotronHMLP or NemotronHMoE on the normed h;
    returns (output, state)."""
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
    if kind == MOE:
        return experts(d, w, h), ()
    return relu2_mlp(d, w, h, c.intermediate_size), ()


def relu2_mlp(d: Decoder, w: Weights, h, size: int):
    """NemotronHMLP: down_proj(relu(up_proj(h))²), biased with mlp_bias."""
    c, H = d.c, d.c.hidden_size
    biases = (w("up_proj.bias", size), w("down_proj.bias", H)) if c.mlp_bias else (None, None)
    return plain_mlp(d.g, h, w("up_proj.weight", size, H), w("down_proj.weight", H, size), c.mlp_hidden_act, d.target,
                     biases)


def expert_matrices(w: Weights, count: int, width: int, inter: int):
    """Each expert's (up, down): the hub's per-expert `experts.{e}.up_proj` / `down_proj`, or the
    stacked [E, I, width] / [E, width, I] `experts.up_proj` / `experts.down_proj` transformers saves."""
    if w.prefix + "experts.up_proj" in w.ckpt:
        return (unstacked(w("experts.up_proj", count, inter, width)),
                unstacked(w("experts.down_proj", count, width, inter)))
    each = [w.under(f"experts.{e}.") for e in range(count)]
    return [x("up_proj.weight", inter, width) for x in each], [x("down_proj.weight", width, inter) for x in each]


def experts(d: Decoder, w: Weights, h):
    """NemotronHMoE.forward: the routed relu² experts (between the latent projections, when the
    model has them) plus the shared relu² MLP."""
    g, c = d.g, d.c
    H, E, latent = c.hidden_size, c.n_routed_experts, c.moe_latent_size
    if c.mlp_hidden_act != "relu2":
        raise BuildError(f"Nemotron-H experts with mlp_hidden_act {c.mlp_hidden_act!r}: builder builds relu2 experts")
    with g.scope("gate"):
        logits, index, weight = grouped_sigmoid_router(
            g, h, w("gate.weight", E, H), w("gate.e_score_correction_bias", E), c.num_experts_per_tok, c.n_group,
            c.topk_group, c.norm_topk_prob, c.routed_scaling_factor, d.target)
    x = h
    if latent is not None:
        with g.scope("fc1_latent_proj"):
            x = linear(g, h, w("fc1_latent_proj.weight", latent, H), d.target,
                       w("fc1_latent_proj.bias", latent) if c.mlp_bias else None)
    up, down = expert_matrices(w, E, latent or H, c.moe_intermediate_size)
    y = routed_experts(g, x, logits, index, weight, c.num_experts_per_tok, up, up, down, d.target, RELU_SQUARED_ALPHA)
    if latent is not None:
        with g.scope("fc2_latent_proj"):
            y = linear(g, y, w("fc2_latent_proj.weight", H, latent), d.target,
                       w("fc2_latent_proj.bias", H) if c.mlp_bias else None)
    with g.scope("shared_experts"):
        shared = relu2_mlp(d, w.under("shared_experts."), h, c.moe_shared_expert_intermediate_size)
    return g.op.Add(y, shared)


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
    return prefix_holding(ckpt, "embeddings.weight", ("backbone.", "model."))


def nemotron_h_vocabulary(d: Decoder):
    embed = d.prefix + "embeddings.weight"
    return vocabulary(d.g, d.ckpt, d.target, (d.c.vocab_size, d.c.hidden_size), d.c.tie_word_embeddings, embed=embed)


def final_norm(d: Decoder):
    with d.g.scope("model", "norm_f"):
        return d.stream.norm(d.ckpt.weight(d.prefix + "norm_f.weight", (d.c.hidden_size,)))



FAMILY = register(Family(
    "nemotron_h", NemotronHConfig, decoder_layer, VARIANTS, structure=STRUCTURE, parser=parse_config, rotary=lambda d: None,
    prepare=conv_padding, vocabulary=nemotron_h_vocabulary, final_norm=final_norm,
    prefix=lambda d: decoder_prefix(d.ckpt),
    ignored=("mtp.*",),  # the multi-token-prediction layers, which transformers skips too
))

__all__ = ["FAMILY", "VARIANTS", "NemotronHConfig", "decoder_layer"]
