"""Gemma 1, 2, 3 and Gemma3ForConditionalGeneration's text decoder against transformers."""

import json

import pytest
import torch
import transformers
from conftest import TINY
from fake_quant import assert_quantized_parity
from helpers import (
    GENAI_PROMPT,
    PROMPT,
    OnnxDecoder,
    assert_parity,
    build,
    make_checkpoint,
    relative_error,
)
from safetensors.numpy import load_file, save_file
from test_genai import assert_same_greedy

GEMMA = {**TINY, "head_dim": 16, "eos_token_id": 255}
# Windows shorter than the 10-token prompt, soft-capping on, global and local layers both present.
VARIANTS = {
    "gemma": ("GemmaConfig", {}),
    "gemma2": ("Gemma2Config", dict(sliding_window=4, attn_logit_softcapping=5.0, final_logit_softcapping=3.0,
                                    query_pre_attn_scalar=24)),
    "gemma3": ("Gemma3TextConfig", dict(num_hidden_layers=3, sliding_window=4, sliding_window_pattern=2,
                                        query_pre_attn_scalar=24, rope_parameters={
                                            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
                                            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}})),
}


def make_gemma(folder, name):
    config_class, overrides = VARIANTS[name]
    return make_checkpoint(folder, config_class, **{**GEMMA, **overrides})


def make_gemma3_multimodal(folder, hub_layout: bool):
    """A tiny Gemma3ForConditionalGeneration; `hub_layout` renames tensors as the hub's -it
    checkpoints store them (language_model.model.*) instead of transformers 5's (model.language_model.*)."""
    text = {**GEMMA, **VARIANTS["gemma3"][1]}
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                  image_size=28, patch_size=14)
    cfg = transformers.Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4,
                                    image_token_index=250, boi_token_index=251, eoi_token_index=252, eos_token_id=255)
    make_checkpoint(folder, "Gemma3Config", **cfg.to_dict())
    if hub_layout:
        tensors = load_file(folder / "model.safetensors")
        renamed = {}
        for k, v in tensors.items():
            if k.startswith("model.language_model."):
                k = "language_model.model." + k[len("model.language_model."):]
            elif k.startswith("model."):
                k = k[len("model."):]
            renamed[k] = v
        save_file(renamed, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def variant(request, tmp_path_factory):
    return make_gemma(tmp_path_factory.mktemp(request.param), request.param)


def test_fp32_matches_transformers(variant, tmp_path):
    assert_parity(build(variant, tmp_path / "out", "-p", "fp32"), variant, tolerance=1e-4)


def test_fp16_matches_transformers(variant, tmp_path):
    # See test_parity_llama: fp16 rounding through two or three layers, bound 1e-2 of the largest logit.
    assert_parity(build(variant, tmp_path / "out", "-p", "fp16"), variant, tolerance=1e-2)


def test_int4_matches_fake_quantized_transformers(variant, tmp_path):
    out = build(variant, tmp_path / "out", "-p", "int4", "--accuracy-level", "0")
    assert_quantized_parity(variant, out, exact=True)


def test_genai_greedy_matches_transformers(variant, tmp_path):
    out = build(variant, tmp_path / "out", "-p", "fp32")
    assert_same_greedy(out, variant, GENAI_PROMPT)


@pytest.mark.parametrize("hub_layout", [False, True], ids=["transformers-layout", "hub-layout"])
def test_gemma3_multimodal_text_decoder(tmp_path, hub_layout):
    source = make_gemma3_multimodal(tmp_path / "src", hub_layout)
    out = build(source, tmp_path / "out", "-p", "fp32")
    cfg = json.loads((out / "genai_config.json").read_text())
    assert cfg["model"]["type"] == "gemma3_text" and cfg["model"]["eos_token_id"] == 255
    model = transformers.AutoModelForImageTextToText.from_pretrained(source, dtype=torch.float32).eval()
    with torch.no_grad():
        prefill = model(input_ids=torch.tensor([PROMPT]), use_cache=True)
        next_id = int(prefill.logits[0, -1].argmax())
        step = model(input_ids=torch.tensor([[next_id]]), past_key_values=prefill.past_key_values, use_cache=True)
    got_prefill, got_step = OnnxDecoder(out).prefill_and_step(PROMPT, next_id)
    assert relative_error(got_prefill, prefill.logits[0].numpy()) < 1e-4
    assert relative_error(got_step, step.logits[0].numpy()) < 1e-4
    assert (got_prefill.argmax(-1) == prefill.logits[0].numpy().argmax(-1)).all()


@pytest.mark.parametrize("flags", [[], ["--windowed-kv-cache"]], ids=["full-kv-cache", "window-ring-buffer"])
def test_sliding_window_cache_over_many_steps(tmp_path, flags):
    # Gemma 2 with a 4-token window: decode eight steps past a 10-token prompt, each step's logits
    # against transformers' full forward of the whole sequence.
    source = make_gemma(tmp_path / "src", "gemma2")
    out = build(source, tmp_path / "out", "-p", "fp32", *flags)
    decoder = OnnxDecoder(out)
    model = transformers.AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).eval()
    ids = list(PROMPT)
    logits, present = decoder.run(ids, None, len(ids))
    windowed = bool(flags)
    assert present["present.0.key"].shape[2] == (4 if windowed else len(ids))  # layer 0 slides
    assert present["present.1.key"].shape[2] == len(ids)  # layer 1 is global
    for _ in range(8):
        ids.append(int(logits[-1].argmax()))
        logits, present = decoder.run(ids[-1:], present, len(ids))
        with torch.no_grad():
            expected = model(torch.tensor([ids])).logits[0, -1].numpy()
        assert relative_error(logits[-1], expected) < 1e-4
    cfg = json.loads((out / "genai_config.json").read_text())["model"]["decoder"]
    assert ("sliding_window" in cfg) == windowed
    if windowed:
        assert cfg["sliding_window"]["layers"] == [0] and cfg["sliding_window"]["window_size"] == 4
