"""TII Falcon-H1 (FalconH1ForCausalLM): every layer runs a Mamba-2 mixer and attention side by side
on the same normed input, then a SwiGLU, with μP multipliers nearly everywhere.

Reference: transformers/models/falcon_h1/modeling_falcon_h1.py. Each layer is
x + ssm_out_multiplier · mamba(n) + attention_out_multiplier · self_attn(attention_in_multiplier · n)
with n = input_layernorm(x), then x + feed_forward(pre_ff_layernorm(x)), the SwiGLU being
down_proj(up_proj(h) · silu(gate_proj(h) · m₀)) · m₁ with `mlp_multipliers` [m₀, m₁]. The mixer
(builder.blocks.mamba2, `mamba.*`) is Granite 4.0's but for its keys: intermediate `mamba_d_ssm`
(else mamba_expand · hidden_size), in_proj's input scaled by `ssm_in_multiplier` and its output
by `ssm_multipliers` (one per segment: z, x, B, C, dt), in_proj's bias `mamba_proj_bias` and
out_proj's `projectors_bias`, the gated norm only with `mamba_rms_norm` (`mamba_norm_before_gate`:
norm(y) · silu(z)). Attention scales k by `key_multiplier` before the rotary (the cache holds the
scaled keys). The embeddings are scaled by `embedding_multiplier`, the logits by
`lm_head_multiplier`; the final norm is `model.final_layernorm`.

Every multiplier that scales a projection's output or input is folded into its weight rows (and
bias) at write time, exact up to one rounding: ssm_in, ssm_multipliers, ssm_out,
attention_in, key, attention_out, mlp_multipliers; embedding and lm_head too when untied. Tied,
the shared table stays as stored and both scales stay in the graph.

State contract: every layer both attends and scans, so it reads past_key_values.%d.key/value,
then past.%d.conv (batch, conv_dim, mamba_d_conv − 1) and past.%d.recurrent (batch,
mamba_n_heads, mamba_d_head, mamba_d_state), transformers' cache layout, and returns them in that
order (FalconH1Config.layer_state). onnxruntime-genai 0.18 knows no falcon_h1: the
model declares Granite 4.0's type "granitemoehybrid" (its runtime keeps states by name).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from architectures import granite
from architectures.granitemoehybrid import MambaStates, resolve_mamba_keys
from builder.architecture import Weights, attention_weights
from builder.blocks import AttentionSpec, gated_mlp, self_attention
from builder.blocks.mamba2 import Mamba2Spec, Mamba2Weights, mamba2_mixer
from builder.blocks.vocabulary import Vocabulary
from builder.decoder_config import DecoderConfig
from builder.family import Decoder, Family, conv_padding, register, tied_vocabulary
from builder.io import logits_dtype
from builder.lazy import Weight
from builder.state import LayerState

# FalconH1Config's defaults where they differ from DecoderConfig's.
VARIANTS: dict[str, dict[str, Any]] = {"FalconH1ForCausalLM": dict(
    model_type="falcon_h1", vocab_size=128000, intermediate_size=14336, num_key_value_heads=8, rms_norm_eps=1e-5,
    max_position_embeddings=8192, pad_token_id=0,
)}
# genai 0.18 has no falcon_h1: Granite 4.0's type carries the same KV, conv and SSM state names.
STRUCTURE: dict[str, dict[str, Any]] = {"FalconH1ForCausalLM": dict(model_type="granitemoehybrid")}
HYBRID = "hybrid"  # FalconH1Config.layers_block_type: attention and Mamba in every layer


@dataclass(frozen=True)
class FalconH1Config(MambaStates, DecoderConfig):
    """config.json of Falcon-H1: the shared decoder keys, the Mamba-2 mixer's and the μP
    multipliers (FalconH1Config's defaults; `head_dim` is read when config.json has it)."""

    LAYER_TYPES: ClassVar[tuple[str, ...]] = (HYBRID,)

    mlp_bias: bool = False
    projectors_bias: bool = False
    mamba_d_ssm: int | None = 1024
    mamba_n_heads: int = 128
    mamba_d_head: int | str = "auto"
    mamba_n_groups: int = 1
    mamba_d_state: int = 256
    mamba_d_conv: int = 4
    mamba_expand: int = 2
    mamba_chunk_size: int = 256
    mamba_conv_bias: bool = True
    mamba_proj_bias: bool = False
    mamba_norm_before_gate: bool = True
    mamba_rms_norm: bool = False
    # transformers writes an infinite limit as {"__float__": "Infinity"} (strict JSON has no Infinity).
    time_step_limit: list[float | dict[str, str]] | None = None
    lm_head_multiplier: float = 1.0
    embedding_multiplier: float = 1.0
    mlp_multipliers: list[float] | None = None  # [gate, down]
    key_multiplier: float = 1.0
    attention_out_multiplier: float = 1.0
    attention_in_multiplier: float = 1.0
    ssm_multipliers: list[float] | None = None  # [z, x, B, C, dt]
    ssm_in_multiplier: float = 1.0
    ssm_out_multiplier: float = 1.0

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        resolve_mamba_keys(self, self.mamba_intermediate,
                           "mamba_d_ssm" if self.mamba_d_ssm is not None else "mamba_expand · hidden_size")
        for key, count in (("mlp_multipliers", 2), ("ssm_multipliers", 5)):
            value = getattr(self, key)
            if value is None:
                set_(self, key, [1.0] * count)
            elif len(value) != count:
                raise ValueError(f"{key} has {len(value)} values; expected {count}")
        super().__post_init__()

    def default_layer_types(self) -> list[str]:
        """FalconH1Config.layers_block_type, whatever config.json says: every layer hybrid."""
        return [HYBRID] * self.num_hidden_layers

    @property
    def mamba_intermediate(self) -> int:
        return self.mamba_d_ssm if self.mamba_d_ssm is not None else self.mamba_expand * self.hidden_size

    @property
    def mamba(self) -> Mamba2Spec:
        limit = self.time_step_limit or (0.0, math.inf)
        return Mamba2Spec(self.mamba_n_heads, self.mamba_d_head, self.mamba_n_groups, self.mamba_d_state,
                          self.mamba_d_conv, self.rms_norm_eps, self.hidden_act, limit, norm=self.mamba_rms_norm,
                          norm_before_gate=self.mamba_norm_before_gate)

    @property
    def conv_layers(self) -> list[int]:
        """Every layer carries a conv state and an SSM state (and a KV cache: layer_state)."""
        return list(range(self.num_hidden_layers))

    def layer_state(self, layer: int) -> LayerState:
        """Every layer attends and scans: a KV cache, then the mixer's conv and SSM states, declared
        "full_attention" (genai allocates KV by the type and finds the other states by name)."""
        kv = DecoderConfig.layer_state(self, layer).kv
        return dataclasses.replace(MambaStates.layer_state(self, layer), kv=kv, kind="full_attention")


def scaled(w: Weight | None, m: float | np.ndarray) -> Weight | None:
    """`w` times `m` (a number, or one per row), in float32 at write time; `w` as stored where m is 1."""
    if w is None or np.all(np.asarray(m) == 1):
        return w
    rows = np.asarray(m, np.float32).reshape(-1, *[1] * (len(w.shape) - 1))  # (rows, 1, …) or (1, …)
    if len(w.shape) == 2:  # a block of rows at a time: an embedding or lm_head never whole in float32
        return w.map_rows(lambda: lambda a, start, stop: a.astype(np.float32) * (rows if len(rows) == 1 else
                                                                                 rows[start:stop]), np.float32)
    return w.map(lambda a: a.astype(np.float32) * rows, np.float32)


def mixer(d: Decoder, w: Weights, i: int, h):
    """FalconH1Mixer.forward times ssm_out_multiplier; returns (output, present conv, present SSM)."""
    c = d.c
    spec = c.mamba
    P, GN = spec.intermediate, spec.groups * spec.state_size
    raw = Mamba2Weights.read(w, spec, c.hidden_size, c.mamba_conv_bias, c.mamba_proj_bias, c.projectors_bias)
    # ssm_multipliers over in_proj's rows: z (P), x (P), B (G·N), C (G·N), dt (heads), FalconH1's mup_vector.
    rows = np.repeat(np.float32(c.ssm_multipliers), [P, P, GN, GN, spec.heads])
    weights = Mamba2Weights(
        in_proj=scaled(raw.in_proj, rows * np.float32(c.ssm_in_multiplier)), conv=raw.conv, dt_bias=raw.dt_bias,
        A_log=raw.A_log, D=raw.D, out_proj=scaled(raw.out_proj, c.ssm_out_multiplier), norm=raw.norm,
        conv_bias=raw.conv_bias, in_proj_bias=scaled(raw.in_proj_bias, rows),
        out_proj_bias=scaled(raw.out_proj_bias, c.ssm_out_multiplier),
    )
    return mamba2_mixer(d.g, h, weights, spec, d.io.conv[i], d.io.recurrent[i], d.prepared, d.target)


def attention(d: Decoder, w: Weights, i: int, h):
    """FalconH1Attention.forward on attention_in_multiplier · h, times attention_out_multiplier;
    returns (output, present key, present value)."""
    c = d.c
    a = attention_weights(w, c, c.attention_bias, c.attention_bias)
    m_in, m_k, m_out = c.attention_in_multiplier, c.key_multiplier, c.attention_out_multiplier
    a = dataclasses.replace(a, q=scaled(a.q, m_in), k=scaled(a.k, m_in * m_k), v=scaled(a.v, m_in),
                            o=scaled(a.o, m_out), k_bias=scaled(a.k_bias, m_k), o_bias=scaled(a.o_bias, m_out))
    spec = AttentionSpec(c.num_attention_heads, c.num_key_value_heads, c.head_dim)
    return self_attention(d.g, h, d.past(i), d.lengths, d.rotary, a, spec, d.target)


def feed_forward(d: Decoder, w: Weights, h):
    """FalconH1MLP.forward: the SwiGLU with mlp_multipliers folded into gate_proj and down_proj."""
    c = d.c
    H, I = c.hidden_size, c.intermediate_size
    gate_m, down_m = c.mlp_multipliers
    biases = (scaled(w("gate_proj.bias", I), gate_m), w("up_proj.bias", I),
              scaled(w("down_proj.bias", H), down_m)) if c.mlp_bias else None
    return gated_mlp(d.g, h, scaled(w("gate_proj.weight", I, H), gate_m), w("up_proj.weight", I, H),
                     scaled(w("down_proj.weight", H, I), down_m), c.hidden_act, d.target, biases)


def decoder_layer(d: Decoder, w: Weights, i: int):
    """FalconH1DecoderLayer.forward; returns the layer's present (key, value, conv, SSM state)."""
    g, c = d.g, d.c
    with g.scope("input_layernorm"):
        h = d.stream.norm(w("input_layernorm.weight", c.hidden_size))
    with g.scope("mamba"):
        m, conv, ssm = mixer(d, w.under("mamba."), i, h)
    with g.scope("self_attn"):
        a, key, value = attention(d, w.under("self_attn."), i, h)
    d.stream.add(g.op.Add(m, a))
    with g.scope("pre_ff_layernorm"):
        h = d.stream.norm(w("pre_ff_layernorm.weight", c.hidden_size))
    with g.scope("feed_forward"):
        d.stream.add(feed_forward(d, w.under("feed_forward."), h))
    return key, value, conv, ssm


def vocabulary(d: Decoder) -> Vocabulary:
    """The embedding and lm_head with their multipliers folded in when untied; tied, as stored."""
    v = tied_vocabulary(d)
    if v.shared is not None:
        return v
    return Vocabulary.create(d.g, scaled(v.embedding, d.c.embedding_multiplier), scaled(v.head, d.c.lm_head_multiplier),
                             False, d.target)


def embed(d: Decoder):
    """embed_tokens(ids) · embedding_multiplier, the multiplier in the graph only for a tied table."""
    return granite.embed(d) if d.vocab.shared is not None else d.vocab.embed(d.g, d.io.input_ids)


def logits(d: Decoder, h):
    """lm_head(h) · lm_head_multiplier, the multiplier in the graph only for a tied table."""
    out = d.vocab.logits(d.g, h)
    m = d.c.lm_head_multiplier
    if d.vocab.shared is None or m == 1:
        return out
    with d.g.scope("lm_head"):
        return d.g.op.Mul(out, d.g.constant(m, logits_dtype(d.target.io_dtype)))


def final_norm(d: Decoder):
    """model.final_layernorm over the residual stream."""
    with d.g.scope("model", "final_layernorm"):
        return d.stream.norm(d.ckpt.weight("model.final_layernorm.weight", (d.c.hidden_size,)))


FAMILY = register(Family(
    "falcon_h1", FalconH1Config, decoder_layer, VARIANTS, structure=STRUCTURE, prepare=conv_padding,
    vocabulary=vocabulary, embed=embed, logits=logits, final_norm=final_norm,
))

__all__ = ["FAMILY", "STRUCTURE", "VARIANTS", "FalconH1Config", "decoder_layer"]
