"""Lazy weights: concatenations and stacks are exact, and are written part by part into the
output instead of being assembled first and copied again."""

import contextlib
import tracemalloc
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx_ir as ir
import pytest
from helpers import mapped_rss

from builder.blocks.moe import quantized_experts
from builder.graph import Graph
from builder.inputs.safetensors import SafetensorsCheckpoint
from builder.lazy import Weight
from builder.lazy_results import StreamedTensor
from builder.materialize import ROW_BLOCK_BYTES, STREAM_BYTES
from builder.quantize import quantize
from builder.target import Quantization
from builder.writer import save_model

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


# --- stacks written one member at a time ------------------------------------------------------------

def save(tensors: list[ir.TensorProtocol], folder) -> Path:
    """model.onnx.data as builder.writer.save_model (onnx_ir's parallel writer) writes these initializers."""
    values = [ir.Value(name=t.name, shape=t.shape, type=ir.TensorType(t.dtype), const_value=t) for t in tensors]
    folder.mkdir()
    graph = ir.Graph(inputs=[], outputs=values, nodes=[], initializers=values, opset_imports={"": 21})
    save_model(ir.Model(graph, ir_version=10), folder, progress=False)
    return folder / "model.onnx.data"


def written(tensors: list[ir.TensorProtocol], folder) -> bytes:
    return save(tensors, folder).read_bytes()


def traced_peak(fn) -> int:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16])
def test_stack_is_streamed_with_the_bytes_of_the_whole_tensor(tmp_path, dtype):
    experts = [Weight.constant(RNG.standard_normal((48, 64)).astype(np.float32)) for _ in range(5)]
    plain = Weight.constant(RNG.standard_normal((40, 64)).astype(np.float32))
    stacked = Weight.stack(experts).astype(dtype)
    streamed = stacked.to_ir("experts")
    assert isinstance(streamed, StreamedTensor)
    whole = ir.Tensor(np.stack([e.numpy() for e in experts]).astype(dtype), name="experts")
    got = written([plain.to_ir("a"), streamed, plain.to_ir("b")], tmp_path / "streamed")
    want = written([plain.to_ir("a"), whole, plain.to_ir("b")], tmp_path / "whole")
    assert got == want and len(got) >= whole.nbytes + 2 * plain.nbytes
    assert np.array_equal(streamed.numpy(), whole.numpy())


def test_stack_is_written_holding_one_expert(tmp_path):
    # 64 experts of 512 KB (fp16): written whole, the stack would be 32 MB; streamed, one expert and
    # its fp16 copy are held at a time. Before streaming, the measured peak was the whole stack.
    experts = [Weight.constant(np.full((512, 512), e, np.float32)) for e in range(64)]
    stacked = Weight.stack(experts).astype(np.float16)
    one = 512 * 512 * 2
    peak = traced_peak(lambda: save([stacked.to_ir("experts")], tmp_path / "out"))
    assert stacked.nbytes == 64 * one
    assert peak < 4 * one, f"peak {peak / 2**20:.1f} MB while writing a {stacked.nbytes / 2**20:.0f} MB stack"
    data = np.fromfile(tmp_path / "out" / "model.onnx.data", np.float16).reshape(64, 512, 512)
    assert np.array_equal(data[:, 0, 0], np.arange(64))


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_a_large_table_is_written_a_block_of_rows_at_a_time(tmp_path, dtype):
    # A 160 MB float32 (80 MB float16) table from a bf16 source (an embedding widened for the CPU): written whole it
    # was held whole, plus its cast copy (gpt-oss' 2.3 GB embedding set a 2.46 GiB int4 peak).
    # Row blocks of the mapped source are converted, written and their pages handed back.
    from safetensors.numpy import save_file

    rows, cols = 20480, 2048
    table = (np.arange(rows, dtype=np.float32)[:, None] + RNG.standard_normal(cols).astype(np.float32)[None])
    save_file({"t": table.astype(ml_dtypes.bfloat16)}, tmp_path / "t.safetensors")
    weight = SafetensorsCheckpoint.open(tmp_path).weight("t").astype(dtype)
    assert weight.nbytes > STREAM_BYTES
    tensor = weight.to_ir("table")
    peak = traced_peak(lambda: save([tensor], tmp_path / "out"))
    assert peak < 4 * ROW_BLOCK_BYTES, f"peak {peak / 2**20:.0f} MB writing a {weight.nbytes / 2**20:.0f} MB table"
    data = np.fromfile(tmp_path / "out" / "model.onnx.data", dtype).reshape(rows, cols)
    assert np.array_equal(data, table.astype(ml_dtypes.bfloat16).astype(dtype))


