"""The output projection to vocabulary logits."""

from __future__ import annotations

import onnx_ir as ir

from builder.blocks import stored_float
from builder.blocks.linear import QuantizedValues, linear, quantized_weight
from builder.graph import Graph
from builder.io import logits_dtype
from builder.lazy import Weight
from builder.target import Target, source_modules

Shared = QuantizedValues | ir.Value


def shared_vocabulary(g: Graph, weight: Weight, target: Target) -> Shared | None:
    """One stored vocabulary matrix for tied embeddings and lm_head.

    A 4-bit lm_head's quantized matrix (the lookup gathers from it with GatherBlockQuantized), or —
    when lm_head stays in float — the [vocab, hidden] table itself, which lm_head multiplies
    transposed (FusedMatMul transB=1) instead of storing a transposed copy. An int8 build's lm_head
    is not shared (its lookup keeps its own float table, as before); an int8 lm_head in an int4
    build (int8_layers, the mixed preset) is: ONNX Runtime's GatherBlockQuantized reads 8 bits too.
    A matrix stored pre-quantized (a GGUF's token_embd, often Q8_0 or Q6_K beside Q4 layers) is
    shared at its own bits in any quantized build: the lookup gathers the file's codes.
    """
    if not target.quantizes("lm_head"):
        with g.scope("model", "embed_tokens"):
            return g.weight("weight", weight.astype(stored_float.matrix_dtype(weight, target)))
    q = target.quantization
    if not target.provider.quantized_gather:  # the lookup keeps a float table (embedding)
        return None
    if weight.blocks is not None:  # stored pre-quantized (GGUF): its own 4- or 8-bit codes, shared as stored,
        if weight.blocks.input_order is not None:  # unless act-order GPTQ's permuted columns
            return None
    elif q.bits != 4:  # an int8 build of float weights
        return None
    with g.scope("lm_head"):
        return quantized_weight(g, weight, q, target.io_dtype, q.bits_for("lm_head", source_modules(weight.sources)),
                                lookup=True)


def last_positions(g: Graph, h: ir.Value, seqlens_k: ir.Value) -> ir.Value:
    """Each row's hidden state at its last real token, (B, S, H) -> (B, 1, H): all that
    onnxruntime-genai samples from, so lm_head multiplies one row per sequence instead of S.

    The last real token of row b is min(seqlens_k[b], S - 1). genai pads a batch of prompts on the
    right (its attention mask is 0 over the trailing pad ids) and prefills a batch once, with no past
    (Generator::AppendTokens refuses a second call for a batch): there seqlens_k (real tokens - 1)
    is the row's last real column, not S - 1 (the padding's, which the reference builder's
    Gather(-1) takes). Everywhere else no padding follows a real token and seqlens_k (tokens seen
    - 1) >= S - 1: another append_tokens of a batch of one, each chunk of a chunked prefill, every
    decode step (a right-padded row's mask has zeros before its new token there).
    """
    with g.scope("lm_head", "last_position"):
        last = g.op.Sub(g.op.Shape(h, start=1, end=2), g.constant([1], "int64"))  # (1,): S - 1
        seen = g.op.Cast(seqlens_k, to=ir.DataType.INT64)  # (B,)
        row = g.op.Where(g.op.Less(seen, last), seen, last)  # (B,): the smaller (webgpu has no Min kernel)
        row = g.op.Unsqueeze(row, g.constant([1, 2], "int64"))  # (B,) -> (B, 1, 1)
        return g.op.GatherND(h, row, batch_dims=1)  # (B, S, H) -> (B, 1, H)


def lm_head(
    g: Graph, x: ir.Value, weight: Weight, target: Target,
    softcap: float | None = None, shared: Shared | None = None, bias: Weight | None = None,
) -> ir.Value:
    """logits = x · Wᵀ (+ bias: Phi-2's lm_head has one), optionally soft-capped
    (softcap · tanh(logits / softcap)), in the logits dtype. `shared` is what shared_vocabulary
    registered for tied embeddings."""
    with g.scope("lm_head"):
        if isinstance(shared, ir.Value):
            shared = stored_float.widened(g, shared, target)  # folded at load where stored narrower
            if target.standard_ops or not target.provider.fused_matmul:  # ONNX Runtime folds the Transpose at load
                logits = g.op.MatMul(x, g.op.Transpose(shared, perm=[1, 0]))
            else:
                logits = g.ms.FusedMatMul(x, shared, transB=1)  # (B, S, H) · (V, H)ᵀ
            if bias is not None:
                logits = g.op.Add(logits, g.weight("bias", bias.astype(target.io_dtype)))
        else:
            logits = linear(g, x, weight, target, bias, quantized=shared)
        out_dtype = logits_dtype(target.io_dtype)
        if out_dtype != target.io_dtype:
            logits = g.op.Cast(logits, to=ir.DataType.from_numpy(out_dtype))
        if softcap:
            cap = g.constant(softcap, out_dtype)
            logits = g.op.Mul(g.op.Tanh(g.op.Div(logits, cap)), cap)
    return logits
