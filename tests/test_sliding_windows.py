"""Sliding-window layers in the real client, at the settings people use: onnxruntime-genai's greedy
generation equals transformers' for max_length below, at and above the window, for a prompt longer
than the window, and for a right-padded batch of prompts of different lengths (each row against
transformers on that prompt alone), for the families with windows in FAMILIES (dense ones with
their own window logic, and Mixtral for the mixtures of experts), built with the defaults."""

import json
import sys
from pathlib import Path

import pytest
import torch
import transformers
from conftest import TINY
from helpers import build, make_checkpoint
from test_genai import NEAR_TIE

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
from genai_batch import genai_generate  # noqa: E402  (re-exported: the family tests import it from here)

WINDOW = 16
# Prompts whose greedy continuations, with these seeded random tiny models, run long before any
# near-tie or end-of-sequence token (chosen by a search over random prompts).
PROMPT = [7, 3, 11, 19, 23, 29, 31, 37]  # 8 tokens
LONG_PROMPT = [197, 88, 156, 132, 218, 68, 97, 89, 90, 32, 77, 63, 225, 244, 157, 202, 247, 186, 230, 128,
               37, 151, 144, 200]  # 24 tokens, past the window
RAGGED = [PROMPT, [37, 148, 219, 208, 198], [229, 243, 192, 134, 210, 36, 135, 202, 146, 55, 112]]  # 8, 5, 11
EOS = 255

FAMILIES = {
    "mistral": ("MistralConfig", dict(sliding_window=WINDOW)),
    "qwen2": ("Qwen2Config", dict(use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1)),
    "gemma2": ("Gemma2Config", dict(head_dim=16, sliding_window=WINDOW, query_pre_attn_scalar=24)),
    "gemma3": ("Gemma3TextConfig", dict(head_dim=16, num_hidden_layers=3, sliding_window=WINDOW,
                                        sliding_window_pattern=2, query_pre_attn_scalar=24)),
    "phi3": ("Phi3Config", dict(sliding_window=WINDOW, pad_token_id=0, bos_token_id=1)),
    "ministral": ("MinistralConfig", dict(head_dim=16, sliding_window=WINDOW,
                                          layer_types=["sliding_attention", "full_attention"]), 1),
    "starcoder2": ("Starcoder2Config", dict(sliding_window=WINDOW)),
    "cohere2": ("Cohere2Config", dict(sliding_window=WINDOW, layer_types=["sliding_attention", "full_attention"])),
    "olmo3": ("Olmo3Config", dict(sliding_window=WINDOW, layer_types=["sliding_attention", "full_attention"]), 1),
    "exaone4": ("Exaone4Config", dict(sliding_window=WINDOW, sliding_window_pattern=2,
                                      layer_types=["sliding_attention", "full_attention"]), 2),
    "mixtral": ("MixtralConfig", dict(sliding_window=WINDOW, num_local_experts=4, num_experts_per_tok=2)),
}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request, tmp_path_factory):
    """(checkpoint, default build, transformers model) for one family with a 16-token window."""
    config_class, overrides, *seed = FAMILIES[request.param]  # a seed where the default one near-ties early
    root = tmp_path_factory.mktemp(request.param)
    source = make_checkpoint(root / "src", config_class, seed=seed[0] if seed else 0,
                             **{**TINY, "eos_token_id": EOS, **overrides})
    out = build(source, root / "out", "-p", "fp32")
    decoder = json.loads((out / "genai_config.json").read_text())["model"]["decoder"]
    assert "sliding_window" not in decoder  # the default: full-length caches, any max_length
    model = transformers.AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).eval()
    return source, out, model


def continuation(model, ids: list[int], new_tokens: int) -> list[int]:
    """transformers' greedy continuation of `ids`, up to `new_tokens` tokens or the end-of-sequence
    token, cut before the first step whose top two logits are within NEAR_TIE."""
    out = model.generate(torch.tensor([ids]), max_new_tokens=new_tokens, do_sample=False, eos_token_id=EOS,
                         pad_token_id=EOS, output_logits=True, return_dict_in_generate=True)
    tokens = out.sequences[0, len(ids):].tolist()
    for step, logits in enumerate(out.logits):
        top2 = torch.topk(logits[0].float(), 2).values
        if top2[0] - top2[1] < NEAR_TIE:
            return tokens[:step]
    return tokens


def assert_rows_match(model, prompts, generated, new_tokens):
    for ids, got in zip(prompts, generated):
        expected = continuation(model, ids, new_tokens)
        assert len(expected) >= min(4, new_tokens), "the reference stopped too early to prove anything"
        assert got[: len(expected)] == expected, f"prompt of {len(ids)} tokens"


@pytest.mark.parametrize("max_length", [12, WINDOW, 40], ids=["below-window", "at-window", "past-window"])
def test_generation_at_any_max_length(family, max_length):
    _, out, model = family
    generated = genai_generate(out, [PROMPT], max_length)
    assert_rows_match(model, [PROMPT], generated, max_length - len(PROMPT))


def test_prompt_longer_than_the_window(family):
    _, out, model = family
    generated = genai_generate(out, [LONG_PROMPT], 40)
    assert_rows_match(model, [LONG_PROMPT], generated, 40 - len(LONG_PROMPT))


def test_right_padded_batch_of_different_lengths(family):
    # 11 + 29 = 40 positions: every row's generation crosses the window.
    _, out, model = family
    generated = genai_generate(out, RAGGED, 40)
    assert_rows_match(model, RAGGED, generated, 40 - max(map(len, RAGGED)))


def test_windowed_cache_refuses_a_max_length_below_the_window(tmp_path):
    from builder.cli import main

    config_class, overrides = FAMILIES["mistral"]
    source = make_checkpoint(tmp_path / "src", config_class, **{**TINY, **overrides})
    (tmp_path / "b.yaml").write_text(f"model: {source}\nsearch: {{max_length: 12}}\nwindowed_kv_cache: true\n")
    assert main(["--config", str(tmp_path / "b.yaml"), "-o", str(tmp_path / "out"), "-q"]) == 2
    assert not (tmp_path / "out").exists()
    # The same build without the ring buffer is fine.
    assert main(["-m", str(source), "-o", str(tmp_path / "full"), "-q", "-p", "fp32"]) == 0
