"""Gemma 4's text decoder against transformers: fp32 prefill and decode steps feeding back every KV
(prompts shorter and longer than the sliding window), fp16, int4 against fake quantization,
onnxruntime-genai's greedy generation (one prompt, and two of different lengths in a batch), the
multimodal layout, and the I/O of layers that share KV or have their own head size."""

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import transformers
from fake_quant import fake_quantize_model
from helpers import GENAI_PROMPT, build, make_checkpoint, relative_error
from safetensors.numpy import load_file, save_file
from family_runner import (PROMPT, STEPS, assert_ragged_batch_matches, assert_steps_match, onnx_steps,
                              reference_steps)
from test_family_moe import fake_quantize_experts
from test_family_moe2 import ROUTER_SCALE

import architectures
from builder.errors import BuildError
from builder.options import PRECISION_DEFAULTS
from builder.quantize import dequantize, quantize

S, F = "sliding_attention", "full_attention"
# Every feature on: sliding layers of head 16 over 2 KV heads, full layers of head 32 over 1 KV
# head whose values are their keys (attention_k_eq_v) and whose rotary is proportional (a quarter
# of the pairs rotate); the last 2 layers read layers 2 and 3's KV with double-wide MLPs;
# per-layer inputs of 32; soft-capped logits; a window of 8.
CONFIG = dict(
    vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=6, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, global_head_dim=32, num_global_key_value_heads=1, attention_k_eq_v=True,
    num_kv_shared_layers=2, use_double_wide_mlp=True, hidden_size_per_layer_input=32, vocab_size_per_layer_input=256,
    sliding_window=8, layer_types=[S, F, S, F, S, F], final_logit_softcapping=30.0, max_position_embeddings=128,
    initializer_range=0.1, eos_token_id=255,
)
LONG = [int(t) for t in np.random.default_rng(0).integers(3, 255, 29)]  # past the window of 8


def make(folder, **overrides):
    """A tiny random Gemma 4 whose layer_scalar buffers and router scales are random too
    (transformers keeps ones), its routers decisive (random ones are near-uniform)."""
    make_checkpoint(folder, "Gemma4TextConfig", **{**CONFIG, **overrides})
    tensors = load_file(folder / "model.safetensors")
    rng = np.random.default_rng(1)
    for key, value in tensors.items():
        if key.endswith(("layer_scalar", "router.scale", "router.per_expert_scale")):
            tensors[key] = rng.uniform(0.5, 1.5, value.shape).astype(value.dtype)
        elif key.endswith("router.proj.weight"):
            tensors[key] = value * ROUTER_SCALE
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    return make(tmp_path_factory.mktemp("gemma4"))


@pytest.fixture(scope="module")
def fp32(source, tmp_path_factory):
    return build(source, tmp_path_factory.mktemp("gemma4_fp32"), "-p", "fp32")


def load(source):
    model = transformers.AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).eval()
    assert type(model).__name__ == "Gemma4ForCausalLM"
    return model


def test_fp32_prefill_and_decode_match_transformers(source, fp32):
    model = load(source)
    assert [m.self_attn.is_kv_shared_layer for m in model.model.layers] == [False] * 4 + [True] * 2
    assert_steps_match(fp32, model)
    assert_steps_match(fp32, model, LONG)


def test_plain_variant(tmp_path):
    # No per-layer inputs, no KV sharing, separate values on full layers (their KV heads then the
    # sliding layers'), untied lm_head, no soft-capping, default layer types (5 sliding, 1 full).
    source = make(tmp_path / "src", hidden_size_per_layer_input=0, num_kv_shared_layers=0, attention_k_eq_v=False,
                  use_double_wide_mlp=False, tie_word_embeddings=False, final_logit_softcapping=None,
                  layer_types=None, num_hidden_layers=7)
    assert_steps_match(build(source, tmp_path / "out", "-p", "fp32"), load(source), LONG)


def test_fp16_prefill_and_decode_close_to_transformers(source, tmp_path):
    out = build(source, tmp_path / "out", "-p", "fp16")
    want, fed = reference_steps(load(source), PROMPT, STEPS)
    for step, (g, w) in enumerate(zip(onnx_steps(out, PROMPT, fed), want)):
        assert relative_error(g, w) < 1e-2, f"step {step}: relative error {relative_error(g, w):.2e}"


