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
@pytest.mark.parametrize("scale_dtype", [np.float32, np.float16, "bfloat16"])
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("symmetric", [True, False], ids=["sym", "asym"])
@pytest.mark.parametrize("block_size", BLOCK_SIZES)
def test_kernel_gives_the_numpy_bytes(monkeypatch, method, scale_dtype, bits, symmetric, block_size):
    import ml_dtypes

    assert quantize_module._kernel() is not None
    scale_dtype = ml_dtypes.bfloat16 if scale_dtype == "bfloat16" else scale_dtype
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
    for fn in (kernel.quantize_blocks, kernel._search, kernel._round_scales, kernel._tile_halving_sum):
        assert fn.targetoptions["nogil"], fn


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_kernel_widens_every_16_bit_value_as_numpy_does(monkeypatch, dtype):
    import ml_dtypes

    # Every finite value of magnitude 2^-100 and up (all of float16's, subnormals included), and
    # ±0, alone in its block: the symmetric scale is −value / 8, exact, so the scales show each
    # value as the kernel widened it.
    values = np.arange(1 << 16, dtype=np.uint16).view(np.float16 if dtype == "float16" else ml_dtypes.bfloat16)
    wide = np.abs(values.astype(np.float32))
    values = values[np.isfinite(wide) & ((wide >= 2.0 ** -100) | (wide == 0))]
    w = np.zeros((values.size, 32), values.dtype)
    w[:, 5] = values
    kernel, numpy = both(monkeypatch, w, 4, 32, True, np.float32, "rtn")
    np.testing.assert_array_equal(kernel.scales.view(np.uint32), numpy.scales.view(np.uint32))
    np.testing.assert_array_equal(kernel.data, numpy.data)
    assert np.unique(kernel.scales).size > values.size // 2 - 2  # the values' own scales, not a constant


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_kernel_rounds_scales_as_numpy_casts(dtype):
    import ml_dtypes

    from builder._kernel import SCALE_BFLOAT16, SCALE_FLOAT16

    # Every 4099th float32 bit pattern (all exponents, both signs, NaNs, infinities) and the edges:
    # float16's overflow threshold 65520 and its neighbours, its least normal and subnormals, ties.
    u = np.arange(0, 1 << 32, 4099, dtype=np.uint64).astype(np.uint32)
    edges = np.array([65504, 65519.996, 65520, 65536, 2.0 ** -14, 2.0 ** -24, 1.5 * 2.0 ** -24, 2.5 * 2.0 ** -24,
                      2.0 ** -25, 1 + 2.0 ** -11, 1 + 3 * 2.0 ** -11, 1 + 2.0 ** -8, 3.3895e38, np.inf, np.nan],
                     np.float32)
    values = np.concatenate([u.view(np.float32), edges, -edges])
    target = np.float16 if dtype == "float16" else ml_dtypes.bfloat16
    with np.errstate(over="ignore", invalid="ignore"):
        expected = values.astype(target).astype(np.float32)
    got = values.copy()
    quantize_module._kernel()._round_scales(got, SCALE_FLOAT16 if dtype == "float16" else SCALE_BFLOAT16)
    nan = np.isnan(expected)
    np.testing.assert_array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(got.view(np.uint32)[~nan], expected.view(np.uint32)[~nan])
    # NaNs: quiet, with the value's sign (payloads are the casts' own business, and never reach a scale
    # from arithmetic other than as the default quiet NaN, which both keep).
    np.testing.assert_array_equal(np.signbit(got[nan]), np.signbit(values[nan]))


def test_kernel_reads_pending_concatenations_in_their_own_dtype(monkeypatch):
    import ml_dtypes

    from builder.pending_values import PendingConcat

    # A fused projection's parts, chunks of 7 rows straddling the parts' boundaries: the kernel
    # gets the joined bfloat16 rows (not numpy's float32 cast) and gives the numpy path's bytes.
    rng = np.random.default_rng(5)
    parts = [rng.standard_normal((n, 96)).astype(ml_dtypes.bfloat16) for n in (10, 4, 9)]
    monkeypatch.setattr(quantize_module, "ROW_CHUNK_ELEMENTS", 96 * 7)
    sources = []
    monkeypatch.setattr(quantize_module, "_kernel_source", _recording(quantize_module._kernel_source, sources))
    kernel, numpy = both(monkeypatch, PendingConcat(parts, 0), 4, 32, False, np.float32, "search")
    for a, b in zip((kernel.data, kernel.scales, kernel.zero_points), (numpy.data, numpy.scales, numpy.zero_points)):
        np.testing.assert_array_equal(a, b)
    assert [kind for _, kind in sources] == [quantize_module._kernel().SOURCE_BFLOAT16] * 4


