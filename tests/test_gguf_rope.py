"""Rotary scaling that llama.cpp stores as tensors, not metadata: Llama 3.1/3.2's llama3 scaling as
per-frequency factors (rope_freqs.weight: each frequency divided by its factor, as llama.cpp's rope
kernels do) and Phi-3's LongRoPE factors (rope_factors_long/short.weight).

transformers 5.23 reads neither from a GGUF: it builds the plain rotary (its GGUF config has no
scaling, and rope_freqs.weight is skipped), so its logits for such a file are not the model's. The
reference is transformers on the original checkpoint, from which the test writes the GGUF.
"""

import pytest
import torch
import transformers
from conftest import TINY
from gguf_files import VOCAB, write_gguf
from helpers import OnnxDecoder, assert_parity, build, make_checkpoint, model_logits, relative_error

# A pretraining length of 32 puts the 8 frequencies (head_dim 16) in all three bands: kept, ramped, divided.
LLAMA3 = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 32}
LONGROPE = {"rope_type": "longrope", "rope_theta": 10000.0, "long_factor": [1.0, 1.5, 2.0, 3.0, 5.0, 8.0, 13.0, 21.0],
            "short_factor": [1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7]}
BASE = {**TINY, "vocab_size": VOCAB, "eos_token_id": 255}
LONG_PROMPT = [(7 * i + 3) % 250 for i in range(100)]  # far enough for the low frequencies' scaling to show


def test_llama3_rope_freqs_equal_the_original_checkpoint(tmp_path):
    # llama.cpp's converter reads the pretraining length from the config's top level (default 8192).
    source = make_checkpoint(tmp_path / "src", "LlamaConfig", **{**BASE, "head_dim": 16, "rope_parameters": LLAMA3,
                                                                 "original_max_position_embeddings": 32})
    path = write_gguf(source, tmp_path / "llama.gguf", "F32")
    out = build(path, tmp_path / "out", "-p", "fp32")
    assert_parity(out, source, tolerance=1e-4, ids=LONG_PROMPT)
    # transformers on the same GGUF drops the scaling: far from the model (the reason for the reference above).
    theirs = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    want, _, _ = model_logits(transformers.AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32), LONG_PROMPT)
    dropped, _, _ = model_logits(theirs.eval(), LONG_PROMPT)
    got, _ = OnnxDecoder(out).run(LONG_PROMPT, None, len(LONG_PROMPT))
    print(f"relative max error: ours {relative_error(got, want):.2e}, transformers' GGUF loading "
          f"{relative_error(dropped, want):.2e}")
    assert relative_error(dropped, want) > 1e-3  # 6.9e-3: 20 times what the parity above allows


@pytest.mark.parametrize("prompt", [[5, 9, 200, 17], LONG_PROMPT[:40]])  # within, then past the pretraining length
def test_phi3_longrope_factors_equal_the_original_checkpoint(tmp_path, prompt):
    source = make_checkpoint(tmp_path / "src", "Phi3Config", **{**BASE, "pad_token_id": 0, "max_position_embeddings": 64,
                                                                "original_max_position_embeddings": 16,
                                                                "rope_parameters": LONGROPE})
    path = write_gguf(source, tmp_path / "phi3.gguf", "F32")
    out = build(path, tmp_path / "out", "-p", "fp32")
    assert_parity(out, source, tolerance=1e-4, ids=prompt)
