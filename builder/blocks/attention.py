"""Self-attention through ONNX Runtime's GroupQueryAttention, rotary embedding fused.

Q, K and V come from one fused projection (the three weights concatenated lazily); the optional
per-head q/k RMSNorm of Qwen3 and Gemma 3 (or LayerNorm of Phi, StableLM and Cohere) runs between
the projection and the attention op.
Rotary tables GroupQueryAttention cannot fuse (an `ExplicitRotary`) rotate q and k before it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

from builder.blocks.linear import linear
from builder.blocks.norm import layer_norm, rms_norm
from builder.blocks.rope import ExplicitRotary, fused_rotary_fits
from builder.errors import BuildError
from builder.graph import Graph
from builder.lazy import Weight
from builder.state import kv_head_size
from builder.target import Target


@dataclass(frozen=True)
class AttentionWeights:
    """Projection weights in Hugging Face's [out, in] layout; biases and q/k norms optional.
    A checkpoint that stores Q, K and V fused (Phi-3's qkv_proj) passes `qkv` instead of q, k, v.
    A q/k norm weight is [head_dim], shared by the heads, or [heads, head_dim], one norm per head
    (StableLM's LayerNormPerHead); its bias (LayerNorm only) has the same shape.
    `sinks` [num_heads] (gpt-oss): a learned logit per head that joins each softmax's denominator
    only, GroupQueryAttention's `head_sink` input."""

    o: Weight
    q: Weight | None = None
    k: Weight | None = None
    v: Weight | None = None
    qkv: Weight | None = None
    q_bias: Weight | None = None
    k_bias: Weight | None = None
    v_bias: Weight | None = None
    o_bias: Weight | None = None
    q_norm: Weight | None = None
    k_norm: Weight | None = None
    q_norm_bias: Weight | None = None
    k_norm_bias: Weight | None = None
    sinks: Weight | None = None


@dataclass(frozen=True)
class AttentionSpec:
    """Shape and numerics of one layer's attention.

    Attributes:
        scale: multiplies Q·Kᵀ; None means 1/√head_dim.
        window: sliding-window length (Hugging Face's `sliding_window`), or None for global.
        softcap: tanh soft-capping of the attention logits (Gemma 2), 0 for none.
        norm_eps: epsilon of the q/k norm, when there is one.
        rotary_interleaved: rotate pairs (x0, x1), (x2, x3), … (GLM, Cohere: rotate_every_two)
            instead of Hugging Face's usual rotate_half halves.
        qk_layer_norm: the q/k norms are LayerNorms (Phi, StableLM, Cohere's use_qk_norm) instead of
            RMSNorms; their weight is [head_dim], or [heads, head_dim] for one weight per head.
        qk_norm_whole: the q/k RMSNorm spans the whole projection, all heads at once (OLMo 2/3),
            instead of each head's vector.
        clip_qkv: clamps the q, k and v projections to [-clip_qkv, clip_qkv] (OLMo), None for none.
        qk_norm_after_rotary: the q/k norms apply to the rotated q and k (HunYuan) instead of
            before the rotation; needs an `ExplicitRotary`.
    """

    num_heads: int
    num_kv_heads: int
    head_dim: int
    scale: float | None = None
    window: int | None = None
    softcap: float = 0.0
    norm_eps: float = 1e-6
    rotary_interleaved: bool = False
    qk_layer_norm: bool = False
    qk_norm_whole: bool = False
    clip_qkv: float | None = None
    qk_norm_after_rotary: bool = False


@dataclass(frozen=True)
class SequenceLengths:
    """What GroupQueryAttention learns from the attention mask, computed once per model; the mask
    itself, and the boolean masks ONNX's Attention reads (standard_mask), made once per window."""

    seqlens_k: ir.Value  # int32 [batch]: tokens seen so far minus one
    total_sequence_length: ir.Value  # int32 scalar
    attention_mask: ir.Value | None = None  # int64 [batch, total]
    masks: dict = field(default_factory=dict, compare=False)  # window (0: none) -> bool (B, 1, S, total)


def sequence_lengths(g: Graph, attention_mask: ir.Value) -> SequenceLengths:
    """seqlens_k = int32(sum(mask, axis 1) − 1); total_sequence_length = int32(mask's dim 1)."""
    with g.scope("model", "attn_mask_reformat"):
        summed = g.op.ReduceSum(attention_mask, g.constant([1], "int64"), keepdims=0)  # (B, T) -> (B,)
        seqlens_k = g.op.Cast(g.op.Sub(summed, g.constant(1, "int64")), to=ir.DataType.INT32)
        total = g.op.Shape(attention_mask, start=1, end=2)  # (1,)
        total = g.op.Cast(g.op.Squeeze(total, g.constant([0], "int64")), to=ir.DataType.INT32)  # ()
    return SequenceLengths(seqlens_k, total, attention_mask)


def _head_norm(g: Graph, x: ir.Value, weight: Weight, heads: int, spec: AttentionSpec, target: Target,
               bias: Weight | None = None) -> ir.Value:
    """RMSNorm (or LayerNorm) over each head's vector: (B, S, H*D) -> (B, S, H, D) -> norm -> (B, S, H*D)."""
    if spec.qk_norm_whole:  # OLMo 2/3: one RMSNorm over the whole (B, S, H*D) projection
        return rms_norm(g, x, weight, spec.norm_eps, target)
    x = g.op.Reshape(x, g.constant([0, 0, heads, spec.head_dim], "int64"))
    if spec.qk_layer_norm:
        x = _head_layer_norm(g, x, weight, bias, spec, target)
    else:
        x = rms_norm(g, x, weight, spec.norm_eps, target)
    return g.op.Reshape(x, g.constant([0, 0, heads * spec.head_dim], "int64"))


def _head_layer_norm(g: Graph, x: ir.Value, weight: Weight, bias: Weight | None, spec: AttentionSpec,
                     target: Target) -> ir.Value:
    """LayerNorm over the last axis of (B, S, H, D). A [H, D] weight (one norm per head, StableLM)
    scales after a plain LayerNorm, since LayerNormalization's scale has the normalized shape (D)."""
    if len(weight.shape) == 1:
        return layer_norm(g, x, weight, bias, spec.norm_eps, target)
    x = layer_norm(g, x, None, None, spec.norm_eps, target, hidden=spec.head_dim)
    x = g.op.Mul(x, g.weight("weight", weight.astype(target.io_dtype)))  # (B, S, H, D) · (H, D)
    if bias is not None:
        x = g.op.Add(x, g.weight("bias", bias.astype(target.io_dtype)))
    return x


def _rotate(g: Graph, q: ir.Value, k: ir.Value, rotary: ExplicitRotary, lengths: SequenceLengths,
            spec: AttentionSpec) -> tuple[ir.Value, ir.Value]:
    """q and k rotated before GroupQueryAttention, which then runs with do_rotary=0."""
    with g.scope("q_rotary"):
        q = rotary.rotate(g, q, spec.num_heads, lengths.seqlens_k, spec.rotary_interleaved)
    with g.scope("k_rotary"):
        k = rotary.rotate(g, k, spec.num_kv_heads, lengths.seqlens_k, spec.rotary_interleaved)
    return q, k


def self_attention(
    g: Graph,
    x: ir.Value,
    past: tuple[ir.Value, ir.Value],
    lengths: SequenceLengths,
    rotary: tuple[ir.Value, ir.Value] | ExplicitRotary | None,
    w: AttentionWeights,
    spec: AttentionSpec,
    target: Target,
    q_scale: ir.Value | None = None,
    attention_bias: ir.Value | None = None,
) -> tuple[ir.Value, ir.Value, ir.Value]:
    """Returns (attention output after o_proj, present_key, present_value); `rotary` is (cos, sin)
    for GroupQueryAttention's fused rotary, an `ExplicitRotary` (q and k rotated before it), or None
    for a layer without rotary embedding (SmolLM3's and Cohere 2's global layers).
    `q_scale` (B, S, 1) multiplies each token's query by its own factor (Ministral 3's llama-4
    attention temperature); the rotary rotation is linear, so scaling before it equals after.
    `attention_bias` (B, 1, S, total) is added to the scores (Llama 4's chunk mask)."""
    qkv = _qkv_projection(g, x, w, spec, target)
    explicit = isinstance(rotary, ExplicitRotary)
    if spec.qk_norm_after_rotary and not explicit:
        raise ValueError("q/k norms after the rotary embedding need explicit rotary tables (rotary_tables(explicit=True))")
    if isinstance(qkv, tuple) or w.q_norm is not None or w.k_norm is not None or explicit or q_scale is not None:
        q, k, v = _queries_keys_values(g, qkv, rotary if explicit else None, lengths, w, spec, target, q_scale)
    else:
        q, k, v = qkv, None, None  # packed QKV input
    if explicit:
        rotary = None  # q and k are rotated: GroupQueryAttention runs with do_rotary=0
    out, present_k, present_v = group_query_attention(g, (q, k, v), past, lengths, rotary, w.sinks, spec, target,
                                                      attention_bias)
    with g.scope("o_proj"):
        out = linear(g, out, w.o, target, w.o_bias)
    return out, present_k, present_v


def _qkv_projection(g: Graph, x: ir.Value, w: AttentionWeights, spec: AttentionSpec,
                    target: Target) -> ir.Value | tuple[ir.Value, ir.Value, ir.Value]:
    """q, k and v projected by one MatMul over the concatenated weights (and biases), clipped
    where the spec says: (B, S, hidden) -> (B, S, q_dim + 2·kv_dim); or, for a provider that
    takes them apart (Target.provider.packed_qkv), three projections (q, k, v)."""
    q_dim, kv_dim = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
    if not target.provider.packed_qkv and w.qkv is None:
        parts = []
        for name, weight, bias in (("q_proj", w.q, w.q_bias), ("k_proj", w.k, w.k_bias), ("v_proj", w.v, w.v_bias)):
            with g.scope(name):
                y = linear(g, x, weight, target, bias)
            if spec.clip_qkv is not None:
                y = g.op.Clip(y, g.constant(-spec.clip_qkv, target.io_dtype), g.constant(spec.clip_qkv, target.io_dtype))
            parts.append(y)
        return tuple(parts)
    bias = _qkv_bias(w)
    fused = w.qkv if w.qkv is not None else Weight.concat([w.q, w.k, w.v], axis=0)
    if fused.shape[0] != q_dim + 2 * kv_dim:
        raise ValueError(f"fused QKV weight has {fused.shape[0]} rows, expected {q_dim + 2 * kv_dim}")
    with g.scope("qkv_proj"):
        qkv = linear(g, x, fused, target, bias)  # (B, S, q_dim + 2·kv_dim)
    if spec.clip_qkv is not None:
        qkv = g.op.Clip(qkv, g.constant(-spec.clip_qkv, target.io_dtype), g.constant(spec.clip_qkv, target.io_dtype))
    return qkv


def _qkv_bias(w: AttentionWeights) -> Weight | None:
    """The q, k and v biases concatenated as the fused projection's, or None without biases."""
    biases = (w.q_bias, w.k_bias, w.v_bias)
    if all(b is None for b in biases):
        return None
    if not all(b is not None for b in biases):
        raise ValueError("q/k/v biases must be all present or all absent")
    return Weight.concat(biases, axis=0)


def split_packed(g: Graph, qkv: ir.Value, spec: AttentionSpec) -> tuple[ir.Value, ir.Value, ir.Value]:
    """q, k and v of the packed projection: (B, S, Hq·D + 2·Hkv·D) -> (B, S, Hq·D), (B, S, Hkv·D) twice."""
    q_dim, kv_dim = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
    return g.op.Split(qkv, g.constant([q_dim, kv_dim, kv_dim], "int64"), axis=-1, _outputs=3)


def _queries_keys_values(g: Graph, qkv: ir.Value | tuple[ir.Value, ir.Value, ir.Value], rotary: ExplicitRotary | None,
                         lengths: SequenceLengths, w: AttentionWeights, spec: AttentionSpec, target: Target,
                         q_scale: ir.Value | None) -> tuple[ir.Value, ir.Value, ir.Value]:
    """q, k and v split from the projection (or projected apart), q and k normed per head and
    rotated (by `rotary`, the explicit tables, when given; after the norms unless the spec says
    before), q scaled by `q_scale`."""
    q, k, v = qkv if isinstance(qkv, tuple) else split_packed(g, qkv, spec)
    if rotary is not None and spec.qk_norm_after_rotary:
        q, k = _rotate(g, q, k, rotary, lengths, spec)
    q, k = _qk_norms(g, q, k, w, spec, target)
    if rotary is not None and not spec.qk_norm_after_rotary:
        q, k = _rotate(g, q, k, rotary, lengths, spec)
    if q_scale is not None:
        q = g.op.Mul(q, q_scale)  # (B, S, Hq*D) · (B, S, 1)
    return q, k, v


def _qk_norms(g: Graph, q: ir.Value, k: ir.Value, w: AttentionWeights, spec: AttentionSpec,
              target: Target) -> tuple[ir.Value, ir.Value]:
    """q and k through their per-head norms, each where the checkpoint has one."""
    if w.q_norm is not None:
        with g.scope("q_norm"):
            q = _head_norm(g, q, w.q_norm, spec.num_heads, spec, target, w.q_norm_bias)
    if w.k_norm is not None:
        with g.scope("k_norm"):
            k = _head_norm(g, k, w.k_norm, spec.num_kv_heads, spec, target, w.k_norm_bias)
    return q, k


def group_query_attention(
    g: Graph,
    qkv: tuple[ir.Value, ir.Value | None, ir.Value | None],
    past: tuple[ir.Value, ir.Value],
    lengths: SequenceLengths,
    rotary: tuple[ir.Value, ir.Value] | None,
    sinks: Weight | None,
    spec: AttentionSpec,
    target: Target,
    attention_bias: ir.Value | None = None,
) -> tuple[ir.Value, ir.Value, ir.Value]:
    """GroupQueryAttention over q, k and v (or the packed projection, k and v None), the KV cache
    read from `past` and written in place; `rotary` (cos, sin) when it rotates q and k itself;
    `attention_bias` (B or 1, 1, S, total) added to the scores, indexed by absolute key position.
    Returns (out (B, S, num_heads·head_dim), present_key, present_value). A standard-ops target
    runs ONNX's Attention instead (standard_attention)."""
    if isinstance(rotary, ExplicitRotary):
        # It iterates as (cos, sin), so it would pass for the fused tables: GroupQueryAttention then
        # takes a rotary width it cannot (cos_cache's width must be a multiple of 8) and the model
        # fails in its first run (a gated-attention layer did so with Qwen3.5's 12-wide rotary).
        raise ValueError("explicit rotary tables rotate q and k before GroupQueryAttention, never inside it")
    half = rotary[0].shape[-1] if rotary is not None and rotary[0].shape is not None else None
    if isinstance(half, int) and not fused_rotary_fits(2 * half, spec.head_dim):
        raise ValueError(f"GroupQueryAttention cannot rotate a head of {spec.head_dim} by {2 * half}: "
                         "rotary_tables(head_size=...) gives an ExplicitRotary for it")
    if spec.head_dim != kv_head_size(spec.head_dim):
        return _padded_heads(g, qkv, past, lengths, rotary, sinks, spec, target, attention_bias)
    if target.standard_ops:
        if rotary is not None:
            raise ValueError("a standard-ops target rotates q and k before the attention (ExplicitRotary)")
        if sinks is not None:
            raise BuildError("--standard-ops: attention sinks (gpt-oss) have no form in ONNX's Attention; "
                             "build without --standard-ops")
        return standard_attention(g, qkv, past, lengths, spec, target, attention_bias)
    # Inputs 9-13: position_ids (unused), attention_bias, head_sink, k_scale, v_scale (an int8 cache's).
    scales = g.kv_scales.get(past[0])
    extra = [None, attention_bias, None if sinks is None else g.weight("sinks", sinks.astype(target.io_dtype)),
             *(scales or (None, None))]
    while extra and extra[-1] is None:
        extra.pop()
    quantized = {} if scales is None else {"k_quant_type": target.kv_cache.quant_type,
                                           "v_quant_type": target.kv_cache.quant_type, "kv_cache_bit_width": 8}
    return g.ms.GroupQueryAttention(
        *qkv, past[0], past[1], lengths.seqlens_k, lengths.total_sequence_length,
        *(rotary if rotary is not None else (None, None)),
        *extra,
        _outputs=3,
        num_heads=spec.num_heads,
        kv_num_heads=spec.num_kv_heads,
        scale=spec.scale,
        softcap=spec.softcap or None,
        local_window_size=spec.window if spec.window else -1,
        # A window-sized ring buffer instead of a max-length cache for this layer's KV.
        sliding_window_cache=1 if spec.window and target.windowed_kv_cache else None,
        do_rotary=1 if rotary is not None else 0,
        rotary_interleaved=int(spec.rotary_interleaved) if rotary is not None else None,
        **quantized,
    )


def _padded_heads(g: Graph, qkv: tuple[ir.Value, ir.Value | None, ir.Value | None], past: tuple[ir.Value, ir.Value],
                  lengths: SequenceLengths, rotary: tuple[ir.Value, ir.Value] | None, sinks: Weight | None,
                  spec: AttentionSpec, target: Target,
                  attention_bias: ir.Value | None) -> tuple[ir.Value, ir.Value, ir.Value]:
    """group_query_attention for a head size that is not a multiple of 8: each head of q, k and v
    padded with zeros to kv_head_size (q·k and the softmax unchanged, at the real head's scale; v's
    extra outputs zero) and the output cut back. The KV cache holds the padded heads."""
    if rotary is not None:
        raise ValueError("a padded head is rotated before the attention (rotary_tables(head_size=...))")
    D, padded = spec.head_dim, kv_head_size(spec.head_dim)
    q, k, v = qkv if qkv[1] is not None else split_packed(g, qkv[0], spec)
    zeros = g.constant([0, 0, 0, 0, 0, 0, 0, padded - D], "int64")

    def pad(x: ir.Value, heads: int) -> ir.Value:
        x = g.op.Reshape(x, g.constant([0, 0, heads, D], "int64"))  # (B, S, H·D) -> (B, S, H, D)
        x = g.op.Pad(x, zeros)  # -> (B, S, H, padded)
        return g.op.Reshape(x, g.constant([0, 0, heads * padded], "int64"))  # -> (B, S, H·padded)

    with g.scope("pad_heads"):
        padded_qkv = (pad(q, spec.num_heads), pad(k, spec.num_kv_heads), pad(v, spec.num_kv_heads))
    wide = dataclasses.replace(spec, head_dim=padded, scale=spec.scale if spec.scale is not None else D ** -0.5)
    out, present_k, present_v = group_query_attention(g, padded_qkv, past, lengths, None, sinks, wide, target,
                                                      attention_bias)
    with g.scope("unpad_heads"):
        out = g.op.Reshape(out, g.constant([0, 0, spec.num_heads, padded], "int64"))  # (B, S, Hq, padded)
        out = g.op.Slice(out, g.constant([0], "int64"), g.constant([D], "int64"), g.constant([3], "int64"))
        out = g.op.Reshape(out, g.constant([0, 0, spec.num_heads * D], "int64"))  # (B, S, Hq·D)
    return out, present_k, present_v


def standard_attention(
    g: Graph,
    qkv: tuple[ir.Value, ir.Value | None, ir.Value | None],
    past: tuple[ir.Value, ir.Value],
    lengths: SequenceLengths,
    spec: AttentionSpec,
    target: Target,
    attention_bias: ir.Value | None = None,
) -> tuple[ir.Value, ir.Value, ir.Value]:
    """ONNX's Attention (opset 24) over q, k and v (B, S, heads·head_dim), q and k already rotated:
    present = past ‖ new along the sequence (onnxruntime-genai then keeps separate past and
    present buffers), the causal, padding and window rules in one boolean mask (standard_mask)."""
    q, k, v = qkv if qkv[1] is not None else split_packed(g, qkv[0], spec)
    mask = standard_mask(g, q, lengths, spec.window or 0)
    if attention_bias is not None:  # additive: −∞ where the boolean mask hides, then the bias
        dtype = np.dtype(target.io_dtype)
        mask = g.op.Add(g.op.Where(mask, g.constant(0.0, dtype), g.constant(-np.inf, dtype)), attention_bias)
    return g.op.Attention(q, k, v, mask, past[0], past[1], _outputs=3, q_num_heads=spec.num_heads,
                          kv_num_heads=spec.num_kv_heads, scale=spec.scale, softcap=spec.softcap or None)


def standard_mask(g: Graph, q: ir.Value, lengths: SequenceLengths, window: int) -> ir.Value:
    """bool (B, 1, S, total): key j is seen by new token i (at index total − S + i of the cache)
    when j ≤ that index, the attention mask keeps j, and (with a window) the two positions (counted
    over kept tokens, as GroupQueryAttention counts them) are less than `window` apart; every token
    also sees itself, so a padding row stays finite. Made once per window size."""
    if window in lengths.masks:
        return lengths.masks[window]
    with g.scope("model", "attn_mask_standard" + (f"_window{window}" if window else "")):
        i64 = lambda v: g.constant(v, np.int64)  # noqa: E731
        total = g.op.Shape(lengths.attention_mask, start=1, end=2)  # (1,)
        new = g.op.Shape(q, start=1, end=2)  # (1,)
        keys = g.op.Range(i64(0), g.op.Squeeze(total, i64([0])), i64(1))  # (T,)
        queries = g.op.Range(g.op.Squeeze(g.op.Sub(total, new), i64([0])), g.op.Squeeze(total, i64([0])), i64(1))  # (S,)
        column = g.op.Unsqueeze(queries, i64([1]))  # (S, 1)
        causal = g.op.LessOrEqual(keys, column)  # (S, T)
        kept = g.op.Cast(lengths.attention_mask, to=ir.DataType.BOOL)  # (B, T)
        seen = g.op.And(g.op.Unsqueeze(causal, i64([0])), g.op.Unsqueeze(kept, i64([1])))  # (B, S, T)
        if window:
            positions = g.op.Sub(g.op.CumSum(lengths.attention_mask, i64(1)), i64(1))  # (B, T): kept tokens before
            query_positions = g.op.Slice(positions, g.op.Sub(total, new), total, i64([1]))  # (B, S)
            distance = g.op.Sub(g.op.Unsqueeze(query_positions, i64([2])), g.op.Unsqueeze(positions, i64([1])))
            seen = g.op.And(seen, g.op.Less(distance, i64(window)))  # (B, S, T)
        itself = g.op.Equal(keys, column)  # (S, T)
        mask = g.op.Unsqueeze(g.op.Or(seen, itself), i64([1]))  # (B, S, T) -> (B, 1, S, T)
    lengths.masks[window] = mask
    return mask
