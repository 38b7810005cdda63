"""A checkpoint's multi-token-prediction (MTP) head, built as the draft model beside its decoder.

Qwen3.5, Qwen3.6 and Qwen3-Next checkpoints ship one extra decoder layer that transformers drops on
load (`mtp.*`): given the decoder's last hidden state h_i (after its final norm: lm_head's input)
and the embedding of the token t_{i+1} the decoder chose from it, it predicts t_{i+2}:

    x      = fc(concat(norm_e(embed(t_{i+1})), norm_h(h_i)))
    y      = layer(x)                 # one full-attention decoder layer of the family's own kind
    out    = norm(y)                  # -> hidden_states_out, which a chained draft feeds back
    logits = lm_head(out)             # the decoder's own lm_head (and embedding)

A family declares its head with a `DraftHead` (the tensor names, the config its layer is built
with); `draft_model` records it as `mtp.onnx`, a `builder.package.PackageModel` with
onnxruntime-genai 0.18's `mtp` section of genai_config.json, its embedding and lm_head being the
decoder's own values (same content keys), so builder.writer stores them once, in
model.onnx.data, and mtp.onnx points there: no second copy on disk and no `shared_initializers`
declaration (which genai 0.18's CPU provider refuses). The decoder then outputs `hidden_states`
(`HIDDEN_STATES`). builder.speculative runs the two.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from builder.architecture import Weights, decoder_info
from builder.blocks.linear import linear
from builder.blocks.lm_head import last_positions
from builder.blocks.norm import rms_norm
from builder.errors import BuildError
from builder.graph import Graph
from builder.inputs.source import Checkpoint
from builder.io import BATCH, SEQUENCE, DecoderIO, graph_value, hidden_output
from builder.lazy import Weight
from builder.package import Package, PackageModel, with_model
from builder.target import Target

log = logging.getLogger("builder")

__all__ = ["DRAFT_STEM", "HIDDEN_STATES", "DraftHead", "draft_model", "full_attention_layer", "nextn_head", "plain_norm",
           "with_draft_head"]

DRAFT_STEM = "mtp"  # mtp.onnx, genai_config.json's "mtp" section
HIDDEN_STATES = "hidden_states"  # the decoder's output and the head's input: h after the final norm
HIDDEN_STATES_OUT = "hidden_states_out"  # the head's own normed output, for a chained draft


def plain_norm(w: Weights, name: str, size: int) -> Weight:
    """A norm's weight as stored (a family whose RMSNorm scales by the weight itself)."""
    return w(name, size)


def _mtp_prefix(c: Any) -> str:
    return "mtp."


def _mtp_layer(c: Any) -> str:
    return "mtp.layers.0."


def _mtp_layers(tensors, c: Any) -> int:
    """Qwen's head: one module (mtp.*) with its layers mtp.layers.N."""
    found = re.compile(r"mtp\.layers\.(\d+)\.")
    return len({m.group(1) for n in tensors if (m := found.match(n))})


@dataclass(frozen=True)
class DraftHead:
    """Where a family's checkpoints keep their MTP head and how its layer is built.

    `prefix(c)`: the head's module (Qwen's `mtp.`; DeepSeek's next-token layer
    `model.layers.{num_hidden_layers}.`), under which the norms, the projection and the `copies`
    are; `layer_prefix(c)`: its decoder layer's tensors (Qwen's `mtp.layers.0.`; DeepSeek's the
    module's own); `layers(tensors, c)`: how many layers the checkpoint's head has (one is built).
    The head is read only when the checkpoint has tensors under `prefix` (transformers' own
    save_pretrained drops them). `layer_config(c)`: the decoder's config as the head's one layer is
    built (Qwen3.5's: num_hidden_layers 1, layer_types [full_attention]); the layer is the family's
    own `layer` hook. `norm(w, name, size)`: a norm weight as the family's RMSNorm multiplies it
    (Qwen3.5's (1 + weight)). `copies`: names under the prefix that hold the decoder's embedding and
    lm_head again (DeepSeek's embed_tokens, shared_head.head): checked equal to the decoder's, whose
    values the head reads. `ignored`: the pattern a family ignores the head's tensors by when it is
    not built."""

    prefix: Callable[[Any], str] = _mtp_prefix
    layer_prefix: Callable[[Any], str] = _mtp_layer
    layers: Callable[[Any, Any], int] = _mtp_layers
    embedding_norm: str = "pre_fc_norm_embedding.weight"
    hidden_norm: str = "pre_fc_norm_hidden.weight"
    projection: str = "fc.weight"
    final_norm: str = "norm.weight"
    copies: tuple[tuple[str, str], ...] = ()  # (name under the prefix, the decoder's tensor it copies)
    layer_config: Callable[[Any], Any] = lambda c: c
    norm: Callable[[Weights, str, int], Weight] = plain_norm
    ignored: str | None = "mtp.*"
    declared: Callable[[Any], bool] = lambda c: True  # whether the config says the checkpoint has a head

    def stored(self, ckpt: Checkpoint, c: Any) -> bool:
        """Whether the config declares a head and the checkpoint holds any of its tensors."""
        prefix = self.prefix(c)
        return self.declared(c) and any(n.startswith(prefix) for n in ckpt.tensors)


