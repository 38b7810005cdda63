"""ERNIE 4.5 MoE against transformers: fp32 and int4 logits (routing from standard operators, experts
in ONNX Runtime's MoE/QMoE), genai's greedy generation, decisive routing that the correction bias
changes, and config.json parsing against Ernie4_5_MoeConfig."""

import copy
import json
import shutil

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

# 6 experts, top-2, 2 shared experts, biases everywhere; layers 1 and 2 sparse, 0 and 3 dense.
CONFIG = dict(TINY, eos_token_id=255, num_hidden_layers=4, moe_num_experts=6, moe_k=2, moe_intermediate_size=32,
              moe_num_shared_experts=2, moe_layer_start_index=1, moe_layer_end_index=2, use_bias=True)
ROUTER_SCALE = 30.0  # random routers are near-uniform; scaled up, their choices are decisive


@pytest.fixture(scope="module")
def ernie(tmp_path_factory):
    return make(tmp_path_factory.mktemp("ernie4_5_moe"))


def make(folder):
    folder = make_checkpoint(folder, "Ernie4_5_MoeConfig", **CONFIG)
    tensors, rng = load_file(folder / "model.safetensors"), np.random.default_rng(1)
    for key, value in tensors.items():
        if key.endswith(".bias") and "norm" not in key:  # transformers initializes biases to zero
            tensors[key] = (0.1 * rng.standard_normal(value.shape)).astype(value.dtype)
        if key.endswith("mlp.gate.weight"):
            tensors[key] = value * ROUTER_SCALE
        if key.endswith("e_score_correction_bias"):  # of the order of the probabilities it corrects
            tensors[key] = (0.25 * rng.standard_normal(value.shape)).astype(value.dtype)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


def test_routing_is_decisive_and_the_bias_changes_it(ernie):
    model = transformers.AutoModelForCausalLM.from_pretrained(ernie, dtype=torch.float32).eval()
    biases = [m.e_score_correction_bias.detach().numpy()[0] for m in model.modules()
              if type(m).__name__ == "Ernie4_5_MoeStatics"]
    changed = 0
    for ids in (PROMPT, GENAI_PROMPT):
        seen = router_logits(model, ids)
        assert len(seen) == len(biases) == 2
        for logits, bias in zip(seen, biases):
            p = torch.softmax(torch.from_numpy(logits), -1).numpy()
            top = np.sort(p + bias, -1)[:, ::-1]
            assert (top[:, 1] - top[:, 2]).min() > 1e-3, "a near-tie in the top-k choice"
            chosen, plain = np.argsort(-(p + bias), -1)[:, :2], np.argsort(-p, -1)[:, :2]
            changed += (np.sort(chosen, -1) != np.sort(plain, -1)).any(-1).sum()
    assert changed > 0, "the correction bias never changes the experts chosen"


def test_fp32_matches_transformers(ernie, tmp_path):
    assert_parity(build(ernie, tmp_path / "out", "-p", "fp32"), ernie, tolerance=1e-4)


def test_stacked_experts_match_transformers(ernie, tmp_path):
    # Ernie4_5_MoeExperts' own layout, gate_up_proj [E, 2I, H] (gate rows, then up) and down_proj [E, H, I].
    source = tmp_path / "stacked"
    shutil.copytree(ernie, source)
    tensors = load_file(source / "model.safetensors")
    for layer in (1, 2):
        p, E = f"model.layers.{layer}.mlp.experts.", CONFIG["moe_num_experts"]
        each = {n: [tensors.pop(f"{p}{e}.{n}_proj.weight") for e in range(E)] for n in ("gate", "up", "down")}
        tensors[p + "gate_up_proj"] = np.stack([np.concatenate(x) for x in zip(each["gate"], each["up"])])
        tensors[p + "down_proj"] = np.stack(each["down"])
    save_file(tensors, source / "model.safetensors", metadata={"format": "pt"})
    assert_parity(build(source, tmp_path / "out", "-p", "fp32"), ernie, tolerance=1e-4)


@pytest.mark.parametrize("method, symmetric", [("rtn", True), ("search", False)], ids=["rtn", "default"])
def test_int4_matches_fake_quantized_transformers(ernie, tmp_path, method, symmetric):
    # rtn: ONNX Runtime's quantizer; default: int4's search with zero points. Every nn.Linear and the
    # stacked experts are rounded; the router is no Linear: float.
    flags = ("--quant-method", "rtn", "--symmetric") if method == "rtn" else ()  # the default: no flags
    out = build(ernie, tmp_path / "out", "-p", "int4", "--accuracy-level", "0", *flags)
    assert_rounded_parity(out, ernie, lambda model: fake_quantize_experts(model, symmetric=symmetric, method=method))


def test_genai_greedy_matches_transformers(ernie, tmp_path):
    out = build(ernie, tmp_path / "out", "-p", "fp32")
    assert json.loads((out / "genai_config.json").read_text())["model"]["type"] == "ernie4_5"
    assert_same_greedy(out, ernie, GENAI_PROMPT)


@pytest.mark.parametrize("config", [
    {},
    dict(num_hidden_layers=6, moe_layer_start_index=0, moe_layer_end_index=4, moe_layer_interval=2,
         moe_num_shared_experts=0, use_bias=True, tie_word_embeddings=False, head_dim=64,
         rope_scaling={"type": "linear", "factor": 2.0}),
    dict(rope_theta=10_000.0, moe_norm_min=1e-6, moe_k=8, moe_num_experts=128, pad_token_id=None),
    # YaRN's original length defaults to the class's max_position_embeddings (131072), not Llama's 2048.
    dict(rope_scaling={"rope_type": "yarn", "factor": 4.0}),
])
def test_matches_transformers_config(config):
    hf = transformers.Ernie4_5_MoeConfig(**copy.deepcopy(config))  # transformers fills in the dicts it is given
    architecture = "Ernie4_5_MoeForCausalLM"
    c = architectures.load(architecture).parse_config({**config, "architectures": [architecture]}, architecture)
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "rms_norm_eps", "max_position_embeddings", "bos_token_id", "eos_token_id",
                "pad_token_id", "tie_word_embeddings", "use_bias", "moe_intermediate_size", "moe_k",
                "moe_num_experts", "moe_num_shared_experts", "moe_layer_start_index", "moe_layer_end_index",
                "moe_layer_interval", "moe_norm_min"):
        assert getattr(c, key) == getattr(hf, key), key
    assert c.rope_parameters == dict(hf.rope_parameters)
    assert c.head_dim == getattr(hf, "head_dim", hf.hidden_size // hf.num_attention_heads)
    layer = transformers.models.ernie4_5_moe.modeling_ernie4_5_moe.Ernie4_5_MoeDecoderLayer
    small = transformers.Ernie4_5_MoeConfig(**{**config, **TINY, "num_hidden_layers": c.num_hidden_layers,
                                              "moe_num_experts": 4, "moe_k": 2, "head_dim": 16})
    sparse = [type(layer(small, i).mlp).__name__.endswith("SparseMoeBlock") for i in range(c.num_hidden_layers)]
    assert [c.sparse(i) for i in range(c.num_hidden_layers)] == sparse