BY_ROWS = {  # recipe -> whether its value comes a block of rows at a time (Weight.by_rows)
    "source": (lambda a, b: a, True),
    "cast": (lambda a, b: a.astype(np.float16), True),
    "cast-of-cast": (lambda a, b: a.astype(ml_dtypes.bfloat16).astype(np.float32), True),  # rounds through bf16
    "rows": (lambda a, b: a.slice(0, 8, 1800), True),
    "columns": (lambda a, b: a.slice(1, 0, 200), False),
    "transposed": (lambda a, b: a.transpose(), False),
    "concat-rows": (lambda a, b: Weight.concat([a, b.astype(np.float32)]), True),
    "concat-mixed-then-cast": (lambda a, b: Weight.concat([a, b]).astype(np.float16), True),
    "concat-rows-sliced": (lambda a, b: Weight.concat([a, b.astype(np.float32)]).slice(0, 10, 2900), True),
    "concat-columns": (lambda a, b: Weight.concat([a, a], axis=1), False),
    "map": (lambda a, b: a.map(lambda w: w + 1), False),
    "map-rows": (lambda a, b: a.map_rows(lambda: lambda rows, start, stop: rows * 2), True),
    "map-rows-cast": (lambda a, b: a.map_rows(lambda: lambda rows, start, stop: rows * 2).astype(np.float16), True),
    # Rows of a value computed whole (a GGUF q_proj's un-permuted float rows under a LoRA merge).
    "map-rows-of-a-map": (lambda a, b: a.map(lambda w: w + 1).map_rows(lambda: lambda rows, start, stop: rows * 2),
                          False),
}


@pytest.mark.parametrize("recipe", sorted(BY_ROWS))
def test_by_rows_says_which_values_come_a_block_of_rows_at_a_time(recipe, monkeypatch):
    # report.estimate counts a large weight with `by_rows` as one block held, any other as whole:
    # the flag must say what row_blocks does. Before, a fused q/k/v came whole and the estimate
    # counted every large float table whole (Qwen2.5-1.5B's fp32 build: 2.1 GB predicted, 0.35 measured).
    from builder import materialize

    monkeypatch.setattr(materialize, "ROW_BLOCK_BYTES", 2**16)  # 64 rows of 256 float32
    x, y = RNG.standard_normal((2048, 256)).astype(np.float32), RNG.standard_normal((1024, 256)).astype(np.float16)
    a, b = Weight.source(x.shape, x.dtype, lambda _: x, "a"), Weight.source(y.shape, y.dtype, lambda _: y, "b")
    weight = BY_ROWS[recipe][0](a, b)

    def drain() -> None:
        for block in weight._row_blocks():
            del block

    held = traced_peak(drain)
    assert weight.by_rows == BY_ROWS[recipe][1] == (held < weight.nbytes / 4), f"{held} bytes held"
    values = np.concatenate(list(weight._row_blocks()))
    assert values.dtype == weight.dtype and values.shape == weight.shape
    assert np.array_equal(values, weight.numpy(), equal_nan=True)


