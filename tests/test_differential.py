"""Differential config checks in CI (tests/differential.py): for every family, configs drawn at
random within what transformers' config classes accept, with the edge values and the hub's
spellings real checkpoints use. Whatever transformers runs to finite logits, builder builds, ONNX
Runtime runs and the fp32 logits match (< 1e-4); whatever transformers refuses, builder refuses in
one line. scripts/differential_configs.py draws thousands of them."""

import pytest
from differential import bases, cases, run_case

PER_FAMILY = 2  # cases per base here: about 120 in all, under a second each
SEED = 0

# Drift found and not yet closed, each named by the case that shows it (strict: a fix makes the
# case pass and must remove its line here).
KNOWN: dict[str, str] = {}

CASES = cases(bases(), PER_FAMILY, SEED)


@pytest.mark.parametrize("case", [pytest.param(c, id=c.label[:120], marks=[pytest.mark.xfail(
    strict=True, reason=KNOWN[c.label])] if c.label in KNOWN else []) for c in CASES])
def test_builder_agrees_with_transformers(case, tmp_path):
    outcome = run_case(case, tmp_path)
    assert outcome.problem is None, f"{outcome.problem}: {outcome.detail}"


def test_the_sample_covers_every_kind_of_variation():
    # A generator that stopped drawing a kind of change would leave the check blind to it.
    drawn = " ".join(c.label for c in CASES)
    for marker in ("head_dim=", "num_attention_heads=", "partial_rotary_factor=", "rope_type': 'llama3'",
                   "'yarn'", "tie_word_embeddings=", "sliding_window=", "vocab_size=", "hub_type", "hub_rope_type",
                   "null_optional", "infinite_limit"):
        assert marker in drawn, marker


@pytest.mark.parametrize("config_class, overrides", [
    ("LlamaConfig", dict(head_dim=20, hidden_size=60, num_attention_heads=3, num_key_value_heads=1)),
    ("Qwen3Config", dict(head_dim=12, num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)),
    ("Gemma3TextConfig", dict(head_dim=20, sliding_window=4, layer_types=["sliding_attention", "full_attention"])),
])
def test_heads_padded_to_a_multiple_of_8_generate_as_transformers(config_class, overrides, tmp_path):
    # GroupQueryAttention refuses heads that are not a multiple of 8 at the first run: they are
    # padded with zeros (the KV cache holds the padded heads, genai_config.json says so), and
    # onnxruntime-genai's greedy tokens equal transformers'.
    import json

    from conftest import TINY
    from helpers import GENAI_PROMPT, build, make_checkpoint
    from test_genai import assert_same_greedy

    source = make_checkpoint(tmp_path / "src", config_class, **{**TINY, "eos_token_id": 255, **overrides})
    out = build(source, tmp_path / "out", "-p", "fp32")
    decoder = json.loads((out / "genai_config.json").read_text())["model"]["decoder"]
    assert decoder["head_size"] == -(-overrides["head_dim"] // 8) * 8
    assert_same_greedy(out, source, GENAI_PROMPT)
