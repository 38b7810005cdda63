"""Cohere, Cohere 2, GLM and GLM-4-0414 against transformers: the shared family proofs per
architecture (tests/family_runner.py: fp32 and int4 steps, genai's greedy generation), config
parsing, the rotary layout; the per-head q/k LayerNorm block against numpy."""

import dataclasses

import numpy as np
import onnx_ir as ir
import onnxruntime as ort
import pytest
import transformers
from conftest import TINY
from family_runner import families_tests
from helpers import (
    PROMPT,
    OnnxDecoder,
    build,
    make_checkpoint,
    reference,
    relative_error,
)

import architectures.cohere
import architectures.glm
from builder.blocks import AttentionSpec
from builder.blocks.attention import _head_norm
from builder.graph import Graph
from builder.lazy import Weight
from builder.target import Target

BASE = {**TINY, "eos_token_id": 255}
# Features on: logit_scale ≠ 1, q/k/v/o biases, per-head q/k LayerNorm, tied and untied, windows
# shorter than the 10-token prompt, global layers without rotary, partial interleaved rotary
# (16 of 32 and 16 of 64 dims), sandwich norms.
VARIANTS = {
    "cohere-bias": ("CohereConfig", dict(logit_scale=0.3, attention_bias=True)),
    "cohere-qk-norm-untied": ("CohereConfig", dict(use_qk_norm=True, tie_word_embeddings=False, logit_scale=2.0)),
    "cohere2": ("Cohere2Config", dict(num_hidden_layers=4, sliding_window=4, logit_scale=0.5)),
    "cohere2-bias-layer-types": ("Cohere2Config", dict(
        sliding_window=3, attention_bias=True, tie_word_embeddings=False, logit_scale=1.5,
        layer_types=["full_attention", "sliding_attention"])),
    "glm": ("GlmConfig", dict(head_dim=32, pad_token_id=0)),
    "glm4": ("Glm4Config", dict(head_dim=64, partial_rotary_factor=0.25, pad_token_id=0, tie_word_embeddings=True)),
}


# The shared proofs (tests/family_runner.py) per architecture, over its variants; the config
# proofs are test_matches_transformers_config's below.
globals().update(families_tests(VARIANTS, {
    "CohereConfig": dict(architecture="CohereForCausalLM", genai_type="llama"),
    "Cohere2Config": dict(architecture="Cohere2ForCausalLM", genai_type="llama"),
    "GlmConfig": dict(architecture="GlmForCausalLM", genai_type="chatglm"),
    "Glm4Config": dict(architecture="Glm4ForCausalLM", genai_type="chatglm"),
}, base=BASE, config_raws=()))


@pytest.mark.parametrize("name", ["glm4", "cohere-bias"])
def test_rotary_layout_is_what_parity_checks(name, tmp_path, monkeypatch):
    # The parity above proves the interleaved pairs (and, for GLM, which dims rotate): the same
    # build with rotate_half's layout instead misses transformers by far more than 1e-4.
    module = architectures.glm if name.startswith("glm") else architectures.cohere
    real = module.self_attention
    monkeypatch.setattr(module, "self_attention", lambda g, x, past, lengths, rotary, w, spec, target: real(
        g, x, past, lengths, rotary, w, dataclasses.replace(spec, rotary_interleaved=False), target))
    config_class, overrides = VARIANTS[name]
    source = make_checkpoint(tmp_path / "src", config_class, **{**BASE, **overrides})
    ref_prefill, _, next_id = reference(source, PROMPT)
    prefill, _ = OnnxDecoder(build(source, tmp_path / "out", "-p", "fp32")).prefill_and_step(PROMPT, next_id)
    assert relative_error(prefill, ref_prefill) > 1e-3


@pytest.mark.parametrize("per_head", [True, False], ids=["weight-per-head", "shared-weight"])
def test_head_layer_norm_matches_numpy(per_head):
    heads, D, eps = 3, 16, 1e-5
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 5, heads * D)).astype(np.float32)
    w = rng.standard_normal((heads, D) if per_head else (D,)).astype(np.float32)
    g = Graph()
    inp = ir.Value(name="x", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape(x.shape))
    spec = AttentionSpec(heads, heads, D, norm_eps=eps, qk_layer_norm=True)
    out = _head_norm(g, inp, Weight.constant(w), heads, spec, Target(io_dtype=np.dtype(np.float32)))
    out.name = "out"
    proto = ir.serde.serialize_model(g.model([inp], [out]))
    got = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    h = x.reshape(2, 5, heads, D)
    h = (h - h.mean(-1, keepdims=True)) / np.sqrt(h.var(-1, keepdims=True) + eps) * w
    np.testing.assert_allclose(got, h.reshape(x.shape), rtol=1e-5, atol=1e-5)


