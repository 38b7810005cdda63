"""int4/int8 builds against transformers running the same rounding (fake quantization)."""

import onnx
import pytest
from conftest import TINY
from fake_quant import assert_quantized_parity, cosine, op_histogram, reference
from helpers import PROMPT, OnnxDecoder, build, make_checkpoint

VARIANTS = {
    "llama": ("LlamaConfig", {}),
    "llama-tied": ("LlamaConfig", dict(tie_word_embeddings=True)),
    "mistral-window": ("MistralConfig", dict(sliding_window=4)),
    "qwen2": ("Qwen2Config", {}),
    "qwen3-tied": ("Qwen3Config", dict(head_dim=32, tie_word_embeddings=True)),
}


@pytest.mark.parametrize("accuracy_level", [4, 0])
@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_int4_matches_fake_quantized_transformers(name, accuracy_level, tmp_path):
    config_class, overrides = VARIANTS[name]
    source = make_checkpoint(tmp_path / "src", config_class, **{**TINY, **overrides})
    out = build(source, tmp_path / "out", "-p", "int4", "--accuracy-level", str(accuracy_level))
    assert_quantized_parity(source, out, exact=accuracy_level == 0)
    ops = op_histogram(out)
    assert "MatMul" not in ops, "a float MatMul is left"
    layers = TINY["num_hidden_layers"]
    assert ops["MatMulNBits"] == layers * 5 + 1  # qkv, o, gate, up, down per layer + lm_head
    if overrides.get("tie_word_embeddings"):
        # The lookup reads lm_head's quantized matrix: no float copy of the vocabulary.
        assert ops["GatherBlockQuantized"] == 1 and "Gather" not in ops
        model = onnx.load(out / "model.onnx", load_external_data=False)
        assert not [t for t in model.graph.initializer if list(t.dims) == [TINY["vocab_size"], TINY["hidden_size"]]]


@pytest.mark.parametrize("flags, bits, block_size, symmetric", [
    (["-p", "int4", "--asymmetric", "--block-size", "16"], 4, 16, False),
    (["-p", "int4", "--block-size", "64", "--accuracy-level", "0", "--symmetric"], 4, 64, True),
    (["-p", "int4", "--quant-method", "rtn", "--symmetric", "--accuracy-level", "0"], 4, 32, True),
    (["-p", "int4", "--block-size", "256", "--asymmetric", "--accuracy-level", "0"], 4, 256, False),
    (["-p", "int8"], 8, 32, True),
    (["-p", "int8", "--asymmetric", "--block-size", "128"], 8, 128, False),
])
def test_quantization_options(tmp_path, tiny_llama, flags, bits, block_size, symmetric):
    out = build(tiny_llama, tmp_path / "out", *flags)
    method = "rtn" if "rtn" in flags else None  # None: the precision's default
    assert_quantized_parity(tiny_llama, out, bits, block_size, symmetric, exact="0" in flags, method=method)
    model = onnx.load(out / "model.onnx", load_external_data=False)
    for node in (n for n in model.graph.node if n.op_type == "MatMulNBits"):
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        assert (attrs["bits"], attrs["block_size"]) == (bits, block_size)
        assert (len(node.input) > 3 and node.input[3] != "") == (not symmetric)


@pytest.mark.parametrize("block_size", [16, 128])
def test_tied_asymmetric_lookup_is_exact(tmp_path, block_size):
    # GatherBlockQuantized reads lm_head's data, scales and zero points; with float32 arithmetic
    # the embedding rows equal the fake-quantized tied weight, so the logits match exactly.
    source = make_checkpoint(tmp_path / "src", "LlamaConfig", **{**TINY, "tie_word_embeddings": True, "hidden_size": 80, "head_dim": 16})
    out = build(source, tmp_path / "out", "-p", "int4", "--asymmetric", "--block-size", str(block_size), "--accuracy-level", "0")
    assert op_histogram(out)["GatherBlockQuantized"] == 1
    assert_quantized_parity(source, out, 4, block_size, False, exact=True)


def test_exclude_lm_head_and_float_layers(tmp_path, tiny_llama):
    out = build(tiny_llama, tmp_path / "out", "-p", "int4", "--exclude-lm-head", "--float-layers", "model.layers.1.mlp.*")
    model = onnx.load(out / "model.onnx", load_external_data=False)
    float_matmuls = sorted(n.name for n in model.graph.node if n.op_type in ("MatMul", "FusedMatMul"))
    assert float_matmuls == [  # a float linear reads its weight as stored ([out, in], transB)
        "/lm_head/FusedMatMul", "/model/layers.1/mlp/down_proj/FusedMatMul",
        "/model/layers.1/mlp/gate_proj/FusedMatMul", "/model/layers.1/mlp/up_proj/FusedMatMul",
    ]
    assert op_histogram(out)["MatMulNBits"] == 2 * 5 - 3
    gqa = [n for n in model.graph.node if n.op_type == "MatMulNBits"]
    assert all(dict((a.name, a.i) for a in n.attribute)["accuracy_level"] == 4 for n in gqa)


def test_quantized_embeddings_untied(tmp_path, tiny_llama):
    out = build(tiny_llama, tmp_path / "out", "-p", "int4", "--quantize-embeddings")
    ops = op_histogram(out)
    assert ops["GatherBlockQuantized"] == 1 and "Gather" not in ops
    # The lookup's rounding is not in the fake-quantized reference; top-1 must still agree.
    ref_prefill, _, next_id = reference(tiny_llama, 4, 32)  # the int4 defaults
    prefill, _ = OnnxDecoder(out).prefill_and_step(PROMPT, next_id)
    assert cosine(prefill, ref_prefill) > 0.99


def test_int4_cuda_graph_is_fp16(tmp_path, tiny_llama):
    out = build(tiny_llama, tmp_path / "out", "-p", "int4", "-e", "cuda")
    model = onnx.load(out / "model.onnx", load_external_data=False)
    for node in (n for n in model.graph.node if n.op_type == "MatMulNBits"):
        assert dict((a.name, a.i) for a in node.attribute)["accuracy_level"] == 0
    scales = [t for t in model.graph.initializer if t.name.endswith(".scales")]
    assert scales and all(t.data_type == onnx.TensorProto.FLOAT16 for t in scales)