def qmoe(symmetric: bool, experts: int = 6, rows: int = 32, cols: int = 64):
    """quantized_experts over interleaved gate/up parts: (graph, the three initializer tensors, the
    float parts)."""
    gates = [Weight.constant(RNG.standard_normal((rows, cols)).astype(np.float32)) for _ in range(experts)]
    ups = [Weight.constant(RNG.standard_normal((rows, cols)).astype(np.float32)) for _ in range(experts)]
    g = Graph()
    q = Quantization(bits=4, block_size=32, symmetric=symmetric, method="rtn")
    values = quantized_experts(g, (gates, ups), q, np.dtype(np.float16), ())
    return [v.const_value if v is not None else None for v in values], (gates, ups)


@pytest.mark.parametrize("symmetric", [True, False], ids=["symmetric", "zero-points"])
@pytest.mark.parametrize("order", ["codes-first", "scales-first"])
def test_quantized_stack_is_streamed_with_the_bytes_of_each_expert_quantized_alone(tmp_path, symmetric, order):
    tensors, (gates, ups) = qmoe(symmetric)
    tensors = [t for t in tensors if t is not None]
    assert isinstance(tensors[0], StreamedTensor)
    if order == "scales-first":  # a by-product asked for first: everything is computed at once
        tensors = tensors[1:] + tensors[:1]
    got = written(tensors, tmp_path / "out")
    # The expected bytes: each expert's gate and up quantized alone, rows interleaved.
    parts = {"data": [], "scales": [], "zero_points": []}
    for gate, up in zip(gates, ups):
        a, b = (quantize(w.numpy(), 4, 32, symmetric, np.float16) for w in (gate, up))
        for name, x, y in (("data", a.data.reshape(32, -1), b.data.reshape(32, -1)), ("scales", a.scales, b.scales),
                           ("zero_points", a.zero_points, b.zero_points)):
            if x is not None:
                parts[name].append(np.stack([x, y], 1).reshape(64, -1))  # rows 2i gate, 2i+1 up
    want = {k: np.stack(v) for k, v in parts.items() if v}
    whole = [ir.Tensor(want[t.name], name=t.name) for t in tensors]
    assert got == written(whole, tmp_path / "whole")
    # Written again (a second save of the same model): computed again, the same bytes.
    assert written(tensors, tmp_path / "again") == got


def test_quantized_stack_is_written_holding_one_expert(tmp_path):
    # 128 experts: their codes are 8 MB, an expert's float gate and up 512 KB; the scales (1 MB)
    # are kept as the codes stream by. Before streaming, the whole codes and scales were held.
    tensors, _ = qmoe(True, experts=128, rows=64, cols=1024)
    data, scales, _ = tensors
    expert_float = 2 * 64 * 1024 * 4
    # An expert is large enough for the compiled quantizer: load it first, or its import (~25 MB
    # traced) counts in the peak when this test runs alone (it passed only after other tests).
    quantize(np.zeros((64, 1024), np.float32), 4, 32, True, np.float16)
    peak = traced_peak(lambda: save([data, scales], tmp_path / "out"))
    assert data.nbytes == 8 * 2**20 and scales.nbytes == 2**20
    assert peak < scales.nbytes + 4 * expert_float, f"peak {peak / 2**20:.1f} MB for {data.nbytes / 2**20:.0f} MB of codes"


def test_blocks_concat_reblocks_and_refuses_different_input_orders(caplog):
    """Fused parts: blocks of 32 and 16 join at 16 (same values); parts permuted along K differently
    (act-order q/k/v with different g_idx) cannot share one input, so they are not joined."""
    from builder.stored_blocks import BlockArrays, Blocks

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


def test_a_by_product_asked_for_just_before_the_stream_begins_waits_for_it():
    # Two writer threads: one reaches the scales a moment before the other begins streaming the
    # codes. The scales' thread computed every expert at once, holding all the codes (what made
    # test_quantized_stack_is_written_holding_one_expert fail now and then); it now waits.
    import threading
    import time

    from builder.lazy_results import StackedResult

    parts = {"data": ((4, 2), np.uint8), "scales": ((4, 1), np.float32)}
    result = StackedResult(4, lambda e: {"data": np.full(2, e, np.uint8), "scales": np.full(1, e, np.float32)}, parts)
    result._compute_all = lambda: pytest.fail("computed every expert at once")
    streamed = []

    def stream_later():
        time.sleep(0.2)
        streamed.extend(result._stream())

    writer = threading.Thread(target=stream_later)
    writer.start()
    scales = result._take("scales")
    writer.join()
    assert scales[:, 0].tolist() == [0, 1, 2, 3] and [int(s[0]) for s in streamed] == [0, 1, 2, 3]


