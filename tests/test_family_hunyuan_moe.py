"""HunYuan MoE (HunYuanMoEV1ForCausalLM) against transformers: fp32 prefill and decode (every option
on, and the other way, and the stacked expert layout), int4 against the same rounding, genai's greedy
generation, decisive routing, and config.json parsing against HunYuanMoEV1Config."""

import copy
import shutil

import numpy as np
import pytest
import torch
import transformers
from conftest import TINY
from helpers import GENAI_PROMPT, PROMPT, assert_parity, build, make_checkpoint
from safetensors.numpy import load_file, save_file
from test_family_moe import assert_rounded_parity, fake_quantize_experts
from test_genai import assert_same_greedy

import architectures
from builder.errors import BuildError

ARCHITECTURE = "HunYuanMoEV1ForCausalLM"
ALPHA = {"type": "dynamic", "alpha": 1000.0, "factor": 1.0, "rope_theta": 10000.0}  # the hub's rope_scaling
# Every feature on: 8 experts, top-k per layer (2, 3, 1), NTK-alpha rope, q/k/v/o biases, tied
# embeddings, head_dim its own key (4 heads of 32 on a hidden size of 64).
CONFIG = dict(TINY, eos_token_id=255, num_hidden_layers=3, head_dim=32, intermediate_size=64, num_experts=8,
              moe_topk=[2, 3, 1], attention_bias=True, tie_word_embeddings=True, rope_parameters=ALPHA)
# The other way: one top-k for all layers, plain rope, no biases, untied, head_dim hidden / heads.
PLAIN = dict(TINY, eos_token_id=255, head_dim=16, num_experts=4, moe_topk=2, rope_parameters={"rope_theta": 500.0})
ROUTER_SCALE = 30.0  # random routers are near-uniform; scaled up, their choices are decisive


def make(folder, config=CONFIG):
    folder = make_checkpoint(folder, "HunYuanMoEV1Config", **config)
    tensors, rng = load_file(folder / "model.safetensors"), np.random.default_rng(1)
    for key, value in tensors.items():
        if key.endswith("_proj.bias"):  # transformers initializes biases to zero
            tensors[key] = (0.1 * rng.standard_normal(value.shape)).astype(value.dtype)
        if key.endswith("mlp.gate.wg.weight"):
            tensors[key] = value * ROUTER_SCALE
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


@pytest.fixture(scope="module")
def hunyuan_moe(tmp_path_factory):
    return make(tmp_path_factory.mktemp("hunyuan_moe"))


def test_routing_is_decisive(hunyuan_moe):
    # The parity tests prove the router only if no token's top-k is a near-tie an ulp could flip.
    model = transformers.AutoModelForCausalLM.from_pretrained(hunyuan_moe, dtype=torch.float32).eval()
    gates = [m for m in model.modules() if type(m).__name__ == "HunYuanMoEV1Gate"]
    seen = []
    hooks = [m.register_forward_hook(lambda m, i, o: seen.append((m.top_k, o[0].detach().numpy()))) for m in gates]
    with torch.no_grad():
        for ids in (PROMPT, GENAI_PROMPT):
            model(torch.tensor([ids]))
    for h in hooks:
        h.remove()
    assert sorted({k for k, _ in seen}) == [1, 2, 3]
    for k, logits in seen:
        top = np.sort(logits, -1)[:, ::-1]
        assert (top[:, k - 1] - top[:, k]).min() > 1e-3, "a near-tie in the top-k choice"


def test_fp32_matches_transformers(hunyuan_moe, tmp_path):
    assert_parity(build(hunyuan_moe, tmp_path / "out", "-p", "fp32"), hunyuan_moe, tolerance=1e-4)


def test_fp16_matches_transformers(hunyuan_moe, tmp_path):
    assert_parity(build(hunyuan_moe, tmp_path / "out", "-p", "fp16"), hunyuan_moe, tolerance=1e-2)


def test_plain_options_match_transformers(tmp_path):
    source = make(tmp_path / "plain", PLAIN)
    assert_parity(build(source, tmp_path / "out", "-p", "fp32"), source, tolerance=1e-4)


def test_stacked_experts_build_the_same_model(hunyuan_moe, tmp_path):
    # HunYuanMoEV1Experts' own layout: gate_up_proj [E, 2I, H] (gate rows, then up) and down_proj [E, H, I].
    source = tmp_path / "stacked"
    shutil.copytree(hunyuan_moe, source)
    tensors = load_file(source / "model.safetensors")
    for layer in range(CONFIG["num_hidden_layers"]):
        p = f"model.layers.{layer}.mlp.experts."
        each = {x: [tensors.pop(f"{p}{e}.{x}_proj.weight") for e in range(CONFIG["num_experts"])]
                for x in ("gate", "up", "down")}
        tensors[p + "gate_up_proj"] = np.stack([np.concatenate(x) for x in zip(each["gate"], each["up"])])
        tensors[p + "down_proj"] = np.stack(each["down"])
    save_file(tensors, source / "model.safetensors", metadata={"format": "pt"})
    assert_parity(build(source, tmp_path / "out", "-p", "fp32"), hunyuan_moe, tolerance=1e-4)


