"""Llama, Mistral, Qwen2, Qwen3: ONNX Runtime logits against transformers', prefill and decode."""

import pytest
import torch
from conftest import TINY
from helpers import PROMPT, assert_parity, build, make_checkpoint

VARIANTS = {
    "llama": ("LlamaConfig", {}),
    "llama-tied": ("LlamaConfig", dict(tie_word_embeddings=True)),
    "llama-bias": ("LlamaConfig", dict(attention_bias=True, mlp_bias=True)),
    "llama3-rope": ("LlamaConfig", dict(rope_parameters=dict(
        rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
        original_max_position_embeddings=32))),
    "linear-rope": ("LlamaConfig", dict(rope_parameters=dict(rope_type="linear", rope_theta=10000.0, factor=4.0))),
    "yarn-rope": ("LlamaConfig", dict(rope_parameters=dict(
        rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=32))),
    "mistral": ("MistralConfig", dict(sliding_window=None)),
    # A window shorter than the prompt: GroupQueryAttention's local_window_size must cut the same
    # keys as transformers' sliding-window mask, in the prefill and in the decode step.
    "mistral-window": ("MistralConfig", dict(sliding_window=4)),
    "qwen2-window": ("Qwen2Config", dict(use_sliding_window=True, sliding_window=3, max_window_layers=1)),
    "qwen2": ("Qwen2Config", {}),
    "qwen3-tied": ("Qwen3Config", dict(head_dim=32, tie_word_embeddings=True)),
}


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def variant(request, tmp_path_factory):
    config_class, overrides = VARIANTS[request.param]
    return make_checkpoint(tmp_path_factory.mktemp(request.param), config_class, **{**TINY, **overrides})


def test_fp32_matches_transformers(variant, tmp_path):
    # fp32 end to end: only summation order differs from torch.
    import onnx

    out = build(variant, tmp_path / "out", "-p", "fp32")
    assert_parity(out, variant, tolerance=1e-4)
    # A float32 table's rows are not cast to float32 again (only a 16-bit one's are widened).
    nodes = onnx.load(out / "model.onnx", load_external_data=False).graph.node
    rows = {n.output[0] for n in nodes if n.op_type == "Gather" and n.input[0] == "model.embed_tokens.weight"}
    assert rows and not [n for n in nodes if n.op_type == "Cast" and n.input[0] in rows]


@pytest.mark.parametrize("name", ["llama", "qwen3-tied"])
def test_fp16_matches_transformers(name, tmp_path):
    # fp16 weights and activations against the fp32 reference: each op rounds to an 11-bit
    # mantissa (relative step 2^-11 ≈ 4.9e-4); through two layers, attention and the lm_head
    # the logits' error stays a few steps, so 1e-2 of the largest logit is a wide but still
    # meaningful bound (a wrong rotary or norm gives errors of order 1).
    config_class, overrides = VARIANTS[name]
    source = make_checkpoint(tmp_path / "src", config_class, **{**TINY, **overrides})
    assert_parity(build(source, tmp_path / "out", "-p", "fp16"), source, tolerance=1e-2)


