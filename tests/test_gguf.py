"""GGUF input: small GGUF files written from tiny checkpoints (tests/gguf_files.py) built with the
CLI and compared with transformers loading the same file (`gguf_file=`)."""

import json

import numpy as np
import onnx
import pytest
import torch
import transformers
from conftest import TINY
from gguf_files import VOCAB, write_gguf
from helpers import GENAI_PROMPT, OnnxDecoder, PROMPT, build, make_checkpoint, model_logits, relative_error
from test_genai import MAX_LENGTH, genai_greedy

from builder.cli import main
from builder.quantize import QuantizedMatrix, dequantize

MIXED = {"*.attn_v.*": "Q8_0", "*.ffn_down.*": "Q4_1", "*.ffn_up.*": "Q6_K", "*": "Q4_0"}
ARCHS = {"llama": ("LlamaConfig", {}), "qwen2": ("Qwen2Config", {}),
         "qwen3": ("Qwen3Config", {"tie_word_embeddings": True})}


K_QUANTS = dict(hidden_size=256, intermediate_size=256, num_attention_heads=8, num_key_value_heads=4)  # rows of 256


def make_gguf(tmp_path, arch="llama", types="F32", **overrides):
    config_class, extra = ARCHS[arch]
    src = make_checkpoint(tmp_path / "src", config_class, **{**TINY, "vocab_size": VOCAB, "eos_token_id": 255,
                                                             **extra, **overrides})
    return write_gguf(src, tmp_path / f"{arch}.gguf", types)


def transformers_model(path):
    return transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                             dtype=torch.float32).eval()


def assert_same_logits(path, out, tolerance=1e-4):
    model = transformers_model(path)
    ref_prefill, ref_step, next_id = model_logits(model, PROMPT)
    got_prefill, got_step = OnnxDecoder(out).prefill_and_step(PROMPT, next_id)
    for name, got, want in (("prefill", got_prefill, ref_prefill),
                            ("decode", got_step, ref_step)):
        err = relative_error(got, want)
        assert err < tolerance, f"{name}: relative max error {err:.2e}"
        assert (got.argmax(-1) == want.argmax(-1)).all()
    return err


@pytest.mark.parametrize("arch, types, precision", [
    ("llama", "F32", "fp32"),
    ("llama", "F16", "fp32"),
    ("llama", {"*": "Q8_0"}, "fp32"),
    ("llama", {"*": "Q8_0"}, "int4"),
    ("llama", {"*": "Q4_0"}, "int4"),
    ("llama", {"*": "Q4_1"}, "fp32"),
    ("llama", MIXED, "fp32"),
    ("qwen2", {"*": "Q4_0"}, "int4"),
    ("qwen3", {"*": "Q4_0"}, "int4"),  # tied: lm_head's stored blocks feed GatherBlockQuantized
    ("qwen3", {"*": "Q8_0"}, "int8"),
])
def test_lossless_build_matches_transformers(tmp_path, arch, types, precision):
    path = make_gguf(tmp_path, arch, types, **(K_QUANTS if types is MIXED else {}))
    level = ("--accuracy-level", "0") if precision.startswith("int") else ()
    out = build(path, tmp_path / "out", "-p", precision, *level)
    assert_same_logits(path, out)


def test_stored_blocks_are_written_as_is(tmp_path):
    """An int4 build's MatMulNBits holds the file's own Q4_0/Q8_0 values: dequantized, they equal
    gguf's dequantization bit for bit (q/v fused into one qkv_proj, mixed 4/8-bit widened to 8)."""
    import gguf

    path = make_gguf(tmp_path, "qwen2", {"*.attn_v.*": "Q8_0", "*": "Q4_0"})
    out = build(path, tmp_path / "out", "-p", "int4")
    model = onnx.load(out / "model.onnx")
    init = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    nodes = {n.name: n for n in model.graph.node}
    reader = gguf.GGUFReader(path)
    stored = {t.name: gguf.quants.dequantize(t.data, t.tensor_type) for t in reader.tensors}

    def onnx_weight(prefix, bits):
        data, scales = init[f"{prefix}.data"], init[f"{prefix}.scales"]
        return dequantize(QuantizedMatrix(data, scales, None), data.shape[1] * 32, bits)

    node = nodes["/model/layers.0/mlp/down_proj/MatMulNBits"]
    assert {a.name: a.i for a in node.attribute}["bits"] == 4
    np.testing.assert_array_equal(onnx_weight("model.layers.0.mlp.down_proj", 4), stored["blk.0.ffn_down.weight"])
    qkv = onnx_weight("model.layers.0.self_attn.qkv_proj", 8)  # Q4_0 q/k and Q8_0 v as 8-bit
    want = np.concatenate([stored[f"blk.0.attn_{x}.weight"] for x in "qkv"])
    np.testing.assert_array_equal(qkv, want)


