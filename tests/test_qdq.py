"""--qdq: quantized weights as blocked DequantizeLinear + MatMul, the same codes and scales as
MatMulNBits, with logits equal to the MatMulNBits build's at the same accuracy level."""

import collections

import onnx
import pytest
from conftest import TINY
from helpers import GENAI_PROMPT, OnnxDecoder, PROMPT, build, make_checkpoint, relative_error
from test_gguf import make_gguf
from test_genai import genai_greedy

CASES = {  # flags beside -p and --accuracy-level 0
    "int4-asymmetric-tied": ("qwen3-tied", ["-p", "int4"]),
    "int4-symmetric-block64": ("llama", ["-p", "int4", "--symmetric", "--block-size", "64"]),
    "int8": ("llama", ["-p", "int8"]),
    "int4-int8-tied-head": ("qwen3-tied", ["-p", "int4", "--int8-layers", "lm_head"]),  # gathered with Gather + DQ
}


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("qdq")
    return {
        "llama": make_checkpoint(root / "llama", "LlamaConfig", **TINY),
        "qwen3-tied": make_checkpoint(root / "qwen3", "Qwen3Config", **{**TINY, "head_dim": 32, "tie_word_embeddings": True}),
    }


def ops(folder):
    model = onnx.load(folder / "model.onnx", load_external_data=False)
    return collections.Counter(n.op_type for n in model.graph.node), model


def data_bytes(folder):
    return (folder / "model.onnx.data").stat().st_size


def stored_sizes(model):
    return {t.name: next(int(e.value) for e in t.external_data if e.key == "length")
            for t in model.graph.initializer if t.external_data}


def assert_same_logits(nbits, qdq, tolerance=1e-5):
    ids, next_id = PROMPT, 7
    for name, a, b in zip(("prefill", "decode"), OnnxDecoder(nbits).prefill_and_step(ids, next_id),
                          OnnxDecoder(qdq).prefill_and_step(ids, next_id)):
        err = relative_error(b, a)
        assert err < tolerance, f"{name}: relative max error {err:.2e} against the MatMulNBits build"


@pytest.mark.parametrize("case", CASES)
def test_qdq_equals_matmulnbits(sources, tmp_path, case):
    source, flags = CASES[case]
    flags = [*flags, "--accuracy-level", "0"]
    nbits = build(sources[source], tmp_path / "nbits", *flags)
    qdq = build(sources[source], tmp_path / "qdq", *flags, "--qdq")
    counts, model = ops(qdq)
    assert "MatMulNBits" not in counts
    layers = TINY["num_hidden_layers"]
    assert counts["DequantizeLinear"] >= layers * 5 + 1 and counts["MatMul"] == counts["DequantizeLinear"] - (
        1 if case == "int4-int8-tied-head" else 0)  # the lookup's DequantizeLinear feeds no MatMul
    for node in (n for n in model.graph.node if n.op_type == "DequantizeLinear"):
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        assert attrs["axis"] == 0 and attrs["block_size"] in (32, 64)
    # The same codes and scales; a tied vocabulary's lookup has its own copy (Vocabulary.create).
    sizes = stored_sizes(model)
    lookup = sum(v for k, v in sizes.items() if k.startswith("model.embed_tokens."))
    if "tied" in case:
        assert lookup == sum(v for k, v in sizes.items() if k.startswith("lm_head."))
    else:
        lookup = 0
    assert abs(data_bytes(qdq) - lookup - data_bytes(nbits)) <= 0.01 * data_bytes(nbits)
    assert_same_logits(nbits, qdq)


def test_qdq_keeps_gguf_blocks_and_minimums(tmp_path):
    # Q4_1's per-block minimums stay the added term beside the DequantizeLinear + MatMul.
    path = make_gguf(tmp_path, "qwen3", {"token_embd.*": "Q8_0", "*": "Q4_1"})
    nbits = build(path, tmp_path / "nbits", "-p", "int4", "--accuracy-level", "0")
    qdq = build(path, tmp_path / "qdq", "-p", "int4", "--accuracy-level", "0", "--qdq")
    counts, _ = ops(qdq)
    assert "MatMulNBits" not in counts and counts["ReduceSum"] >= 2
    assert_same_logits(nbits, qdq)


@pytest.mark.parametrize("source", ["llama", "qwen3-tied"])
def test_onnxruntime_fuses_qdq_into_matmulnbits_at_the_builds_level(sources, tmp_path, source):
    """genai_config.json carries the accuracy level onnxruntime-genai gives ONNX Runtime for the
    MatMulNBits it fuses (its own default is 4): a level-0 build generates what the MatMulNBits
    build generates, and the optimized graph has MatMulNBits again, lm_head's too (a tied lookup
    reading lm_head's codes kept it a float MatMul: ONNX Runtime fuses only codes nothing else reads)."""
    import onnxruntime as ort

    qdq = build(sources[source], tmp_path / "qdq", "-p", "int4", "--accuracy-level", "0", "--qdq")
    nbits = build(sources[source], tmp_path / "nbits", "-p", "int4", "--accuracy-level", "0")
    assert genai_greedy(qdq, GENAI_PROMPT) == genai_greedy(nbits, GENAI_PROMPT)
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(str(qdq / "model.onnx"), options, providers=["CPUExecutionProvider"])
    fused = collections.Counter(n.op_type for n in onnx.load(tmp_path / "optimized.onnx", load_external_data=False).graph.node)
    assert fused["MatMulNBits"] == TINY["num_hidden_layers"] * 5 + 1 and "MatMul" not in fused


def test_reference_spelling_maps_to_qdq(sources, tmp_path):
    from builder.cli import genai_extra_options

    assert genai_extra_options(["use_qdq=true"], {})["qdq"] is True
