"""Builds for each execution provider: the genai_config.json, I/O and graph form that
onnxruntime-genai 0.18's own builder writes for that provider (its values below, read from its
outputs for the tiny Llama and Qwen3 on 2026-11-27), and, since every operator these graphs use
also has an ONNX Runtime CPU kernel, fp16-level parity with transformers on the CPU."""

import collections
import json

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from conftest import TINY
from fake_quant import assert_quantized_parity
from helpers import (GENAI_PROMPT, PROMPT, OnnxDecoder, add_example_tokenizer, assert_parity, build, make_checkpoint,
                     reference, relative_error)
from test_flags import assert_refused

from builder.provider_kernels import missing, ops_of

# onnxruntime-genai 0.18's builder: provider_options per provider (-e cuda, dml, webgpu, NvTensorRtRtx).
PROVIDER_OPTIONS = {
    "cuda": [{"cuda": {"enable_cuda_graph": "0"}}],
    "dml": [{"dml": {"enable_graph_capture": "1"}}],
    "webgpu": [{"webgpu": {"enableGraphCapture": "0", "validationMode": "basic"}}],
    "trt-rtx": [{"NvTensorRtRtx": {"enable_cuda_graph": "1"}}],
}
LAYERS = TINY["num_hidden_layers"]


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    # q/k norms and a tied vocabulary: the parts where providers differ most
    return make_checkpoint(tmp_path_factory.mktemp("qwen3"), "Qwen3Config",
                           **{**TINY, "head_dim": 32, "tie_word_embeddings": True})


def graph(folder):
    model = onnx.load(folder / "model.onnx", load_external_data=False)
    ops = collections.Counter(n.op_type for n in model.graph.node)
    return model, ops


def attributes(model, op_type):
    return [{a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
            for n in model.graph.node if n.op_type == op_type]


def io_types(model):
    name = onnx.TensorProto.DataType.Name
    return {v.name: name(v.type.tensor_type.elem_type) for v in [*model.graph.input, *model.graph.output]}


@pytest.mark.parametrize("precision", ["fp16", "int4"])
@pytest.mark.parametrize("provider", sorted(PROVIDER_OPTIONS))
def test_provider_build_has_the_references_contract_and_runs(qwen3, tmp_path, provider, precision):
    out = build(qwen3, tmp_path / "out", "-p", precision, "-e", provider, *(
        ["--accuracy-level", "0"] if precision == "int4" and provider == "webgpu" else []))
    genai = json.loads((out / "genai_config.json").read_text())
    decoder = genai["model"]["decoder"]
    assert decoder["session_options"]["provider_options"] == PROVIDER_OPTIONS[provider]
    assert genai["search"]["past_present_share_buffer"] is True
    model, ops = graph(out)
    positions = provider == "dml"
    assert ("position_ids" in decoder["inputs"]) == positions
    expected = {"input_ids": "INT64", "attention_mask": "INT64", **({"position_ids": "INT64"} if positions else {}),
                **{f"{kind}.{i}.{part}": "FLOAT16" for i in range(LAYERS) for kind, part in
                   (("past_key_values", "key"), ("past_key_values", "value"), ("present", "key"), ("present", "value"))},
                "logits": "FLOAT16"}
    assert io_types(model) == expected
    gqa = attributes(model, "GroupQueryAttention")
    assert len(gqa) == LAYERS and all(a["do_rotary"] == (0 if positions else 1) for a in gqa)
    if positions:  # DirectML: RotaryEmbedding on q and k from position_ids, Q, K, V projected apart
        assert ops["RotaryEmbedding"] == 2 * LAYERS
        assert all("position_ids" in n.input for n in model.graph.node if n.op_type == "RotaryEmbedding")
        assert not any("qkv_proj" in n.name for n in model.graph.node)
    if provider == "trt-rtx":  # no fused norms, QDQ weights, no GatherBlockQuantized
        assert not {"SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization"} & set(ops)
        assert "GatherBlockQuantized" not in ops and "MatMulNBits" not in ops
        if precision == "int4":
            dq = [n for n in model.graph.node if n.op_type == "DequantizeLinear"]
            assert len(dq) == LAYERS * 5 + 1 and all(len(n.input) == 2 for n in dq)  # symmetric: no zero points
    elif precision == "int4":
        levels = {a["accuracy_level"] for a in attributes(model, "MatMulNBits")}
        assert levels == {0}
        # the tied lookup reads lm_head's codes, where the provider has GatherBlockQuantized (not DirectML)
        assert ops["GatherBlockQuantized"] == (0 if provider == "dml" else 1)
    assert missing(ops_of(ir.load(out / "model.onnx")), provider) == []  # every node has the provider's kernel
    if precision == "fp16":
        assert_parity(out, qwen3, tolerance=1e-2)
    elif provider in ("cuda", "webgpu"):
        assert_quantized_parity(qwen3, out)
    else:  # a float lookup beside the rounded lm_head (trt-rtx: symmetric): builder's own --verify reference
        assert_verified(qwen3, out, "-p", "int4", "-e", provider)


FAMILIES = {
    "llama": ("LlamaConfig", {}),
    "gemma3-windows": ("Gemma3TextConfig", dict(head_dim=32, sliding_window=4, query_pre_attn_scalar=32,
                                                layer_types=["sliding_attention", "full_attention"])),
    "qwen3-moe": ("Qwen3MoeConfig", dict(head_dim=32, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)),
}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request, tmp_path_factory):
    config_class, overrides = FAMILIES[request.param]
    source = make_checkpoint(tmp_path_factory.mktemp(request.param), config_class, **{**TINY, **overrides})
    return request.param, add_example_tokenizer(source)


