"""What each decoder layer carries from one step to the next, declared as data.

A family's config answers `layer_state(i)` with a `LayerState`: a KV cache (`KV`), a convolution's
last inputs (`Conv`), a recurrent state (`Recurrent`), a combination of them in that order (Falcon-H1
attends and scans in every layer), or nothing (Nemotron-H's MLP layers, Gemma 4's layers that read
another layer's KV). From these declarations alone come the decoder's state inputs and outputs
(builder.io: names, slots, shapes, dtypes) and genai_config.json's state section
(builder.genai_config: the past/present names, `layer_types`, the conv cache's length, the
sliding-window layers), as mlx-lm's `make_cache()` does in code.

    >>> LayerState(conv=Conv(96, 3), recurrent=Recurrent((4, 8, 12)), kind="linear_attention").names
    ('conv', 'recurrent')
"""

from __future__ import annotations

from dataclasses import dataclass


def kv_head_size(head_dim: int) -> int:
    """The head size attention runs at and a KV cache stores: `head_dim` rounded up to a multiple
    of 8. ONNX Runtime's GroupQueryAttention refuses other sizes at the model's first run ("head_size
    must be a multiple of 8"), after its session was made; a head of 20 runs as 24, zeros after."""
    return -(-head_dim // 8) * 8


@dataclass(frozen=True)
class KV:
    """A key and a value cache, each (batch, heads, length, head_size); `window`: the layer's sliding
    window (None: global), whose cache may be a window-long ring buffer (--windowed-kv-cache)."""

    heads: int
    head_size: int
    window: int | None = None


@dataclass(frozen=True)
class Conv:
    """A causal convolution's last inputs, (batch, channels, length): the kernel's taps less one."""

    channels: int
    length: int


@dataclass(frozen=True)
class Recurrent:
    """A linear recurrence's state, (batch, *shape) (a Mamba-2 mixer's SSM state, a gated
    DeltaNet's key-by-value matrices)."""

    shape: tuple[int, ...]


@dataclass(frozen=True)
class LayerState:
    """What one layer carries, fed and returned in this order: its KV, its conv state, its recurrent
    state; `kind` is the layer type genai_config.json lists for it."""

    kv: KV | None = None
    conv: Conv | None = None
    recurrent: Recurrent | None = None
    kind: str = "full_attention"

    @property
    def names(self) -> tuple[str, ...]:
        """The states it carries, in the order a layer returns them ('key', 'value', 'conv', 'recurrent')."""
        return (*(("key", "value") if self.kv else ()), *(("conv",) if self.conv else ()),
                *(("recurrent",) if self.recurrent else ()))

    @property
    def stateless(self) -> bool:
        """It carries nothing: onnxruntime-genai does not count it among the layers it allocates for."""
        return not self.names


__all__ = ["KV", "Conv", "LayerState", "Recurrent", "kv_head_size"]