def nextn_head(layer_config: Callable[[Any], Any]) -> DraftHead:
    """DeepSeek-V3's and GLM-4.5's next-token-prediction module: model.layers.{num_hidden_layers}
    holds enorm, hnorm, eh_proj, shared_head.norm, the copies embed_tokens and shared_head.head,
    and its decoder layer's own tensors (self_attn.*, mlp.*, the layer norms)."""
    def prefix(c: Any) -> str:
        return f"model.layers.{c.num_hidden_layers}."

    def layers(tensors, c: Any) -> int:
        """The layers past num_hidden_layers, one pass over the names."""
        found = re.compile(r"model\.layers\.(\d+)\.")
        return len({i for n in tensors if (m := found.match(n)) and (i := int(m.group(1))) >= c.num_hidden_layers})

    return DraftHead(prefix=prefix, layer_prefix=prefix, layers=layers, embedding_norm="enorm.weight",
                     hidden_norm="hnorm.weight", projection="eh_proj.weight", final_norm="shared_head.norm.weight",
                     copies=(("embed_tokens.weight", "model.embed_tokens.weight"),
                             ("shared_head.head.weight", "lm_head.weight")),
                     layer_config=layer_config, ignored=None, declared=lambda c: c.num_nextn_predict_layers > 0)


def draft_model(family, ckpt: Checkpoint, c: Any, target: Target, head_target: Target | None = None) -> PackageModel:
    """The family's MTP head (`family.mtp`, a DraftHead) recorded as mtp.onnx: inputs input_ids,
    attention_mask, hidden_states (batch, sequence, hidden), its one layer's KV cache; outputs
    logits of the last position (batch, 1, vocab), hidden_states_out (every position's) and that
    layer's present KV. `head_target`: what the head's own projection and layer are built for, when
    not the decoder's `target` (its vocabulary stays the decoder's)."""
    from builder.family import Decoder  # the shared body's per-build state (family imports this module's users)

    head: DraftHead = family.mtp
    layers, prefix = head.layers(ckpt.tensors, c), head.prefix(c)
    if layers != 1:
        raise BuildError(f"the checkpoint's MTP head has {layers} layers ({prefix}...); onnxruntime-genai "
                         "runs a one-layer head: build without it (--no-mtp)")
    _check_copies(head, ckpt, prefix)
    layer_config = head.layer_config(c)
    info = decoder_info(layer_config)
    if info.num_layers != 1 or info.layers[0].kv is None or info.layers[0].names != ("key", "value"):
        raise BuildError(f"{family.name}'s MTP layer must be one attention layer with a KV cache")
    g = Graph()
    io = DecoderIO.from_states(info.layers, target.io_dtype, position_ids=target.provider.position_ids)
    H = c.hidden_size
    hidden = graph_value(HIDDEN_STATES, target.io_dtype, (BATCH, SEQUENCE, H))
    g.position_ids = io.position_ids
    d = Decoder(g, io, ckpt, layer_config, target)
    d.prefix = family.prefix(d) if callable(family.prefix) else family.prefix
    d.rotary = family.rotary(d)
    d.lengths  # noqa: B018 - recorded before the layer, as the decoder's body does
    d.prepared = family.prepare(d) if family.prepare is not None else None
    d.vocab = family.vocabulary(d)  # the decoder's values: stored once, in model.onnx.data
    d.target = target = head_target or target  # the head's own projection and layer
    w = family.weights(ckpt, prefix)
    tokens = family.embed(d)
    with g.scope("mtp", "pre_fc_norm_embedding"):
        tokens = rms_norm(g, tokens, head.norm(w, head.embedding_norm, H), c.rms_norm_eps, target)
    with g.scope("mtp", "pre_fc_norm_hidden"):
        h = rms_norm(g, hidden, head.norm(w, head.hidden_norm, H), c.rms_norm_eps, target)
    with g.scope("mtp", "fc"):
        x = linear(g, g.op.Concat(tokens, h, axis=-1), w(head.projection, H, 2 * H), target)
    d.stream = family.stream(d, x)
    with g.scope("model", "layers.0"):
        presents = [family.layer(d, family.weights(ckpt, head.layer_prefix(c)), 0)]
    with g.scope("mtp", "norm"):
        out = d.stream.norm(head.norm(w, head.final_norm, H))
    # A draft reads the last row's logits alone (after an accepted draft the head takes two pairs, over
    # a prompt all of them): lm_head over that row only, [batch, 1, vocab], as a pruned decoder's.
    logits = family.logits(d, last_positions(g, out, d.lengths.seqlens_k))
    out = hidden_output(g, out, HIDDEN_STATES_OUT, target.io_dtype, H)
    inputs = [*io.inputs[:2], hidden, *io.inputs[2:]]
    outputs = [*io.outputs(logits, info.vocab_size, presents, last_only=True), out]
    return PackageModel(DRAFT_STEM, g.model(inputs, outputs, standard=target.standard_ops), dict(g.sources),
                        DRAFT_STEM, genai_section(info.layers[0].kv))


