"""Granite MoE, Phi-3.5-MoE and ERNIE 4.5 MoE against transformers: fp32 and int4 logits (experts in
ONNX Runtime's MoE/QMoE), genai's greedy generation, decisive routing on the test prompts, and
config.json parsing against their config classes."""

import numpy as np
import pytest
import torch
import transformers
from conftest import TINY
from helpers import GENAI_PROMPT, PROMPT, assert_parity, build, make_checkpoint
from safetensors.numpy import load_file, save_file
from test_family_moe import assert_rounded_parity, fake_quantize_experts, router_logits
from test_genai import assert_same_greedy

import architectures
from builder.blocks.moe import sparsemixer, unstacked
from builder.lazy import Weight

BASE = {**TINY, "eos_token_id": 255}
# Each with its features on, 4-8 experts, top-2. Granite MoE: all four multipliers ≠ 1, q/k/v/o biases.
VARIANTS = {
    "granitemoe": ("GraniteMoeConfig", dict(num_local_experts=6, num_experts_per_tok=2, embedding_multiplier=3.0,
                                            residual_multiplier=0.5, attention_multiplier=0.2, logits_scaling=0.25,
                                            attention_bias=True)),
    # Phi-MoE: sparsemixer routing, LayerNorms, q/k/v/o and lm_head biases, a window shorter than the prompt.
    "phimoe": ("PhimoeConfig", dict(num_local_experts=6, attention_bias=True, lm_head_bias=True, sliding_window=4,
                                    router_jitter_noise=0.3)),
}
ROUTERS = ("block_sparse_moe.router.layer.weight", "block_sparse_moe.gate.weight")
ROUTER_SCALE = 30.0  # random routers are near-uniform; scaled up, their top-k choices are decisive


def make(folder, name):
    config_class, overrides = VARIANTS[name]
    make_checkpoint(folder, config_class, **{**BASE, **overrides})
    tensors = load_file(folder / "model.safetensors")
    rng = np.random.default_rng(1)
    for key, value in tensors.items():
        if key.endswith(".bias") and "norm" not in key:  # transformers initializes biases to zero
            tensors[key] = (0.1 * rng.standard_normal(value.shape)).astype(value.dtype)
        if key.endswith(ROUTERS):
            tensors[key] = value * ROUTER_SCALE
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def variant(request, tmp_path_factory):
    return make(tmp_path_factory.mktemp(request.param), request.param)


def test_routing_is_decisive(variant):
    model = transformers.AutoModelForCausalLM.from_pretrained(variant, dtype=torch.float32).eval()
    k = model.config.num_experts_per_tok
    seen = [logits for ids in (PROMPT, GENAI_PROMPT) for logits in router_logits(model, ids)]
    assert len(seen) == 2 * model.config.num_hidden_layers
    for logits in seen:
        top = np.sort(logits, -1)[:, ::-1]
        assert (top[:, k - 1] - top[:, k]).min() > 1e-3, "a near-tie in the top-k choice"


def test_fp32_matches_transformers(variant, tmp_path):
    assert_parity(build(variant, tmp_path / "out", "-p", "fp32"), variant, tolerance=1e-4)


@pytest.mark.parametrize("method, symmetric", [("rtn", True), ("search", False)], ids=["rtn", "default"])
def test_int4_matches_fake_quantized_transformers(variant, tmp_path, method, symmetric):
    flags = ("--quant-method", "rtn", "--symmetric") if method == "rtn" else ()  # the default: no flags
    out = build(variant, tmp_path / "out", "-p", "int4", "--accuracy-level", "0", *flags)

    def rounding(model):  # quantizes every nn.Linear: Phi-MoE's router is one, and stays float
        routers = {n: m.weight.clone() for n, m in model.named_modules() if type(m).__name__.endswith("TopKRouter")}
        fake_quantize_experts(model, symmetric=symmetric, method=method)
        with torch.no_grad():
            for name, weight in routers.items():
                model.get_submodule(name).weight.copy_(weight)

    assert_rounded_parity(out, variant, rounding)


def test_genai_greedy_matches_transformers(variant, tmp_path):
    assert_same_greedy(build(variant, tmp_path / "out", "-p", "fp32"), variant, GENAI_PROMPT)


