"""MLPs: the gated one of Llama-style decoders, down(act(gate(x)) · up(x)), and the plain
two-matrix one of GPT-style decoders (Phi-2, Starcoder2, Nemotron), down(act(up(x)))."""

from __future__ import annotations

import math

import numpy as np
import onnx_ir as ir

from builder.blocks.linear import linear, module_name
from builder.errors import BuildError
from builder.graph import Graph
from builder.lazy import Weight
from builder.target import Target, source_modules

ACTIVATIONS = ("silu", "gelu_pytorch_tanh", "gelu_new", "gelu", "relu", "relu2")


def activation(g: Graph, x: ir.Value, name: str, target: Target | None = None) -> ir.Value:
    """Hugging Face's ACT2FN[name] as ONNX ops; GELU in plain ops for a target whose provider has no
    kernel for ONNX's Gelu (DirectML)."""
    if name == "silu":
        return g.op.Mul(x, g.op.Sigmoid(x))
    if name in ("gelu_pytorch_tanh", "gelu_new", "gelu") and target is not None and not target.provider.gelu_op:
        return _gelu_expanded(g, x, tanh=name != "gelu")
    if name in ("gelu_pytorch_tanh", "gelu_new"):  # both the tanh approximation
        return g.op.Gelu(x, approximate="tanh")
    if name == "relu":
        return g.op.Relu(x)
    if name == "relu2":  # ReLUSquaredActivation (Nemotron)
        r = g.op.Relu(x)
        return g.op.Mul(r, r)
    if name == "gelu":
        return g.op.Gelu(x)
    raise BuildError(f"unsupported activation {name!r}; supported: {', '.join(ACTIVATIONS)}")


def _gelu_expanded(g: Graph, x: ir.Value, tanh: bool) -> ir.Value:
    """x/2 · (1 + tanh(√(2/π)·(x + 0.044715·x³))), or x/2 · (1 + erf(x/√2)): ONNX's Gelu's definitions."""
    def c(v: float) -> ir.Value:
        return g.op.CastLike(g.constant(v, np.float32), x)

    if tanh:
        inner = g.op.Mul(g.op.Add(x, g.op.Mul(c(0.044715), g.op.Mul(x, g.op.Mul(x, x)))), c(math.sqrt(2 / math.pi)))
        core = g.op.Tanh(inner)
    else:
        core = g.op.Erf(g.op.Mul(x, c(1 / math.sqrt(2))))
    return g.op.Mul(g.op.Mul(x, c(0.5)), g.op.Add(core, c(1.0)))


def gated_mlp(
    g: Graph, x: ir.Value, gate: Weight, up: Weight, down: Weight, act: str, target: Target,
    biases: tuple[Weight, Weight, Weight] | None = None,
) -> ir.Value:
    """down_proj(act(gate_proj(x)) · up_proj(x)), each projection float or quantized per `target`;
    `biases` (gate, up, down) for checkpoints with mlp_bias."""
    gate_b, up_b, down_b = biases or (None, None, None)
    if _fusable(g, gate, up, target):
        # One MatMulNBits (and one minimum term) over gate's rows then up's, then a Split: the
        # same codes, bit-identical logits, fewer nodes.
        bias = None if gate_b is None else Weight.concat([gate_b, up_b])
        with g.scope("gate_up_proj"):
            both = linear(g, x, Weight.concat([gate, up]), target, bias)
            gate_out, up_out = g.op.Split(both, g.constant([gate.shape[0], up.shape[0]], "int64"), axis=-1,
                                          _outputs=2)
    else:
        with g.scope("gate_proj"):
            gate_out = linear(g, x, gate, target, gate_b)
        with g.scope("up_proj"):
            up_out = linear(g, x, up, target, up_b)
    with g.scope("act_fn"):
        h = g.op.Mul(activation(g, gate_out, act, target), up_out)
    with g.scope("down_proj"):
        return linear(g, h, down, target, down_b)


def _fusable(g: Graph, gate: Weight, up: Weight, target: Target) -> bool:
    """Whether gate_proj and up_proj go into one matrix: stored blocks with per-block minimums
    (GGUF's Q4_1 and K-quants) of one layout, quantized to the same bits (no --float-layers or
    --int8-layers pattern tells them apart), on a provider that fuses Q, K and V too. Each minimum
    term is four nodes beside its MatMulNBits; fused, SmolLM2's Q4_1 build decodes 5% faster
    (docs/BENCHMARKS.md). Without minimums a fused matrix measured no faster (±1%)."""
    a, b = gate.blocks, up.blocks
    if a is None or b is None or not (a.offsets and b.offsets) or a.input_order is not None or b.input_order is not None:
        return False
    if (a.bits, a.block_size, a.zero_points) != (b.bits, b.block_size, b.zero_points) or gate.shape[1] != up.shape[1]:
        return False
    q = target.quantization
    if q is None or not target.provider.packed_qkv:
        return False
    names = []
    for part, w in (("gate_proj", gate), ("up_proj", up)):
        with g.scope(part):
            names.append((module_name(g), source_modules(w.sources)))
    return all(target.quantizes(*n) for n in names) and len({q.bits_for(*n) for n in names}) == 1


def plain_mlp(
    g: Graph, x: ir.Value, up: Weight, down: Weight, act: str, target: Target,
    biases: tuple[Weight | None, Weight | None] = (None, None), names: tuple[str, str] = ("up_proj", "down_proj"),
) -> ir.Value:
    """down(act(up(x))) (+ biases), each projection float or quantized per `target`; `names` are the
    checkpoint's module names for the two projections (`fc1`/`fc2`, `c_fc`/`c_proj`, …)."""
    with g.scope(names[0]):
        h = linear(g, x, up, target, biases[0])
    with g.scope("act_fn"):
        h = activation(g, h, act, target)
    with g.scope(names[1]):
        return linear(g, h, down, target, biases[1])
