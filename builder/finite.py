"""The rule that a float weight read from a checkpoint is written finite: a NaN or an infinity in
the file, or a bfloat16 or float32 value past float16's range (±65,504) cast for an fp16 build,
would make a model that computes NaN or infinities, built without a word. `finite_check` is the
`lazy.Check` every float initializer read from a checkpoint is written through (graph.Graph.weight).

The scan costs a pass over what is written, at memory speed: a 16-bit array is tested as two
integer maxima over its bits (0.16 ns an element here, against 1.3 for numpy's isfinite on
float16), a float32 one by isfinite (0.29 ns)."""

from __future__ import annotations

import ml_dtypes
import numpy as np

from builder.errors import BuildError

# A 16-bit float's bits with every exponent bit set: its infinities and NaNs are exactly the values
# whose bits, sign cleared, are at least this.
_EXPONENT_BITS = {np.dtype(np.float16): 0x7C00, np.dtype(ml_dtypes.bfloat16): 0x7F80}


def all_finite(a: np.ndarray) -> bool:
    """Whether every element of a float array is finite (any other dtype: True)."""
    if a.size == 0:
        return True
    exponent = _EXPONENT_BITS.get(a.dtype)
    if exponent is not None:
        bits = np.ascontiguousarray(a).reshape(-1)
        # Positive values' bits as int16 are below `exponent` when finite; negative values' as
        # uint16 are below 0x8000 | `exponent` when finite (and positive ones are below 0x8000).
        return bool(bits.view(np.int16).max() < exponent and bits.view(np.uint16).max() < (0x8000 | exponent))
    if a.dtype.kind == "f":
        return bool(np.isfinite(a).all())
    return True


def first_non_finite(a: np.ndarray) -> tuple[int, tuple[int, ...]] | None:
    """(how many, the first one's index) of the elements of a float array that are not finite;
    None if all are."""
    if all_finite(a):
        return None
    bad = np.flatnonzero(~np.isfinite(a.reshape(-1)))
    return bad.size, tuple(int(i) for i in np.unravel_index(int(bad[0]), a.shape))


def finite_check(sources: tuple[str, ...], name: str, shape: tuple[int, ...]):
    """A `lazy.Check` refusing, in one line naming the tensor and the first bad element's index in
    the tensor as written (`shape`: a MatMul's weight is the checkpoint's transposed), a block of
    `name` (read from `sources`) that holds a value that is not finite."""

    def check(block: np.ndarray, first: int) -> None:
        found = first_non_finite(block)
        if found is None:
            return
        count, at = found
        index = list(at)
        if index:  # a 0-d weight (Apertus' xIELU beta) has no index
            index[0] += first
        if np.isnan(np.float32(block[at])):
            what = "NaN"
        elif block.dtype == np.float16:
            what = "a value past float16's range (±65,504) or an infinity"
        else:
            what = "an infinity"
        tensor = name if sources == (name,) else f"{name} (read from {', '.join(sources)})"
        raise BuildError(f"{tensor} holds {what} (at {index} of the {list(shape)} written; {count} in that "
                         "block of rows): a model built from it would compute NaN")

    return check
