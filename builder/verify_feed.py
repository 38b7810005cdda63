"""--verify's side of the built package: its decoder fed as onnxruntime-genai feeds it, from what
the package declares (genai_config.json, and the inputs each graph names), never from the model's
type: every state the decoder reads (KV, conv, recurrent), zeros of the declared shape first and
then what the last step returned; an attention mask over the whole sequence; position ids where
the decoder reads them (M-RoPE's three rows where they are three); the token input through the
package's embedding model where it has one.

Works on open ONNX Runtime sessions without importing ONNX Runtime: builder/verify.py opens them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np

from builder.errors import BuildError

Feed = dict[str, np.ndarray]


def check_fed(genai: dict[str, Any], output: Path) -> None:
    """Refuses a package whose decoder reads no attention mask (one fed by an encoder): --verify
    runs decoders as genai's causal loop does."""
    if "attention_mask" in genai["decoder"]["inputs"]:
        return
    fed = ", fed by an encoder" if "encoder" in genai else ""
    raise BuildError(f"--verify runs decoders that read input_ids and an attention mask, not "
                     f"{genai['type'].capitalize()}'s{fed}; the package in {output} is written (its own tests "
                     "compare it with transformers)")


class DecoderFeed:
    """A decoder session and the states it declares, fed prompt then step as genai feeds it."""

    def __init__(self, session, decoder: dict[str, Any], dtype: type) -> None:
        declared = session.get_inputs()
        window = decoder.get("sliding_window") or {}
        self.session, self.dtype, self.layers = session, dtype, decoder["num_hidden_layers"]
        self.window, self.windowed = window.get("window_size", 0), set(window.get("layers", []))
        self.shapes = {i.name: i.shape for i in declared}
        kv = next((i.type for i in declared if i.name.startswith("past_key_values.")), "")
        self.kv_dtype = np.int8 if kv == "tensor(int8)" else dtype
        # A hybrid's conv and recurrent states (past.<layer>.*), beside KV or instead of it, or none
        # on a layer without state: zeros of the declared shape first, as genai.
        self.states = {i.name: [1 if isinstance(d, str) else d for d in i.shape] for i in declared
                       if i.name.startswith("past.")}
        self.outputs = [o.name for o in session.get_outputs()]

    def logits(self, prompt: Feed, step: Feed, length: int,
               positions: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The logits of the prompt (`length` tokens) and of the step after it; `positions`: the
        prompt's M-RoPE rows (3, 1, S) where the decoder reads three (text alone: 0, 1, …)."""
        if len(self.shapes.get("position_ids", ())) == 3:  # M-RoPE's rows, as genai computes them
            if positions is None:
                positions = np.broadcast_to(np.arange(length), (3, 1, length))
            prompt = {**prompt, "position_ids": np.ascontiguousarray(positions, np.int64)}
            step = {**step, "position_ids": np.full((3, 1, 1), positions.max() + 1, np.int64)}
        first = self.run(prompt, None, length)
        second = self.run(step, first, length + 1)
        return first["logits"][0], second["logits"][0]

    def run(self, feed: Feed, past: Feed | None, total: int) -> Feed:
        """One run over `feed`'s new tokens, `total` with the cached ones; `past`: the last run's
        outputs (None: the first run)."""
        feed = {**feed, "attention_mask": np.ones((1, total), np.int64)}
        if "position_ids" in self.shapes and "position_ids" not in feed:  # a provider's rotary (DirectML's), as genai
            new = next(iter(feed.values())).shape[1]
            feed["position_ids"] = np.arange(total - new, total, dtype=np.int64)[None]
        for layer in range(self.layers):
            feed.update(self._states(layer, past))
        return dict(zip(self.outputs, self.session.run(None, feed)))

    def _states(self, layer: int, past: Feed | None) -> Feed:
        """A layer's state inputs: its presents from `past`, else zeros (KV: the window's length on
        a layer genai allocates window-long, else empty; each layer's own heads and size)."""
        feed = {name: past[name.replace("past", "present", 1)] if past else np.zeros(shape, self.dtype)
                for name, shape in self.states.items() if name.startswith(f"past.{layer}.")}
        if f"past_key_values.{layer}.key" not in self.shapes:
            return feed
        cap = self.window if layer in self.windowed else 0
        for kind in ("key", "value"):
            name = f"past_key_values.{layer}.{kind}"
            _, heads, _, size = self.shapes[name]
            feed[name] = past[f"present.{layer}.{kind}"] if past else np.zeros((1, heads, cap, size), self.kv_dtype)
        return feed


def embedder(session, hidden: int) -> Callable[..., Feed]:
    """The decoder's token input for ids: input_ids where `session` is None, else the embedding
    model's inputs_embeds (with the image features given, else none: a text-only step)."""
    if session is None:
        return lambda ids, features=None: {"input_ids": ids}
    declared = next(i for i in session.get_inputs() if i.name == "image_features")
    dtype = np.float16 if declared.type == "tensor(float16)" else np.float32
    empty = np.zeros((1, 0, hidden)[3 - len(declared.shape):], dtype)

    def embed(ids: np.ndarray, features: np.ndarray | None = None) -> Feed:
        rows = empty if features is None else features.astype(empty.dtype)
        return {"inputs_embeds": session.run(None, {"input_ids": ids, "image_features": rows})[0]}

    return embed


def image_feed(session, pixels: np.ndarray, grid: np.ndarray | None = None) -> Feed:
    """The vision model's inputs: the pixels in the type it declares, and the patch grid where given."""
    kind = next(i.type for i in session.get_inputs() if i.name == "pixel_values")
    feed = {"pixel_values": pixels.astype(np.float16 if kind == "tensor(float16)" else np.float32)}
    if grid is not None:
        feed["image_grid_thw"] = grid
    return feed


__all__ = ["DecoderFeed", "check_fed", "embedder", "image_feed"]