def test_int4_matches_fake_quantized_transformers(source, tmp_path):
    out = build(source, tmp_path / "out", "-p", "int4", "--accuracy-level", "0")
    model = load(source)
    int4 = PRECISION_DEFAULTS["int4"]
    fake_quantize_model(model, 4, 32, int4["symmetric"], method=int4["quant_method"])
    round_per_layer_table(model)
    assert_steps_match(out, model, tolerance=1e-3, min_cosine=0.999)
    kinds = {n.op_type for n in onnx.load(out / "model.onnx").graph.node}
    assert "GatherBlockQuantized" in kinds


def round_per_layer_table(model):
    """The per-layer embedding table as a quantized build gathers it: 8-bit blocks, RTN, symmetric
    (without it a build's output was larger than its bf16 input: the table in float32)."""
    table = model.model.embed_tokens_per_layer.weight
    m = quantize(table.detach().numpy(), 8, 32, True, np.float32, "rtn")
    with torch.no_grad():
        table.copy_(torch.from_numpy(dequantize(m, table.shape[1], 8)))


def test_kv_contract(fp32):
    """The sharing layers 4 and 5 have no cache; the full layers' KV is (1 head, 32), the sliding
    layers' (2, 16); genai_config.json counts the 4 caches."""
    session = ort.InferenceSession(str(fp32 / "model.onnx"), providers=["CPUExecutionProvider"])
    inputs = {i.name: i.shape for i in session.get_inputs()}
    outputs = {o.name: o.shape for o in session.get_outputs()}
    assert list(inputs) == ["input_ids", "attention_mask", *(f"past_key_values.{i}.{kv}" for i in range(4)
                                                             for kv in ("key", "value"))]
    assert inputs["past_key_values.0.key"] == ["batch_size", 2, "past_sequence_length", 16]
    assert inputs["past_key_values.3.value"] == ["batch_size", 1, "past_sequence_length", 32]
    assert outputs["present.1.key"] == ["batch_size", 1, "total_sequence_length", 32]
    decoder = json.loads((fp32 / "genai_config.json").read_text())["model"]["decoder"]
    assert decoder["num_hidden_layers"] == 4
    assert json.loads((fp32 / "genai_config.json").read_text())["model"]["type"] == "gemma4_text"


def test_genai_greedy_matches_transformers(source, fp32):
    from test_genai import assert_same_greedy

    assert_same_greedy(fp32, source, GENAI_PROMPT)


def test_genai_batch_of_different_lengths_matches_transformers(source, fp32):
    assert_ragged_batch_matches(fp32, load(source))


def test_multimodal_checkpoint_builds_its_text_decoder(tmp_path):
    # The hub's Gemma 4 is Gemma4ForConditionalGeneration: the decoder under model.language_model.,
    # its settings under text_config; the vision tower and its embedder are left out.
    torch.manual_seed(0)
    vision = dict(hidden_size=32, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                  num_key_value_heads=2, head_dim=16, global_head_dim=16)
    config = transformers.Gemma4Config(text_config=CONFIG, vision_config=vision, audio_config=None)
    model = transformers.Gemma4ForConditionalGeneration(config).eval()
    model.save_pretrained(tmp_path / "src")
    out = build(tmp_path / "src", tmp_path / "out", "-p", "fp32")
    assert_steps_match(out, model)


def test_hub_spelling_of_the_full_layers():
    # The hub's config.json says global_head_dim and num_global_key_value_heads (no
    # per_layer_config): the same layers as transformers resolves them.
    family = architectures.load("Gemma4ForCausalLM")
    for k_eq_v in (True, False):
        raw = dict(CONFIG, attention_k_eq_v=k_eq_v)
        c = family.parse_config(raw, "Gemma4ForCausalLM")
        want = transformers.Gemma4TextConfig(**raw)
        dims = [(want.per_layer_config[i].num_key_value_heads, want.per_layer_config[i].head_dim) for i in range(6)]
        assert c.layer_dims == dims
        assert c.kv_source == [0, 1, 2, 3, 2, 3]


