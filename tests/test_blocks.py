"""Blocks against numpy: the residual stream's LayerNorm and RMSNorm, summed parallel branches,
post-norms and the plain residual value; attention without rotary embedding."""

import numpy as np
import onnx_ir as ir
import onnxruntime as ort
import pytest

from builder.blocks import ResidualStream
from builder.graph import Graph
from builder.lazy import Weight
from builder.target import Target

RNG = np.random.default_rng(0)
HIDDEN, EPS = 16, 1e-5


def run(build, x: np.ndarray) -> list[np.ndarray]:
    g = Graph()
    inp = ir.Value(name="x", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape(x.shape))
    outputs = build(g, inp)
    for i, v in enumerate(outputs):
        v.name = f"out{i}"
    model = g.model([inp], outputs)
    proto = ir.serde.serialize_model(model)
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})


def np_layer_norm(x, w, b):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + EPS) * w + b


def np_rms_norm(x, w):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + EPS) * w


@pytest.mark.parametrize("layer_norm", [True, False], ids=["layer-norm", "rms-norm"])
def test_residual_stream(layer_norm):
    x = RNG.standard_normal((2, 3, HIDDEN)).astype(np.float32)
    w1, b1, w2, b2, w3 = (RNG.standard_normal(HIDDEN).astype(np.float32) for _ in range(5))
    target = Target(io_dtype=np.dtype(np.float32))

    def norm(v, w, b):
        return np_layer_norm(v, w, b) if layer_norm else np_rms_norm(v, w)

    def build(g, inp):
        stream = ResidualStream(g, inp, EPS, target, layer_norm=layer_norm)
        with g.scope("n1"):
            h = stream.norm(Weight.constant(w1), Weight.constant(b1) if layer_norm else None)
        stream.add(g.op.Mul(h, g.constant(2.0, np.float32)))  # two parallel branches on one norm
        stream.add(g.op.Mul(h, g.constant(-0.5, np.float32)))
        with g.scope("n2"):
            out = stream.norm(Weight.constant(w2), Weight.constant(b2) if layer_norm else None)
        with g.scope("post"):
            stream.add(out, Weight.constant(w3), Weight.constant(b2) if layer_norm else None)  # a post-norm branch
        return [out, stream.value()]

    out, value = run(build, x)
    h = norm(x, w1, b1)
    x1 = x + 2.0 * h - 0.5 * h
    want_out = norm(x1, w2, b2)
    np.testing.assert_allclose(out, want_out, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(value, x1 + norm(want_out, w3, b2), rtol=1e-5, atol=1e-5)
