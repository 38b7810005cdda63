"""Pieces every family uses: DecoderInfo (what I/O and genai_config.json need), Weights under a module
prefix, a self_attn's weights, the layer loop, the tied vocabulary (builder/family.py declares families)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import onnx_ir as ir

from builder.blocks.attention import AttentionWeights
from builder.blocks.vocabulary import Vocabulary
from builder.config_checks import token_ids, warn_past_vocabulary
from builder.errors import BuildError
from builder.graph import Graph
from builder.inputs.source import Checkpoint
from builder.lazy import Weight
from builder.state import LayerState, kv_head_size
from builder.target import Target

log = logging.getLogger("builder")


@dataclass(frozen=True)
class DecoderInfo:
    """The facts about a decoder that its I/O, genai_config.json and build records need; what each
    layer carries is `layers`, one builder.state.LayerState a layer, declared by the family's config."""

    model_type: str  # onnxruntime-genai's model type ("llama", "qwen3", ...)
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_size: int
    context_length: int
    bos_token_id: int | None
    eos_token_ids: list[int]
    pad_token_id: int | None
    layers: tuple[LayerState, ...] = ()

    @property
    def sliding_window_layers(self) -> list[int]:
        return [i for i, s in enumerate(self.layers) if s.kv is not None and s.kv.window]

    @property
    def sliding_window(self) -> int | None:
        """The first sliding layer's window (genai_config.json has one)."""
        sliding = self.sliding_window_layers
        return self.layers[sliding[0]].kv.window if sliding else None

    @property
    def stateless_layers(self) -> list[int]:
        """The layers that carry nothing (onnxruntime-genai does not count them)."""
        return [i for i, s in enumerate(self.layers) if s.stateless]


def decoder_info(c: Any) -> DecoderInfo:
    """DecoderInfo from any family's config: a dataclass with Hugging Face's key names and a
    `layer_state(layer)` method (builder.decoder_config.DecoderConfig's, or the family's own)."""
    warn_past_vocabulary({n: getattr(c, n) for n in ("bos_token_id", "eos_token_id", "pad_token_id")}, c.vocab_size,
                         "config.json")
    return DecoderInfo(
        model_type=c.model_type, vocab_size=c.vocab_size, hidden_size=c.hidden_size,
        num_layers=c.num_hidden_layers, num_attention_heads=c.num_attention_heads,
        num_kv_heads=c.num_key_value_heads, head_size=kv_head_size(c.head_dim),
        context_length=c.max_position_embeddings, bos_token_id=c.bos_token_id,
        eos_token_ids=token_ids(c.eos_token_id), pad_token_id=c.pad_token_id,
        layers=tuple(c.layer_state(i) for i in range(c.num_hidden_layers)),
    )


class Weights:
    """Checkpoint weights under one module prefix: `w("self_attn.q_proj.weight", out, in)` reads
    `model.layers.3.self_attn.q_proj.weight` and checks its shape."""

    def __init__(self, ckpt: Checkpoint, prefix: str = ""):
        self.ckpt, self.prefix = ckpt, prefix

    def __call__(self, name: str, *shape: int) -> Weight:
        return self.ckpt.weight(self.prefix + name, shape or None)

    def optional(self, name: str, *shape: int) -> Weight | None:
        """The weight, or None when the checkpoint does not store it (an optional bias)."""
        return self(name, *shape) if self.prefix + name in self.ckpt else None

    def under(self, prefix: str) -> Weights:
        return type(self)(self.ckpt, self.prefix + prefix)


def attention_weights(
    a: Weights, c: Any, qkv_bias: bool = False, o_bias: bool = False,
    qk_norm: Callable[[str, int], Weight] | None = None,
) -> AttentionWeights:
    """A self_attn module's q/k/v/o_proj in Hugging Face's usual names, their biases when the
    family has them, and its per-head q/k norms read by `qk_norm` (e.g. `a` itself) when it has
    those; shapes from the config's hidden_size, heads and head_dim."""
    H, D = c.hidden_size, c.head_dim
    q_dim, kv_dim = c.num_attention_heads * D, c.num_key_value_heads * D
    return AttentionWeights(
        q=a("q_proj.weight", q_dim, H), k=a("k_proj.weight", kv_dim, H), v=a("v_proj.weight", kv_dim, H),
        o=a("o_proj.weight", H, q_dim),
        q_bias=a("q_proj.bias", q_dim) if qkv_bias else None, k_bias=a("k_proj.bias", kv_dim) if qkv_bias else None,
        v_bias=a("v_proj.bias", kv_dim) if qkv_bias else None, o_bias=a("o_proj.bias", H) if o_bias else None,
        q_norm=qk_norm("q_norm.weight", D) if qk_norm else None, k_norm=qk_norm("k_norm.weight", D) if qk_norm else None,
    )


def prefix_holding(ckpt: Checkpoint, tensor: str, prefixes: tuple[str, ...]) -> str:
    """The first of `prefixes` under which the checkpoint holds `tensor` (where a family's decoder
    is: `model.`, a multimodal checkpoint's `model.language_model.`, Nemotron-H's `backbone.`);
    none is a one-line error naming them all."""
    for prefix in prefixes:
        if prefix + tensor in ckpt:
            return prefix
    raise BuildError(f"the checkpoint has no {tensor} under {', '.join(prefixes)}")


def decoder_layers(
    g: Graph, ckpt: Checkpoint, count: int, layer: Callable[[int, Weights], tuple[ir.Value, ir.Value]],
    prefix: str = "model.", weights: type[Weights] = Weights,
) -> list[tuple[ir.Value, ir.Value]]:
    """Builds layers 0 … count−1, each under its module scope (`model/layers.3`): `layer(i, w)`
    records layer i from its checkpoint tensors `w` (`{prefix}layers.3.*`) and returns its
    present (key, value). Returns the presents in layer order."""
    presents = []
    for i in range(count):
        with g.scope("model", f"layers.{i}"):
            presents.append(layer(i, weights(ckpt, f"{prefix}layers.{i}.")))
    return presents


def vocabulary(
    g: Graph, ckpt: Checkpoint, target: Target, shape: tuple[int, int], tied: bool,
    embed: str = "model.embed_tokens.weight", head: str = "lm_head.weight",
) -> Vocabulary:
    """The embedding and lm_head of a checkpoint, tied as transformers 5 ties them: with
    `tie_word_embeddings` and no stored lm_head, or a stored copy equal to the embedding, lm_head
    is the embedding (stored once); a stored lm_head that differs is used as is, untied
    (transformers warns and does the same)."""
    table = ckpt.weight(embed, shape)
    if not tied:
        return Vocabulary.create(g, table, ckpt.weight(head, shape), False, target)
    if head in ckpt and not ckpt.same_values(head, embed):
        log.warning("%s differs from the embedding although tie_word_embeddings is set: using it untied, "
                    "as transformers does", head)
        return Vocabulary.create(g, table, ckpt.weight(head, shape), False, target)
    if head in ckpt:
        ckpt.consume(head)
    return Vocabulary.create(g, table, table, True, target)
