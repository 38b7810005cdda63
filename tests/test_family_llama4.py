"""Llama 4's text decoder against transformers: chunked attention on the rotary layers (prompts and
decode steps across chunk boundaries), NoPE layers with the attention temperature, the top-1
experts that scale their input beside a shared expert, dense layers between; fp32 prefill and
decode steps, int4 against the same rounding, onnxruntime-genai's greedy generation."""

import numpy as np
import pytest
import torch
import transformers
from helpers import GENAI_PROMPT, build, make_checkpoint
from safetensors.numpy import load_file, save_file
from family_runner import assert_ragged_batch_matches, assert_steps_match

# 4 layers: rotary + chunked (chunks of 8 tokens) except layer 2 (no rotary, global, temperature
# with floor_scale 8); experts on layers 1 and 3 (4 of them, top 1, beside the shared expert),
# dense SwiGLUs of 96 on 0 and 2; 3 query heads over 1 KV head of 32.
CONFIG = dict(
    vocab_size=256, hidden_size=64, intermediate_size=32, intermediate_size_mlp=96, num_hidden_layers=4,
    num_attention_heads=3, num_key_value_heads=1, head_dim=32, max_position_embeddings=256,
    no_rope_layers=[1, 1, 0, 1], interleave_moe_layer_step=2, num_local_experts=4, num_experts_per_tok=1,
    attention_chunk_size=8, floor_scale=8, attn_scale=0.5, use_qk_norm=True, initializer_range=0.1,
    eos_token_id=255, bos_token_id=1, pad_token_id=0, tie_word_embeddings=False,
    rope_parameters=dict(rope_type="default", rope_theta=10000.0),
)
ROUTER_SCALE = 30.0  # random routers are near-uniform; scaled up, the top-1 choice is decisive


def make(folder, **overrides):
    make_checkpoint(folder, "Llama4TextConfig", **{**CONFIG, **overrides})
    tensors = load_file(folder / "model.safetensors")
    for key, value in tensors.items():
        if key.endswith("router.weight"):
            tensors[key] = value * ROUTER_SCALE
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    return make(tmp_path_factory.mktemp("llama4"))


def load(source):
    model = transformers.AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).eval()
    assert type(model).__name__ == "Llama4ForCausalLM"
    return model


def test_fp32_prefill_and_decode_match_transformers(source, tmp_path):
    out = build(source, tmp_path / "out", "-p", "fp32")
    model = load(source)
    assert_steps_match(out, model)  # 10 tokens: the second chunk starts at 8; steps cross into the third at 16
    assert_steps_match(out, model, [int(t) for t in np.random.default_rng(0).integers(0, 255, 29)])


def test_int4_matches_fake_quantized_transformers(source, tmp_path):
    from fake_quant import fake_quantize, fake_quantize_model

    out = build(source, tmp_path / "out", "-p", "int4", "--accuracy-level", "0", "--quant-method", "rtn",
                "--symmetric")
    model = load(source)
    routers = {n: p.clone() for n, p in model.named_parameters() if n.endswith("router.weight")}
    fake_quantize_model(model, 4, 32, True)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name in routers:
                p.copy_(routers[name])
            elif name.endswith(("experts.gate_up_proj", "experts.down_proj")):  # x @ W: [out, in] is W.T
                for e in range(p.shape[0]):
                    p[e].copy_(fake_quantize(p[e].T.contiguous(), 4, 32, True).T)
    assert_steps_match(out, model, tolerance=1e-3, min_cosine=0.999)


def test_int4_verify_rounds_as_the_build(source, tmp_path, capsys):
    # --verify's reference rounded Llama 4's float router and its transposed experts row-wise in
    # the wrong orientation: an int4 --verify of a correct build failed at cosine 0.994.
    from builder.cli import main

    rc = main(["-m", str(source), "-o", str(tmp_path / "out"), "-p", "int4", "--accuracy-level", "0", "--verify"])
    assert rc == 0, capsys.readouterr().err


def test_genai_greedy_and_ragged_batch_match_transformers(source, tmp_path):
    from test_genai import assert_same_greedy

    out = build(source, tmp_path / "out", "-p", "fp32")
    assert_same_greedy(out, source, GENAI_PROMPT)
    assert_ragged_batch_matches(out, load(source))


def test_multimodal_checkpoint_builds_its_text_decoder(tmp_path):
    # The hub's Llama 4 is Llama4ForConditionalGeneration: the text decoder under a language model
    # prefix, its settings under text_config, a vision tower the text build leaves out.
    torch.manual_seed(0)
    vision = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
                  image_size=28, patch_size=14, vision_output_dim=32, projector_input_dim=32,
                  projector_output_dim=32)
    config = transformers.Llama4Config(text_config=CONFIG, vision_config=vision)
    model = transformers.Llama4ForConditionalGeneration(config).eval()
    model.save_pretrained(tmp_path / "src")
    out = build(tmp_path / "src", tmp_path / "out", "-p", "fp32")
    assert_steps_match(out, model)


def test_scout_rope_with_equal_frequency_factors_matches_transformers(tmp_path):
    # meta-llama/Llama-4-Scout-17B-16E-Instruct's config.json: rope_scaling llama3 with
    # low_freq_factor = high_freq_factor = 1.0 (no smoothing band), written the hub's way (rope_theta
    # at top level, rope_scaling). transformers warns and runs it; builder refused it ("llama3 rope
    # needs low_freq_factor (1.0) below high_freq_factor (1.0)"). original_max_position_embeddings 64
    # puts the 32-wide head's wavelengths on both sides of the one edge, so a band or a scaling on
    # the wrong side would show in the logits.
    import json

    source = make(tmp_path / "src")
    config = json.loads((source / "config.json").read_text())
    config.pop("rope_parameters", None)
    config.update(rope_theta=500000.0, rope_scaling={"rope_type": "llama3", "factor": 16.0, "low_freq_factor": 1.0,
                                                     "high_freq_factor": 1.0, "original_max_position_embeddings": 64})
    (source / "config.json").write_text(json.dumps(config))
    model = load(source)
    inv_freq = model.model.rotary_emb.inv_freq
    assert bool((inv_freq < inv_freq.max() / 20).any()) and torch.isfinite(inv_freq).all()  # some scaled, none NaN
    out = build(source, tmp_path / "out", "-p", "fp32")
    assert_steps_match(out, model, [int(t) for t in np.random.default_rng(1).integers(0, 255, 20)])
