"""GGUF input for Gemma 2, Gemma 3 and Phi-3: tiny GGUF files written as llama.cpp's converter
writes them (tests/gguf_files.py: Gemma's norms stored as 1 + weight, sandwich-norm names, Phi-3's
fused attn_qkv / ffn_up), built with the CLI and compared with transformers.

transformers' GGUF loader leaves some keys the file states at its config defaults (UNREAD): the
soft-caps, Gemma 3's rotary scaling, Phi-3's window and partial rotary, and query_pre_attn_scalar
(the file has none; llama.cpp scales by head_dim, see builder.inputs.gguf.names.Family.layers_27b). The
reference is transformers loading the same file with those keys given as the source states them,
and, for F32 files, transformers on the float source checkpoint itself.
"""

import dataclasses

import pytest
import torch
import transformers
from conftest import TINY
from gguf_files import VOCAB, dequantized_checkpoint, write_gguf
from helpers import (
    GENAI_PROMPT,
    OnnxDecoder,
    PROMPT,
    assert_parity,
    build,
    make_checkpoint,
    model_logits,
    relative_error,
)
from test_genai import MAX_LENGTH, genai_greedy

from architectures import load
from builder.inputs.gguf.checkpoint import GGUFCheckpoint

BASE = {**TINY, "vocab_size": VOCAB, "eos_token_id": 255, "pad_token_id": 0}
GEMMA3_ROPE = {"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
               "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}
# Windows shorter than the 10-token prompt; global and local layers (Gemma 3: every 6th is global).
FAMILIES = {
    "gemma2": ("Gemma2Config", dict(head_dim=16, query_pre_attn_scalar=16, sliding_window=4,
                                    attn_logit_softcapping=5.0, final_logit_softcapping=3.0)),
    "gemma3": ("Gemma3TextConfig", dict(head_dim=16, query_pre_attn_scalar=16, num_hidden_layers=6, sliding_window=4,
                                        final_logit_softcapping=3.0, rope_parameters=GEMMA3_ROPE)),
    "phi3": ("Phi3Config", dict(sliding_window=4, partial_rotary_factor=0.5)),
}
UNREAD = {
    "gemma2": ("query_pre_attn_scalar", "attn_logit_softcapping", "final_logit_softcapping"),
    "gemma3": ("query_pre_attn_scalar", "final_logit_softcapping", "rope_parameters"),
    "phi3": ("sliding_window", "rope_parameters"),
}


def make_gguf(tmp_path, family, types):
    config_class, overrides = FAMILIES[family]
    source = make_checkpoint(tmp_path / "src", config_class, **{**BASE, **overrides})
    return source, write_gguf(source, tmp_path / f"{family}.gguf", types)


def transformers_gguf(path, family):
    """transformers on the GGUF file (its dequantized weights), given the keys its loader leaves out."""
    config = transformers.AutoConfig.from_pretrained(path.parent / "src")
    unread = {k: getattr(config, k) for k in UNREAD[family]}
    unread["pad_token_id"] = 0  # the file has none; Phi3Config's default 32000 is past this vocabulary
    return transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32,
                                                             **unread).eval()


def assert_same_logits(model, out, tolerance=1e-4):
    ref_prefill, ref_step, next_id = model_logits(model, PROMPT)
    got_prefill, got_step = OnnxDecoder(out).prefill_and_step(PROMPT, next_id)
    errors = []
    for name, got, want in (("prefill", got_prefill, ref_prefill),
                            ("decode", got_step, ref_step)):
        errors.append(relative_error(got, want))
        assert errors[-1] < tolerance, f"{name}: relative max error {errors[-1]:.2e}"
        assert (got.argmax(-1) == want.argmax(-1)).all(), name
    print(f"relative max error prefill {errors[0]:.2e} decode {errors[1]:.2e}")


@pytest.mark.parametrize("family", FAMILIES)
def test_fp32_from_f32_gguf_equals_the_source(tmp_path, family):
    source, path = make_gguf(tmp_path, family, "F32")
    out = build(path, tmp_path / "out", "-p", "fp32")
    assert_parity(out, source, tolerance=1e-4)  # transformers on the float checkpoint, no overrides
    assert_same_logits(transformers_gguf(path, family), out)


@pytest.mark.parametrize("family, types, precision", [
    ("gemma2", "F16", "fp32"), ("gemma3", "F16", "fp32"), ("phi3", "F16", "fp32"),
    ("gemma2", {"*": "Q4_0"}, "int4"), ("gemma3", {"*.attn_v.*": "Q8_0", "*": "Q4_0"}, "int4"),
    ("phi3", {"*": "Q4_0"}, "int4"), ("phi3", {"*": "Q8_0"}, "int4"), ("gemma2", {"*": "Q8_0"}, "fp32"),
])
def test_build_equals_transformers_on_the_file(tmp_path, family, types, precision):
    _, path = make_gguf(tmp_path, family, types)
    level = ("--accuracy-level", "0") if precision.startswith("int") else ()
    out = build(path, tmp_path / "out", "-p", precision, *level)
    assert_same_logits(transformers_gguf(path, family), out)


def test_genai_greedy_gemma3_q4_0(tmp_path):
    _, path = make_gguf(tmp_path, "gemma3", {"*": "Q4_0"})
    out = build(path, tmp_path / "out", "-p", "int4", "--accuracy-level", "0")
    model = transformers_gguf(path, "gemma3")
    expected = model.generate(torch.tensor([GENAI_PROMPT]), max_length=MAX_LENGTH, do_sample=False, eos_token_id=255,
                              pad_token_id=255)[0].tolist()
    got = genai_greedy(out, GENAI_PROMPT)
    assert len(expected) > len(GENAI_PROMPT) + 5
    assert got[: len(expected)] == expected[: len(got)] and len(got) >= len(GENAI_PROMPT) + 5
    print(f"genai greedy: {len(got) - len(GENAI_PROMPT)} new tokens equal")


