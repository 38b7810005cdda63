"""Lazy weights: concatenations and stacks are exact, and are written part by part into the
output instead of being assembled first and copied again."""

import tracemalloc

import ml_dtypes
import numpy as np
import pytest

from builder.lazy import Weight
from builder.quantize import quantize

RNG = np.random.default_rng(0)
PARTS = [RNG.standard_normal((n, 96)).astype(np.float32) for n in (64, 32, 32)]


def weights():
    return [Weight.constant(p) for p in PARTS]


@pytest.mark.parametrize("recipe", ["plain", "cast", "transposed", "cast-transposed", "map"])
def test_concat_is_exact(recipe):
    fused = Weight.concat(weights(), axis=0)
    expected = np.concatenate(PARTS, axis=0)
    if recipe == "plain":
        got = fused.numpy()
    elif recipe == "cast":
        got, expected = fused.astype(np.float16).numpy(), expected.astype(np.float16)
    elif recipe == "transposed":
        got, expected = fused.transpose().numpy(), expected.T
    elif recipe == "cast-transposed":
        got = fused.astype(ml_dtypes.bfloat16).transpose().numpy()
        expected = expected.astype(ml_dtypes.bfloat16).T
    else:
        got, expected = fused.map(lambda w: w + 1).numpy(), expected + 1
    assert got.dtype == expected.dtype and np.array_equal(got, expected)


def test_concat_quantizes_exactly_chunk_by_chunk():
    fused = Weight.concat(weights(), axis=0)
    got = fused.apply(lambda rows: quantize(rows, 4, 32))
    want = quantize(np.concatenate(PARTS, axis=0), 4, 32)
    assert np.array_equal(got.data, want.data) and np.array_equal(got.scales, want.scales)


def test_stack_is_exact():
    experts = [Weight.constant(p) for p in (PARTS[1], PARTS[2])]
    stacked = Weight.stack(experts)
    assert stacked.shape == (2, 32, 96)
    assert np.array_equal(stacked.numpy(), np.stack([PARTS[1], PARTS[2]]))
    assert np.array_equal(stacked.astype(np.float16).numpy(), np.stack([PARTS[1], PARTS[2]]).astype(np.float16))
    with pytest.raises(ValueError):
        Weight.stack([Weight.constant(PARTS[0]), Weight.constant(PARTS[1])])


def test_concat_is_written_without_a_second_copy():
    # Three 8 MB parts: the fused 24 MB tensor is allocated once, not assembled and then copied.
    parts = [Weight.constant(np.ones((2048, 1024), np.float32)) for _ in range(3)]
    fused = Weight.concat(parts, axis=0)
    tracemalloc.start()
    try:
        out = fused.numpy()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert out.nbytes == 24 * 2**20
    assert peak < 1.25 * out.nbytes, f"peak {peak / 2**20:.0f} MB for a {out.nbytes / 2**20:.0f} MB tensor"


def test_blocks_concat_reblocks_and_refuses_different_input_orders(caplog):
    """Fused parts: blocks of 32 and 16 join at 16 (same values); parts permuted along K differently
    (act-order q/k/v with different g_idx) cannot share one input, so they are not joined."""
    from builder.lazy import BlockArrays, Blocks

    rng = np.random.default_rng(0)

    def part(block, order=None, rows=4, k=64):
        data = rng.integers(0, 256, (rows, k // block, block // 2), dtype=np.uint8)
        scales = rng.standard_normal((rows, k // block)).astype(np.float32)
        zp = rng.integers(0, 256, (rows, k // block // 2), dtype=np.uint8)
        offsets = rng.standard_normal((rows, k // block)).astype(np.float32)
        arrays = BlockArrays(data, scales, zp, offsets)
        return Blocks(4, block, lambda stack: arrays, "x", True, True, order), arrays

    def values(arrays, block):  # float64 [rows, K]
        data, scales, zp, offsets = arrays
        codes = np.stack([data & 15, data >> 4], -1).reshape(len(data), -1, block)
        z = np.stack([zp & 15, zp >> 4], -1).reshape(len(zp), -1)[:, : scales.shape[1], None]
        return ((codes - z.astype(np.float64)) * scales[..., None] + offsets[..., None]).reshape(len(data), -1)

    (a, arrays_a), (b, arrays_b) = part(32), part(16)
    joined = Blocks.concat([a, b])
    assert joined.block_size == 16
    np.testing.assert_array_equal(values(joined.compute(None), 16),
                                  np.concatenate([values(arrays_a, 32), values(arrays_b, 16)]))
    order = rng.permutation(64)
    assert Blocks.concat([part(32, order)[0], part(32, order.copy())[0]]).input_order is not None
    assert Blocks.concat([part(32, order)[0], part(32, rng.permutation(64))[0]]) is None
    assert "different act-order permutations" in caplog.text