@pytest.mark.parametrize("key, value", [("enable_moe_block", True), ("use_bidirectional_attention", "all")])
def test_refuses_what_it_does_not_build(key, value):
    # An MoE block without its sizes; bidirectional attention.
    with pytest.raises(BuildError, match=key):
        architectures.load("Gemma4ForCausalLM").parse_config({**CONFIG, key: value}, "Gemma4ForCausalLM")


# gemma-4-26B-A4B's block: 4 GeGLU experts, top 2, beside the dense MLP (every layer).
MOE = dict(enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=32)


@pytest.fixture(scope="module")
def moe_source(tmp_path_factory):
    return make(tmp_path_factory.mktemp("gemma4_moe"), **MOE)


def test_moe_fp32_prefill_and_decode_match_transformers(moe_source, tmp_path):
    out = build(moe_source, tmp_path / "out", "-p", "fp32")
    model = load(moe_source)
    assert_steps_match(out, model)
    assert_steps_match(out, model, LONG)


def test_moe_int4_matches_fake_quantized_transformers(moe_source, tmp_path):
    # The experts round as each expert's [out, in] rows (moe_intermediate_size is a whole number of
    # blocks, so the [H, E·I] down matrix's blocks are each expert's); the router stays float.
    out = build(moe_source, tmp_path / "out", "-p", "int4", "--accuracy-level", "0")
    model = load(moe_source)
    router = [m.router.proj.weight.clone() for m in model.model.layers]
    int4 = PRECISION_DEFAULTS["int4"]
    fake_quantize_experts(model, 4, 32, int4["symmetric"], int4["quant_method"])
    with torch.no_grad():
        for m, weight in zip(model.model.layers, router):
            m.router.proj.weight.copy_(weight)
    round_per_layer_table(model)
    assert_steps_match(out, model, tolerance=1e-3, min_cosine=0.999)


def test_moe_genai_greedy_matches_transformers(moe_source, tmp_path):
    from test_genai import assert_same_greedy

    assert_same_greedy(build(moe_source, tmp_path / "out", "-p", "fp32"), moe_source, GENAI_PROMPT)


def test_windowed_cache_numbers_the_caches(source, tmp_path):
    # genai_config.json lists the ring-buffer caches by their number: layer 4 shares layer 2's KV
    # and has none, so the sliding caches are 0 and 2 (layer numbers would name 4, a full cache).
    from test_sliding_windows import assert_rows_match, genai_generate

    out = build(source, tmp_path / "out", "-p", "fp32", "--windowed-kv-cache")
    assert json.loads((out / "genai_config.json").read_text())["model"]["decoder"]["sliding_window"]["layers"] == [0, 2]
    generated = genai_generate(out, [LONG[:20]], 40)
    assert_rows_match(load(source), [LONG[:20]], generated, 20)


def test_verify_feeds_each_layers_kv_shape(source, tmp_path):
    # --verify fed every cache the sliding layers' shape: ONNX Runtime refused the full layers' (1, 32).
    from builder.cli import main

    assert main(["-m", str(source), "-o", str(tmp_path / "out"), "-q", "-p", "fp32", "--verify"]) == 0


def test_moe_fp16_prefill_and_decode_close_to_transformers(moe_source, tmp_path):
    out = build(moe_source, tmp_path / "out", "-p", "fp16")
    want, fed = reference_steps(load(moe_source), LONG, STEPS)
    for step, (g, w) in enumerate(zip(onnx_steps(out, LONG, fed), want)):
        assert relative_error(g, w) < 1e-2, f"step {step}: relative error {relative_error(g, w):.2e}"


def test_per_layer_config_keys_as_transformers_writes_them():
    # transformers 5 writes per_layer_config's layer keys zero-padded ("05", "11") and reads int(key):
    # read as strings, "05" was no layer 5, whose head size fell back to the sliding one.
    import architectures

    raw = {**json.loads(transformers.Gemma4TextConfig().to_json_string(use_diff=False)),
           "architectures": ["Gemma4ForCausalLM"]}
    assert "05" in raw["per_layer_config"]
    c = architectures.load("Gemma4ForCausalLM").parse_config(raw, "Gemma4ForCausalLM")
    assert c.layer_dims[5] == c.layer_dims[29] == (raw["num_key_value_heads"], 512)