@pytest.mark.parametrize("provider", sorted(PROVIDER_OPTIONS))
def test_families_run_where_the_provider_has_kernels(family, tmp_path, capsys, provider):
    """Every node of a fp16 build has a kernel on its provider (ONNX Runtime's registrations,
    builder/provider_kernels.py), or the build says which do not: DirectML has no MoE kernel and
    refuses; the others run on the CPU with fp16 parity, a prompt past Gemma 3's window included."""
    name, source = family
    capsys.readouterr()
    out = tmp_path / "out"
    if name == "qwen3-moe" and provider == "dml":
        assert_refused(capsys, tmp_path, ["-m", source, "-p", "fp16", "-e", provider],
                       "-e dml: ONNX Runtime's dml provider has no kernel for com.microsoft::MoE")
        return
    build(source, out, "-p", "fp16", "-e", provider)
    gone = missing(ops_of(ir.load(out / "model.onnx")), provider)
    if name == "qwen3-moe" and provider in ("trt-rtx", "webgpu"):  # float experts: MoE has no kernel there
        assert gone == ["com.microsoft::MoE"]
        assert "ONNX Runtime will run those nodes on the CPU" in capsys.readouterr().err
    else:
        assert gone == [], gone
    ids = PROMPT + [3, 14, 15, 92, 65]
    want, want_step, next_id = reference(source, ids)
    for got, expected in zip(OnnxDecoder(out).prefill_and_step(ids, next_id), (want, want_step)):
        assert relative_error(got, expected) < 1e-2
        top2 = np.sort(expected, axis=-1)[:, -2:]
        clear = top2[:, 1] - top2[:, 0] > 1e-2 * np.abs(expected).max()  # fp16 may swap a near tie
        assert (got.argmax(-1) == expected.argmax(-1))[clear].all()


def assert_verified(source, out, *flags):
    from builder.options import BuildOptions
    from builder.verify import verify

    options = BuildOptions(model=str(source), precision=flags[1], execution_provider=flags[3])
    verdicts = verify(options, out, source, quiet=True)
    assert verdicts and all(v.passed for v in verdicts), verdicts


