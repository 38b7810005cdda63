"""DeepSeek-V3 (multi-head latent attention, the latent cached; GLM-4.5's experts) against
transformers: fp32 prefill and decode steps, int4 against the same rounding, onnxruntime-genai's
greedy generation (one prompt and a ragged batch), the cache contract, and the latent cache's
exactness against the decompressed attention."""

import json

import numpy as np
import onnxruntime as ort
import pytest
import torch
import transformers
from helpers import GENAI_PROMPT, build, make_checkpoint
from safetensors.numpy import load_file, save_file
from family_runner import assert_ragged_batch_matches, assert_steps_match

# 3 heads with q_lora_rank (and a variant without), rank 32, rope 16, nope 24, v 20 (all different),
# YaRN with mscale_all_dim (the softmax scale's mscale²); 2 dense layers then experts: 8 in 2
# groups (the best 1 kept), top 2, a shared expert.
CONFIG = dict(
    vocab_size=256, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=3,
    num_attention_heads=3, num_key_value_heads=3, q_lora_rank=48, kv_lora_rank=32, qk_rope_head_dim=16,
    qk_nope_head_dim=24, v_head_dim=20, n_routed_experts=8, num_experts_per_tok=2, n_group=2, topk_group=1,
    n_shared_experts=1, first_k_dense_replace=2, routed_scaling_factor=2.5, max_position_embeddings=256,
    rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=64,
                         beta_fast=32, beta_slow=1, mscale=1.0, mscale_all_dim=1.0),
    initializer_range=0.1, eos_token_id=255, bos_token_id=0, pad_token_id=0, tie_word_embeddings=False,
)


def make(folder, **overrides):
    make_checkpoint(folder, "DeepseekV3Config", **{**CONFIG, **overrides})
    tensors = load_file(folder / "model.safetensors")
    rng = np.random.default_rng(1)
    for key, value in tensors.items():  # a sigmoid router scaled up saturates (ties): the bias spreads it
        if key.endswith("e_score_correction_bias"):
            tensors[key] = rng.standard_normal(value.shape).astype(value.dtype)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    return make(tmp_path_factory.mktemp("deepseek_v3"))


def load(source):
    model = transformers.AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).eval()
    assert type(model).__name__ == "DeepseekV3ForCausalLM"
    return model


def test_fp32_prefill_and_decode_match_transformers(source, tmp_path):
    out = build(source, tmp_path / "out", "-p", "fp32")
    model = load(source)
    assert_steps_match(out, model)
    assert_steps_match(out, model, [int(t) for t in np.random.default_rng(0).integers(0, 255, 90)])  # past YaRN's 64


def test_without_q_lora_and_rotate_half(tmp_path):
    source = make(tmp_path / "src", q_lora_rank=None, rope_interleave=False, first_k_dense_replace=1,
                  rope_parameters=dict(rope_type="default", rope_theta=10000.0))
    assert_steps_match(build(source, tmp_path / "out", "-p", "fp32"), load(source))


@pytest.mark.parametrize("interleave", [True, False])
def test_a_rotary_part_the_fused_rotary_cannot_take(tmp_path, interleave):
    # qk_rope_head_dim 8 (4 pairs): GroupQueryAttention's fused rotary takes cos tables of a multiple
    # of 8 pairs only, so q_pe and k_pe are rotated before it (an ExplicitRotary); the layer handed
    # those tables to GroupQueryAttention as if fused, a model ONNX Runtime refuses to run.
    source = make(tmp_path / "src", qk_rope_head_dim=8, rope_interleave=interleave)
    assert_steps_match(build(source, tmp_path / "out", "-p", "fp32"), load(source))


def test_cache_contract(source, tmp_path):
    """One KV head of rope + rank per layer: the latent, not the heads' keys and values."""
    out = build(source, tmp_path / "out", "-p", "fp32")
    session = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    inputs = {i.name: i.shape for i in session.get_inputs()}
    assert inputs["past_key_values.0.key"] == ["batch_size", 1, "past_sequence_length", 16 + 32]
    decoder = json.loads((out / "genai_config.json").read_text())["model"]["decoder"]
    assert (decoder["head_size"], decoder["num_key_value_heads"], decoder["num_attention_heads"]) == (48, 1, 3)


def test_int4_matches_fake_quantized_transformers(source, tmp_path):
    # Every Linear but kv_b_proj (absorbed into per-head MatMuls, float) and the router; each
    # stored expert alone at the layer's QMoE block.
    from test_family_moe import fake_quantize_experts

    out = build(source, tmp_path / "out", "-p", "int4", "--accuracy-level", "0", "--quant-method", "rtn",
                "--symmetric")
    model = load(source)
    kept = {n: p.clone() for n, p in model.named_parameters() if "kv_b_proj" in n}
    fake_quantize_experts(model, 4, 32, True)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name in kept:
                p.copy_(kept[name])
    assert_steps_match(out, model, tolerance=1e-3, min_cosine=0.999)


def test_genai_greedy_and_ragged_batch_match_transformers(source, tmp_path):
    from test_genai import assert_same_greedy

    out = build(source, tmp_path / "out", "-p", "fp32")
    assert_same_greedy(out, source, GENAI_PROMPT)
    assert_ragged_batch_matches(out, load(source))


def test_fp8_block_checkpoint_builds_the_dequantized_model(source, tmp_path):
    # DeepSeek-V3's hub checkpoints: every projection (experts, kv_b_proj, shared experts) float8
    # e4m3 with 128×128 weight_scale_inv blocks; the router, norms, embeddings and lm_head not.
    import re

    from test_fp8 import write_fp8

    projections = re.compile(r"model\.layers\.\d+\.(self_attn|mlp)\.(experts\.\d+\.|shared_experts\.)?\w+_proj\.weight")
    path, ref = write_fp8(source, tmp_path / "fp8", "fp8-block", linear=projections)
    from safetensors import safe_open

    with safe_open(path / "model.safetensors", "pt") as stored:
        for name in ("model.layers.2.mlp.experts.3.up_proj.weight", "model.layers.0.self_attn.kv_b_proj.weight"):
            assert stored.get_tensor(name).dtype == torch.float8_e4m3fn
    assert_steps_match(build(path, tmp_path / "out", "-p", "fp32"), load(ref))


@pytest.mark.parametrize("method", ["greedy", "group_limited_greedy"])
def test_deepseek_v2_matches_transformers(tmp_path, method):
    # DeepSeek-V2: the same latent attention (interleaved pairs always, no q_lora here: V2-Lite),
    # a softmax router whose top-k weights are not renormalized, 2 shared experts.
    config = {k: v for k, v in CONFIG.items() if k not in ("rope_parameters",)}
    config.update(q_lora_rank=None, n_shared_experts=2, topk_method=method, routed_scaling_factor=1.5,
                  num_attention_heads=4, num_key_value_heads=4, n_group=4, topk_group=2, first_k_dense_replace=1)
    make_checkpoint(tmp_path / "src", "DeepseekV2Config", **config)
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "src", dtype=torch.float32).eval()
    assert type(model).__name__ == "DeepseekV2ForCausalLM"
    assert_steps_match(build(tmp_path / "src", tmp_path / "out", "-p", "fp32"), model)
