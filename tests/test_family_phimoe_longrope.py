"""Phi-3.5-MoE with LongRoPE switched on, as the hub's model has it (original_max_position_embeddings
4096 of 131072, distinct short and long factors, short_mscale = long_mscale ≠ 1), shrunk: 16 of 64
positions, so a 10-token prompt stays on the short factors and a 20-token one crosses to the long.

Past original_max_position_embeddings the build uses the long factors for every position, as
Phi-3's LongRoPE does (transformers' Phi3RotaryEmbedding) and as Phi-3.5-MoE's own modeling code
and onnxruntime-genai's builder do. transformers 5.23's PhimoeRotaryEmbedding.forward calls the
longrope init without the sequence length, so it always takes the short factors (only its mscale
switches, and the two are equal): the long-prompt reference is therefore transformers with the
long factors put in the short factors' place, and a test pins transformers' behaviour so that a fix
there shows.

With short_mscale != long_mscale (1.1 and 1.3) transformers scales cos and sin by long_mscale once
max(position_ids) + 1 passes original_max_position_embeddings, else by short_mscale: the same switch
as the tables', so the build folds each mscale into its own tables. A 16-token prompt crosses only
at its decode step (17 > 16); there the checkpoint has equal short and long factors, so that
transformers 5.23's short-factors-only forward is still the exact reference."""

import json
import shutil

import pytest
from helpers import PROMPT, assert_parity, build, reference, relative_error
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
    """A copy of the checkpoint whose rope parameters have `changes` (the weights copied, not
    linked: a build reads nothing outside the model folder)."""
    out.mkdir()
    config = json.loads((folder / "config.json").read_text())
    config["rope_parameters"] = {**config["rope_parameters"], **changes}
    (out / "config.json").write_text(json.dumps(config))
    shutil.copyfile(folder / "model.safetensors", out / "model.safetensors")
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


MSCALES = dict(short_mscale=1.1, long_mscale=1.3)
EDGE_PROMPT = LONG_PROMPT[:16]  # the prefill on the short side, its decode step (17 tokens) on the long


@pytest.fixture(scope="module")
def mscales(longrope, tmp_path_factory):
    """The LongRoPE checkpoint with short_mscale 1.1 and long_mscale 1.3."""
    return with_rope(longrope, tmp_path_factory.mktemp("mscales") / "ckpt", **MSCALES)


@pytest.fixture(scope="module")
def mscales_build(mscales, tmp_path_factory):
    return build(mscales, tmp_path_factory.mktemp("mscales-build") / "out", "-p", "fp32")


def test_distinct_mscales_short_prompt_matches_transformers(mscales, mscales_build):
    assert_parity(mscales_build, mscales, tolerance=1e-4, ids=PROMPT)


def test_distinct_mscales_long_prompt_matches_transformers(mscales, mscales_build, tmp_path):
    reference_folder = with_rope(mscales, tmp_path / "long", short_factor=LONGROPE["long_factor"])
    assert_parity(mscales_build, reference_folder, tolerance=1e-4, ids=LONG_PROMPT)
    # long_mscale is in play past original_max_position_embeddings: short_mscale there gives other logits.
    short_only = with_rope(reference_folder, tmp_path / "short-only", long_mscale=MSCALES["short_mscale"])
    assert abs(reference(short_only, LONG_PROMPT)[0] - reference(reference_folder, LONG_PROMPT)[0]).max() > 1e-3


def test_distinct_mscales_switch_at_the_decode_step_that_crosses(mscales, tmp_path):
    same_factors = with_rope(mscales, tmp_path / "ckpt", short_factor=LONGROPE["long_factor"])
    out = build(same_factors, tmp_path / "out", "-p", "fp32")
    assert_parity(out, same_factors, tolerance=1e-4, ids=EDGE_PROMPT)
    # Only the decode step crosses: short_mscale everywhere leaves the prefill as it is and moves the
    # step's logits past the parity tolerance (by about 5e-4 relative), which the build would fail.
    want = reference(same_factors, EDGE_PROMPT)
    short_only = reference(with_rope(same_factors, tmp_path / "short-only", long_mscale=MSCALES["short_mscale"]),
                           EDGE_PROMPT)
    assert (short_only[0] == want[0]).all()
    assert relative_error(short_only[1], want[1]) > 1e-4


def test_longrope_without_mscales_is_refused(longrope, tmp_path, capsys):
    # transformers' PhimoeConfig refuses it (TypeError): there is no model to match.
    from builder.cli import main

    folder = with_rope(longrope, tmp_path / "ckpt")
    config = json.loads((folder / "config.json").read_text())
    del config["rope_parameters"]["short_mscale"], config["rope_parameters"]["long_mscale"]
    (folder / "config.json").write_text(json.dumps(config))
    assert main(["-m", str(folder), "-o", str(tmp_path / "out"), "-q", "-p", "fp32"]) == 2
    assert capsys.readouterr().err == ("error: Phi-MoE's LongRoPE needs a number for rope_parameters' short_mscale, "
                                       "not None\n")