@pytest.mark.parametrize("name, config", [
    ("GraniteMoeConfig", {}),
    ("GraniteMoeConfig", dict(num_key_value_heads=4, embedding_multiplier=12.0, logits_scaling=8.0,
                              rope_scaling={"type": "linear", "factor": 2.0}, num_local_experts=32)),
    ("PhimoeConfig", {}),
    ("PhimoeConfig", dict(sliding_window=2048, attention_bias=True, lm_head_bias=True, router_jitter_noise=0.05,
                          rope_scaling={"rope_type": "longrope", "short_factor": [1.0] * 64, "long_factor": [2.0] * 64,
                                        "short_mscale": 1.2, "long_mscale": 1.2,
                                        "original_max_position_embeddings": 4096})),
    ("PhimoeConfig", dict(head_dim=64)),  # PhimoeAttention reads a given head_dim
])
def test_matches_transformers_config(name, config):
    hf = getattr(transformers, name)(**config)
    architecture = name.replace("Config", "ForCausalLM")
    c = architectures.load(architecture).parse_config({**config, "architectures": [architecture]}, architecture)
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "rms_norm_eps", "num_experts_per_tok", "max_position_embeddings",
                "bos_token_id", "eos_token_id", "pad_token_id", "tie_word_embeddings", "attention_bias",
                *SPECIFIC[name]):
        assert getattr(c, key) == getattr(hf, key), key
    assert c.head_dim == (getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads)
    expected_rope = dict(hf.rope_parameters)
    if expected_rope.get("short_mscale"):  # PhimoeRotaryEmbedding scales cos/sin by it, not by the factor
        expected_rope["attention_factor"] = expected_rope["short_mscale"]
    assert c.rope_parameters == expected_rope
    window = getattr(hf, "sliding_window", None)
    assert [c.window(i) for i in range(c.num_hidden_layers)] == [window] * c.num_hidden_layers


SPECIFIC = {
    "GraniteMoeConfig": ("num_local_experts", "embedding_multiplier", "residual_multiplier", "attention_multiplier",
                         "logits_scaling"),
    "PhimoeConfig": ("num_local_experts", "router_jitter_noise", "lm_head_bias", "sliding_window"),
}


def test_unstacked_splits_each_expert_alone():
    stacked = Weight.constant(np.arange(3 * 4 * 2, dtype=np.float32).reshape(3, 4, 2))
    gates, ups = unstacked(stacked, 0, 2), unstacked(stacked, 2)
    assert [w.shape for w in gates + ups] == [(2, 2)] * 6
    assert np.array_equal(ups[1].numpy(), stacked.numpy()[1, 2:])
    assert np.array_equal(gates[2].numpy(), stacked.numpy()[2, :2])


def test_sparsemixer_matches_transformers():
    # Logits with a few experts within the 2·eps band of each choice, and some far below it.
    from test_blocks import run
    from transformers.models.phimoe.modeling_phimoe import sparsemixer as reference

    scores = np.random.default_rng(0).standard_normal((2, 5, 8)).astype(np.float32) * 2
    got_index, got_weight = run(lambda g, x: list(sparsemixer(g, x, 0.2, np.float32)), scores)
    want_weight, want_index = reference(torch.from_numpy(scores).reshape(-1, 8), 0.2, training=False)
    assert np.array_equal(got_index.reshape(-1, 2), want_index.numpy())
    np.testing.assert_allclose(got_weight.reshape(-1, 2), want_weight.numpy(), rtol=1e-6)
    assert 0.05 < (want_weight.numpy() < 0.999).mean() < 0.95  # both lone and shared choices occur


def test_the_hubs_phimoe_spelling_builds_the_same_model(tmp_path):
    # microsoft/Phi-3.5-MoE-instruct's config.json names PhiMoEForCausalLM (with auto_map for its
    # old remote code); transformers loads it as PhimoeForCausalLM by model_type, and so do we.
    import json
    import shutil

    source = make(tmp_path / "src", "phimoe")
    hub = tmp_path / "hub"
    shutil.copytree(source, hub)
    config = json.loads((hub / "config.json").read_text())
    config.update(architectures=["PhiMoEForCausalLM"], auto_map={"AutoModelForCausalLM": "modeling_phimoe.PhiMoEForCausalLM"})
    (hub / "config.json").write_text(json.dumps(config))
    a, b = build(source, tmp_path / "a", "-p", "fp32"), build(hub, tmp_path / "b", "-p", "fp32")
    assert (a / "model.onnx.data").read_bytes() == (b / "model.onnx.data").read_bytes()
    assert (a / "model.onnx").read_bytes() == (b / "model.onnx").read_bytes()
