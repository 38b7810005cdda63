"""Nemotron (NemotronForCausalLM): Nemotron-3, Nemotron-4 and Minitron, e.g. Nemotron-Mini-4B-Instruct.

Reference: transformers/models/nemotron/modeling_nemotron.py. StableLM's sequential LayerNorm
layer (architectures/stablelm.py) with, apart from it: LayerNorm1P, a LayerNorm with bias that
scales by (1 + weight), the 1 folded into the weight here; a plain MLP, up_proj -> relu² ->
down_proj; partial rotary (half the head by default); optional biases on the attention
(`attention_bias`) and the MLP (`mlp_bias`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any, ClassVar

import numpy as np
import onnx_ir as ir

from architectures import stablelm
from architectures.stablelm import LayerNormWeights
from builder.architecture import Weights
from builder.decoder_config import DecoderConfig
from builder.family import Decoder, parse, register
from builder.lazy import Weight

# NemotronConfig's defaults where they differ from the shared ones (partial_rotary_factor: for
# configs that omit it).
VARIANTS: dict[str, dict[str, Any]] = {"NemotronForCausalLM": dict(
    model_type="nemotron", vocab_size=256000, hidden_size=6144, intermediate_size=24576, num_attention_heads=48,
    hidden_act="relu2", max_position_embeddings=4096, bos_token_id=2, eos_token_id=3, partial_rotary_factor=0.5,
)}

# No layer slides, whatever config.json says.
STRUCTURE: dict[str, dict[str, Any]] = {"NemotronForCausalLM": dict(sliding_window=None, layer_types=None)}


@dataclass(frozen=True)
class NemotronConfig(DecoderConfig):
    """config.json of NemotronForCausalLM: the shared decoder keys and its own."""

    norm_eps: float = 1e-5
    mlp_bias: bool = False
    use_parallel_residual: ClassVar[bool] = False

    def __post_init__(self) -> None:
        # transformers keeps None here and then fails to build the attention; every hub config sets it.
        if self.num_key_value_heads is None:
            raise ValueError("num_key_value_heads is not set (transformers' NemotronAttention needs it too)")
        super().__post_init__()

    @property
    def layer_norm_eps(self) -> float:
        """norm_eps, under the name StableLM's layer and stream read."""
        return self.norm_eps


class NemotronWeights(LayerNormWeights):
    """Weights of a Nemotron module; `norm` reads a LayerNorm1P as a plain LayerNorm's (weight + 1, bias)."""

    def norm(self, name: str, size: int) -> tuple[Weight, Weight]:
        weight = self(f"{name}.weight", size).map(lambda x: x.astype(np.float32) + 1, np.float32)
        return weight, self(f"{name}.bias", size)


def mlp(d: Decoder, m: Weights, h: ir.Value) -> ir.Value:
    """NemotronMLP: down_proj(relu²(up_proj(h))), biases with mlp_bias."""
    return stablelm.plain(d, m, h, ("up_proj", "down_proj"), d.c.mlp_bias)


# NemotronDecoderLayer.forward: x + attn(ln1p(x)), then x + mlp(ln1p(x)), as StableLM's layer.
FAMILY = register(stablelm.FAMILY.with_(
    name="nemotron", config=NemotronConfig, variants=VARIANTS, structure=STRUCTURE,
    layer=partial(stablelm.decoder_layer, self_attn=stablelm.biased_self_attn, mlp=mlp),
    weights=NemotronWeights, final_norm=partial(stablelm.final_norm, weights=NemotronWeights),
    parser=parse,  # an odd rotated share runs in transformers' Nemotron (one dimension more rotates)
))

__all__ = ["FAMILY", "VARIANTS", "NemotronConfig", "NemotronWeights"]
