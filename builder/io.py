"""The decoder's inputs and outputs as onnxruntime-genai expects them (docs/DESIGN.md, "Model I/O contract")."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

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

    A multimodal package's decoder reads `inputs_embeds` (batch, sequence, hidden) from its
    embedding model instead of `input_ids`; `token_input` is whichever of the two the graph has.
    A hybrid decoder's convolution layers read a conv state (`conv`, by layer) and have no KV:
    their `past` entry is None, and their layer returns its present conv state alone, a 1-tuple;
    linear-attention layers (Qwen3.5) also read a recurrent state (`recurrent`, by layer) and
    return (conv state, recurrent state). A layer that attends and scans in parallel (Falcon-H1's
    every layer: `hybrid_layers`, among the conv layers) keeps its KV as well: it reads
    past_key_values.%d.key, .value, then past.%d.conv, .recurrent, and returns (key, value, conv
    state, recurrent state) in that order. A `stateless` layer (Nemotron-H's MLP and expert
    layers) reads and returns nothing: its `past` entry is None and it returns (). The state
    names number the layers that carry state (`slots`: layer -> number), as onnxruntime-genai
    numbers what it allocates: it gives every layer it counts a KV cache or a conv state, so a
    stateless layer is not counted.
    Gemma 4's KV-sharing layers are stateless too: they attend over another layer's `past`. Its
    full-attention layers' KV has its own (heads, head size): `layer_kv_dims`."""

    input_ids: ir.Value | None
    attention_mask: ir.Value
    past: list[tuple[ir.Value, ir.Value]]
    io_dtype: np.dtype
    kv_dims: tuple[int, int]  # (num_kv_heads, head_size)
    windowed_layers: frozenset[int] = frozenset()
    inputs_embeds: ir.Value | None = None
    conv: dict[int, ir.Value] = field(default_factory=dict)
    recurrent: dict[int, ir.Value] = field(default_factory=dict)
    stateless: frozenset[int] = frozenset()
    slots: dict[int, int] = field(default_factory=dict)
    layer_kv_dims: dict[int, tuple[int, int]] = field(default_factory=dict)  # layer -> its own kv_dims
    position_ids: ir.Value | None = None  # int64 (batch, sequence) where the provider feeds positions;
    # (3, batch, sequence) for Qwen-VL's M-RoPE (onnxruntime-genai computes both)
    kv_dtype: np.dtype | None = None  # the KV cache's dtype where it is not the IO dtype (int8)

    def kv_dims_of(self, layer: int) -> tuple[int, int]:
        """(num_kv_heads, head_size) of `layer`'s KV: its own where it differs (Gemma 4's full layers)."""
        return self.layer_kv_dims.get(layer, self.kv_dims)

    @classmethod
    def create(
        cls, num_layers: int, num_kv_heads: int, head_size: int, io_dtype: np.dtype, windowed_layers=(),
        embeds_width: int | None = None, conv_layers=(), conv_state: tuple[int, int] | None = None,
        recurrent_state: tuple[int, ...] | None = None, stateless_layers=(), hybrid_layers=(),
        layer_kv_dims: dict[int, tuple[int, int]] | None = None, position_ids: bool = False,
        kv_dtype: np.dtype | None = None, position_rows: int | None = None,
    ) -> DecoderIO:
        """`windowed_layers` keep a window-long KV ring buffer (see Target.windowed_kv_cache);
        `embeds_width` (the hidden size) makes the decoder read inputs_embeds instead of input_ids;
        `conv_layers` read a conv state of (channels, length) `conv_state` instead of a KV cache, and
        with `recurrent_state` (its shape less the batch) a recurrent state after it too;
        `stateless_layers` carry no state at all; `hybrid_layers` (conv layers too) read their KV
        cache before those states; `layer_kv_dims` (layer -> (num_kv_heads, head_size)) gives the
        layers whose KV is shaped apart (Gemma 4's full-attention layers); `position_ids` adds that
        input (int64, batch by sequence), fed by onnxruntime-genai (the DirectML provider's rotary);
        `kv_dtype` stores the KV cache in another dtype than the activations (an int8 cache);
        `position_rows` makes position_ids (position_rows, batch, sequence), the positions
        onnxruntime-genai computes for Qwen-VL's multimodal rotary."""
        windowed, stateless = frozenset(windowed_layers), frozenset(stateless_layers)
        slots = {layer: n for n, layer in enumerate(i for i in range(num_layers) if i not in stateless)}

        own = dict(layer_kv_dims or {})

        def kv(i: int, pattern: str) -> ir.Value:
            length = PAST_WINDOW if i in windowed else PAST
            heads, size = own.get(i, (num_kv_heads, head_size))
            return graph_value(pattern % slots[i], kv_dtype or io_dtype, (BATCH, heads, length, size))

        conv = {i: graph_value(PAST_CONV % slots[i], io_dtype, (BATCH, *conv_state)) for i in conv_layers}
        recurrent = {} if recurrent_state is None else {
            i: graph_value(PAST_RECURRENT % slots[i], io_dtype, (BATCH, *recurrent_state)) for i in conv_layers}
        hybrid = frozenset(hybrid_layers)
        past = [None if i in stateless or (i in conv and i not in hybrid) else (kv(i, PAST_KEY), kv(i, PAST_VALUE))
                for i in range(num_layers)]
        embeds = (None if embeds_width is None
                  else graph_value("inputs_embeds", io_dtype, (BATCH, SEQUENCE, embeds_width)))
        return cls(
            input_ids=graph_value("input_ids", np.int64, (BATCH, SEQUENCE)) if embeds is None else None,
            attention_mask=graph_value("attention_mask", np.int64, (BATCH, TOTAL)),
            past=past,
            io_dtype=np.dtype(io_dtype),
            kv_dims=(num_kv_heads, head_size),
            windowed_layers=windowed,
            inputs_embeds=embeds,
            conv=conv,
            recurrent=recurrent,
            stateless=stateless,
            slots=slots,
            layer_kv_dims=own,
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

    def outputs(self, logits: ir.Value, vocab_size: int, presents: list[tuple[ir.Value, ir.Value]],
                last_only: bool = False) -> list[ir.Value]:
        """Names and types the final values as the contract's outputs. `last_only`: logits of each
        row's last token alone, (batch, 1, vocab): onnxruntime-genai reads that fixed 1 as a pruned
        model (Model::IsPruned) and takes the row as the one to sample from."""
        logits.name = "logits"
        logits.type = tensor_type(logits_dtype(self.io_dtype))
        logits.shape = ir.Shape((BATCH, 1 if last_only else SEQUENCE, vocab_size))
        for i, present in enumerate(presents):
            if self.past[i] is not None:
                heads, size = self.kv_dims_of(i)
                key, value, *present = present
                for v, pattern in ((key, PRESENT_KEY), (value, PRESENT_VALUE)):
                    v.name = pattern % self.slots[i]
                    v.type = tensor_type(self.kv_dtype or self.io_dtype)
                    v.shape = ir.Shape((BATCH, heads, TOTAL_WINDOW if i in self.windowed_layers else TOTAL, size))
            if i in self.conv:
                self._name_conv_state(i, *present)
        return [logits, *(v for state in presents for v in state)]

    def _conv(self, layer: int) -> tuple[ir.Value, ...]:
        """A layer's conv state and its recurrent state, those it has."""
        return tuple(states[layer] for states in (self.conv, self.recurrent) if layer in states)

    def _name_conv_state(self, layer: int, state: ir.Value, recurrent: ir.Value | None = None) -> None:
        """Names a conv layer's present state(s): its conv state, and its recurrent state if it has one."""
        named = [(state, self.conv[layer], PRESENT_CONV)]
        if recurrent is not None:
            named.append((recurrent, self.recurrent[layer], PRESENT_RECURRENT))
        for value, past, pattern in named:
            value.name = pattern % self.slots[layer]
            value.type, value.shape = past.type, ir.Shape(tuple(past.shape))


def logits_dtype(io_dtype: np.dtype) -> np.dtype:
    """fp16 models return fp16 logits; bf16 ones return fp32 (what onnxruntime-genai samples from)."""
    return np.dtype(np.float16) if np.dtype(io_dtype) == np.float16 else np.dtype(np.float32)
