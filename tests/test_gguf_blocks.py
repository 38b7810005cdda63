"""GGUF's quantized types as MatMulNBits blocks (builder/inputs/gguf/blocks.py): for every type, the
blocks' values — (code − zero point)·scale + offset, in float64 — rounded once to float32 equal
gguf-py's own dequantization (the numbers transformers loads) bit for bit."""

import contextlib

import gguf
import numpy as np
import pytest
from gguf_files import random_blocks

from builder.inputs.gguf.blocks import LAYOUT, WITH_MINIMUM, gguf_blocks


def block_values(arrays, bits: int, block: int) -> np.ndarray:
    """float64 [N, K] of BlockArrays, from the format's definition (nibbles, element 2j low)."""
    data, scales, zp, offsets = arrays
    n, k_blocks = scales.shape
    codes = np.stack([data & 0x0F, data >> 4], axis=-1).reshape(n, -1) if bits == 4 else data.reshape(n, -1)
    if zp is None:
        zp = np.full((n, k_blocks), 1 << (bits - 1))
    elif bits == 4:
        zp = np.stack([zp & 0x0F, zp >> 4], axis=-1).reshape(n, -1)[:, :k_blocks]
    w = (codes.astype(np.float64).reshape(n, k_blocks, block) - zp[..., None]) * scales[..., None].astype(np.float64)
    if offsets is not None:
        w = w + offsets[..., None].astype(np.float64)
    return w.reshape(n, -1)


def stored(kind: str, shape=(6, 512)) -> np.ndarray:
    qtype = gguf.GGMLQuantizationType[kind]
    w = np.random.default_rng(1).standard_normal(shape).astype(np.float32) * 0.05
    w[0] += 0.3  # a row of blocks far from zero: minimums large against the scales
    try:
        return gguf.quants.quantize(w, qtype)
    except NotImplementedError:
        return random_blocks(shape, qtype)


@pytest.mark.parametrize("kind", LAYOUT)
def test_blocks_hold_the_stored_values(kind):
    raw = stored(kind)
    qtype = gguf.GGMLQuantizationType[kind]
    want = gguf.quants.dequantize(raw, qtype)
    blocks = gguf_blocks(kind, want.shape, lambda stack: raw)
    with contextlib.ExitStack() as stack:
        arrays = blocks.compute(stack)
    assert (blocks.bits, blocks.block_size) == LAYOUT[kind]
    assert (arrays.offsets is not None) == (kind in WITH_MINIMUM) == blocks.offsets == blocks.zero_points
    got = block_values(arrays, blocks.bits, blocks.block_size)
    np.testing.assert_array_equal(got.astype(np.float32), want)
    if kind in WITH_MINIMUM:  # the zero point is the codes' middle where that offset is exact
        middle = {"Q4_1": 8, "Q4_K": 8, "Q2_K": 2, "Q5_1": 128, "Q5_K": 128}[kind]
        zp = arrays.zero_points
        zp = np.stack([zp & 0x0F, zp >> 4], axis=-1).reshape(len(zp), -1) if blocks.bits == 4 else zp
        assert (zp == middle).mean() > 0.9, kind


def test_decoded_codes_are_not_copied_again_but_mapped_bytes_are(tmp_path):
    # The real-file peak: a 270M GGUF's 168 MB token_embd was held three times (the mapped bytes,
    # the decoded codes, a copy of them): 0.68 GiB peak RSS, 0.50 GiB once the copy is gone.
    from builder.blocks.linear import _owned

    computed = (np.arange(64, dtype=np.uint8) ^ np.uint8(0x80)).reshape(8, 8)
    assert _owned(computed, np.uint8) is computed
    path = tmp_path / "raw.bin"
    path.write_bytes(bytes(range(64)))
    mapped = np.memmap(path, np.uint8, "r", shape=(8, 8))
    kept = _owned(mapped[2:], np.uint8)
    assert not np.shares_memory(kept, mapped) and (kept == mapped[2:]).all()
    import mmap
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        viewed = np.frombuffer(m, np.uint8).reshape(8, 8)
        kept = _owned(viewed, np.uint8)
        assert not np.shares_memory(kept, viewed)
        del viewed


