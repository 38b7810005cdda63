"""int4/int8 block quantization: bit-exact with ONNX Runtime's own MatMulNBitsQuantizer."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

import builder.quantize as quantize_module
from builder.quantize import BLOCK_SIZES, dequantize, quantize, round_half_away

# (K, N): K a multiple of every block size, or not (the last block zero-padded). K is even: for an
# odd K ONNX Runtime's last high nibble is left over from its previous loop iteration (we write 0).
SHAPES = [(256, 48), (100, 24), (258, 40)]


def ort_quantize(w_kn: np.ndarray, bits: int, block_size: int, symmetric: bool):
    """Runs ONNX Runtime's quantizer (default algorithm) on a one-MatMul model; returns its initializers."""
    k, n = w_kn.shape
    elem = {np.float32: TensorProto.FLOAT, np.float16: TensorProto.FLOAT16}[w_kn.dtype.type]
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "g",
        [helper.make_tensor_value_info("x", elem, [1, k])], [helper.make_tensor_value_info("y", elem, [1, n])],
        [numpy_helper.from_array(w_kn, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    quantizer = MatMulNBitsQuantizer(model, bits=bits, block_size=block_size, is_symmetric=symmetric)
    quantizer.process()
    out = quantizer.model.model
    node = next(n for n in out.graph.node if n.op_type == "MatMulNBits")
    inits = {t.name: numpy_helper.to_array(t) for t in out.graph.initializer}
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    b, scales = inits[node.input[1]], inits[node.input[2]]
    zp = inits[node.input[3]] if len(node.input) > 3 and node.input[3] else None
    return b, scales, zp, attrs


@pytest.mark.parametrize("path", ["kernel", "numpy"])
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("symmetric", [True, False], ids=["sym", "asym"])
@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_bit_exact_with_onnxruntime_quantizer(monkeypatch, bits, symmetric, block_size, dtype, path):
    # Both of builder's paths: the compiled kernel (numba, an optional extra) and the numpy fallback.
    if path == "kernel" and quantize_module._kernel() is None:
        pytest.skip("numba is not installed")
    monkeypatch.setattr(quantize_module, "USE_KERNEL", path == "kernel")
    monkeypatch.setattr(quantize_module, "KERNEL_MIN_ELEMENTS", 0)
    rng = np.random.default_rng(block_size + bits)
    for k, n in SHAPES:
        w = (rng.standard_normal((k, n)) * rng.uniform(0.01, 2)).astype(dtype)
        w[:16, 0] = np.array([0.5, -0.5] * 8)  # magnitude ties: the negative value must win
        w[:, 1] = 0  # all-zero blocks: scale 0
        w[:, 2] = np.abs(w[:, 2])  # one-signed blocks
        w[:, 3] = 0
        w[::3, 3] = -0.0  # blocks of +0 and −0: the scale's sign bit is the first element's
        b, scales, zp, attrs = ort_quantize(w, bits, block_size, symmetric)
        ours = quantize(w.T, bits, block_size, symmetric, dtype)  # Hugging Face layout [N, K]
        assert attrs["K"] == k and attrs["N"] == n and attrs["bits"] == bits and attrs["block_size"] == block_size
        assert ours.data.shape == b.shape and ours.data.dtype == np.uint8
        np.testing.assert_array_equal(ours.data, b, err_msg=f"B differs for K={k}, N={n}")
        assert ours.scales.dtype == scales.dtype
        np.testing.assert_array_equal(ours.scales.reshape(-1).view(np.uint8), scales.reshape(-1).view(np.uint8))
        if symmetric:
            assert zp is None and ours.zero_points is None
        else:
            np.testing.assert_array_equal(ours.zero_points.reshape(-1), zp.reshape(-1))


def test_round_half_away_from_zero():
    x = np.array([0.5, 1.5, 2.5, -0.5, -2.5, 0.49999997, -0.49999997, 7.5, 1e-8], np.float32)
    np.testing.assert_array_equal(round_half_away(x), [1, 2, 3, -1, -3, 0, 0, 8, 0])


@pytest.mark.parametrize("bits, symmetric", [(4, True), (4, False), (8, True)])
def test_dequantized_error_is_within_one_step(bits, symmetric):
    # Round-to-nearest errs by half a step, plus up to half a step where the grid is clipped:
    # symmetric puts the largest magnitude at −8·scale, so its opposite (+8) clips to 7.
    rng = np.random.default_rng(0)
    w = rng.standard_normal((32, 100)).astype(np.float32)
    q = quantize(w, bits, 32, symmetric)
    back = dequantize(q, 100, bits)
    step = np.repeat(q.scales.astype(np.float32), 32, axis=1)[:, :100]
    err = np.abs(back - w)
    assert (err <= np.abs(step) * (1 + 1e-5)).all()
    assert err.mean() < 0.3 * np.abs(step).mean()


def test_chunked_rows_equal_one_pass(monkeypatch):
    rng = np.random.default_rng(1)
    w = rng.standard_normal((300, 64)).astype(np.float32)
    whole = quantize(w, 4, 32, False)
    monkeypatch.setattr("builder.quantize.ROW_CHUNK_ELEMENTS", 64 * 7)  # 7 rows at a time
    chunked = quantize(w, 4, 32, False)
    for a, b in zip((whole.data, whole.scales, whole.zero_points), (chunked.data, chunked.scales, chunked.zero_points)):
        np.testing.assert_array_equal(a, b)