# Types with a per-block minimum (an offset beside MatMulNBits), 5- and 6-bit codes as 8-bit, and
# the K-quants' 16-value blocks fused with 32-value ones (q/k/v of different types).
WITH_MINIMUMS = {
    "Q4_1": ("llama", {"*": "Q4_1"}),
    "Q5_1": ("llama", {"*": "Q5_1"}),
    "Q4_K": ("llama", {"*": "Q4_K"}),
    "Q5_K": ("llama", {"*": "Q5_K"}),
    "Q4_K_M-like": ("llama", {"*.attn_v.*": "Q6_K", "*.ffn_down.*": "Q6_K", "*": "Q4_K"}),
    "Q2_K-mix": ("llama", {"*.attn_q.*": "Q2_K", "*.attn_k.*": "Q3_K", "*.attn_v.*": "Q5_0", "*.ffn_*": "Q2_K",
                           "*": "Q4_K"}),
    "Q4_1-tied": ("qwen3", {"*": "Q4_1"}),  # lm_head's blocks also feed GatherBlockQuantized, offsets added
}


@pytest.mark.parametrize("case", WITH_MINIMUMS)
def test_minimums_and_k_quants_are_lossless(tmp_path, case):
    """Q4_1, Q5_1 and the K-quants keep their values in an int4 build (each block's minimum times
    the sum of its inputs added to MatMulNBits): logits equal transformers' on the same GGUF at
    accuracy_level 0. Before, they were re-quantized (Q4_1: relative error 0.14)."""
    arch, types = WITH_MINIMUMS[case]
    sizes = {} if case.startswith(("Q4_1", "Q5_1")) else K_QUANTS
    path = make_gguf(tmp_path, arch, types, **sizes)
    out = build(path, tmp_path / "out", "-p", "int4", "--accuracy-level", "0")
    model = onnx.load(out / "model.onnx", load_external_data=False)
    ops = [n.op_type for n in model.graph.node]
    # qkv, o, gate_up (gate and up of one layout: one matrix, one minimum term), down per layer; lm_head
    assert ops.count("MatMulNBits") == 4 * 2 + 1
    assert any(n.name.endswith("mlp/gate_up_proj/MatMulNBits") for n in model.graph.node)
    assert ops.count("ReduceSum") >= 2  # the offsets' block sums
    if case == "Q4_1-tied":
        assert "GatherBlockQuantized" in ops
    assert_same_logits(path, out)


def test_gate_and_up_as_one_matrix_change_no_logit(tmp_path, monkeypatch):
    # Fused (one MatMulNBits and one minimum term for both), the logits are those of the two
    # matrices apart to the bit; a pattern that gives them different bits keeps them apart.
    import builder.blocks.mlp as mlp

    path = make_gguf(tmp_path, "llama", {"*": "Q4_1"})
    fused = build(path, tmp_path / "fused", "-p", "int4", "--accuracy-level", "0")
    original = mlp._fusable
    monkeypatch.setattr(mlp, "_fusable", lambda *a: False)
    apart = build(path, tmp_path / "apart", "-p", "int4", "--accuracy-level", "0")
    monkeypatch.setattr(mlp, "_fusable", original)
    for got, want in zip(OnnxDecoder(fused).prefill_and_step(PROMPT, 3), OnnxDecoder(apart).prefill_and_step(PROMPT, 3)):
        assert np.array_equal(got, want)
    mixed = build(path, tmp_path / "mixed", "-p", "int4", "--int8-layers", "*.up_proj")
    names = [n.name for n in onnx.load(mixed / "model.onnx", load_external_data=False).graph.node]
    assert not any("gate_up_proj" in n for n in names) and any("mlp/up_proj/MatMulNBits" in n for n in names)


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1"])
def test_genai_greedy_matches_transformers(tmp_path, kind):
    path = make_gguf(tmp_path, "llama", {"*": kind})
    out = build(path, tmp_path / "out", "-p", "int4", "--accuracy-level", "0")
    model = transformers_model(path)
    ids = torch.tensor([GENAI_PROMPT])
    expected = model.generate(ids, max_length=MAX_LENGTH, do_sample=False, eos_token_id=255,
                              pad_token_id=255)[0].tolist()
    got = genai_greedy(out, GENAI_PROMPT)
    assert len(expected) > len(GENAI_PROMPT) + 5
    assert got[: len(expected)] == expected[: len(got)] and len(got) >= len(GENAI_PROMPT) + 5


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_metadata_config_matches_transformers(tmp_path, arch):
    from builder.inputs.gguf.checkpoint import GGUFCheckpoint

    path = make_gguf(tmp_path, arch, "F32")
    raw, ckpt, _ = GGUFCheckpoint.open_file(path)
    ours = transformers.AutoConfig.for_model(**raw)
    theirs = transformers.AutoConfig.from_pretrained(path.parent, gguf_file=path.name)
    for key in ("model_type", "num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads",
                "num_key_value_heads", "rms_norm_eps", "max_position_embeddings", "vocab_size",
                "tie_word_embeddings", "rope_parameters"):
        assert getattr(ours, key) == getattr(theirs, key), key
    head_dim = [getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads for c in (ours, theirs)]
    assert head_dim[0] == head_dim[1]
    assert raw["eos_token_id"] == 255 and raw["bos_token_id"] == VOCAB - 2
    json.dumps(raw)  # plain Python values, as a config.json holds


