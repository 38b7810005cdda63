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
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import onnx_ir as ir

from builder.architecture import Weights, decoder_info, decoder_layers
from builder.blocks.linear import linear
from builder.blocks.lm_head import last_positions
from builder.blocks.norm import rms_norm
from builder.errors import BuildError
from builder.graph import Graph
from builder.inputs.source import Checkpoint
from builder.io import BATCH, SEQUENCE, DecoderIO, graph_value
from builder.lazy import Weight
from builder.package import PackageModel
from builder.target import Target

__all__ = ["DRAFT_STEM", "HIDDEN_STATES", "DraftHead", "draft_model", "full_attention_layer", "plain_norm"]

DRAFT_STEM = "mtp"  # mtp.onnx, genai_config.json's "mtp" section
HIDDEN_STATES = "hidden_states"  # the decoder's output and the head's input: h after the final norm
HIDDEN_STATES_OUT = "hidden_states_out"  # the head's own normed output, for a chained draft


def plain_norm(w: Weights, name: str, size: int) -> Weight:
    """A norm's weight as stored (a family whose RMSNorm scales by the weight itself)."""
    return w(name, size)


@dataclass(frozen=True)
class DraftHead:
    """Where a family's checkpoints keep their MTP head and how its layer is built.

    `prefix`: the head's tensors (`mtp.`: `{prefix}fc.weight`, `{prefix}layers.0.*`, ...), read
    only when the checkpoint has some (transformers' own save_pretrained drops them); the other
    names are under it. `layer_config(c)`: the decoder's config as the head's one layer is built
    (Qwen3.5's: num_hidden_layers 1, layer_types [full_attention]); the layer is the family's own
    `layer` hook. `norm(w, name, size)`: a norm weight as the family's RMSNorm multiplies it
    (Qwen3.5's (1 + weight))."""

    prefix: str = "mtp."
    embedding_norm: str = "pre_fc_norm_embedding.weight"
    hidden_norm: str = "pre_fc_norm_hidden.weight"
    projection: str = "fc.weight"
    final_norm: str = "norm.weight"
    layer_config: Callable[[Any], Any] = lambda c: c
    norm: Callable[[Weights, str, int], Weight] = plain_norm

    @property
    def pattern(self) -> str:
        """The fnmatch pattern of the head's tensors (a family ignores them when it is not built)."""
        return self.prefix + "*"

    def stored(self, ckpt: Checkpoint) -> bool:
        """Whether the checkpoint holds any of the head's tensors."""
        return any(n.startswith(self.prefix) for n in ckpt.tensors)

    def layer_count(self, ckpt: Checkpoint) -> int:
        """How many layers the checkpoint's head has (`{prefix}layers.N.*`)."""
        found = re.compile(re.escape(self.prefix) + r"layers\.(\d+)\.")
        return len({m.group(1) for n in ckpt.tensors if (m := found.match(n))})


def draft_model(family, ckpt: Checkpoint, c: Any, target: Target) -> PackageModel:
    """The family's MTP head (`family.mtp`, a DraftHead) recorded as mtp.onnx: inputs input_ids,
    attention_mask, hidden_states (batch, sequence, hidden), its one layer's KV cache; outputs
    logits of the last position (batch, 1, vocab), hidden_states_out (every position's) and that
    layer's present KV."""
    from builder.family import Decoder  # the shared body's per-build state (family imports this module's users)

    head: DraftHead = family.mtp
    layers = head.layer_count(ckpt)
    if layers != 1:
        raise BuildError(f"the checkpoint's MTP head has {layers} layers ({head.prefix}layers.N); onnxruntime-genai "
                         "runs a one-layer head: build without it (--no-mtp)")
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
    w = family.weights(ckpt, head.prefix)
    tokens = family.embed(d)
    with g.scope("mtp", "pre_fc_norm_embedding"):
        tokens = rms_norm(g, tokens, head.norm(w, head.embedding_norm, H), c.rms_norm_eps, target)
    with g.scope("mtp", "pre_fc_norm_hidden"):
        h = rms_norm(g, hidden, head.norm(w, head.hidden_norm, H), c.rms_norm_eps, target)
    with g.scope("mtp", "fc"):
        x = linear(g, g.op.Concat(tokens, h, axis=-1), w(head.projection, H, 2 * H), target)
    d.stream = family.stream(d, x)
    presents = decoder_layers(g, ckpt, 1, lambda i, lw: family.layer(d, lw, i), head.prefix, family.weights)
    with g.scope("mtp", "norm"):
        out = d.stream.norm(head.norm(w, head.final_norm, H))
    # A draft reads the last row's logits alone (after an accepted draft the head takes two pairs, over
    # a prompt all of them): lm_head over that row only, [batch, 1, vocab], as a pruned decoder's.
    logits = family.logits(d, last_positions(g, out, d.lengths.seqlens_k))
    out = g.op.Identity(out)  # its own value: the graph output beside lm_head's input
    out.name, out.type, out.shape = HIDDEN_STATES_OUT, hidden.type, ir.Shape(hidden.shape)
    inputs = [*io.inputs[:2], hidden, *io.inputs[2:]]
    outputs = [*io.outputs(logits, info.vocab_size, presents, last_only=True), out]
    kv = info.layers[0].kv
    genai = {
        "num_hidden_layers": 1, "num_key_value_heads": kv.heads, "head_size": kv.head_size,
        "main_hidden_states": HIDDEN_STATES,
        "inputs": {"input_ids": "input_ids", "hidden_states": HIDDEN_STATES, "attention_mask": "attention_mask",
                   "position_ids": "position_ids", "past_key_names": "past_key_values.%d.key",
                   "past_value_names": "past_key_values.%d.value"},
        "outputs": {"logits": "logits", "hidden_states": HIDDEN_STATES_OUT, "present_key_names": "present.%d.key",
                    "present_value_names": "present.%d.value"},
    }
    return PackageModel(DRAFT_STEM, g.model(inputs, outputs, standard=target.standard_ops), dict(g.sources),
                        DRAFT_STEM, genai)


def full_attention_layer(c: Any, attention: str = "full_attention") -> Any:
    """`c` as a one-layer decoder whose layer is `attention` (Qwen3.5's MTP layer)."""
    return dataclasses.replace(c, num_hidden_layers=1, layer_types=[attention])