def test_by_products_are_written_after_as_many_bytes_of_other_weights_as_their_main_part():
    # A 1B build's lm_head codes take 1.3 s to quantize; its scales, placed one layer-norm weight
    # later, kept the second writer thread waiting on that computation the whole time (an int4
    # build was 16% slower). Each by-product now follows as many bytes of later main tensors as
    # its own main part has, so both threads compute until it is done.
    from builder.lazy_results import SharedResult, write_order

    def value(tensor):
        return ir.Value(name=tensor.name, const_value=tensor)

    def quantized(name, rows):
        result = SharedResult(lambda: {"data": np.zeros((rows, 16), np.uint8), "scales": np.zeros(rows, np.float32)})
        return [value(result.tensor("data", (rows, 16), np.uint8, f"{name}.data")),
                value(result.tensor("scales", (rows,), np.float32, f"{name}.scales"))]

    norm = value(ir.Tensor(np.ones(4, np.float32), name="norm"))
    big, small = quantized("lm_head", 64), [quantized(f"w{i}", 16) for i in range(6)]  # 1024 and 256 bytes of codes
    initializers = [*big, norm] + [v for pair in small for v in pair]
    order = [v.name for v in write_order(initializers)]
    assert order[:2] == ["lm_head.data", "norm"]
    assert order.index("lm_head.scales") == order.index("w3.data") + 1  # after 4 × 256 bytes
    assert order.index("w0.scales") == order.index("w1.data") + 1  # equal sizes: after the next one
    assert sorted(order) == sorted(v.name for v in initializers)


def test_computed_rows_cast_into_a_concatenation_are_never_whole():
    """A part whose rows are computed (a dequantized weight) cast to the parts' common dtype was
    computed whole, then cast in a second copy, before its slice of the output was filled; now each
    block of rows is cast straight into the output."""
    from builder.materialize import ComputedRows

    rows = lambda a, b: np.ones((b - a, 1000), np.float16)  # noqa: E731
    part = Weight((4000, 1000), np.float16, lambda s: ComputedRows(rows, (4000, 1000), 100, dtype=np.float16), ("a",))
    other = Weight.constant(np.ones((8, 1000), ml_dtypes.bfloat16))
    joined = Weight.concat([part, other])
    assert joined.dtype == np.float32
    peak = traced_peak(joined.numpy)
    out = 4008 * 1000 * 4
    assert peak < out + 2**21, f"peak {peak / 2**20:.1f} MB for a {out / 2**20:.1f} MB result"


def test_a_cast_of_a_concatenation_hands_back_its_parts_pages(tmp_path):
    # release() looked for a concatenation's parts before unwrapping the cast around it, so a cast
    # fused q/k/v kept every part's mapped pages.
    from safetensors.numpy import save_file

    from builder.mapped_pages import release
    from builder.pending_values import PendingCast, PendingConcat

    save_file({"a": np.ones((1024, 1024), np.float32), "b": np.ones((1024, 1024), np.float32)},
              tmp_path / "m.safetensors")
    checkpoint = SafetensorsCheckpoint.open(tmp_path)
    with contextlib.ExitStack() as stack:
        parts = [checkpoint.weight(n)._compute(stack) for n in ("a", "b")]
        value = PendingCast(PendingConcat(parts, 0), np.dtype(np.float64))
        assert np.asarray(value).sum() == 2 * 1024 * 1024  # every page read
        assert mapped_rss(tmp_path / "m.safetensors") >= 4 * 2**20
        release(value)
        assert mapped_rss(tmp_path / "m.safetensors") < 64 * 1024  # the header's page and the parts' edges
