"""Zyphra Zamba2 (Zamba2ForCausalLM): Mamba-2 layers, a few of them "hybrid": before its mixer, a
hybrid layer runs one of `num_mem_blocks` shared transformer blocks on the concatenation of the
hidden state and the original embeddings.

Reference: transformers/models/zamba2/modular_zamba2.py. `layers_block_type` says which layers are
plain Mamba layers (x + mamba(input_layernorm(x))) and which are hybrid. Hybrid layer j, the k-th
hybrid layer, runs shared block k mod num_mem_blocks: with tie_word_embeddings (the default),
the one stored under the first hybrid layer using it (`model.layers.{first}.shared_transformer.*`:
transformers ties the others' copies to it, and saves it alone); without, transformers ties
nothing, and each hybrid layer reads its own copy (`model.layers.{j}.shared_transformer.*`):

    s = input_layernorm(concat(x, embeddings))          an RMSNorm over 2·hidden_size
    a = o_proj(attention(s))                            q/k/v read 2·hidden_size, heads of 2·H/heads
    t = linear(down_proj(act(gate) · up))               gate, up = gate_up_proj(pre_ff_layernorm(a))
    x = x + mamba(input_layernorm(x + t))               mamba_decoder.*: t joins the mixer's input only

with no residual inside the block. Each application has its own LoRA adapters on the shared
weights (`…_adapter_list.{k}.0` = A, `.1` = B): on gate_up_proj always, on q/k/v with
`use_shared_attention_adapter`; they are folded here, W + B·A in float32, into the application's
own copy of that weight (exact up to one rounding; the shared weight is then stored once per
application). Its own `linear` projects the block's output back. Attention scales by
(head_dim / 2)^-½ and rotates the whole head only with `use_mem_rope` (no rotary otherwise); no
projection has a bias. The mixer is builder.blocks.mamba2 with Zamba2's keys (`n_mamba_heads`,
`mamba_ngroups`, …): its conv always has a bias (`use_conv_bias` is not read), in_proj and
out_proj have `add_bias_linear`'s (as gate_up_proj and down_proj), the gated norm's eps is 1e-5,
dt is clamped from below by `time_step_min` at prefill (transformers' decode step does not clamp).
The final norm is `model.final_layernorm`; the embeddings are tied by default.

State contract (transformers' cache numbering: the shared block's KV sits at the hybrid layer's own
index): Mamba layers past.%d.conv (batch, conv_dim, mamba_d_conv − 1) and past.%d.recurrent
(batch, n_mamba_heads, mamba_headdim, mamba_d_state); hybrid layers past_key_values.%d.key/value,
then those two, as Falcon-H1's layers (architectures/falcon_h1.py). onnxruntime-genai 0.18 knows no
zamba2: the model declares Granite 4.0's type "granitemoehybrid" (its runtime keeps states by name).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from architectures.falcon_h1 import final_norm
from architectures.granitemoehybrid import LEGACY, MAMBA, MambaStates, mixer
from builder.architecture import Weights
from builder.blocks import AttentionSpec, gated_mlp, self_attention
from builder.blocks.attention import AttentionWeights
from builder.blocks.linear import linear
from builder.blocks.mamba2 import Mamba2Spec
from builder.blocks.norm import rms_norm, skip_rms_norm
from builder.blocks.residual import ResidualStream
from builder.decoder_config import DecoderConfig
from builder.family import Decoder, Family, conv_padding, parse, register, rotary
from builder.lazy import Weight
from builder.state import LayerState

HYBRID = "hybrid"
# Zamba2Config's defaults where they differ from DecoderConfig's (intermediate_size: 4 · hidden_size).
VARIANTS: dict[str, dict[str, Any]] = {"Zamba2ForCausalLM": dict(
    model_type="zamba2", vocab_size=32000, max_position_embeddings=4096, hidden_size=2560, num_hidden_layers=54,
    intermediate_size=None, hidden_act="gelu", num_attention_heads=32, rms_norm_eps=1e-5, pad_token_id=0,
    bos_token_id=1, eos_token_id=2, tie_word_embeddings=True,
)}
# genai 0.18 has no zamba2: Granite 4.0's type carries the same KV, conv and SSM state names.
STRUCTURE: dict[str, dict[str, Any]] = {"Zamba2ForCausalLM": dict(model_type="granitemoehybrid")}


@dataclass(frozen=True)
class Zamba2Config(MambaStates, DecoderConfig):
    """config.json of Zamba2: the shared decoder keys, the Mamba-2 mixer's, the shared blocks'
    (Zamba2Config's defaults). Derived as transformers derives them, whatever config.json says:
    head_dim (2 · hidden_size / heads), the mixer's head width, the hybrid layers."""

    LAYER_TYPES: ClassVar[tuple[str, ...]] = (MAMBA, HYBRID, *LEGACY)

    intermediate_size: int | None = None
    layers_block_type: list[str] | None = None
    mamba_d_state: int = 64
    mamba_d_conv: int = 4
    mamba_expand: int = 2
    mamba_ngroups: int = 1
    n_mamba_heads: int = 8
    time_step_min: float = 0.001
    use_conv_bias: bool = True  # not read by transformers: the conv always has a bias
    chunk_size: int = 256
    add_bias_linear: bool = False
    num_mem_blocks: int = 1
    use_shared_attention_adapter: bool = False
    adapter_rank: int = 128
    use_mem_rope: bool = False
    use_long_context: bool = False

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        H = self.hidden_size
        set_(self, "intermediate_size", self.intermediate_size or 4 * H)
        set_(self, "head_dim", 2 * H // self.num_attention_heads)
        if self.use_long_context:
            set_(self, "max_position_embeddings", 16384)
        types = self.layers_block_type if self.layers_block_type is not None else self.layer_types
        if types is not None:
            types = [LEGACY.get(t, t) for t in types]
            if any(t not in (MAMBA, HYBRID) for t in types):
                raise ValueError(f"layers_block_type has {next(t for t in types if t not in (MAMBA, HYBRID))!r}; "
                                 "Zamba2 layers are 'mamba' or 'hybrid'")
            set_(self, "layer_types", types)
        if self.mamba_expand * H % self.n_mamba_heads:
            raise ValueError(f"n_mamba_heads ({self.n_mamba_heads}) must divide mamba_expand · hidden_size "
                             f"({self.mamba_expand * H})")
        if self.n_mamba_heads % self.mamba_ngroups:
            raise ValueError(f"mamba_ngroups ({self.mamba_ngroups}) must divide n_mamba_heads ({self.n_mamba_heads})")
        if self.mamba_d_conv < 2:
            raise ValueError(f"mamba_d_conv {self.mamba_d_conv}: the convolution needs at least 2 taps")
        if self.num_mem_blocks < 1:
            raise ValueError(f"num_mem_blocks {self.num_mem_blocks}: a hybrid layer needs a shared block")
        if self.use_shared_attention_adapter and self.num_key_value_heads not in (None, self.num_attention_heads):
            # the adapters project to 2 · hidden_size, k_proj and v_proj to kv_heads · head_dim
            raise ValueError(f"use_shared_attention_adapter with {self.num_key_value_heads} KV heads of "
                             f"{self.num_attention_heads}: transformers' k/v adapters fit only as many KV heads")
        if self.use_shared_attention_adapter and self.num_attention_heads * self.head_dim != 2 * H:
            raise ValueError(f"use_shared_attention_adapter with num_attention_heads ({self.num_attention_heads}) "
                             f"not dividing 2 · hidden_size ({2 * H}): transformers' adapters do not fit q_proj")
        super().__post_init__()

    def default_layer_types(self) -> list[str]:
        """Zamba2Config's pattern (54 layers: a hybrid layer every sixth, then closer), for any count."""
        pattern = [MAMBA] + ([MAMBA] * 5 + [HYBRID]) * 7 + [MAMBA] * 4 + [HYBRID] + [MAMBA] * 3 + [HYBRID] + [MAMBA] * 2
        if self.num_hidden_layers != len(pattern):
            raise ValueError(f"no layers_block_type for {self.num_hidden_layers} layers: transformers' default "
                             f"has {len(pattern)}")
        return pattern

    @property
    def hybrid_layer_ids(self) -> list[int]:
        return [i for i, kind in enumerate(self.layer_types) if kind == HYBRID]

    def shared_block_layer(self, layer: int) -> int:
        """The layer whose `shared_transformer.*` hybrid `layer` runs: tied, the first hybrid layer
        of its block (the blocks alternate over the hybrid layers: 0, 1, …, num_mem_blocks − 1, 0,
        …); untied, its own (transformers ties the blocks only with tie_word_embeddings)."""
        ids = self.hybrid_layer_ids
        return ids[ids.index(layer) % self.num_mem_blocks] if self.tie_word_embeddings else layer

    @property
    def mamba(self) -> Mamba2Spec:
        return Mamba2Spec(self.n_mamba_heads, self.mamba_expand * self.hidden_size // self.n_mamba_heads,
                          self.mamba_ngroups, self.mamba_d_state, self.mamba_d_conv, 1e-5, "silu",
                          (self.time_step_min, math.inf))

    # granitemoehybrid.mixer's keys
    mamba_conv_bias: ClassVar[bool] = True

    @property
    def mamba_proj_bias(self) -> bool:
        return self.add_bias_linear

    @property
    def conv_layers(self) -> list[int]:
        """Every layer scans (hybrid ones attend too: layer_state)."""
        return list(range(self.num_hidden_layers))

    def layer_state(self, layer: int) -> LayerState:
        """A Mamba layer's conv and SSM states; a hybrid layer's KV cache before them, declared
        "full_attention" (genai allocates KV by the type and finds the other states by name)."""
        state = MambaStates.layer_state(self, layer)
        if self.layer_types[layer] != HYBRID:
            return state
        return dataclasses.replace(state, kv=DecoderConfig.layer_state(self, layer).kv, kind="full_attention")


class EmbeddingStream(ResidualStream):
    """The residual stream that also keeps the embeddings it starts from (the shared blocks read them)."""

    def __init__(self, d: Decoder, x):
        super().__init__(d.g, x, d.c.rms_norm_eps, d.target)
        self.embeddings = x


def adapted(base: Weight, m: Weights, adapters: str, k: int, rank: int) -> Weight:
    """`base` with application k's adapter folded in, base + B·A in float32 (A = `{adapters}.{k}.0`
    (rank, in), B = `{adapters}.{k}.1` (out, rank)), a block of rows at a time."""
    a, b = m(f"{adapters}.{k}.0.weight", rank, base.shape[1]), m(f"{adapters}.{k}.1.weight", base.shape[0], rank)

    def make():
        af, bf = a.numpy().astype(np.float32), b.numpy().astype(np.float32)
        return lambda rows, start, stop: rows.astype(np.float32) + bf[start:stop] @ af

    return base.map_rows(make, np.float32)


def shared_block(d: Decoder, i: int, x):
    """Zamba2AttentionDecoderLayer.forward at hybrid layer i on (x, embeddings); returns (its
    output, before `linear`, the present key and value)."""
    g, c = d.g, d.c
    H, I, D, r = c.hidden_size, c.intermediate_size, c.head_dim, c.adapter_rank
    k = c.hybrid_layer_ids.index(i)  # this application's adapters
    s = Weights(d.ckpt, f"{d.prefix}layers.{c.shared_block_layer(i)}.shared_transformer.")
    with g.scope("input_layernorm"):
        h = rms_norm(g, g.op.Concat(x, d.stream.embeddings, axis=-1), s("input_layernorm.weight", 2 * H),
                     c.rms_norm_eps, d.target)
    a = s.under("self_attn.")
    q_dim, kv_dim = c.num_attention_heads * D, c.num_key_value_heads * D
    q, key, value = (a(f"{n}_proj.weight", rows, 2 * H) for n, rows in (("q", q_dim), ("k", kv_dim), ("v", kv_dim)))
    if c.use_shared_attention_adapter:
        q, key, value = (adapted(w, a, f"linear_{n}_adapter_list", k, r) for n, w in zip("qkv", (q, key, value)))
    with g.scope("self_attn"):
        spec = AttentionSpec(c.num_attention_heads, c.num_key_value_heads, D, scale=(D / 2) ** -0.5)
        h, key, value = self_attention(g, h, d.past(i), d.lengths, d.rotary,
                                       AttentionWeights(q=q, k=key, v=value, o=a("o_proj.weight", H, q_dim)), spec,
                                       d.target)
    with g.scope("pre_ff_layernorm"):
        h = rms_norm(g, h, s("pre_ff_layernorm.weight", H), c.rms_norm_eps, d.target)
    f = s.under("feed_forward.")
    gate_up = adapted(f("gate_up_proj.weight", 2 * I, H), f, "gate_up_proj_adapter_list", k, r)  # chunk(2): gate, up
    biases = None
    if c.add_bias_linear:
        gate_up_bias = f("gate_up_proj.bias", 2 * I)
        biases = (gate_up_bias.slice(0, 0, I), gate_up_bias.slice(0, I, 2 * I), f("down_proj.bias", H))
    with g.scope("feed_forward"):
        h = gated_mlp(g, h, gate_up.slice(0, 0, I), gate_up.slice(0, I, 2 * I), f("down_proj.weight", H, I),
                      c.hidden_act, d.target, biases)
    return h, key, value


def decoder_layer(d: Decoder, w: Weights, i: int):
    """Zamba2MambaDecoderLayer.forward, or Zamba2HybridLayer.forward; returns the layer's present
    state: (conv, SSM), or (key, value, conv, SSM)."""
    g, c = d.g, d.c
    H = c.hidden_size
    if c.layer_types[i] != HYBRID:
        with g.scope("input_layernorm"):
            h = d.stream.norm(w("input_layernorm.weight", H))
        with g.scope("mamba"):
            h, conv, ssm = mixer(d, w.under("mamba."), i, h)
        d.stream.add(h)
        return conv, ssm
    x = d.stream.value()
    with g.scope("shared_transformer"):
        t, key, value = shared_block(d, i, x)
    with g.scope("linear"):
        t = linear(g, t, w("linear.weight", H, H), d.target)
    m = w.under("mamba_decoder.")
    with g.scope("mamba_decoder", "input_layernorm"):  # norm(x + t); the residual stays x
        h, _ = skip_rms_norm(g, t, x, m("input_layernorm.weight", H), c.rms_norm_eps, d.target)
    with g.scope("mamba_decoder", "mamba"):
        h, conv, ssm = mixer(d, m.under("mamba."), i, h)
    d.stream.add(h)
    return key, value, conv, ssm


def parse_config(family: Family, raw: dict[str, Any], architecture: str) -> Zamba2Config:
    """`parse` with Zamba2Config's derived keys dropped (attention_head_dim, mamba_headdim,
    hybrid_layer_ids, …: recomputed from the others, as transformers does) and head_dim given as
    transformers derives it (2 · hidden_size / heads, which the shared check would refuse where
    the heads do not divide hidden_size itself)."""
    raw = {k: v for k, v in raw.items() if k not in ("head_dim", "attention_head_dim")}
    defaults = family.variants[architecture]
    H, heads = raw.get("hidden_size", defaults["hidden_size"]), raw.get("num_attention_heads",
                                                                         defaults["num_attention_heads"])
    if isinstance(H, int) and isinstance(heads, int) and heads > 0:
        raw["head_dim"] = 2 * H // heads
    return parse(family, raw, architecture)


def rotary_tables(d: Decoder):
    """The whole head's rotary with `use_mem_rope`, none otherwise."""
    return rotary(d) if d.c.use_mem_rope else None


FAMILY = register(Family(
    "zamba2", Zamba2Config, decoder_layer, VARIANTS, structure=STRUCTURE, parser=parse_config, rotary=rotary_tables,
    prepare=conv_padding, stream=EmbeddingStream, final_norm=final_norm,
    # tied, transformers replaces every later application's copy of a shared block by the first one
    ignored=("model.layers.*.shared_transformer.*",),
))

__all__ = ["FAMILY", "STRUCTURE", "VARIANTS", "Zamba2Config", "decoder_layer"]
