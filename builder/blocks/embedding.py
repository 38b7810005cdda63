"""Token embedding lookup: a float table, or rows gathered straight from a 4- or 8-bit quantized matrix."""

from __future__ import annotations

import onnx_ir as ir

from builder.blocks import stored_float
from builder.blocks.linear import QuantizedValues, quantized_weight
from builder.graph import Graph
from builder.lazy import Weight
from builder.target import Target, source_modules


def embedding(
    g: Graph, input_ids: ir.Value, weight: Weight, target: Target,
    scale: float | None = None, shared: QuantizedValues | ir.Value | None = None,
) -> ir.Value:
    """Gathers rows of the [vocab, hidden] matrix; `scale` multiplies the result (Gemma's √hidden).

    `shared` (blocks.shared_vocabulary's, for tied embeddings) is the float table to gather from,
    or lm_head's quantized matrix, which makes the lookup a GatherBlockQuantized over it;
    with Quantization.embeddings set, or the table among int8_layers, an untied table is quantized
    for the lookup alone (at the bits Quantization.bits_for gives `model.embed_tokens`). The scale
    is rounded to the IO dtype first, as Hugging Face does with its `normalizer` buffer.
    """
    q = target.quantization
    if shared is None and q is not None and target.provider.quantized_gather:
        if weight.blocks is not None:  # stored pre-quantized (GGUF): gathered as stored, the file's codes
            # (not an act-order GPTQ table: its columns are permuted)
            bits, wanted = weight.blocks.bits, weight.blocks.input_order is None
        else:
            bits = q.bits_for("model.embed_tokens", source_modules(weight.sources))
            wanted = (q.embeddings and q.bits == 4) or (q.bits == 4 and bits == 8)
        if wanted:
            bits = bits if weight.blocks is not None else target.lookup_bits(bits)
            shared = quantized_weight(g, weight, q, target.io_dtype, bits, lookup=True)
    if isinstance(shared, QuantizedValues):
        x = _gather_quantized(g, input_ids, shared, target)
    else:
        # A float table: lm_head's (tied) or its own. A bfloat16 or float16 one under float32
        # activations is stored as it is and each gathered row widened (blocks.stored_float): the
        # same values at half the bytes (an untied Llama-3.1-8B table is 1.05 GB instead of 2.1 GB).
        table = shared if shared is not None else g.weight("weight", weight.astype(stored_float.table_dtype(weight, target)))
        x = stored_float.widened(g, g.op.Gather(table, input_ids, axis=0), target, stored=table)
    if scale is not None:
        x = g.op.Mul(x, g.constant(scale, target.io_dtype))
    return x


