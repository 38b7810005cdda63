"""The vocabulary: token embedding lookup and lm_head over one [vocab, hidden] matrix or two.

Tied embeddings are stored once whatever the precision: a float table that lm_head multiplies
transposed (FusedMatMul transB=1), or lm_head's 4-bit matrix that the lookup gathers from
(GatherBlockQuantized). An 8-bit lm_head keeps a float lookup table (GatherBlockQuantized reads
4-bit data only). With QDQ weights the lookup quantizes its own copy (Vocabulary.create). Untied tables are each their own, the embedding quantized only when asked.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx_ir as ir

from builder.blocks.embedding import embedding
from builder.blocks.linear import QuantizedValues, quantized_weight
from builder.blocks.lm_head import Shared, lm_head, shared_vocabulary
from builder.graph import Graph
from builder.lazy import Weight
from builder.target import Target


@dataclass(frozen=True)
class Vocabulary:
    """What a decoder reads tokens with and writes logits with.

    Example:
        >>> vocab = Vocabulary.create(g, embed, head, tied=True, target=target)   # doctest: +SKIP
        >>> x = vocab.embed(g, io.input_ids, scale=hidden ** 0.5)                 # doctest: +SKIP
        >>> logits = vocab.logits(g, hidden_states)                               # doctest: +SKIP
    """

    embedding: Weight
    head: Weight
    target: Target
    shared: Shared | None = None
    lookup: Shared | None = None  # what the lookup reads when it is not `shared`

    @classmethod
    def create(cls, g: Graph, embedding: Weight, head: Weight, tied: bool, target: Target) -> Vocabulary:
        """`head` is lm_head's [vocab, hidden] weight; `tied` says it is the embedding itself."""
        shared = shared_vocabulary(g, head, target) if tied else None
        if isinstance(shared, QuantizedValues) and shared.qdq:
            # ONNX Runtime fuses lm_head's DequantizeLinear + MatMul into MatMulNBits only when
            # nothing else reads its codes (measured, 1.31): the lookup gets its own copy.
            with g.scope("model", "embed_tokens"):
                lookup = quantized_weight(g, embedding, target.quantization, target.io_dtype,
                                          target.lookup_bits(shared.bits))
            return cls(embedding, head, target, shared, lookup)
        return cls(embedding, head, target, shared, shared)

    def embed(self, g: Graph, input_ids: ir.Value, scale: float | None = None) -> ir.Value:
        """The rows of `input_ids` (under model.embed_tokens), times `scale` (Gemma's √hidden)."""
        with g.scope("model", "embed_tokens"):
            return embedding(g, input_ids, self.embedding, self.target, scale=scale, shared=self.lookup)

    def logits(self, g: Graph, h: ir.Value, softcap: float | None = None, bias: Weight | None = None) -> ir.Value:
        """lm_head(h) (+ `bias`, Phi-2's) in the logits dtype, soft-capped when `softcap` is set (Gemma 2)."""
        return lm_head(g, h, self.head, self.target, softcap=softcap, shared=self.shared, bias=bias)