def test_webgpu_int4_defaults_to_accuracy_level_4(qwen3, tmp_path):
    model, _ = graph(build(qwen3, tmp_path / "out", "-p", "int4", "-e", "webgpu"))
    assert {a["accuracy_level"] for a in attributes(model, "MatMulNBits")} == {4}


@pytest.mark.parametrize("provider", ["cuda", "trt-rtx"])
def test_bf16_keeps_bf16_cache_and_float32_logits(qwen3, tmp_path, provider):
    model, _ = graph(build(qwen3, tmp_path / "out", "-p", "bf16", "-e", provider))
    types = io_types(model)
    assert types["logits"] == "FLOAT" and types["present.0.key"] == "BFLOAT16"


def test_directml_graph_generates_in_genai_with_its_position_ids(qwen3, tmp_path):
    """onnxruntime-genai feeds position_ids to a model that declares them; run on the CPU (the
    provider options dropped), the DirectML graph generates what the CPU graph generates."""
    from test_genai import genai_greedy

    dml = build(qwen3, tmp_path / "dml", "-p", "fp16", "-e", "dml")
    cpu = build(qwen3, tmp_path / "cpu", "-p", "fp16")
    config = json.loads((dml / "genai_config.json").read_text())
    config["model"]["decoder"]["session_options"]["provider_options"] = []
    (dml / "genai_config.json").write_text(json.dumps(config))
    assert genai_greedy(dml, GENAI_PROMPT) == genai_greedy(cpu, GENAI_PROMPT)


def test_longrope_without_if_on_providers_that_have_none(tmp_path):
    # Phi-3.5's LongRoPE switches tables past original_max_position_embeddings: an If elsewhere,
    # a Where over both tables on DirectML and TensorRT-RTX; the 20-token prompt crosses 16.
    source = make_checkpoint(tmp_path / "src", "Phi3Config", **{
        **TINY, "eos_token_id": 255, "pad_token_id": 0, "bos_token_id": 1, "max_position_embeddings": 64, "original_max_position_embeddings": 16,
        "rope_parameters": {"rope_type": "longrope", "rope_theta": 10000.0,
                            "short_factor": [1.0 + 0.1 * i for i in range(8)],
                            "long_factor": [2.0 + 0.5 * i for i in range(8)]}})
    long_prompt = PROMPT + [3, 14, 15, 92, 65, 35, 89, 79, 32, 38]
    for provider in ("dml", "trt-rtx"):
        out = build(source, tmp_path / provider, "-p", "fp16", "-e", provider)
        _, ops = graph(out)
        assert "If" not in ops and ops["Where"] >= 2
        assert_parity(out, source, tolerance=1e-2, ids=long_prompt)


@pytest.mark.parametrize("flags, message", [
    (["-e", "trt-rtx", "--asymmetric"], "-e trt-rtx reads quantized weights only as symmetric"),
    (["-e", "dml", "--windowed-kv-cache"], "-e dml: onnxruntime-genai keeps full-length caches"),
    (["-e", "dml", "-p", "fp32"], "-p fp32 -e dml is not supported: onnxruntime-genai's attention on dml runs fp16"),
    (["-e", "webgpu", "-p", "bf16"], "-p bf16 -e webgpu is not supported"),
])
def test_provider_refusals_are_one_line(qwen3, tmp_path, capsys, flags, message):
    assert_refused(capsys, tmp_path, ["-m", qwen3, *flags], message)


@pytest.mark.parametrize("spelling", ["NvTensorRtRtx", "TRT-RTX", "DML", "WebGPU"])
def test_reference_spellings_name_the_provider(spelling):
    from builder.options import BuildOptions

    expected = {"nvtensorrtrtx": "trt-rtx", "trt-rtx": "trt-rtx", "dml": "dml", "webgpu": "webgpu"}[spelling.lower()]
    assert BuildOptions(model="x", execution_provider=spelling).execution_provider == expected
    assert np.dtype(BuildOptions(model="x", execution_provider=spelling).target().io_dtype) == np.float16
