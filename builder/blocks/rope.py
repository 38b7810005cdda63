"""Rotary position embeddings: the inverse frequencies of each Hugging Face `rope_type`, and the
cos/sin caches GroupQueryAttention reads ([max_positions, rotary_dim / 2]).

GroupQueryAttention rotates q and k itself (do_rotary=1) when the rotary dimension is a multiple
of 16. Other dimensions (a 32-wide head with partial_rotary_factor 0.75 rotates 24), and models
that normalize q and k after the rotation (HunYuan), get an `ExplicitRotary` instead: a
com.microsoft::RotaryEmbedding node per q and k before the attention, at the positions
GroupQueryAttention would use.

The arithmetic follows transformers' `modeling_rope_utils` in float32, as torch does it there,
so the caches match Hugging Face's cos/sin to the last bit or two.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx_ir as ir

from builder.errors import BuildError
from builder.graph import Graph
from builder.lazy import Weight
from builder.target import Target

ROPE_TYPES = ("default", "linear", "dynamic", "llama3", "yarn", "longrope", "proportional")


@dataclass(frozen=True)
class Rope:
    """inv_freq: float32 [rotary_dim / 2]; attention_factor scales cos and sin (yarn, longrope)."""

    inv_freq: np.ndarray
    attention_factor: float = 1.0

    @property
    def rotary_dim(self) -> int:
        return 2 * len(self.inv_freq)

    @classmethod
    def from_parameters(cls, params: dict[str, Any], head_dim: int, max_position_embeddings: int) -> Rope:
        """Reads a standardized `rope_parameters` dict (see architectures' config parsing). A GGUF's
        `freq_factors` (llama.cpp's rope_freqs tensor, how it stores Llama 3.1's scaling) divide the
        frequencies, as its rope kernels do."""
        rope = cls._scaled(params, head_dim, max_position_embeddings)
        if params.get("freq_factors") is None:
            return rope
        factors = np.asarray(params["freq_factors"], dtype=np.float32)
        if factors.shape != rope.inv_freq.shape:
            raise BuildError(f"{len(factors)} rotary frequency factors for {len(rope.inv_freq)} frequencies")
        return cls((rope.inv_freq / factors).astype(np.float32), rope.attention_factor)

    @classmethod
    def _scaled(cls, params: dict[str, Any], head_dim: int, max_position_embeddings: int) -> Rope:
        rope_type = params.get("rope_type", "default")
        base = float(params["rope_theta"])
        if rope_type == "proportional":
            return cls(proportional_inv_freq(params, base, head_dim))
        # An odd share of the head makes ceil(dim / 2) frequencies, as transformers' arange(0, dim, 2)
        # does: one more dimension rotates (Phi and StableLM cannot run it: StableLmConfig refuses).
        dim = int(head_dim * params.get("partial_rotary_factor", 1.0))
        inv_freq = default_inv_freq(base, dim)
        if rope_type in ("default", "dynamic"):
            # Dynamic NTK only departs from the default past max_position_embeddings, beyond the
            # context the model is built for.
            return cls(inv_freq)
        if rope_type == "linear":
            return cls((inv_freq / np.float32(params["factor"])).astype(np.float32))
        if rope_type == "llama3":
            return cls(llama3_inv_freq(inv_freq, params))
        if rope_type == "yarn":
            return yarn(params, base, dim, max_position_embeddings)
        if rope_type == "longrope":
            return longrope(params, base, dim, max_position_embeddings, long=False)
        raise BuildError(f"unsupported rope_type {rope_type!r}; supported: {', '.join(ROPE_TYPES)}")

    def caches(self, max_positions: int, dtype: np.dtype) -> tuple[Weight, Weight]:
        """Lazy cos and sin tables, computed in float32 when written, stored in `dtype`."""
        half = len(self.inv_freq)

        def table(fn):
            def compute() -> np.ndarray:
                freqs = np.arange(max_positions, dtype=np.float32)[:, None] * self.inv_freq[None, :]
                out = fn(freqs)
                if self.attention_factor != 1.0:
                    out *= np.float32(self.attention_factor)
                return out

            weight = Weight.computed((max_positions, half), np.float32, compute)
            # What determines the table: another model of the build with the same rotary (a draft
            # head beside its decoder) reads the stored one (builder/writer.py's content keys).
            weight.derived = ("rotary", fn.__name__, self.inv_freq.tobytes(), float(self.attention_factor),
                              max_positions)
            return weight.astype(dtype)

        return table(np.cos), table(np.sin)


def default_inv_freq(base: float, dim: int) -> np.ndarray:
    # 1 / base^(2i/dim), with the exponent formed in float32 as torch.arange(...).float() / dim does.
    exponent = np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim)
    return (1.0 / np.power(np.float32(base), exponent)).astype(np.float32)


def proportional_inv_freq(params: dict[str, Any], base: float, head_dim: int) -> np.ndarray:
    """Gemma 4's full layers (transformers' _compute_proportional_rope_parameters): the first
    partial_rotary_factor of the head's pairs at 1 / base^(2i / head_dim) (exponents over the whole
    head), the rest at frequency 0 (cos 1, sin 0: not rotated); the table spans the whole head."""
    angles = int(params.get("partial_rotary_factor", 1.0) * head_dim // 2)
    inv_freq = np.zeros(head_dim // 2, np.float32)
    inv_freq[:angles] = default_inv_freq(base, head_dim)[:angles]
    return (inv_freq / np.float32(params.get("factor", 1.0))).astype(np.float32)


def llama3_inv_freq(inv_freq: np.ndarray, params: dict[str, Any]) -> np.ndarray:
    """Llama 3.1's band-wise scaling: low frequencies divided by `factor`, high ones kept, a ramp between."""
    factor = params["factor"]
    low, high = params["low_freq_factor"], params["high_freq_factor"]
    old_context = params["original_max_position_embeddings"]
    wavelen = (2 * math.pi / inv_freq).astype(np.float32)
    scaled = np.where(wavelen > old_context / low, inv_freq / np.float32(factor), inv_freq).astype(np.float32)
    medium = ~(wavelen < old_context / high) & ~(wavelen > old_context / low)
    # low == high (Llama 4 Scout: both 1.0) leaves no band between the two wavelengths, and the ramp
    # divides by zero; low > high leaves none either. transformers computes the ramp everywhere
    # and takes it only inside the band, so only a wavelength exactly on the edge reads it.
    with np.errstate(divide="ignore", invalid="ignore"):
        smooth = ((old_context / wavelen - low) / np.float32(high - low)).astype(np.float32)
        smoothed = ((1 - smooth) * scaled / np.float32(factor) + smooth * scaled).astype(np.float32)
    result = np.where(medium, smoothed, scaled).astype(np.float32)
    if not np.isfinite(result).all():
        raise BuildError(f"llama3 rope: low_freq_factor = high_freq_factor ({low}) puts a frequency exactly on the "
                         "band's edge, where transformers' ramp is 0/0: the model would compute NaN")
    return result