def test_int4_matches_fake_quantized_transformers(hunyuan_moe, tmp_path):
    # Every Linear and every expert rounded, but the router (gate.wg), which the build keeps in float.
    def rounding(model):
        routers = {n: p.detach().clone() for n, p in model.named_parameters() if n.endswith("gate.wg.weight")}
        fake_quantize_experts(model)
        with torch.no_grad():
            for n, p in model.named_parameters():
                if n in routers:
                    p.copy_(routers[n])

    out = build(hunyuan_moe, tmp_path / "out", "-p", "int4", "--accuracy-level", "0", "--quant-method", "rtn",
                "--symmetric")
    assert_rounded_parity(out, hunyuan_moe, rounding)


def test_genai_greedy_matches_transformers(hunyuan_moe, tmp_path):
    out = build(hunyuan_moe, tmp_path / "out", "-p", "fp32")
    assert_same_greedy(out, hunyuan_moe, GENAI_PROMPT)


# tencent/Hunyuan-A13B-Instruct's config.json as recalled (not checked against the hub): the original
# code's per-layer lists, which transformers ignores, and its legacy rope_scaling.
A13B = dict(hidden_size=4096, intermediate_size=3072, num_hidden_layers=32, num_attention_heads=32,
            num_key_value_heads=8, head_dim=128, vocab_size=128167, max_position_embeddings=32768,
            rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=True, num_experts=64, moe_topk=[8] * 32,
            moe_intermediate_size=[3072] * 32, num_shared_expert=[1] * 32, use_mixed_mlp_moe=True, use_cla=False,
            use_qk_norm=True, bos_token_id=1, eos_token_id=127960, pad_token_id=127961,
            rope_scaling={"alpha": 1000.0, "beta_fast": 32, "beta_slow": 1, "factor": 1.0, "mscale": 1.0,
                          "mscale_all_dim": 1.0, "type": "dynamic"})


@pytest.mark.parametrize("config", [
    dict(head_dim=128),
    A13B,
    dict(head_dim=64, num_local_experts=16, num_experts_per_tok=4, attention_bias=True, eos_token_id=[2, 3],
         rope_parameters={"rope_type": "dynamic", "alpha": 50.0, "factor": 1.0, "rope_theta": 1e6}),
    dict(head_dim=64, num_experts=4, moe_topk=[1, 2] * 16, rope_scaling={"type": "linear", "factor": 2.0}),
], ids=["defaults", "a13b", "aliases", "linear"])
def test_matches_transformers_config(config):
    hf = transformers.HunYuanMoEV1Config(**copy.deepcopy(config))
    c = architectures.load(ARCHITECTURE).parse_config({**config, "architectures": [ARCHITECTURE]}, ARCHITECTURE)
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim", "hidden_act", "max_position_embeddings", "rms_norm_eps",
                "tie_word_embeddings", "bos_token_id", "eos_token_id", "pad_token_id", "attention_bias",
                "num_experts", "moe_topk"):
        assert getattr(c, key) == getattr(hf, key), key
    strip = lambda d: {k: v for k, v in d.items() if k != "type"}  # noqa: E731
    assert strip(c.rope_parameters) == strip(hf.rope_parameters)
    small = transformers.HunYuanMoEV1Config(**{**copy.deepcopy(config), **TINY, "head_dim": 16})
    gate = transformers.models.hunyuan_v1_moe.modeling_hunyuan_v1_moe.HunYuanMoEV1Gate
    assert [c.top_k(i) for i in range(2)] == [gate(small, i).top_k for i in range(2)]
    assert c.model_type == "hunyuandensev1"  # onnxruntime-genai's type whose contract it runs


@pytest.mark.parametrize("config, message", [
    (dict(moe_intermediate_size=[1024] * 32), "transformers' experts are intermediate_size"),
    (dict(num_shared_expert=2), "shared MLP is one expert"),
    (dict(use_mixed_mlp_moe=False), "always adds the shared MLP"),
    (dict(use_cla=True), "cross-layer attention"),
    (dict(moe_topk=[2] * 31), "31 entries for 32 layers"),
    (dict(num_experts=4, moe_topk=5), "1 to num_experts"),
    (dict(num_experts=[8] * 32), "num_experts is"),
])
def test_what_transformers_would_build_otherwise_is_refused(config, message):
    raw = {**A13B, **config, "architectures": [ARCHITECTURE]}
    with pytest.raises(BuildError, match=message):
        architectures.load(ARCHITECTURE).parse_config(raw, ARCHITECTURE)
