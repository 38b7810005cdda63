"""LFM2 (short convolutions with carried state, interleaved with attention) against transformers:
fp32 prefill and decode steps feeding back every KV and conv state, int4 against fake
quantization, onnxruntime-genai's greedy generation (one prompt, and two of different lengths in a
batch), and the state contract onnxruntime-genai 0.18 reads."""

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import transformers
from fake_quant import cosine, fake_quantize_model
from helpers import GENAI_PROMPT, build, make_checkpoint, relative_error
from safetensors.numpy import load_file, save_file
from family_runner import (PROMPT, STEPS, assert_ragged_batch_matches, assert_steps_match, load, onnx_steps,
                           reference_steps)
from test_genai import assert_same_greedy

from builder.options import PRECISION_DEFAULTS

# Both layer kinds, a conv layer first and last; 5 query heads over 1 KV head (odd, grouped);
# conv_bias on (random biases below: transformers initializes them to zero), a 4-tap kernel.
CONFIG = dict(
    vocab_size=256, hidden_size=80, intermediate_size=96, num_hidden_layers=4, num_attention_heads=5,
    num_key_value_heads=1, max_position_embeddings=128, conv_bias=True, conv_L_cache=4, block_multiple_of=16,
    initializer_range=0.1,  # varied greedy continuations (at 0.02 the tiny model repeats one token)
    layer_types=["conv", "full_attention", "conv", "conv"], eos_token_id=255,
)


def make(folder, **overrides):
    make_checkpoint(folder, "Lfm2Config", **{**CONFIG, **overrides})
    tensors = load_file(folder / "model.safetensors")
    rng = np.random.default_rng(1)
    for key, value in tensors.items():
        if key.endswith(".bias"):
            tensors[key] = (0.1 * rng.standard_normal(value.shape)).astype(value.dtype)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    return make(tmp_path_factory.mktemp("lfm2"))


def test_fp32_prefill_and_decode_match_transformers(source, tmp_path):
    assert_steps_match(build(source, tmp_path / "out", "-p", "fp32"), load(source))


def test_prompt_shorter_than_the_kernel(source, tmp_path):
    # Two tokens then steps: the conv reads the zero state it starts with, as transformers pads.
    out = build(source, tmp_path / "out", "-p", "fp32")
    want, fed = reference_steps(load(source), [9, 4], STEPS)
    for step, (g, w) in enumerate(zip(onnx_steps(out, [9, 4], fed), want)):
        assert relative_error(g, w) < 1e-4, f"step {step}"


def test_int4_matches_fake_quantized_transformers(source, tmp_path):
    out = build(source, tmp_path / "out", "-p", "int4", "--accuracy-level", "0")
    model = load(source)
    conv_weights = [m.conv.conv.weight.clone() for m in model.model.layers if hasattr(m, "conv")]
    int4 = PRECISION_DEFAULTS["int4"]  # what the build does when not told
    fake_quantize_model(model, 4, 32, int4["symmetric"], method=int4["quant_method"])  # every Linear, not the Conv1d
    assert all(torch.equal(a, m.conv.conv.weight) for a, m in
               zip(conv_weights, [m for m in model.model.layers if hasattr(m, "conv")]))
    want, fed = reference_steps(model, PROMPT, STEPS)
    for step, (g, w) in enumerate(zip(onnx_steps(out, PROMPT, fed), want)):
        assert cosine(g, w) > 0.999 and relative_error(g, w) < 1e-4, f"step {step}"
    kernels = [t for t in onnx.load(out / "model.onnx").graph.initializer if t.name.endswith("conv.conv.weight")]
    assert len(kernels) == 3 and all(t.data_type == onnx.TensorProto.FLOAT for t in kernels)


def test_state_contract(source, tmp_path):
    """Attention layers: KV only; conv layers: past.%d.conv / present.%d.conv only, (batch, hidden,
    kernel−1); genai_config.json names them and lists the layer types (the lfm2 type needs them)."""
    out = build(source, tmp_path / "out", "-p", "fp32")
    session = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    inputs = {i.name: i.shape for i in session.get_inputs()}
    outputs = {o.name: o.shape for o in session.get_outputs()}
    assert sorted(inputs) == sorted(["input_ids", "attention_mask", "past.0.conv", "past_key_values.1.key",
                                     "past_key_values.1.value", "past.2.conv", "past.3.conv"])
    assert inputs["past.0.conv"] == outputs["present.0.conv"] == ["batch_size", 80, 3]
    assert sorted(outputs) == sorted(["logits", "present.0.conv", "present.1.key", "present.1.value",
                                      "present.2.conv", "present.3.conv"])
    decoder = json.loads((out / "genai_config.json").read_text())["model"]["decoder"]
    assert decoder["inputs"]["past_conv_names"] == "past.%d.conv"
    assert decoder["outputs"]["present_conv_names"] == "present.%d.conv"
    assert decoder["layer_types"] == CONFIG["layer_types"]
    assert decoder["conv_cache_size"] == 3


def test_genai_greedy_matches_transformers(source, tmp_path):
    assert_same_greedy(build(source, tmp_path / "out", "-p", "fp32"), source, GENAI_PROMPT)


def test_genai_batch_of_different_lengths_matches_transformers(source, tmp_path):
    # genai pads the shorter row on the right (as og.Tokenizer.encode_batch does): its conv state
    # must be the row's last real inputs, not the padding after them.
    out = build(source, tmp_path / "out", "-p", "fp32")
    assert_ragged_batch_matches(out, load(source))


def test_verify_feeds_the_conv_states(source, tmp_path):
    # --verify fed only KV inputs: ONNX Runtime refused the missing past.%d.conv (a traceback).
    from builder.cli import main

    assert main(["-m", str(source), "-o", str(tmp_path / "out"), "-q", "-p", "fp32", "--verify"]) == 0


CASES = {
    "defaults": {},
    "full-attn-idxs": dict(num_hidden_layers=6, full_attn_idxs=[1, 4]),
    "old-spellings": dict(block_ff_dim=4096, tie_embedding=False, block_ffn_dim_multiplier=1.5, block_multiple_of=64),
    "no-adjust": dict(intermediate_size=5000, block_auto_adjust_ff_dim=False, conv_L_cache=5),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_transformers_config(case):
    import architectures
    from transformers.models.lfm2.modeling_lfm2 import Lfm2MLP

    raw = {**CASES[case], "architectures": ["Lfm2ForCausalLM"]}
    c = architectures.load("Lfm2ForCausalLM").parse_config(raw, "Lfm2ForCausalLM")
    want = transformers.Lfm2Config(**CASES[case])
    assert c.layer_types == want.layer_types
    assert c.tie_word_embeddings == want.tie_word_embeddings
    states = [c.layer_state(i) for i in range(c.num_hidden_layers)]
    assert [s.kind for s in states] == want.layer_types
    for s in states:  # conv layers: their last conv_L_cache - 1 inputs; attention layers: a KV cache
        assert (s.conv is None) == (s.kind != "conv") and (s.kv is None) == (s.kind == "conv")
        assert s.conv is None or (s.conv.channels, s.conv.length) == (want.hidden_size, want.conv_L_cache - 1)
    assert c.rope_parameters["rope_theta"] == want.rope_parameters["rope_theta"]
    with torch.device("meta"):
        assert c.feed_forward_size == Lfm2MLP(want).w1.out_features