@pytest.mark.parametrize("kind", LAYOUT)
def test_blocks_decoded_a_range_at_a_time_give_back_each_range(kind, monkeypatch):
    """A tensor is decoded CHUNK_BYTES of the file at a time, each range's mapped pages released
    once decoded (the real gemma-3-270m Q4_K_M build: peak RSS 0.51 -> 0.36 GiB), with the same arrays
    as decoding it whole; here ranges of 5 rows of 13, the last one short."""
    import builder.inputs.gguf.blocks as blocks_module
    import builder.mapped_pages as mapped_pages

    raw = stored(kind, shape=(13, 512))
    whole = gguf_blocks(kind, (13, 512), lambda stack: raw).compute(contextlib.ExitStack())
    released = []
    monkeypatch.setattr(blocks_module, "CHUNK_BYTES", raw[:5].nbytes)
    monkeypatch.setattr(mapped_pages, "release", lambda view: released.append(view.shape[0]))
    chunked = gguf_blocks(kind, (13, 512), lambda stack: raw).compute(contextlib.ExitStack())
    assert released == [5, 5, 3]
    for want, got in zip(whole, chunked):
        assert (want is None) == (got is None)
        if want is not None:
            assert got.dtype == want.dtype and got.shape == want.shape and got.flags.c_contiguous
            np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("kind", ["Q8_0", "Q4_K", "Q6_K"])
@pytest.mark.parametrize("permuted", [False, True])
def test_float_builds_dequantize_a_block_of_rows_at_a_time(kind, permuted, tmp_path, monkeypatch):
    """A float build dequantizes a block of rows at a time as the writer asks for them, each block's
    pages given back, and never the whole tensor beside its result (Qwen2.5-Coder-1.5B Q4_K_M,
    -p fp32: peak RSS 2.25 -> 1.20 GB; gemma-3-270m: 1.05 -> 0.33 GB): gguf's own values, from a
    mapped file as a build reads it, whole, transposed and cast (a MatMul's weight), sliced (a
    fused projection's part) and streamed (an embedding table); q/k rows un-permuted alike."""
    import builder.inputs.gguf.checkpoint as checkpoint
    from builder.inputs.mapping import TensorInfo
    from builder.lazy import Weight

    raw = stored(kind, shape=(13, 512))
    path = tmp_path / "raw.bin"
    path.write_bytes(raw.tobytes())
    order = checkpoint.unpermute_rows(12, 2)[::-1].copy() if permuted else None
    rows = 12 if permuted else 13
    info = TensorInfo("w", np.dtype(np.uint8), (rows, raw.shape[1]), path, 0, raw[:rows].nbytes)
    tensor = checkpoint.GGUFTensor(info, kind, (rows, 512), order)
    want = gguf.quants.dequantize(raw[:rows], gguf.GGMLQuantizationType[kind])
    want = want[order] if permuted else want
    decoded, released = [], []
    dequantize = gguf.quants.dequantize
    monkeypatch.setattr(gguf.quants, "dequantize", lambda x, q: decoded.append(len(x)) or dequantize(x, q))
    monkeypatch.setattr("builder.materialize.ROW_BLOCK_BYTES", 5 * 512 * 4)
    monkeypatch.setattr(checkpoint, "release", lambda view: released.append(view.shape[0]))
    w = Weight((rows, 512), np.float32, checkpoint._dequantized(tensor), ("w",))

    np.testing.assert_array_equal(w.numpy(), want)
    # Un-permuted rows give back the source rows between the block's first and last (none, before:
    # a permuted q/k_proj left its whole source resident, 113 MB of a Q8_0 8192² one).
    assert decoded == [5, 5, rows - 10] and released == ([5, 6, 3] if permuted else [5, 5, 3])
    np.testing.assert_array_equal(w.transpose().astype(np.float16).numpy(), want.T.astype(np.float16))
    np.testing.assert_array_equal(w.slice(0, 3, 9).transpose().numpy(), want[3:9].T)
    assert np.concatenate(list(w.astype(np.float16)._row_blocks())).tobytes() == want.astype(np.float16).tobytes()
    assert max(decoded) == 5
