"""The real client: onnxruntime-genai's greedy generation equals transformers' greedy generate."""

import numpy as np
import pytest
import torch
import transformers
from conftest import TINY
from helpers import GENAI_PROMPT, build, make_checkpoint

MAX_LENGTH = 30


def genai_greedy(folder, ids):
    import onnxruntime_genai as og

    model = og.Model(str(folder))
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=MAX_LENGTH)
    generator = og.Generator(model, params)
    generator.append_tokens(np.array([ids], dtype=np.int32))
    while not generator.is_done():
        generator.generate_next_token()
    return [int(t) for t in generator.get_sequence(0)]


NEAR_TIE = 1e-3  # top-2 logit gap below which float32 rounding may pick either token


def transformers_greedy(source, ids):
    """transformers' greedy generate, cut before the first step whose top two logits are within
    NEAR_TIE (there, two correct float32 implementations may differ; seen with a gap of 7e-4)."""
    model = transformers.AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).eval()
    eos = model.config.eos_token_id
    out = model.generate(torch.tensor([ids]), max_length=MAX_LENGTH, do_sample=False, eos_token_id=eos,
                         pad_token_id=eos, output_logits=True, return_dict_in_generate=True)
    tokens = out.sequences[0].tolist()
    for step, logits in enumerate(out.logits):
        top2 = torch.topk(logits[0].float(), 2).values
        if top2[0] - top2[1] < NEAR_TIE:
            return tokens[: len(ids) + step]
    # onnxruntime-genai stops at the end-of-sequence token without returning it.
    if len(tokens) < MAX_LENGTH and tokens[-1] == eos:
        tokens = tokens[:-1]
    return tokens


def assert_same_greedy(folder, source, ids):
    expected = transformers_greedy(source, ids)
    assert len(expected) > len(ids) + 5, "the reference stopped too early to prove anything"
    got = genai_greedy(folder, ids)
    assert got[: len(expected)] == expected


@pytest.mark.parametrize("config_class, overrides", [
    ("LlamaConfig", {}),
    ("MistralConfig", dict(sliding_window=4)),
    ("Qwen2Config", dict(use_sliding_window=True, sliding_window=4, max_window_layers=1)),
    ("Qwen3Config", dict(head_dim=32, tie_word_embeddings=True)),
])
def test_genai_greedy_matches_transformers(tmp_path, config_class, overrides):
    # eos 255: a token these seeded random models do not emit early, so the sequences are long.
    source = make_checkpoint(tmp_path / "src", config_class, **{**TINY, "eos_token_id": 255, **overrides})
    out = build(source, tmp_path / "out", "-p", "fp32")
    assert_same_greedy(out, source, GENAI_PROMPT)
