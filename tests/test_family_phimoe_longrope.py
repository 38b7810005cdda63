"""Phi-3.5-MoE with LongRoPE switched on, as the hub's model has it (original_max_position_embeddings
4096 of 131072, distinct short and long factors, short_mscale = long_mscale ≠ 1), shrunk: 16 of 64
positions, so a 10-token prompt stays on the short factors and a 20-token one crosses to the long.

Past original_max_position_embeddings the build uses the long factors for every position, as
Phi-3's LongRoPE does (transformers' Phi3RotaryEmbedding) and as Phi-3.5-MoE's own modeling code
and onnxruntime-genai's builder do. transformers 5.23's PhimoeRotaryEmbedding.forward calls the
longrope init without the sequence length, so it always takes the short factors (only its mscale
switches, and the two are equal): the long-prompt reference is therefore transformers with the
long factors put in the short factors' place, and a test pins transformers' behaviour so that a fix
there shows."""

import json

import pytest
from helpers import PROMPT, assert_parity, build, reference
from test_family_moe2 import make

LONG_PROMPT = PROMPT + [3, 14, 15, 92, 65, 35, 89, 79, 32, 38]  # 20 tokens, past 16
HALF = 8  # rotated pairs of the 16-wide heads
LONGROPE = {"rope_type": "longrope", "rope_theta": 10000.0, "original_max_position_embeddings": 16,
            "short_factor": [1.0 + 0.1 * i for i in range(HALF)], "long_factor": [2.0 + 0.5 * i for i in range(HALF)],
            "short_mscale": 1.2, "long_mscale": 1.2}


@pytest.fixture(scope="module")
def longrope(tmp_path_factory):
    """The phimoe test checkpoint (sparsemixer, biases, window 4) with LongRoPE."""
    folder = make(tmp_path_factory.mktemp("phimoe-longrope"), "phimoe")
    config = json.loads((folder / "config.json").read_text())
    config.update(max_position_embeddings=64, original_max_position_embeddings=16, rope_parameters=LONGROPE)
    config.pop("rope_scaling", None)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def with_rope(folder, out, **changes):
    """A copy of the checkpoint (weights linked) whose rope parameters have `changes`."""
    out.mkdir()
    config = json.loads((folder / "config.json").read_text())
    config["rope_parameters"] = {**config["rope_parameters"], **changes}
    (out / "config.json").write_text(json.dumps(config))
    (out / "model.safetensors").symlink_to(folder / "model.safetensors")
    return out


def test_short_prompt_matches_transformers(longrope, tmp_path):
    out = build(longrope, tmp_path / "out", "-p", "fp32")
    assert_parity(out, longrope, tolerance=1e-4, ids=PROMPT)
    # The short factors and the mscale are both in play: other factors give other logits.
    other = with_rope(longrope, tmp_path / "other", short_factor=LONGROPE["long_factor"])
    assert abs(reference(other, PROMPT)[0] - reference(longrope, PROMPT)[0]).max() > 1e-3


def test_long_prompt_matches_transformers_on_the_long_factors(longrope, tmp_path):
    out = build(longrope, tmp_path / "out", "-p", "fp32")
    assert_parity(out, with_rope(longrope, tmp_path / "long", short_factor=LONGROPE["long_factor"]), tolerance=1e-4,
                  ids=LONG_PROMPT)


def test_transformers_phimoe_never_takes_the_long_factors(longrope, tmp_path):
    # Why the long-prompt reference swaps the factors: transformers 5.23 gives the same logits past
    # original_max_position_embeddings whatever the long factors are.
    other = with_rope(longrope, tmp_path / "other", long_factor=[9.0] * HALF)
    assert (reference(other, LONG_PROMPT)[0] == reference(longrope, LONG_PROMPT)[0]).all(), \
        "transformers' Phimoe now switches to the long factors: compare the long prompt with it directly"