def _gather_quantized(g: Graph, input_ids: ir.Value, m: QuantizedValues, target: Target) -> ir.Value:
    q = target.quantization
    bits, block_size = m.bits, m.block_size or q.block_size
    k_blocks = -(-m.k // block_size)
    padded = k_blocks * block_size
    if m.qdq:
        x = _gather_qdq_columns(g, input_ids, m, block_size)
        padded = m.k
    else:
        # MatMulNBits' B [N, k_blocks, block_size·bits/8] holds the same bytes as rows of [N, padded·bits/8].
        data = g.op.Reshape(m.data, g.constant([m.n, padded * bits // 8], "int64"))
        x = g.ms.GatherBlockQuantized(
            data, input_ids, m.scales, m.lookup_zero_points or m.zero_points,
            bits=bits, block_size=block_size, gather_axis=0, quantize_axis=1,
        )  # (B, S, padded)
    if m.offsets is not None:  # each block's minimum (GGUF Q4_1, K-quants), added to its values
        rows = g.op.Transpose(g.op.Gather(m.offsets, input_ids, axis=1), perm=[1, 2, 0])  # (K/b, B, S) -> (B, S, K/b)
        blocked = g.op.Reshape(x, g.constant([0, 0, k_blocks, block_size], "int64"))  # (B, S, K) -> (B, S, K/b, b)
        x = g.op.Reshape(g.op.Add(blocked, g.op.Unsqueeze(rows, g.constant([-1], "int64"))),
                         g.constant([0, 0, padded], "int64"))  # (B, S, K/b, b) -> (B, S, K)
    if padded != m.k:
        x = g.op.Slice(x, g.constant([0], "int64"), g.constant([m.k], "int64"), g.constant([-1], "int64"))
    return x


def _gather_qdq_columns(g: Graph, input_ids: ir.Value, m: QuantizedValues, block_size: int) -> ir.Value:
    """Rows of W from the QDQ layout's Wᵀ [K, N]: its columns. 4-bit codes through
    GatherBlockQuantized (ONNX's Gather has no int4 type), 8-bit ones with standard ops: Gather
    then a blocked DequantizeLinear."""
    if m.bits == 4:
        x = g.ms.GatherBlockQuantized(m.data, input_ids, m.scales, m.zero_points, bits=4, block_size=block_size,
                                      gather_axis=1, quantize_axis=0)  # (K, B, S)
    else:
        codes = g.op.Gather(m.data, input_ids, axis=1)  # (K, B, S)
        scales = g.op.Gather(m.scales, input_ids, axis=1)  # (K/b, B, S)
        zero_points = None if m.zero_points is None else g.op.Gather(m.zero_points, input_ids, axis=1)
        x = g.op.DequantizeLinear(codes, scales, zero_points, axis=0, block_size=block_size)
    return g.op.Transpose(x, perm=[1, 2, 0])  # (K, B, S) -> (B, S, K)

def image_tokens(g: Graph, input_ids: ir.Value, image_token: int, vocab_size: int) -> tuple[ir.Value, ir.Value]:
    """(is_image (B, S) bool, the ids to look up): an image token past the vocabulary (transformers'
    check) is looked up as token 0, its row then replaced by merge_image_features."""
    is_image = g.op.Equal(input_ids, g.constant(image_token, "int64"))
    if image_token < vocab_size:
        return is_image, input_ids
    return is_image, g.op.Where(is_image, g.constant(0, "int64"), input_ids)


def merge_image_features(g: Graph, input_ids: ir.Value, is_image: ir.Value, features: ir.Value, text: ir.Value,
                         hidden: int, target: Target) -> ir.Value:
    """inputs_embeds: `text` (B, S, hidden), with the n-th image token (row-major over batch and
    sequence; `is_image` (B, S) bool) taking row n of `features` (rows, hidden), in order, as
    transformers' masked_scatter places them. Image tokens past the rows given (onnxruntime-genai
    sends zero rows at decode steps) keep their text embedding."""
    with g.scope("merge_image_features"):
        rows = g.op.Shape(features, start=0, end=1)  # (1,)
        flat = g.op.Reshape(is_image, g.constant([-1], "int64"))
        # The n-th image token (row-major over batch and sequence) takes feature row n.
        nth = g.op.Sub(g.op.CumSum(g.op.Cast(flat, to=ir.DataType.INT64), g.constant(0, "int64")),
                       g.constant(1, "int64"))
        filled = g.op.And(flat, g.op.Less(nth, rows))
        padded = g.op.Concat(g.op.Cast(features, to=ir.DataType.from_numpy(target.io_dtype)),
                             g.op.Expand(g.constant(0, target.io_dtype), g.constant([1, hidden], "int64")),
                             axis=0)  # row `rows`, zeros: what unfilled positions gather (then discarded)
        picked = g.op.Gather(padded, g.op.Where(filled, nth, rows), axis=0)  # (B·S, hidden)
        picked = g.op.Reshape(picked, g.op.Shape(text))  # -> (B, S, hidden)
        mask = g.op.Unsqueeze(g.op.Reshape(filled, g.op.Shape(input_ids)), g.constant([-1], "int64"))
        return g.op.Where(mask, picked, text)
