"""builder/finite.py: float weights are written finite. Its bit test agrees with numpy's isfinite
on every float16 and bfloat16 value, and the check sees every array a lazy tensor writes (whole, a
block of rows at a time, one expert of a stack at a time) with the index of its first row."""

import ml_dtypes
import numpy as np
import pytest

import builder.lazy as lazy
from builder.errors import BuildError
from builder.finite import all_finite, finite_check
from builder.lazy import Weight


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16], ids=["float16", "bfloat16"])
def test_bits_agree_with_isfinite_on_every_16_bit_value(dtype):
    values = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(dtype)
    finite = np.isfinite(values.astype(np.float32))
    assert all_finite(values[finite]) and all_finite(values[:0])
    for bad in np.flatnonzero(~finite)[:: 97]:  # each non-finite value alone among finite ones
        assert not all_finite(np.array([values[0], values[bad], values[1]]))
    assert not all_finite(values[~finite][-1:]) and not all_finite(values[~finite][:1])


@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16])
def test_the_check_sees_each_written_block_with_its_rows(tmp_path, monkeypatch, dtype):
    from test_lazy import save

    w = np.zeros((64, 32), np.float32)
    w[50, 7] = np.nan
    seen = []
    check = finite_check(("w",), "w", (64, 32))

    def spy(block, first):
        seen.append((first, len(block)))
        check(block, first)

    monkeypatch.setattr(lazy, "STREAM_BYTES", 16)
    monkeypatch.setattr("builder.materialize.ROW_BLOCK_BYTES", 20 * 32 * np.dtype(dtype).itemsize)
    with pytest.raises(BuildError, match=r"^w holds NaN \(at \[50, 7\] of the \[64, 32\] written; 1 in that block"):
        save([Weight.constant(w).astype(dtype).to_ir("w", spy)], tmp_path / "rows")
    assert seen == [(0, 20), (20, 20), (40, 20)]  # streamed: the block holding row 50 stopped it

    seen.clear()
    stack = Weight.stack([Weight.constant(np.ones_like(w)), Weight.constant(np.full_like(w, np.inf))])
    with pytest.raises(BuildError, match=r"holds (an infinity|a value past float16's range .*) \(at \[1, 0, 0\] of "):
        save([stack.astype(dtype).to_ir("w", lambda b, i: (seen.append((i, len(b))), check(b, i)))], tmp_path / "stack")
    assert seen == [(0, 1), (1, 1)]


def test_a_0d_weight_is_refused_in_one_line():
    """A 0-d weight (Apertus' xIELU beta) that is NaN raised an IndexError while naming its index."""
    w = Weight((), np.float32, lambda stack: np.array(np.nan, np.float32), ("beta",))
    with pytest.raises(BuildError, match=r"^beta holds NaN \(at \[\] of the \[\] written"):
        w.to_ir("beta", finite_check(("beta",), "beta", ())).numpy()
