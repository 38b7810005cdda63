"""What ONNX Runtime's CUDA kernels read differently from its CPU kernels, proved without a GPU:
the layouts a `-e cuda` build writes for them, checked against the kernels' indexing (seen wrong on
an H200 before each fix: scripts/cuda_check.py). The CPU proves the numbers elsewhere."""

import numpy as np
import onnx
import pytest
from conftest import TINY
from helpers import add_example_tokenizer, build, make_checkpoint
from onnx import numpy_helper

from builder.cli import main
from builder.stored_blocks import unpack_codes

# hidden 96 in blocks of 32: three blocks a row, an odd count, so MatMulNBits' rows of 4-bit zero
# points (a byte each begun) and a packing over the whole table differ.
TIED = {**TINY, "hidden_size": 96, "num_attention_heads": 6, "head_dim": 16, "tie_word_embeddings": True}


def initializers(folder):
    model = onnx.load(folder / "model.onnx")
    return model, {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


def test_tied_lookup_reads_zero_points_as_cudas_kernel_indexes_them(tmp_path):
    # ONNX Runtime's CUDA GatherBlockQuantized takes block = flat index / block_size over the whole
    # [vocab, K] table and reads that block's 4-bit zero point at the same flat position; rows of
    # MatMulNBits' zero points (which the tied lookup shared) start each on a byte.
    out = build(make_checkpoint(tmp_path / "src", "LlamaConfig", **TIED), tmp_path / "out", "-e", "cuda", "-p", "int4")
    model, init = initializers(out)
    head = next(n for n in model.graph.node if n.op_type == "MatMulNBits" and n.name.startswith("/lm_head"))
    lookup = next(n for n in model.graph.node if n.op_type == "GatherBlockQuantized")
    n, k, block = 256, 96, 32
    kb = k // block
    # lm_head's own rows, as MatMulNBits reads them: each row's codes, scales and zero points
    codes = unpack_codes(init[head.input[1]].reshape(n, -1), 4)[:, :k].astype(np.int32)
    zero = unpack_codes(init[head.input[3]], 4)[:, :kb].astype(np.int32)
    want = (codes - np.repeat(zero, block, axis=1)) * np.repeat(init[head.input[2]].astype(np.float32), block, axis=1)
    # the lookup's inputs, indexed as CUDA's kernel does
    flat = np.arange(n * k)
    table_codes = unpack_codes(init[head.input[1]].reshape(-1), 4).astype(np.int32)  # the same bytes, reshaped
    zero_flat = unpack_codes(init[lookup.input[3]].reshape(-1), 4).astype(np.int32)
    scales_flat = init[lookup.input[2]].astype(np.float32).reshape(-1)
    blocks = flat // block
    got = ((table_codes[flat] - zero_flat[blocks]) * scales_flat[blocks]).reshape(n, k)
    np.testing.assert_array_equal(got, want)


def test_verify_runs_the_cuda_lookup_on_the_cpu(tmp_path, capsys):
    # The CPU kernel indexes zero points by row: --verify swaps the lookup back to lm_head's rows.
    source = make_checkpoint(tmp_path / "src", "LlamaConfig", **TIED)
    assert main(["-m", str(source), "-o", str(tmp_path / "out"), "-e", "cuda", "-p", "int4", "--verify"]) == 0
    assert "-> PASS" in capsys.readouterr().err


MOE = {**TINY, "num_experts": 4, "moe_intermediate_size": 64, "num_experts_per_tok": 2, "head_dim": 16}


def test_cuda_qmoe_says_its_weights_are_in_the_raw_layout(tmp_path):
    # Without weights_prepacked=0 CUDA's QMoE reads the [E, N, K/2] rows as its own repacked
    # layout: logits off by 0.13 to 0.9 of their size on an H200, with no error.
    source = make_checkpoint(tmp_path / "src", "Qwen3MoeConfig", **MOE)
    for provider, want in (("cuda", 0), ("cpu", None)):
        out = build(source, tmp_path / provider, "-e", provider, "-p", "int4")
        node = next(n for n in onnx.load(out / "model.onnx", load_external_data=False).graph.node
                    if n.op_type == "QMoE")
        attributes = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        assert attributes.get("weights_prepacked") == want


@pytest.mark.parametrize("sizes, message", [
    (dict(hidden_size=96, num_attention_heads=6), "hidden (96) and expert intermediate (64)"),
    (dict(moe_intermediate_size=32), "hidden (64) and expert intermediate (32)"),
])
def test_cuda_qmoe_refuses_sizes_its_kernel_cannot_take(tmp_path, capsys, sizes, message):
    # ONNX Runtime 1.31's CUDA QMoE fails at run time ("requires hidden_size to be a multiple of 64").
    source = make_checkpoint(tmp_path / "src", "Qwen3MoeConfig", **{**MOE, **sizes})
    capsys.readouterr()  # transformers' own progress lines
    assert main(["-m", str(source), "-o", str(tmp_path / "out"), "-e", "cuda", "-p", "int4", "-q"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err and "--float-layers '*.experts'" in err
    assert not (tmp_path / "out").exists()
    # the suggested way out builds
    assert main(["-m", str(source), "-o", str(tmp_path / "float"), "-e", "cuda", "-p", "int4", "-q",
                 "--float-layers", "*.experts"]) == 0


def test_a_bfloat16_node_no_kernel_takes_is_refused_in_one_line(tmp_path, capsys, monkeypatch):
    # Before, DeepSeek-V3's routing Log was handed bfloat16, which neither CUDA nor the CPU runs:
    # the session failed on the GPU. Put back, the build refuses it, and writes nothing.
    import builder.blocks.moe as moe
    from test_family_deepseek_v3 import make

    monkeypatch.setattr(moe, "in_op_dtype", lambda g, x, dtype, op: op(x))  # Log in the build's dtype again
    source = add_example_tokenizer(make(tmp_path / "src"))
    capsys.readouterr()
    assert main(["-m", str(source), "-o", str(tmp_path / "out"), "-e", "cuda", "-p", "bf16", "-q"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no bfloat16 kernel for ai.onnx::Log on cuda or the CPU" in err
    assert not (tmp_path / "out").exists()