def test_folder_with_one_gguf_and_default_output_name(tmp_path, monkeypatch):
    path = make_gguf(tmp_path, "llama", {"*": "Q8_0"})
    monkeypatch.chdir(tmp_path)
    assert main(["-m", str(tmp_path), "-p", "fp32", "-q"]) == 0
    assert (tmp_path / f"{tmp_path.name}-fp32-cpu" / "model.onnx").is_file()
    assert main(["-m", str(path), "-p", "fp32", "-q"]) == 0
    assert (tmp_path / "llama-fp32-cpu" / "model.onnx").is_file()


def test_unsupported_tensor_type_is_one_line(tmp_path, capsys):
    path = make_gguf(tmp_path, "llama", {"*.ffn_up.*": "IQ4_NL", "*": "Q4_0"})
    capsys.readouterr()
    assert main(["-m", str(path), "-o", str(tmp_path / "out"), "-q"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "IQ4_NL is not supported" in err and "blk.0.ffn_up.weight" in err


TEXTS = ["hello the world", " the  the\n\nthe 123 4567!", "<think>é ü 😀<|endoftext|>the", "It's THE end's"]


@pytest.mark.parametrize("arch", ["llama", "qwen2"])  # llama-bpe and qwen2 pre-tokenizer splits
def test_tokenizer_encodes_like_transformers(tmp_path, arch):
    import onnxruntime_genai as og

    path = make_gguf(tmp_path, arch, "F32")
    out = build(path, tmp_path / "out", "-p", "fp32")
    theirs = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    ours = transformers.AutoTokenizer.from_pretrained(out)
    genai = og.Tokenizer(og.Model(str(out)))
    for text in TEXTS:
        want = theirs(text).input_ids
        assert ours(text).input_ids == want, text
        assert genai.encode(text).tolist() == want, text
    config = json.loads((out / "tokenizer_config.json").read_text())
    assert config["chat_template"] == theirs.chat_template and config["eos_token"] == theirs.eos_token


@pytest.mark.parametrize("arch", ["qwen3", "llama"], ids=["tied", "untied"])
def test_an_8bit_token_embedding_is_gathered_as_stored(tmp_path, arch):
    # llama.cpp keeps token_embd at Q8_0 (or Q6_K) beside Q4 layers. An int4 build wrote it as a
    # float32 Gather table beside lm_head's 8-bit copy of the same codes: the real SmolLM2-135M
    # Q4_1 file built to 228.6 MB (115.4 MB now, 111.6 MB the lossless minimum). Now the lookup
    # gathers the stored codes (tied: lm_head's), and the logits are the same.
    path = make_gguf(tmp_path, arch, {"token_embd.*": "Q8_0", "*": "Q4_1"})
    out = build(path, tmp_path / "out", "-p", "int4", "--accuracy-level", "0")
    model = onnx.load(out / "model.onnx", load_external_data=False)
    gathers = [n for n in model.graph.node if "Gather" in n.op_type and n.op_type != "GatherElements"]
    assert [n.op_type for n in gathers] == ["GatherBlockQuantized"]
    assert {a.name: a.i for a in gathers[0].attribute}["bits"] == 8
    assert not any(t.name == "model.embed_tokens.weight" for t in model.graph.initializer)
    assert_same_logits(path, out)


def test_the_predicted_peak_counts_the_quantizer_only_where_floats_are_quantized(tmp_path):
    """An int4 build of a Q4_0 file keeps its blocks and never loads the compiled quantizer (numba,
    105 MB): the estimate counted it for any graph with MatMulNBits (SmolLM2's Q4_1 file: 389 MB
    predicted against 182 measured, 221 now)."""
    from builder import pipeline
    from builder.options import BuildOptions
    from builder.report import QUANTIZER_RSS

    peaks = {}
    for kind in ("Q4_0", "F32"):
        (tmp_path / kind).mkdir()
        options = BuildOptions(model=str(make_gguf(tmp_path / kind, "qwen2", kind)), output=str(tmp_path / "out"),
                               precision="int4")
        peaks[kind] = pipeline.plan(options, pipeline.source_folder(options)).estimate.peak_rss
    assert peaks["F32"] - peaks["Q4_0"] >= QUANTIZER_RSS, peaks
