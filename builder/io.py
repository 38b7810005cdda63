"""The decoder's inputs and outputs as onnxruntime-genai expects them (docs/DESIGN.md, "Model I/O contract")."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

from builder.state import KV, LayerState

BATCH, SEQUENCE, TOTAL, PAST = "batch_size", "sequence_length", "total_sequence_length", "past_sequence_length"
# KV length of a layer whose cache is a sliding-window ring buffer: its capacity, not the sequence.
PAST_WINDOW, TOTAL_WINDOW = "past_sliding_length", "total_sliding_length"

PAST_KEY, PAST_VALUE = "past_key_values.%d.key", "past_key_values.%d.value"
PRESENT_KEY, PRESENT_VALUE = "present.%d.key", "present.%d.value"
# A convolution layer's state (LFM2): its last inputs, (batch, channels, length); no KV cache.
PAST_CONV, PRESENT_CONV = "past.%d.conv", "present.%d.conv"
# A linear-attention layer's recurrent state (Qwen3.5's gated DeltaNet), beside its conv state.
PAST_RECURRENT, PRESENT_RECURRENT = "past.%d.recurrent", "present.%d.recurrent"


def tensor_type(dtype: np.dtype | type) -> ir.TensorType:
    """The ONNX tensor type of a numpy dtype."""
    return ir.TensorType(ir.DataType.from_numpy(np.dtype(dtype)))


def graph_value(name: str, dtype: np.dtype | type, dims: tuple) -> ir.Value:
    """A named graph input (or output) of `dtype` and shape `dims` (symbolic names or sizes)."""
    return ir.Value(name=name, type=tensor_type(dtype), shape=ir.Shape(dims))


@dataclass
class DecoderIO:
    """The graph inputs, and the output values once the decoder has produced them.

    What each layer carries is its `states` entry (builder.state.LayerState, declared by the
    family's config), and the inputs follow it: a KV cache's `past` (past_key_values.%d.key,
    .value), a conv state's `conv` (past.%d.conv), a recurrent state's `recurrent`
    (past.%d.recurrent), in that order; a layer returns its presents in the same order (key, value,
    conv, recurrent: those it declares), checked against the declaration. The state names number
    the layers that carry state (`slots`: layer -> number), as onnxruntime-genai numbers what it
    allocates: a stateless layer (Nemotron-H's MLP layers, Gemma 4's KV-sharing ones, which
    attend over another layer's `past`) is not counted; its `past` entry is None, as a layer's
    without a KV cache.
    A multimodal package's decoder reads `inputs_embeds` (batch, sequence, hidden) from its
    embedding model instead of `input_ids`; `token_input` is whichever of the two the graph has."""

    input_ids: ir.Value | None
    attention_mask: ir.Value
    past: list[tuple[ir.Value, ir.Value] | None]
    io_dtype: np.dtype
    states: tuple[LayerState, ...]
    windowed_layers: frozenset[int] = frozenset()
    inputs_embeds: ir.Value | None = None
    conv: dict[int, ir.Value] = field(default_factory=dict)
    recurrent: dict[int, ir.Value] = field(default_factory=dict)
    slots: dict[int, int] = field(default_factory=dict)
    position_ids: ir.Value | None = None  # int64 (batch, sequence) where the provider feeds positions;
    # (3, batch, sequence) for Qwen-VL's M-RoPE (onnxruntime-genai computes both)
    kv_dtype: np.dtype | None = None  # the KV cache's dtype where it is not the IO dtype (int8)

    @classmethod
    def create(cls, num_layers: int, num_kv_heads: int, head_size: int, io_dtype: np.dtype, windowed_layers=(),
               **options) -> DecoderIO:
        """The I/O of a decoder whose every layer carries a KV cache of `num_kv_heads` heads of
        `head_size` (`windowed_layers`: those with a window-long ring buffer); `options` as
        `from_states`'s."""
        kv = KV(num_kv_heads, head_size)
        return cls.from_states([LayerState(kv=kv)] * num_layers, io_dtype, windowed_layers, **options)

    @classmethod
    def from_states(
        cls, states: list[LayerState] | tuple[LayerState, ...], io_dtype: np.dtype, windowed_layers=(),
        embeds_width: int | None = None, position_ids: bool = False, kv_dtype: np.dtype | None = None,
        position_rows: int | None = None,
    ) -> DecoderIO:
        """The I/O of a decoder whose layers carry `states`. `windowed_layers` keep a window-long KV
        ring buffer (see Target.windowed_kv_cache); `embeds_width` (the hidden size) makes the
        decoder read inputs_embeds instead of input_ids; `position_ids` adds that input (int64,
        batch by sequence), fed by onnxruntime-genai (the DirectML provider's rotary); `kv_dtype`
        stores the KV cache in another dtype than the activations (an int8 cache);
        `position_rows` makes position_ids (position_rows, batch, sequence), the positions
        onnxruntime-genai computes for Qwen-VL's multimodal rotary."""
        states, windowed = tuple(states), frozenset(windowed_layers)
        slots = {layer: n for n, layer in enumerate(i for i, s in enumerate(states) if not s.stateless)}

        def kv(i: int, pattern: str) -> ir.Value:
            length = PAST_WINDOW if i in windowed else PAST
            state = states[i].kv
            return graph_value(pattern % slots[i], kv_dtype or io_dtype, (BATCH, state.heads, length, state.head_size))

        conv = {i: graph_value(PAST_CONV % slots[i], io_dtype, (BATCH, s.conv.channels, s.conv.length))
                for i, s in enumerate(states) if s.conv is not None}
        recurrent = {i: graph_value(PAST_RECURRENT % slots[i], io_dtype, (BATCH, *s.recurrent.shape))
                     for i, s in enumerate(states) if s.recurrent is not None}
        past = [(kv(i, PAST_KEY), kv(i, PAST_VALUE)) if s.kv is not None else None for i, s in enumerate(states)]
        embeds = (None if embeds_width is None
                  else graph_value("inputs_embeds", io_dtype, (BATCH, SEQUENCE, embeds_width)))
        return cls(
            input_ids=graph_value("input_ids", np.int64, (BATCH, SEQUENCE)) if embeds is None else None,
            attention_mask=graph_value("attention_mask", np.int64, (BATCH, TOTAL)),
            past=past,
            io_dtype=np.dtype(io_dtype),
            states=states,
            windowed_layers=windowed,
            inputs_embeds=embeds,
            conv=conv,
            recurrent=recurrent,
            slots=slots,
            position_ids=graph_value("position_ids", np.int64, (position_rows, BATCH, SEQUENCE) if position_rows
                                else (BATCH, SEQUENCE)) if position_ids or position_rows else None,
            kv_dtype=None if kv_dtype is None else np.dtype(kv_dtype),
        )

    @property
    def token_input(self) -> ir.Value:
        return self.input_ids if self.inputs_embeds is None else self.inputs_embeds

    @property
    def inputs(self) -> list[ir.Value]:
        states = ((*(kv or ()), *self._conv(i)) for i, kv in enumerate(self.past))
        positions = [] if self.position_ids is None else [self.position_ids]
        return [self.token_input, self.attention_mask, *positions, *(v for state in states for v in state)]

    def outputs(self, logits: ir.Value, vocab_size: int, presents: list[tuple[ir.Value, ...]],
                last_only: bool = False) -> list[ir.Value]:
        """Names and types the final values as the contract's outputs: each layer's presents, in
        its declaration's order, checked against it. `last_only`: logits of each row's last token
        alone, (batch, 1, vocab): onnxruntime-genai reads that fixed 1 as a pruned model
        (Model::IsPruned) and takes the row as the one to sample from."""
        logits.name = "logits"
        logits.type = tensor_type(logits_dtype(self.io_dtype))
        logits.shape = ir.Shape((BATCH, 1 if last_only else SEQUENCE, vocab_size))
        for i, (state, present) in enumerate(zip(self.states, presents, strict=True)):
            if len(present) != len(state.names):
                raise ValueError(f"layer {i} returned {len(present)} states; it declares {', '.join(state.names) or 'none'}")
            named = dict(zip(state.names, present))
            if state.kv is not None:
                for kind, pattern in (("key", PRESENT_KEY), ("value", PRESENT_VALUE)):
                    v = named[kind]
                    v.name = pattern % self.slots[i]
                    v.type = tensor_type(self.kv_dtype or self.io_dtype)
                    length = TOTAL_WINDOW if i in self.windowed_layers else TOTAL
                    v.shape = ir.Shape((BATCH, state.kv.heads, length, state.kv.head_size))
            for kind, pattern, past in (("conv", PRESENT_CONV, self.conv), ("recurrent", PRESENT_RECURRENT,
                                                                            self.recurrent)):
                if kind in named:
                    v = named[kind]
                    v.name = pattern % self.slots[i]
                    v.type, v.shape = past[i].type, ir.Shape(tuple(past[i].shape))
        return [logits, *(v for state in presents for v in state)]

    def _conv(self, layer: int) -> tuple[ir.Value, ...]:
        """A layer's conv state and its recurrent state, those it has."""
        return tuple(states[layer] for states in (self.conv, self.recurrent) if layer in states)


def hidden_output(g, hidden: ir.Value, name: str, io_dtype: np.dtype, width: int) -> ir.Value:
    """`hidden` (batch, sequence, width) as the graph output `name`: its own value (an Identity),
    as the value itself also feeds lm_head."""
    out = g.op.Identity(hidden)
    out.name, out.type, out.shape = name, tensor_type(io_dtype), ir.Shape((BATCH, SEQUENCE, width))
    return out


def logits_dtype(io_dtype: np.dtype) -> np.dtype:
    """fp16 models return fp16 logits; bf16 ones return fp32 (what onnxruntime-genai samples from)."""
    return np.dtype(np.float16) if np.dtype(io_dtype) == np.float16 else np.dtype(np.float32)