CONFIG_CASES = {
    "cohere-minimal": ("CohereForCausalLM", {}),
    "cohere-command-r-plus": ("CohereForCausalLM", dict(use_qk_norm=True, rope_theta=75e6, num_key_value_heads=8,
                                                        logit_scale=0.833, max_position_embeddings=131072)),
    "cohere-old-rope": ("CohereForCausalLM", dict(rope_scaling=dict(type="linear", factor=2.0), head_dim=96)),
    "cohere-partial-ignored": ("CohereForCausalLM", dict(partial_rotary_factor=0.5)),
    "cohere2-minimal": ("Cohere2ForCausalLM", {}),
    "cohere2-r7b": ("Cohere2ForCausalLM", dict(sliding_window_pattern=4, rope_theta=50000.0, logit_scale=0.25,
                                               num_hidden_layers=32, num_key_value_heads=8)),
    "cohere2-layer-types": ("Cohere2ForCausalLM", dict(num_hidden_layers=3, sliding_window=512,
                                                       layer_types=["sliding_attention", "full_attention",
                                                                    "sliding_attention"])),
    "cohere2-rope-parameters": ("Cohere2ForCausalLM", dict(rope_parameters=dict(rope_type="default", rope_theta=5e4))),
    "glm-minimal": ("GlmForCausalLM", {}),
    "glm-9b-chat-hf": ("GlmForCausalLM", dict(partial_rotary_factor=0.5, rope_theta=10000.0, eos_token_id=[1, 2],
                                              max_position_embeddings=131072, rms_norm_eps=1.5625e-07)),
    "glm-rope-parameters": ("GlmForCausalLM", dict(rope_parameters=dict(rope_type="default", rope_theta=3.0))),
    "glm4-minimal": ("Glm4ForCausalLM", {}),
    "glm4-old-rope": ("Glm4ForCausalLM", dict(rope_scaling=dict(type="linear", factor=4.0), partial_rotary_factor=0.75,
                                              attention_bias=False, head_dim=96)),
}
CONFIG_CLASSES = {"CohereForCausalLM": transformers.CohereConfig, "Cohere2ForCausalLM": transformers.Cohere2Config,
                  "GlmForCausalLM": transformers.GlmConfig, "Glm4ForCausalLM": transformers.Glm4Config}
FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
          "num_key_value_heads", "hidden_act", "max_position_embeddings", "tie_word_embeddings", "bos_token_id",
          "eos_token_id", "pad_token_id", "attention_bias", "logit_scale", "layer_norm_eps", "rms_norm_eps",
          "use_qk_norm", "sliding_window", "layer_types")


@pytest.mark.parametrize("case", sorted(CONFIG_CASES))
def test_matches_transformers_config(case):
    arch, raw = CONFIG_CASES[case]
    module = architectures.load(arch)
    ours = module.parse_config(dict(raw, architectures=[arch]), arch)
    theirs = CONFIG_CLASSES[arch](**raw)
    for name in FIELDS:
        if hasattr(theirs, name) and hasattr(ours, name) and not (arch == "CohereForCausalLM" and name == "layer_types"):
            assert getattr(ours, name) == getattr(theirs, name), name
    # Attention's head_dim: getattr(config, "head_dim", None) or hidden // heads, in every modeling file.
    assert ours.head_dim == (getattr(theirs, "head_dim", None) or theirs.hidden_size // theirs.num_attention_heads)
    expected = {k: v for k, v in theirs.rope_parameters.items() if k != "type"}
    if arch == "CohereForCausalLM" and expected["rope_type"] == "default":
        expected.pop("partial_rotary_factor", None)  # compute_default_rope_parameters ignores it
    assert {k: v for k, v in ours.rope_parameters.items() if k != "type"} == expected
