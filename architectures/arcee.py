"""Arcee (AFM-4.5B): Llama's attention and layer with a plain ReLU² MLP, YaRN where configured.

Reference: transformers/models/arcee/modeling_arcee.py. ArceeMLP is down_proj(relu²(up_proj(x)))
with no gate; everything else is LlamaDecoderLayer's, and rotary scaling (YaRN in the released
checkpoints) comes through rope_parameters as for Llama.
"""

from __future__ import annotations

from typing import Any

from architectures import llama
from builder.architecture import Weights
from builder.blocks import plain_mlp
from builder.family import Decoder, register

# ArceeConfig's defaults where they differ from Llama's: the whole config is Llama's otherwise.
VARIANTS: dict[str, dict[str, Any]] = {
    "ArceeForCausalLM": dict(model_type="arcee", vocab_size=32000, hidden_size=2560, intermediate_size=18432,
                             hidden_act="relu2", max_position_embeddings=4096, rms_norm_eps=1e-5,
                             bos_token_id=128000, eos_token_id=128001),
}
# onnxruntime-genai 0.18 knows no "arcee": Llama's contract (a plain decoder), which it is.
STRUCTURE: dict[str, dict[str, Any]] = {"ArceeForCausalLM": dict(model_type="llama")}


def mlp(d: Decoder, m: Weights, h):
    """ArceeMLP.forward: down_proj(act(up_proj(h))), biases where mlp_bias."""
    c = d.c
    H, I = c.hidden_size, c.intermediate_size
    biases = (m("up_proj.bias", I), m("down_proj.bias", H)) if c.mlp_bias else (None, None)
    return plain_mlp(d.g, h, m("up_proj.weight", I, H), m("down_proj.weight", H, I), c.hidden_act, d.target, biases)


def decoder_layer(d: Decoder, w: Weights, i: int):
    return llama.decoder_layer(d, w, i, mlp=mlp)


FAMILY = register(llama.FAMILY.with_(name="arcee", layer=decoder_layer, variants=VARIANTS,
                                     structure=STRUCTURE))

__all__ = ["FAMILY", "VARIANTS", "decoder_layer", "mlp"]