def yarn(params: dict[str, Any], base: float, dim: int, max_position_embeddings: int) -> Rope:
    """YaRN (transformers' `_compute_yarn_parameters`): a per-dimension blend of interpolated and
    extrapolated frequencies, with an attention factor applied to cos and sin."""
    factor = params.get("factor")
    original = params["original_max_position_embeddings"]
    if factor is None:
        factor = max_position_embeddings / original

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention_factor = params.get("attention_factor")
    if attention_factor is None:
        m, m_all = params.get("mscale"), params.get("mscale_all_dim")
        attention_factor = mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor)
    beta_fast = params.get("beta_fast") or 32
    beta_slow = params.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if params.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - low) / (high - low), 0, 1).astype(np.float32)
    pos_freqs = np.power(np.float32(base), np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim))
    extrapolation = (1.0 / pos_freqs).astype(np.float32)
    interpolation = (1.0 / (np.float32(factor) * pos_freqs)).astype(np.float32)
    extrapolation_factor = (1 - ramp).astype(np.float32)
    inv_freq = interpolation * (1 - extrapolation_factor) + extrapolation * extrapolation_factor
    return Rope(inv_freq.astype(np.float32), float(attention_factor))


def longrope(params: dict[str, Any], base: float, dim: int, max_position_embeddings: int, long: bool) -> Rope:
    """Phi-3's LongRoPE (transformers' `_compute_longrope_parameters`): per-dimension factors, the
    short set within the pretraining length, the long set beyond it; `attention_factor` scales cos and sin."""
    original = params["original_max_position_embeddings"]
    factor = params.get("factor") or max_position_embeddings / original
    attention_factor = params.get("attention_factor")
    if attention_factor is None:
        attention_factor = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    ext = np.asarray(params["long_factor" if long else "short_factor"], dtype=np.float32)
    exponent = np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim)
    inv_freq = np.float32(1.0) / (ext * np.power(np.float32(base), exponent, dtype=np.float32))
    return Rope(inv_freq.astype(np.float32), float(attention_factor))