@pytest.mark.parametrize("family", FAMILIES)
def test_metadata_config_equals_the_source_config(tmp_path, family):
    """The config the metadata implies parses to the source's own config; transformers' GGUF config
    differs from ours only in UNREAD."""
    source, path = make_gguf(tmp_path, family, "F32")
    raw, _, _ = GGUFCheckpoint.open_file(path)
    module = load(raw["architectures"][0])
    source_raw = transformers.AutoConfig.from_pretrained(source).to_dict()
    ours, want = (dataclasses.asdict(module.parse_config(r, raw["architectures"][0])) for r in (raw, source_raw))
    for token in ("bos_token_id", "eos_token_id", "pad_token_id"):  # the file's come from its vocabulary
        ours.pop(token), want.pop(token)
    assert ours.pop("rms_norm_eps") == pytest.approx(want.pop("rms_norm_eps"), rel=1e-7)  # stored as float32
    assert ours == want
    theirs = transformers.AutoConfig.from_pretrained(path.parent, gguf_file=path.name).to_dict()
    mine = transformers.AutoConfig.for_model(**raw).to_dict()
    differ = {k for k in mine if k in theirs and mine[k] != theirs[k]} - {"architectures", "_name_or_path",
                                                                         "transformers_version", "dtype"}
    assert differ <= set(UNREAD[family]) | {"pad_token_id", "bos_token_id"}, differ


def test_row_slice_keeps_the_stored_blocks(tmp_path):
    """Phi-3's gate and up are row slices of ffn_up: each keeps its Q8_0 blocks (written as stored),
    and they hold the same values as the slice of the float weight."""
    import contextlib

    import numpy as np

    from builder.quantize import QuantizedMatrix, dequantize

    _, path = make_gguf(tmp_path, "phi3", {"*": "Q8_0"})
    _, ckpt, _ = GGUFCheckpoint.open_file(path)
    whole = ckpt.weight("model.layers.0.mlp.gate_up_proj.weight")
    up = whole.slice(0, TINY["intermediate_size"], 2 * TINY["intermediate_size"])
    assert up.blocks is not None and up.blocks.bits == 8
    with contextlib.ExitStack() as stack:
        data, scales, *_ = up.blocks.compute(stack)
        values = dequantize(QuantizedMatrix(data, scales, None), TINY["hidden_size"], 8)
        np.testing.assert_array_equal(values, whole.numpy()[TINY["intermediate_size"]:])


def test_gemma3_without_a_window_is_all_global():
    """llama.cpp's converter writes no sliding_window for a Gemma 3 whose layers are all global;
    the layers then stay global (not Gemma3TextConfig's default 4096 window every 5 of 6)."""
    from builder.inputs.gguf.metadata import config

    metadata = {f"gemma3.{k}": v for k, v in dict(block_count=6, embedding_length=64, feed_forward_length=128,
                                                   context_length=128, **{"attention.head_count": 4,
                                                   "attention.layer_norm_rms_epsilon": 1e-6,
                                                   "attention.key_length": 16, "rope.freq_base": 1e6}).items()}
    raw = config({**metadata, "tokenizer.ggml.tokens": ["a"] * VOCAB}, "gemma3", {"token_embd.weight"})
    c = load("Gemma3ForCausalLM").parse_config(raw, "Gemma3ForCausalLM")
    assert [c.window(i) for i in range(6)] == [None] * 6 and c.query_pre_attn_scalar == 16


# Gemma 1: transformers 5.23 reads no "gemma" GGUF, so the reference is transformers on the file's
# own values (tests/gguf_files.py: dequantized_checkpoint), which for F32 is the source itself.
@pytest.mark.parametrize("types, precision", [
    ("F32", "fp32"), ({"*": "Q8_0"}, "fp32"), ({"*": "Q4_0"}, "int4"), ({"*.attn_v.*": "Q8_0", "*": "Q4_0"}, "int4"),
])
def test_gemma1_equals_transformers_on_the_file_values(tmp_path, types, precision):
    source = make_checkpoint(tmp_path / "src", "GemmaConfig", **{**BASE, "head_dim": 16})
    path = write_gguf(source, tmp_path / "gemma.gguf", types)
    reference = dequantized_checkpoint(path, source, tmp_path / "ref")
    level = ("--accuracy-level", "0") if precision.startswith("int") else ()
    out = build(path, tmp_path / "out", "-p", precision, *level)
    assert_parity(out, reference, tolerance=1e-4)
    raw, _, _ = GGUFCheckpoint.open_file(path)
    module = load("GemmaForCausalLM")
    ours = dataclasses.asdict(module.parse_config(raw, "GemmaForCausalLM"))
    want = dataclasses.asdict(module.parse_config(transformers.AutoConfig.from_pretrained(source).to_dict(),
                                                  "GemmaForCausalLM"))
    assert ours.pop("rms_norm_eps") == pytest.approx(want.pop("rms_norm_eps"), rel=1e-7)  # stored as float32
    ours.pop("hidden_act"), want.pop("hidden_act")  # the file names none; hidden_activation (compared) is used
    assert {k: v for k, v in ours.items() if "token_id" not in k} == {k: v for k, v in want.items() if "token_id" not in k}
