"""A decoder family, declared in the one file that defines it, and the decoder body families share.

An architecture module ends with its declaration; the registry (architectures/__init__.py), the
CLI's `--list-architectures` and the README's table are read from these, never written twice:

    FAMILY = register(Family(
        "llama", LlamaConfig, decoder_layer, VARIANTS,
        structure=STRUCTURE, ignored=("model.layers.*.self_attn.rotary_emb.inv_freq",),
    ))

The shared body (`Family.build`) records, in this order: the rotary tables (`rotary` hook), the
sequence lengths GroupQueryAttention reads (made the first time a hook asks, so a LongRoPE table
that needs them comes after them), `prepare` (anything the layers share), the vocabulary, the
embedding (`embed`), the residual stream (`stream`), each layer (`layer(d, w, i)` -> its present
key and value), the final norm (`final_norm`) and the logits (`logits`), of each row's last real
token alone where the target says so (Target.last_logits_only). Every hook takes the
per-build `Decoder`, so a layer function reads like the modeling file's forward:

    def decoder_layer(d: Decoder, w: Weights, i: int):
        h = d.stream.norm(w("input_layernorm.weight", d.c.hidden_size))
        ...
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import onnx_ir as ir

from builder.architecture import Weights, decoder_layers, vocabulary
from builder.blocks.attention import SequenceLengths, sequence_lengths
from builder.blocks.lm_head import last_positions
from builder.blocks.residual import ResidualStream
from builder.blocks.rope import ExplicitRotary, Rope, rotary_tables, rotary_tables_by_layer_type
from builder.blocks.short_conv import Padding, padding
from builder.blocks.vocabulary import Vocabulary
from builder.decoder_config import DecoderConfig
from builder.errors import BuildError
from builder.graph import Graph
from builder.hf_config import from_dict, rope_parameters
from builder.inputs.source import Checkpoint
from builder.io import DecoderIO
from builder.target import Target


# What a `rotary` hook returns: GroupQueryAttention's (cos, sin), tables applied before it
# (ExplicitRotary), one of those per layer type, or none (a decoder without a rotary).
RotaryTables = tuple[ir.Value, ir.Value] | ExplicitRotary | dict[str, "RotaryTables"] | None


@dataclass(eq=False)
class Decoder:
    """One build of one decoder: what every hook and layer reads, and what the body makes on the
    way (`rotary`, `prepared`, `vocab`, `stream`), set before the hooks that use them run."""

    g: Graph
    io: DecoderIO
    ckpt: Checkpoint
    c: DecoderConfig  # the family's config (a subclass: its own keys beside the shared ones)
    target: Target
    prefix: str = "model."  # where the checkpoint keeps the decoder's tensors (Family.prefix, resolved)
    rotary: RotaryTables = None  # per layer type for families that rotate them apart
    prepared: object = None  # what the family's `prepare` hook returned (the family reads its own kind)
    vocab: Vocabulary | None = None
    stream: ResidualStream | None = None

    @cached_property
    def lengths(self) -> SequenceLengths:
        return sequence_lengths(self.g, self.io.attention_mask)

    def past(self, layer: int) -> tuple[ir.Value, ir.Value]:
        return self.io.past[layer]


def rotary(d: Decoder) -> RotaryTables:
    """The rotary tables of `c.rope_parameters` over the whole head (`Rope.from_parameters`)."""
    c = d.c
    rope = Rope.from_parameters(c.rope_parameters, c.head_dim, c.max_position_embeddings)
    return rotary_tables(d.g, rope, c.max_position_embeddings, d.target, head_size=c.head_dim)


def rotary_by_layer_type(d: Decoder) -> dict[str, Any]:
    """The rotary tables per layer type (`rotary_tables_by_layer_type`: one set shared by every type,
    or each type its own when `c.rope_parameters` has one dict per type); a layer reads
    `d.rotary[c.layer_types[i]]`."""
    c = d.c
    return rotary_tables_by_layer_type(d.g, c.rope_parameters, c.layer_types, c.head_dim, c.max_position_embeddings,
                                       d.target)


def tied_vocabulary(d: Decoder) -> Vocabulary:
    """The decoder's embed_tokens (under its prefix) and lm_head, tied as transformers 5 ties them
    (builder.architecture.vocabulary)."""
    return vocabulary(d.g, d.ckpt, d.target, (d.c.vocab_size, d.c.hidden_size), d.c.tie_word_embeddings,
                      embed=d.prefix + "embed_tokens.weight")


def embed(d: Decoder) -> ir.Value:
    return d.vocab.embed(d.g, d.io.input_ids)


def conv_padding(d: Decoder) -> Padding | None:
    """A hybrid's `prepare`: where the new tokens' padding is (builder.blocks.short_conv.padding),
    computed once for every layer with a convolution state (`c.conv_layers`: LFM2's, Qwen3.5's
    DeltaNet, Mamba-2's)."""
    return padding(d.g, d.io.token_input, d.io.attention_mask, d.target) if d.c.conv_layers else None


def rms_stream(d: Decoder, x: ir.Value) -> ResidualStream:
    return ResidualStream(d.g, x, d.c.rms_norm_eps, d.target)


def normed_attention(d: Decoder, w: Weights, i: int, attend: Callable, norm: str = "input_layernorm"):
    """A pre-norm layer's first half up to its residual: `norm`(x) in its module's scope, then
    attend(d, the weights under self_attn., i, h) in self_attn's; returns what `attend` returns (the
    attention's output, then the layer's presents)."""
    with d.g.scope(norm):
        h = d.stream.norm(w(f"{norm}.weight", d.c.hidden_size))
    with d.g.scope("self_attn"):
        return attend(d, w.under("self_attn."), i, h)


def final_norm(d: Decoder) -> ir.Value:
    """The decoder's norm (under its prefix) over the residual stream."""
    with d.g.scope("model", "norm"):
        return d.stream.norm(d.ckpt.weight(d.prefix + "norm.weight", (d.c.hidden_size,)))


def logits(d: Decoder, h: ir.Value) -> ir.Value:
    return d.vocab.logits(d.g, h)


def parse(family: Family, raw: dict[str, Any], architecture: str) -> Any:
    """The config of `architecture`: config.json over its VARIANTS row, rotary settings resolved as
    transformers standardizes them (the row's `default_theta` and `partial_rotary_factor` where
    config.json has none), then its STRUCTURE row (facts the modeling file fixes)."""
    defaults = dict(family.variants[architecture])
    # The length scaled rotary settings default to: config.json's, the row's, else the config class's.
    max_pos = raw.get("max_position_embeddings",
                      defaults.get("max_position_embeddings", family.config.max_position_embeddings))
    rope = rope_parameters(raw, max_pos, defaults.pop("default_theta", 10_000.0))
    if "partial_rotary_factor" in defaults:  # the config class's share of the head that rotates (Phi's 0.5)
        rope.setdefault("partial_rotary_factor", defaults.pop("partial_rotary_factor"))
    if not family.partial_rotary:
        rope = whole_head_rotary(rope, architecture)
    return from_dict(family.config, raw, defaults, rope_parameters=rope, **family.structure.get(architecture, {}))


def no_partial_rotary(rope: dict[str, Any], architecture: str) -> dict[str, Any]:
    """`rope` (one dict per layer type) for a modeling file that cannot run a partial rotary at
    all: transformers puts a top-level partial_rotary_factor into every type's entry, its rotary
    then makes cos/sin narrower than the head it multiplies, and the forward fails (Gemma 3,
    OLMo 3, Cohere 2)."""
    for kind, params in rope.items():
        if isinstance(params, dict) and params.get("partial_rotary_factor", 1.0) != 1.0:
            raise BuildError(f"{architecture} with partial_rotary_factor {params['partial_rotary_factor']} "
                             f"({kind}): transformers rotates the whole head there and cannot run it")
    return rope


def strip_partial_rotary(raw: dict[str, Any]) -> dict[str, Any]:
    """config.json without partial_rotary_factor, for a decoder that has no rotary at all (no
    position_embedding_type rope, Nemotron-H): the value is never read."""
    raw = {k: v for k, v in raw.items() if k != "partial_rotary_factor"}
    for key in ("rope_parameters", "rope_scaling"):
        if isinstance(raw.get(key), dict):
            raw[key] = {k: v for k, v in raw[key].items() if k != "partial_rotary_factor"}
    return raw


def whole_head_rotary(rope: dict[str, Any], architecture: str) -> dict[str, Any]:
    """`rope` for a modeling file that rotates the whole head (its own compute_default_rope_parameters
    ignores partial_rotary_factor, as Llama's, Granite's, Gemma's and the MoE families' do): with
    the default rope the factor is dropped, as there; a scaled rope takes it (transformers' shared
    functions do) and makes cos/sin narrower than the head, which transformers cannot run, so it is
    refused."""
    rope = dict(rope)
    if rope.pop("partial_rotary_factor", 1.0) != 1.0 and rope.get("rope_type", "default") != "default":
        raise BuildError(f"{architecture} with partial_rotary_factor and {rope['rope_type']} rope: transformers "
                         "rotates the whole head for these, and cannot run this combination")
    return rope


@dataclass(frozen=True)
class ModelType:
    """Another name on the hub for one of a family's rows: a `model_type` transformers builds with
    that row's class (InternLM3 and EXAONE 3 as Llama), from config.json keys of its own config
    class (`keys`: its attribute_map, the hub's key -> the one the family reads) and tensors of its
    own names (`renames`: its conversion rules, (regex, replacement) over the stored names, in
    order; `splits(config)`: fused tensors whose rows are several of the family's, as
    builder.inputs.renamed.Splits). `architecture` is the family's row for it (its config class's
    defaults, in `variants`)."""

    architecture: str
    keys: dict[str, str] = field(default_factory=dict)
    renames: tuple[tuple[str, str], ...] = ()
    splits: Callable[[Any], tuple] | None = None


@dataclass(frozen=True)
class Family:
    """A decoder family: its architectures (`variants`: architecture -> transformers' config
    defaults for it), config dataclass, layer, and the hooks it changes around the shared body.

    `structure`: per architecture, facts its modeling file fixes whatever config.json says.
    `ignored`: fnmatch patterns of checkpoint tensors deliberately unused. `quant_methods`: the
    pre-quantized `quant_method`s it reads itself (gpt-oss's mxfp4). (A checkpoint's other models
    are built by a package builder registered beside its own definition: builder.package.)
    `partial_rotary`: its modeling files rotate config.json's partial_rotary_factor of the head
    (Phi, StableLM, GLM, Qwen3.5); the others rotate the whole head whatever it says (their own
    compute_default_rope_parameters ignores it: whole_head_rotary), so `parse` drops it, or refuses
    it with a scaled rope, which transformers cannot run.
    `model_types`: the hub's `model_type`s that transformers maps onto one of its rows (ModelType);
    config.json's model_type selects the row whatever its `architectures` says.
    `weights`/`prefix`: how a layer's tensors are read (`{prefix}layers.{i}.`), a callable taking
    the Decoder where the prefix depends on the checkpoint. `layer` None: the shared body does not
    build this family's decoder; its package records it (builder.package.Package.decoder: Whisper's
    int32 ids, self and cross caches, no attention mask)."""

    name: str
    config: type
    layer: Callable[[Decoder, Weights, int], tuple[ir.Value, ir.Value]] | None
    variants: dict[str, dict[str, Any]]
    structure: dict[str, dict[str, Any]] = field(default_factory=dict)
    ignored: tuple[str, ...] = ()
    quant_methods: tuple[str, ...] = ()
    partial_rotary: bool = False
    model_types: dict[str, ModelType] = field(default_factory=dict)
    parser: Callable[[Family, dict[str, Any], str], Any] = parse
    rotary: Callable[[Decoder], RotaryTables] = rotary
    prepare: Callable[[Decoder], Any] | None = None
    vocabulary: Callable[[Decoder], Vocabulary] = tied_vocabulary
    embed: Callable[[Decoder], ir.Value] = embed
    stream: Callable[[Decoder, ir.Value], ResidualStream] = rms_stream
    weights: type[Weights] = Weights
    prefix: str | Callable[[Decoder], str] = "model."
    final_norm: Callable[[Decoder], ir.Value] = final_norm
    logits: Callable[[Decoder, ir.Value], ir.Value] = logits
    mtp: Any = None  # its checkpoints' multi-token-prediction head (builder.draft_head.DraftHead), if any

    @property
    def architectures(self) -> tuple[str, ...]:
        return tuple(self.variants)

    def with_(self, **changes: Any) -> Family:
        """This family with other rows or hooks: a family that is another's decoder with its own
        architectures (Ministral on Llama's) says only what differs."""
        return dataclasses.replace(self, **changes)

    def model_type(self, architecture: str) -> ModelType | None:
        """The ModelType whose row `architecture` is, None for the family's own rows."""
        return next((a for a in self.model_types.values() if a.architecture == architecture), None)

    def parse_config(self, raw: dict[str, Any], architecture: str) -> Any:
        for alias in self.model_types.values():  # the hub's keys of another config class, renamed
            if alias.architecture == architecture and alias.keys:
                raw = {alias.keys.get(k, k): v for k, v in raw.items()}
        return self.parser(self, raw, architecture)

    def build(self, g: Graph, io: DecoderIO, ckpt: Checkpoint, c: Any,
              target: Target) -> tuple[ir.Value, list[tuple[ir.Value, ir.Value]], ir.Value]:
        """The decoder graph: returns (logits, every layer's presents, the final norm's output: the
        hidden states lm_head reads, which a draft head reads too)."""
        if self.layer is None:
            raise ValueError(f"the {self.name} family's decoder is recorded by its package (Package.decoder)")
        d = Decoder(g, io, ckpt, c, target)
        d.prefix = self.prefix(d) if callable(self.prefix) else self.prefix
        d.rotary = self.rotary(d)
        d.lengths  # noqa: B018 - recorded here unless the rotary tables already needed them
        d.prepared = self.prepare(d) if self.prepare is not None else None
        d.vocab = self.vocabulary(d)
        d.stream = self.stream(d, self.embed(d))
        presents = decoder_layers(g, ckpt, c.num_hidden_layers, lambda i, w: self.layer(d, w, i), d.prefix,
                                  self.weights)
        hidden = h = self.final_norm(d)
        if target.last_logits_only:  # (B, S, H) -> (B, 1, H): lm_head for the row genai samples from
            h = last_positions(g, h, d.lengths.seqlens_k)
        return self.logits(d, h), presents, hidden


FAMILIES: dict[str, Family] = {}


def register(family: Family) -> Family:
    """Adds `family` to the registry (architectures/__init__.py imports every module, so each
    declaration registers itself); an architecture claimed twice is a bug, refused."""
    for architecture in family.architectures:
        for other in FAMILIES.values():
            if architecture in other.variants and other.name != family.name:
                raise BuildError(f"{architecture} is declared by both architectures/{other.name}.py and "
                                 f"architectures/{family.name}.py")
    FAMILIES[family.name] = family
    return family


__all__ = ["FAMILIES", "Decoder", "Family", "ModelType", "normed_attention", "conv_padding", "embed", "final_norm", "logits", "parse", "register", "rms_stream",
           "rotary", "rotary_by_layer_type", "tied_vocabulary"]