def fused_rotary_fits(rotary_dim: int, head_size: int) -> bool:
    """Whether GroupQueryAttention's fused rotary (do_rotary=1) takes these widths: ONNX Runtime's
    kernels refuse a cos_cache whose width (rotary_dim / 2) is not a multiple of 8 and, when they
    rotate, a head_size that is not a multiple of 16 ("head_size shall be a multiple of 16"), at
    the model's first run, not when the session is made."""
    return rotary_dim % 16 == 0 and head_size % 16 == 0


def rotary_tables(
    g: Graph, rope: Rope, max_positions: int, target: Target, name: str = "", explicit: bool = False,
    head_size: int | None = None,
) -> tuple[ir.Value, ir.Value]:
    """Registers the cos/sin caches as initializers `model.rotary_emb.<name>cos_cache` / `sin_cache`.

    Returns them as a (cos, sin) pair for GroupQueryAttention's fused rotary, or as an
    `ExplicitRotary` when that cannot do it: widths it does not take (fused_rotary_fits; `head_size`:
    the attention's head, default the rotary's width), or `explicit` (something must run between
    the rotation and the attention, as HunYuan's q/k norms).
    """
    cos, sin = rope.caches(target.positions(max_positions), target.io_dtype)
    with g.scope("model", "rotary_emb"):
        tables = g.weight(f"{name}cos_cache", cos), g.weight(f"{name}sin_cache", sin)
    fits = fused_rotary_fits(rope.rotary_dim, head_size or rope.rotary_dim)
    if explicit or not fits or not target.provider.fused_rotary or target.standard_ops:
        return ExplicitRotary(*tables, rope.rotary_dim, target.standard_ops)
    return tables


@dataclass(frozen=True, eq=False)
class ExplicitRotary:
    """Cos/sin tables ([positions, rotary_dim / 2]) applied to q and k by com.microsoft::RotaryEmbedding
    before GroupQueryAttention, which then runs with do_rotary=0. Iterates as (cos, sin)."""

    cos: ir.Value
    sin: ir.Value
    rotary_dim: int
    standard: bool = False  # ONNX's RotaryEmbedding (opset 23) instead of com.microsoft's
    _positions: list[ir.Value] = field(default_factory=list, repr=False)  # computed once per model

    def __iter__(self):
        return iter((self.cos, self.sin))

    def positions(self, g: Graph, x: ir.Value, seqlens_k: ir.Value) -> ir.Value:
        """int64 [batch, sequence]: each new token's position, as GroupQueryAttention derives it per
        batch row (group_query_attention.cc): past = seqlens_k + 1 − sequence_length, or 0 for a
        first prompt (where a right-padded row would make it negative), then past, past + 1, ….
        Recorded the first time a layer asks for it, and shared by all layers. Where the provider
        has onnxruntime-genai feed positions (Target.provider.position_ids), the model's
        `position_ids` input instead."""
        if g.position_ids is not None:
            return g.position_ids
        if not self._positions:
            with g.scope("rotary_positions"):
                seq = g.op.Shape(x, start=1, end=2)  # (1,): sequence_length
                past = g.op.Sub(g.op.Cast(seqlens_k, to=ir.DataType.INT64), g.op.Sub(seq, g.constant([1], "int64")))
                past = g.op.Max(past, g.constant([0], "int64"))  # (B,)
                steps = g.op.Range(g.constant(0, "int64"), g.op.Squeeze(seq), g.constant(1, "int64"))  # (S,)
                self._positions.append(g.op.Add(g.op.Unsqueeze(past, g.constant([1], "int64")), steps))  # (B, S)
        return self._positions[0]

    def rotate(self, g: Graph, x: ir.Value, heads: int, seqlens_k: ir.Value, interleaved: bool) -> ir.Value:
        """(B, S, heads·head_dim) -> the same, the first rotary_dim of each head rotated (rotate_half
        halves, or pairs when `interleaved`), the rest passed through, as transformers' partial rotary."""
        positions = self.positions(g, x, seqlens_k)
        if self.standard:
            return g.op.RotaryEmbedding(x, self.cos, self.sin, positions, num_heads=heads,
                                        rotary_embedding_dim=self.rotary_dim, interleaved=int(interleaved))
        return g.ms.RotaryEmbedding(x, positions, self.cos, self.sin, num_heads=heads,
                                    rotary_embedding_dim=self.rotary_dim, interleaved=int(interleaved))



