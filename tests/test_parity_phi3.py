"""Phi-3 / 3.5 / 4 (Phi3ForCausalLM) against transformers: fused projections, LongRoPE on both sides
of the pretraining length, partial rotary, tied embeddings."""

import pytest
from conftest import TINY
from fake_quant import assert_quantized_parity
from helpers import GENAI_PROMPT, PROMPT, assert_parity, build, make_checkpoint
from test_genai import assert_same_greedy

LONG_PROMPT = PROMPT + [3, 14, 15, 92, 65, 35, 89, 79, 32, 38]  # 20 tokens

PHI = {**TINY, "eos_token_id": 255, "pad_token_id": 0, "bos_token_id": 1}


def longrope(rotary_half: int):
    # Distinct short and long factors, so using the wrong set shows in the logits.
    return {"rope_type": "longrope", "rope_theta": 10000.0,
            "short_factor": [1.0 + 0.1 * i for i in range(rotary_half)],
            "long_factor": [2.0 + 0.5 * i for i in range(rotary_half)]}


VARIANTS = {
    # Phi-3-mini-4k: plain rope, a sliding window shorter than the prompt.
    "phi3-mini-4k": dict(sliding_window=4),
    # Phi-3-mini-128k / Phi-3.5-mini: LongRoPE past original_max_position_embeddings=16.
    "phi3.5-mini-longrope": dict(max_position_embeddings=64, original_max_position_embeddings=16,
                                 rope_parameters=longrope(8)),
    # Phi-4-mini: LongRoPE, partial rotary 0.75 (48 of 64 dims, as 96 of 128 there), tied
    # embeddings, grouped KV heads.
    "phi4-mini": dict(hidden_size=256, intermediate_size=256, max_position_embeddings=64,
                      original_max_position_embeddings=16, tie_word_embeddings=True,
                      rope_parameters={**longrope(24), "partial_rotary_factor": 0.75}),
    # Phi-4: the same layout without LongRoPE.
    "phi4": dict(rope_parameters={"rope_type": "default", "rope_theta": 250000.0}),
}


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def variant(request, tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp(request.param), "Phi3Config", **{**PHI, **VARIANTS[request.param]})


@pytest.mark.parametrize("ids", [PROMPT, LONG_PROMPT], ids=["10-tokens", "20-tokens"])
def test_fp32_matches_transformers(variant, tmp_path, ids):
    assert_parity(build(variant, tmp_path / "out", "-p", "fp32"), variant, tolerance=1e-4, ids=ids)


def test_fp16_matches_transformers(variant, tmp_path):
    assert_parity(build(variant, tmp_path / "out", "-p", "fp16"), variant, tolerance=1e-2, ids=LONG_PROMPT)


def test_int4_matches_fake_quantized_transformers(variant, tmp_path):
    out = build(variant, tmp_path / "out", "-p", "int4", "--accuracy-level", "0")
    assert_quantized_parity(variant, out, exact=True, ids=LONG_PROMPT)


def test_genai_greedy_matches_transformers(variant, tmp_path):
    # 8 prompt tokens, generation to 30: LongRoPE variants cross from short to long factors mid-way.
    out = build(variant, tmp_path / "out", "-p", "fp32")
    assert_same_greedy(out, variant, GENAI_PROMPT)
