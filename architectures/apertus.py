"""Apertus (swiss-ai): Llama's layer with per-head q/k RMSNorm, its own norm names and a plain MLP
whose activation is xIELU, with learned parameters stored per layer.

Reference: transformers/models/apertus/modeling_apertus.py and XIELUActivation in
transformers/activations.py. ApertusMLP is down_proj(xielu(up_proj(x))) with no gate and no bias;
the layer is LlamaDecoderLayer's with attention_layernorm / feedforward_layernorm for
input_layernorm / post_attention_layernorm; q_norm and k_norm are Qwen3's (per head, before the
rotary); rotary scaling is llama3 by default.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx_ir as ir

from architectures import llama
from builder.architecture import Weights
from builder.blocks.float_ops import op_dtype, to_dtype
from builder.blocks.linear import linear
from builder.blocks.mlp import activation
from builder.errors import BuildError
from builder.family import Decoder, register
from builder.graph import Graph
from builder.lazy import Weight
from builder.target import Target

# ApertusConfig's rotary settings when config.json gives none (its __post_init__ sets them, and
# then a top-level rope_theta is not read).
LLAMA3 = dict(rope_type="llama3", rope_theta=12_000_000.0, factor=8.0, original_max_position_embeddings=8192,
              low_freq_factor=1.0, high_freq_factor=4.0)
VARIANTS: dict[str, dict[str, Any]] = {
    "ApertusForCausalLM": dict(model_type="apertus", rope_parameters=LLAMA3, default_theta=12_000_000.0,
                               vocab_size=131072, intermediate_size=14336, hidden_act="xielu",
                               max_position_embeddings=65536, rms_norm_eps=1e-5, pad_token_id=3),
}
# onnxruntime-genai 0.18 knows no "apertus": Llama's contract (a plain decoder), which it is. The
# modeling file always has the q/k norms and never an MLP bias.
STRUCTURE: dict[str, dict[str, Any]] = {
    "ApertusForCausalLM": dict(model_type="llama", qk_norm=True, mlp_bias=False),
}
NORMS = ("attention_layernorm", "feedforward_layernorm")


def softplus(x: np.ndarray) -> np.ndarray:
    return np.logaddexp(np.float32(0), x.astype(np.float32))


def xielu_parameter(act: Weights, name: str) -> Weight:
    """One of XIELUActivation's stored scalars (alpha_p/alpha_n are [1], beta/eps [] in the hub's
    checkpoints), as float32."""
    w = act(name)
    if int(np.prod(w.shape)) != 1:
        raise BuildError(f"{act.prefix}{name} has shape {list(w.shape)}; xIELU's parameters are single values")
    return w.astype(np.float32)


def xielu(g: Graph, x: ir.Value, act: Weights, target: Target) -> ir.Value:
    """XIELUActivation.forward (its Python branch): β·x + αp·x² where x > 0, else
    β·x + αn·(expm1(min(x, ε)) − x), with αp = softplus(alpha_p) and αn = β + softplus(alpha_n).

    The softplus of each stored value is taken when it is written; β + softplus(alpha_n) in float32
    and then cast, so ONNX Runtime folds both at load (its CPU kernels have no float16 Add to fold).
    expm1(m) is 2·tanh(m/2) / (1 − tanh(m/2)), which keeps its relative precision near 0, where
    exp(m) − 1 cancels (on ONNX Runtime CPU: 3e-7 relative against up to 20% at m ≈ −1e-7)."""
    dtype = target.io_dtype

    def parameter(name: str, transform=None) -> ir.Value:  # float32
        w = xielu_parameter(act, name)
        return g.weight(name, w.map(transform) if transform else w)

    def in_io_dtype(v: ir.Value) -> ir.Value:
        return v if dtype == np.float32 else g.op.Cast(v, to=ir.DataType.from_numpy(dtype))

    beta = parameter("beta")
    alpha_n = in_io_dtype(g.op.Add(beta, parameter("alpha_n", softplus)))
    alpha_p, beta, eps = in_io_dtype(parameter("alpha_p", softplus)), in_io_dtype(beta), in_io_dtype(parameter("eps"))
    positive = g.op.Mul(g.op.Mul(alpha_p, x), x)
    half_tanh = g.op.Tanh(g.op.Mul(g.op.Min(x, eps), g.constant(0.5, dtype)))
    expm1 = g.op.Div(g.op.Add(half_tanh, half_tanh), g.op.Sub(g.constant(1.0, dtype), half_tanh))
    negative = g.op.Mul(alpha_n, g.op.Sub(expm1, x))
    compared = op_dtype(dtype)  # ONNX Runtime's CUDA Greater takes no bfloat16 (blocks.float_ops)
    branch = g.op.Where(g.op.Greater(to_dtype(g, x, dtype, compared), g.constant(0.0, compared)), positive, negative)
    return g.op.Add(branch, g.op.Mul(beta, x))


def mlp(d: Decoder, m: Weights, h):
    """ApertusMLP.forward: down_proj(act_fn(up_proj(h))); act_fn is xIELU with the layer's own
    parameters, or ACT2FN's activation where config.json names another."""
    g, c = d.g, d.c
    H, I = c.hidden_size, c.intermediate_size
    with g.scope("up_proj"):
        h = linear(g, h, m("up_proj.weight", I, H), d.target)
    with g.scope("act_fn"):
        h = xielu(g, h, m.under("act_fn."), d.target) if c.hidden_act == "xielu" else activation(g, h, c.hidden_act)
    with g.scope("down_proj"):
        return linear(g, h, m("down_proj.weight", H, I), d.target)


def decoder_layer(d: Decoder, w: Weights, i: int):
    return llama.decoder_layer(d, w, i, mlp=mlp, norms=NORMS)


FAMILY = register(llama.FAMILY.with_(name="apertus", layer=decoder_layer, variants=VARIANTS,
                                     structure=STRUCTURE))

__all__ = ["FAMILY", "VARIANTS", "decoder_layer", "mlp", "xielu"]