@dataclass(frozen=True, eq=False)
class MultimodalRotary(ExplicitRotary):
    """Qwen-VL's multimodal rotary (M-RoPE): each token has three positions (temporal, height,
    width; genai's position_ids (3, B, S)) and each rotary frequency reads one of them. `cos`/`sin`
    are per-token tables (B·S, rotary_dim / 2) made from those positions by `multimodal_rotary`;
    RotaryEmbedding reads token n's row at position n."""

    def positions(self, g: Graph, x: ir.Value, seqlens_k: ir.Value) -> ir.Value:
        return self._positions[0]


def mrope_rows(sections: list[int], interleaved: bool) -> np.ndarray:
    """Which of the three position rows (0 temporal, 1 height, 2 width) each rotary frequency
    reads: `mrope_section` consecutive runs (Qwen2-VL, Qwen2.5-VL: transformers' per-section split),
    or interleaved t, h, w, t, h, w, … while each section lasts, then temporal (Qwen3-VL's
    apply_interleaved_mrope)."""
    half = sum(sections)
    if not interleaved:
        return np.repeat(np.arange(3), sections)
    rows = np.zeros(half, np.int64)
    for row in (1, 2):
        rows[row: 3 * sections[row]: 3] = row
    return rows


def multimodal_rotary(g: Graph, rope: Rope, max_positions: int, position_ids: ir.Value, sections: list[int],
                      target: Target, interleaved: bool = False) -> MultimodalRotary:
    """The M-RoPE tables of `position_ids` (3, B, S): cos and sin of each token's own position per
    frequency (transformers' Qwen2_5_VLRotaryEmbedding: the frequency's row of the three), as
    (B·S, rotary_dim / 2) tables indexed by the token's place; q and k are then rotated before
    GroupQueryAttention (do_rotary=0)."""
    half = len(rope.inv_freq)
    if sum(sections) != half:
        raise BuildError(f"mrope_section {sections} sums to {sum(sections)}, but the head rotates {half} frequencies")
    cos, sin = rope.caches(target.positions(max_positions), target.io_dtype)
    # (3, 1, 1, half): 1 where the frequency reads that row; a sum over rows then picks it exactly.
    select = (mrope_rows(sections, interleaved)[None, :] == np.arange(3)[:, None]).astype(target.io_dtype)
    with g.scope("model", "rotary_emb"):
        tables = g.weight("cos_cache", cos), g.weight("sin_cache", sin)
        choose = g.constant(select.reshape(3, 1, 1, half))
        per_token = []
        for table in tables:
            rows = g.op.Gather(table, position_ids, axis=0)  # (3, B, S, half)
            picked = g.op.ReduceSum(g.op.Mul(rows, choose), g.constant([0], "int64"), keepdims=0)  # -> (B, S, half)
            per_token.append(g.op.Reshape(picked, g.constant([-1, half], "int64")))  # -> (B·S, half)
        shape = g.op.Shape(position_ids, start=1, end=3)  # (2,): B, S
        count = g.op.ReduceProd(shape, keepdims=0)  # B·S
        places = g.op.Reshape(g.op.Range(g.constant(0, "int64"), count, g.constant(1, "int64")), shape)  # (B, S)
    return MultimodalRotary(*per_token, rope.rotary_dim, _positions=[places])