def _recording(fn, calls):
    def recorded(*args):
        out = fn(*args)
        calls.append(out)
        return out
    return recorded


@pytest.mark.parametrize("method", ["rtn", "search"])
@pytest.mark.parametrize("symmetric", [True, False], ids=["sym", "asym"])
def test_kernel_passes_a_nan_on_as_numpy_does(monkeypatch, method, symmetric):
    # A NaN weight anywhere in a block (first, middle, last, in the padded last block) makes the
    # block's scale NaN on both paths: a broken checkpoint gives NaN outputs, not finite codes that
    # the numpy path would not have written.
    w = np.random.default_rng(6).standard_normal((6, 80)).astype(np.float32)
    for row, col in enumerate((0, 5, 31, 40, 77, 79)):
        w[row, col] = np.nan
    with np.errstate(invalid="ignore"):  # the numpy path's NaN arithmetic
        kernel, numpy = both(monkeypatch, w, 4, 32, symmetric, np.float32, method)
    assert np.isnan(numpy.scales).sum() == 6
    for a, b in zip((kernel.data, kernel.scales, kernel.zero_points), (numpy.data, numpy.scales, numpy.zero_points)):
        if b is not None:
            np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))


def test_a_build_without_numba_says_so_once(monkeypatch, caplog):
    import sys

    import builder

    monkeypatch.setattr(quantize_module, "_KERNEL", [])
    monkeypatch.delattr(builder, "_kernel", raising=False)
    monkeypatch.setitem(sys.modules, "builder._kernel", None)  # `from builder import _kernel` raises ImportError
    w = np.random.default_rng(7).standard_normal((1024, 1024)).astype(np.float32)  # a size the kernel takes
    with caplog.at_level("WARNING", logger="builder"):
        quantize(w, 4, 32, False, np.float32, "rtn")
        quantize(w, 4, 32, True, np.float32, "rtn")
    warnings = [r.getMessage() for r in caplog.records if "compiled quantizer is unavailable" in r.getMessage()]
    assert len(warnings) == 1 and "pip install numba" in warnings[0]


def test_a_small_real_models_matrices_take_the_kernel(monkeypatch):
    # SmolLM2-135M's MLP matrix (576 x 1536, 0.9 M elements) and a small MoE's experts took the numpy
    # path under the earlier 2^20 threshold, at ~70 ns a weight for the search; a toy's stay there.
    kernel = quantize_module._kernel()
    calls = []
    monkeypatch.setattr(kernel, "quantize_blocks", _recording(kernel.quantize_blocks, calls))
    rng = np.random.default_rng(8)
    quantize(rng.standard_normal((1536, 576)).astype(np.float32), 4, 32, False, np.float32, "search")
    assert calls
    calls.clear()
    quantize(rng.standard_normal((128, 64)).astype(np.float32), 4, 32, False, np.float32, "search")
    assert not calls



@pytest.mark.parametrize("method", ["rtn", "search"])
@pytest.mark.parametrize("symmetric", [True, False], ids=["sym", "asym"])
def test_a_subnormal_scale_gives_the_zero_point_on_both_paths(monkeypatch, method, symmetric):
    # A block of weights under ~1e-37 has a float32 scale below the least normal: its reciprocal
    # overflowed to inf, a zero weight times inf was NaN, and the NaN's conversion to a code was
    # undefined (numpy warned "invalid value encountered in cast"). Its codes are now the zero point.
    w = np.random.default_rng(7).standard_normal((4, 64)).astype(np.float32)
    w[1, :32] = np.float32(1e-39) * np.arange(-16, 16, dtype=np.float32)  # zeros among them
    w[2, 32:] = 0
    w[2, 40] = np.float32(1e-40)
    with np.errstate(invalid="raise", under="ignore"):  # a NaN cast to a code raises
        kernel, numpy = both(monkeypatch, w, 4, 32, symmetric, np.float32, method)
    for a, b in zip((kernel.data, kernel.scales, kernel.zero_points), (numpy.data, numpy.scales, numpy.zero_points)):
        if b is not None:
            np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))
    for row, block in ((1, 0), (2, 1)):
        scale = numpy.scales[row, block]
        assert 0 < abs(scale) < np.finfo(np.float32).tiny
        codes = np.stack([numpy.data[row, block] & 0x0F, numpy.data[row, block] >> 4], -1).reshape(-1)
        zero = 8 if symmetric else (numpy.zero_points[row, block // 2] >> (4 * (block % 2))) & 0x0F
        assert (codes == zero).all()
