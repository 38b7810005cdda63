"""The compiled quantization kernel (numba) gives the numpy path's bytes, for every option."""

import numpy as np
import pytest

import builder.quantize as quantize_module
from builder.quantize import BLOCK_SIZES, quantize

numba = pytest.importorskip("numba")  # an optional extra: without it the numpy path is all there is


def inputs():
    rng = np.random.default_rng(3)
    gaussian = rng.standard_normal((37, 256)).astype(np.float32)
    heavy = rng.standard_t(2, (37, 258)).astype(np.float32) * 0.02  # outliers set the scales
    heavy[:, 7] = 300.0
    zeros = np.zeros((5, 256), np.float32)
    signed_zeros = np.zeros((5, 256), np.float32)
    signed_zeros[:, ::3] = -0.0
    mixed = rng.standard_normal((9, 100)).astype(np.float32)  # K=100: the last block of every size padded
    mixed[0] = 0
    mixed[1, :40] = -0.0
    mixed[2] = np.abs(mixed[2])  # one-signed blocks
    mixed[3, :16] = [0.5, -0.5] * 8  # magnitude ties
    mixed[4] = 1e-30  # subnormal scales
    return {"gaussian": gaussian, "heavy": heavy, "zeros": zeros, "signed-zeros": signed_zeros, "mixed": mixed}


INPUTS = inputs()


def both(monkeypatch, w, *args):
    monkeypatch.setattr(quantize_module, "KERNEL_MIN_ELEMENTS", 0)
    out = []
    for use in (True, False):
        monkeypatch.setattr(quantize_module, "USE_KERNEL", use)
        out.append(quantize(w, *args))
    return out


@pytest.mark.parametrize("method", ["rtn", "search"])
@pytest.mark.parametrize("scale_dtype", [np.float32, np.float16])
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("symmetric", [True, False], ids=["sym", "asym"])
@pytest.mark.parametrize("block_size", BLOCK_SIZES)
def test_kernel_gives_the_numpy_bytes(monkeypatch, method, scale_dtype, bits, symmetric, block_size):
    assert quantize_module._kernel() is not None
    for name, w in INPUTS.items():
        kernel, numpy = both(monkeypatch, w, bits, block_size, symmetric, scale_dtype, method)
        for a, b, part in zip((kernel.data, kernel.scales, kernel.zero_points),
                              (numpy.data, numpy.scales, numpy.zero_points), ("data", "scales", "zero points")):
            if b is None:
                assert a is None
                continue
            assert a.dtype == b.dtype and a.shape == b.shape
            np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8), err_msg=f"{name}: {part}")


@pytest.mark.parametrize("method", ["rtn", "search"])
def test_kernel_reads_bf16_fp16_chunk_by_chunk(monkeypatch, method):
    import ml_dtypes

    w = np.random.default_rng(4).standard_normal((300, 192)).astype(np.float32)
    monkeypatch.setattr(quantize_module, "ROW_CHUNK_ELEMENTS", 192 * 7)  # 7 rows at a time, the last 6
    for dtype in (ml_dtypes.bfloat16, np.float16):
        kernel, numpy = both(monkeypatch, w.astype(dtype), 4, 32, False, np.float16, method)
        for a, b in zip((kernel.data, kernel.scales, kernel.zero_points), (numpy.data, numpy.scales, numpy.zero_points)):
            np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))


def test_kernel_releases_the_gil():
    kernel = quantize_module._kernel()
    for fn in (kernel.widen_bf16, kernel.block_params, kernel.encode, kernel.search):
        assert fn.targetoptions["nogil"], fn


def test_kernel_widens_every_bf16_as_ml_dtypes_does():
    import ml_dtypes

    bits = np.arange(1 << 16, dtype=np.uint16).reshape(256, 256)  # every bfloat16, NaNs and ±0 included
    out = np.empty(bits.shape, np.float32)
    quantize_module._kernel().widen_bf16(bits, out)
    np.testing.assert_array_equal(out.view(np.uint32), bits.view(ml_dtypes.bfloat16).astype(np.float32).view(np.uint32))
