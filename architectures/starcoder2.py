"""StarCoder2 (Starcoder2ForCausalLM): starcoder2-3b, -7b and -15b.

Reference: transformers/models/starcoder2/modeling_starcoder2.py. StableLM's sequential LayerNorm
layer (architectures/stablelm.py) with, apart from it: `norm_epsilon`; a plain MLP, c_fc ->
gelu_pytorch_tanh -> c_proj; biases on every projection when `use_bias` (the default); a sliding
window over every layer when `sliding_window` is set; the whole head rotates; tied embeddings by default.

onnxruntime-genai 0.18 knows no "starcoder2" model type; its "llama" one runs the same contract
(input_ids, attention_mask, per-layer KV in and out, logits), so genai_config says "llama".
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any, ClassVar

import onnx_ir as ir

from architectures import stablelm
from builder.architecture import Weights
from builder.decoder_config import DecoderConfig
from builder.family import Decoder, parse, register

# Starcoder2Config's defaults where they differ from the shared ones.
VARIANTS: dict[str, dict[str, Any]] = {"Starcoder2ForCausalLM": dict(
    vocab_size=49152, hidden_size=3072, intermediate_size=12288, num_hidden_layers=30, num_attention_heads=24,
    num_key_value_heads=2, hidden_act="gelu_pytorch_tanh", max_position_embeddings=4096, tie_word_embeddings=True,
    bos_token_id=50256, eos_token_id=50256,
)}

# onnxruntime-genai's model type for the same decoder contract (see the module docstring); every
# layer slides when there is a window, whatever config.json's layer_types says.
STRUCTURE: dict[str, dict[str, Any]] = {"Starcoder2ForCausalLM": dict(model_type="llama", layer_types=None)}


@dataclass(frozen=True)
class Starcoder2Config(DecoderConfig):
    """config.json of Starcoder2ForCausalLM: the shared decoder keys and its own."""

    norm_epsilon: float = 1e-5
    use_bias: bool = True
    use_parallel_residual: ClassVar[bool] = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "attention_bias", self.use_bias)  # use_bias covers q, k, v and o too
        super().__post_init__()

    @property
    def layer_norm_eps(self) -> float:
        """norm_epsilon, under the name StableLM's layer and stream read."""
        return self.norm_epsilon


def mlp(d: Decoder, m: Weights, h: ir.Value) -> ir.Value:
    """Starcoder2MLP: c_proj(gelu(c_fc(h))), biases with use_bias."""
    return stablelm.plain(d, m, h, ("c_fc", "c_proj"), d.c.use_bias)


# Starcoder2DecoderLayer.forward: x + attn(ln1(x)), then x + mlp(ln2(x)), as StableLM's layer.
FAMILY = register(stablelm.FAMILY.with_(
    name="starcoder2", config=Starcoder2Config, variants=VARIANTS, structure=STRUCTURE,
    layer=partial(stablelm.decoder_layer, self_attn=stablelm.biased_self_attn, mlp=mlp),
    partial_rotary=False, parser=parse,  # Starcoder2's rotary spans the whole head, whatever config.json says
))

__all__ = ["FAMILY", "STRUCTURE", "VARIANTS", "Starcoder2Config"]