def test_bf16_checkpoint_builds_fp32_exactly(tmp_path):
    # A bf16 checkpoint (as most hub models are) widened to fp32 must give transformers' fp32
    # results on the same bf16 values. The untied embedding table stays bfloat16 on disk, each
    # gathered row widened (half the bytes, no cost at load); the matrices are float32, as asked.
    import onnx

    source = make_checkpoint(tmp_path / "src", "LlamaConfig", dtype=torch.bfloat16, **TINY)
    out = build(source, tmp_path / "out", "-p", "fp32")
    assert_parity(out, source, tolerance=1e-4)
    stored = {t.name: t.data_type for t in onnx.load(out / "model.onnx", load_external_data=False).graph.initializer}
    assert stored["model.embed_tokens.weight"] == onnx.TensorProto.BFLOAT16
    assert {stored[n] for n in stored if n.endswith("proj.weight")} == {onnx.TensorProto.FLOAT}


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_float_layers_of_a_quantized_build_keep_bf16(tmp_path, tied):
    # In an int4 build the float lm_head (--exclude-lm-head) stays bfloat16 on disk, widened by a
    # Cast ONNX Runtime folds at load; a tied table is stored once, gathered and multiplied
    # (transposed) from the same bytes. transformers with the other linears rounded as the build does.
    import onnx
    from fake_quant import fake_quantize_model
    from helpers import OnnxDecoder, model_logits, relative_error

    import transformers

    source = make_checkpoint(tmp_path / "src", "LlamaConfig", dtype=torch.bfloat16, **{**TINY, "tie_word_embeddings": tied})
    out = build(source, tmp_path / "out", "-p", "int4", "--exclude-lm-head", "--accuracy-level", "0",
                "--quant-method", "rtn", "--symmetric")
    stored = {t.name: t.data_type for t in onnx.load(out / "model.onnx", load_external_data=False).graph.initializer}
    table = "model.embed_tokens.weight"
    assert stored[table] == onnx.TensorProto.BFLOAT16 and ("lm_head.weight" in stored) != tied
    assert stored.get("lm_head.weight", onnx.TensorProto.BFLOAT16) == onnx.TensorProto.BFLOAT16
    model = transformers.AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).eval()
    fake_quantize_model(model, 4, 32, True, lm_head=False)
    want_prefill, want_step, next_id = model_logits(model, PROMPT)
    prefill, step = OnnxDecoder(out).prefill_and_step(PROMPT, next_id)
    assert relative_error(prefill, want_prefill) < 1e-4 and relative_error(step, want_step) < 1e-4


@pytest.mark.parametrize("stored", ["equal", "different"])
def test_tied_config_with_a_stored_lm_head(tmp_path, stored):
    # tie_word_embeddings with lm_head.weight also stored: transformers 5 ties them when the two
    # are equal and uses the stored lm_head, untied, when they differ. So must the build.
    import numpy as np
    import onnx
    from safetensors.numpy import load_file, save_file

    source = make_checkpoint(tmp_path / "src", "LlamaConfig", **{**TINY, "tie_word_embeddings": True})
    tensors = load_file(source / "model.safetensors")
    embed = tensors["model.embed_tokens.weight"]
    rng = np.random.default_rng(0)
    tensors["lm_head.weight"] = embed.copy() if stored == "equal" else rng.normal(0, 0.05, embed.shape).astype(embed.dtype)
    save_file(tensors, source / "model.safetensors", metadata={"format": "pt"})
    out = build(source, tmp_path / "out", "-p", "fp32")
    assert_parity(out, source, tolerance=1e-4)
    vocab_sized = [t.name for t in onnx.load(out / "model.onnx", load_external_data=False).graph.initializer
                   if TINY["vocab_size"] in t.dims]
    assert len(vocab_sized) == (1 if stored == "equal" else 2)


@pytest.mark.parametrize("config_class", ["LlamaConfig", "Qwen3Config"])
def test_partial_rotary_factor_is_ignored_as_transformers_does(tmp_path, config_class):
    # transformers' Llama-family default rotary turns the whole head whatever partial_rotary_factor
    # says (the build rotated half of it: relative error 9e-3 for Llama, 0.4 for Qwen3).
    source = make_checkpoint(tmp_path / "src", config_class, **{**TINY, "head_dim": 32, "partial_rotary_factor": 0.5})
    assert_parity(build(source, tmp_path / "out", "-p", "fp32"), source, tolerance=1e-4)


def test_partial_rotary_with_scaled_rope_is_refused():
    from architectures import load

    from builder.errors import BuildError

    with pytest.raises(BuildError, match="partial_rotary_factor and linear rope"):
        raw = {"partial_rotary_factor": 0.5, "rope_scaling": {"rope_type": "linear", "factor": 2.0}}
        load("LlamaForCausalLM").parse_config(raw, "LlamaForCausalLM")