def rotary_tables_by_layer_type(
    g: Graph, parameters: dict[str, Any], layer_types: list[str], head_dim: int, max_positions: int, target: Target,
) -> dict[str, tuple[ir.Value, ir.Value]]:
    """The (cos, sin) tables for each layer type. `parameters` is one rope_parameters dict for all
    layers, or one per layer type (`{"full_attention": {...}, "sliding_attention": {...}}`, as
    Gemma 3's config resolves): then each type gets its own tables, `full_cos_cache`, ...."""
    if not all(t in parameters for t in layer_types):
        tables = rotary_tables(g, Rope.from_parameters(parameters, head_dim, max_positions), max_positions, target,
                               head_size=head_dim)
        return {t: tables for t in layer_types}
    return {
        t: rotary_tables(g, Rope.from_parameters(parameters[t], head_dim, max_positions), max_positions, target,
                         t.split("_")[0] + "_", head_size=head_dim)
        for t in dict.fromkeys(layer_types)
    }


def longrope_tables(
    g: Graph, params: dict[str, Any], head_dim: int, max_positions: int, total_sequence_length: ir.Value,
    target: Target, long_attention_factor: float | None = None,
) -> tuple[ir.Value, ir.Value]:
    """Short and long LongRoPE tables, chosen per run as transformers does: the long ones once the
    sequence (past + new tokens) passes original_max_position_embeddings, for every position.
    `long_attention_factor`, when given, scales the long tables' cos and sin in place of the
    attention factor of `params` (Phi-3.5-MoE's long_mscale: its scale switches with the tables)."""
    base, dim = float(params["rope_theta"]), int(head_dim * params.get("partial_rotary_factor", 1.0))
    long_params = params if long_attention_factor is None else {**params, "attention_factor": long_attention_factor}
    short = rotary_tables(g, longrope(params, base, dim, max_positions, long=False), max_positions, target, "short_",
                          head_size=head_dim)
    long = rotary_tables(g, longrope(long_params, base, dim, max_positions, long=True), max_positions, target, "long_",
                         head_size=head_dim)
    with g.scope("model", "rotary_emb"):
        threshold = g.constant(params["original_max_position_embeddings"], np.int32)
        is_long = g.op.Greater(total_sequence_length, threshold)
        if target.provider.if_op:
            tables = g.op.If(is_long, then_branch=_select(short, long, "long"),
                             else_branch=_select(short, long, "short"), _outputs=2)
        else:  # providers without If (DirectML, TensorRT-RTX): both tables read, one kept
            tables = tuple(g.op.Where(is_long, b, a) for a, b in zip(short, long))
    return ExplicitRotary(*tables, short.rotary_dim, short.standard) if isinstance(short, ExplicitRotary) else tables


def _select(short: tuple[ir.Value, ir.Value], long: tuple[ir.Value, ir.Value], which: str) -> ir.Graph:
    """An If branch that passes the chosen outer-scope tables through."""
    tables = long if which == "long" else short
    nodes = [ir.Node("", "Identity", [t], num_outputs=1, name=f"/model/rotary_emb/{which}/{kind}")
             for t, kind in zip(tables, ("cos", "sin"))]
    for node, table in zip(nodes, tables):
        out = node.outputs[0]
        out.name, out.type, out.shape = f"{node.name}/output_0", table.type, table.shape
    return ir.Graph(inputs=[], outputs=[n.outputs[0] for n in nodes], nodes=nodes, name=f"{which}_rope")
