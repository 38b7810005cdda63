"""Pieces every family uses: DecoderInfo (what I/O and genai_config.json need), Weights under a module
prefix, a self_attn's weights, the layer loop, the tied vocabulary (builder/family.py declares families)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import onnx_ir as ir

from builder.blocks.attention import AttentionWeights, kv_head_size
from builder.blocks.vocabulary import Vocabulary
from builder.config_checks import token_ids, warn_past_vocabulary
from builder.errors import BuildError
from builder.graph import Graph
from builder.inputs.source import Checkpoint
from builder.lazy import Weight
from builder.target import Target

log = logging.getLogger("builder")


@dataclass(frozen=True)
class DecoderInfo:
    """The facts about a decoder that its I/O, genai_config.json and build records need."""

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
    sliding_window: int | None = None
    sliding_window_layers: list[int] = field(default_factory=list)
    # Hybrid decoders (LFM2): the layers that carry a convolution state instead of a KV cache, the
    # state's (channels, length), and the layer types genai_config.json lists for them.
    conv_layers: list[int] = field(default_factory=list)
    conv_state: tuple[int, int] | None = None
    layer_types: list[str] | None = None
    # Linear-attention layers (Qwen3.5's gated DeltaNet): a recurrent state beside the conv state.
    recurrent_state: tuple[int, ...] | None = None
    # Layers without any state of their own (Nemotron-H's MLP and expert layers, Gemma 4's KV-sharing ones).
    stateless_layers: list[int] = field(default_factory=list)
    # Conv layers that keep a KV cache as well (Falcon-H1's attention beside its Mamba mixer).
    hybrid_layers: list[int] = field(default_factory=list)
    # Layers whose KV is shaped apart: layer -> (num_kv_heads, head_size) (Gemma 4's full layers).
    layer_kv_dims: dict[int, tuple[int, int]] = field(default_factory=dict)


def decoder_info(c: Any) -> DecoderInfo:
    """DecoderInfo from any family's config: a dataclass with Hugging Face's key names and a
    `window(layer)` method (the layer's sliding window, None for global layers)."""
    warn_past_vocabulary({n: getattr(c, n) for n in ("bos_token_id", "eos_token_id", "pad_token_id")}, c.vocab_size,
                         "config.json")
    windows = [c.window(i) for i in range(c.num_hidden_layers)]
    sliding = [i for i, w in enumerate(windows) if w]
    return DecoderInfo(
        model_type=c.model_type, vocab_size=c.vocab_size, hidden_size=c.hidden_size,
        num_layers=c.num_hidden_layers, num_attention_heads=c.num_attention_heads,
        num_kv_heads=c.num_key_value_heads, head_size=kv_head_size(c.head_dim),
        context_length=c.max_position_embeddings, bos_token_id=c.bos_token_id,
        eos_token_ids=token_ids(c.eos_token_id), pad_token_id=c.pad_token_id,
        sliding_window=windows[sliding[0]] if sliding else None, sliding_window_layers=sliding,
        **_conv_state_info(c), **_per_layer_kv_info(c),
    )


def _per_layer_kv_info(c: Any) -> dict[str, Any]:
    """DecoderInfo's per-layer KV fields for a config with `layer_kv_dims` (Gemma 4's): the layers
    whose KV is shaped apart, and the layers that read another layer's KV (`stateless_layers`)."""
    if getattr(c, "layer_kv_dims", None) is None:
        return {}
    dims = {layer: (heads, kv_head_size(size)) for layer, (heads, size) in c.layer_kv_dims.items()}
    return {"layer_kv_dims": dims, "stateless_layers": list(c.stateless_layers)}


def _conv_state_info(c: Any) -> dict[str, Any]:
    """DecoderInfo's conv-state fields for a config with `conv_layers` and `conv_state` (LFM2's);
    none for the others."""
    if not getattr(c, "conv_layers", None):
        return {}
    info = {"conv_layers": list(c.conv_layers), "conv_state": c.conv_state, "layer_types": list(c.layer_types)}
    if getattr(c, "recurrent_state", None):
        info["recurrent_state"] = c.recurrent_state
    if getattr(c, "stateless_layers", None):
        info["stateless_layers"] = list(c.stateless_layers)
    if getattr(c, "hybrid_layers", None):
        info["hybrid_layers"] = list(c.hybrid_layers)
    return info


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
