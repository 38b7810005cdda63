"""Arcee (a family added as one file, architectures/arcee.py) against transformers: fp32 prefill
and decode, int4 against fake quantization, onnxruntime-genai's greedy tokens, config parsing."""

import json

import pytest
import transformers
from conftest import TINY
from fake_quant import assert_quantized_parity
from helpers import GENAI_PROMPT, assert_parity, build, make_checkpoint
from test_genai import assert_same_greedy

import architectures

# YaRN with a pretraining length shorter than the 10-token prompt, so the scaled frequencies matter.
YARN = dict(rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=4, beta_fast=32.0,
            beta_slow=1.0)
VARIANTS = {
    "yarn-biases": dict(rope_parameters=YARN, attention_bias=True, mlp_bias=True, head_dim=32),
    "tied": dict(tie_word_embeddings=True, bos_token_id=1, eos_token_id=2),
}


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def arcee(request, tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp(request.param), "ArceeConfig", **{**TINY, **VARIANTS[request.param]})


def test_fp32_matches_transformers(arcee, tmp_path):
    assert_parity(build(arcee, tmp_path / "out", "-p", "fp32"), arcee, tolerance=1e-4)


def test_int4_matches_fake_quantized_transformers(arcee, tmp_path):
    out = build(arcee, tmp_path / "out", "-p", "int4", "--accuracy-level", "0")
    assert_quantized_parity(arcee, out, exact=True)


def test_genai_greedy_matches_transformers(tmp_path):
    source = make_checkpoint(tmp_path / "src", "ArceeConfig", **{**TINY, **VARIANTS["yarn-biases"]}, eos_token_id=255)
    out = build(source, tmp_path / "out", "-p", "fp32")
    assert json.loads((out / "genai_config.json").read_text())["model"]["type"] == "llama"
    assert_same_greedy(out, source, GENAI_PROMPT)


@pytest.mark.parametrize("raw", [{}, dict(rope_scaling=dict(type="yarn", factor=20.0, original_max_position_embeddings=4096),
                                        num_key_value_heads=4, num_attention_heads=20, head_dim=128)])
def test_config_matches_transformers(raw):
    ours = architectures.load("ArceeForCausalLM").parse_config(dict(raw, architectures=["ArceeForCausalLM"]),
                                                               "ArceeForCausalLM")
    theirs = transformers.ArceeConfig(**raw)
    for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "head_dim", "hidden_act", "max_position_embeddings", "rms_norm_eps",
                 "tie_word_embeddings", "bos_token_id", "eos_token_id", "pad_token_id", "attention_bias", "mlp_bias"):
        assert getattr(ours, name) == getattr(theirs, name), name
    strip = lambda d: {k: v for k, v in d.items() if k != "type"}  # noqa: E731
    assert strip(ours.rope_parameters) == strip(theirs.rope_parameters)