def _check_copies(head: DraftHead, ckpt: Checkpoint, prefix: str) -> None:
    """The decoder's vocabulary stored again under the head (DeepSeek's): equal, and left unread
    (the head reads the decoder's values), or refused."""
    for copy, original in head.copies:
        if prefix + copy in ckpt.tensors:
            if original in ckpt.tensors and not ckpt.same_values(prefix + copy, original):
                raise BuildError(f"{prefix + copy} differs from {original}, which the MTP head shares with the "
                                 "decoder: builder cannot build a head with a vocabulary of its own (--no-mtp)")
            ckpt.consume(prefix + copy)


def genai_section(kv) -> dict[str, Any]:
    """genai_config.json's `mtp` section (onnxruntime-genai 0.18's Config::Model::Mtp) for a head
    whose one layer keeps `kv` (a builder.state.KV)."""
    return {
        "num_hidden_layers": 1, "num_key_value_heads": kv.heads, "head_size": kv.head_size,
        "main_hidden_states": HIDDEN_STATES,
        "inputs": {"input_ids": "input_ids", "hidden_states": HIDDEN_STATES, "attention_mask": "attention_mask",
                   "position_ids": "position_ids", "past_key_names": "past_key_values.%d.key",
                   "past_value_names": "past_key_values.%d.value"},
        "outputs": {"logits": "logits", "hidden_states": HIDDEN_STATES_OUT, "present_key_names": "present.%d.key",
                    "present_value_names": "present.%d.value"},
    }


def full_attention_layer(c: Any, attention: str = "full_attention") -> Any:
    """`c` as a one-layer decoder whose layer is `attention` (Qwen3.5's MTP layer)."""
    return dataclasses.replace(c, num_hidden_layers=1, layer_types=[attention])


def with_draft_head(name: str, family, checkpoint: Checkpoint, config: Any, info, package: Package | None,
                    options, target: Target) -> tuple[Package | None, tuple[str, ...]]:
    """The package with the checkpoint's multi-token-prediction head as mtp.onnx beside the decoder
    (unless --no-mtp or the checkpoint has none), and the tensors the build may leave unread."""
    ignored = family.ignored if package is None else package.ignored
    head = family.mtp
    if head is None or not head.stored(checkpoint, config):
        return package, ignored
    if not options.mtp:
        log.info("%s: the checkpoint's multi-token-prediction head (%s*) is left out (--no-mtp)", name,
                 head.prefix(config))
        return package, ignored
    _check_draft_options(name, options, target)
    try:
        draft = draft_model(family, checkpoint, config, target, _head_target(options, target))
    except BuildError as e:
        raise BuildError(f"{e} (the checkpoint's multi-token-prediction head, {head.prefix(config)}*: build the "
                         "decoder without it with --no-mtp)") from None
    return (with_model(package, draft, info.model_type, (HIDDEN_STATES,)),
            tuple(p for p in ignored if p != head.ignored))


def _head_target(options, target: Target) -> Target | None:
    """The Target of --mtp-precision (None: the decoder's): the same provider and activations, the
    precision's own quantization defaults."""
    if options.mtp_precision in (None, options.precision):
        return None
    from builder.options import QUANTIZED, BuildOptions

    io = options.resolved_io_dtype if options.mtp_precision in QUANTIZED else None
    try:
        head = BuildOptions(model=options.model, input=options.input, precision=options.mtp_precision,
                            execution_provider=options.execution_provider, io_dtype=io).target()
    except BuildError as e:
        raise BuildError(f"--mtp-precision {options.mtp_precision}: {e}") from None
    if head.io_dtype != target.io_dtype:
        raise BuildError(f"--mtp-precision {options.mtp_precision}: the head reads the decoder's hidden states in "
                         f"its activations' {target.io_dtype.name}, and a {options.mtp_precision} head's are "
                         f"{head.io_dtype.name}; choose a precision with the same activations")
    return head.with_layers(1)


def _check_draft_options(name: str, options: BuildOptions, target) -> None:
    """Options a decoder with a draft head does not take: its verify step reads every position's
    logits and the head keeps a float KV cache of its own."""
    if target.last_logits_only:
        raise BuildError(f"--prune-lm-head: {name}'s multi-token-prediction head is verified on every drafted "
                         "position's logits; build without --prune-lm-head, or without the head (--no-mtp)")
    if options.kv_cache != "float":
        raise BuildError(f"--kv-cache {options.kv_cache}: {name}'s multi-token-prediction head keeps a float KV cache; "
                         "build with a float cache, or without the head (--no-mtp)")
