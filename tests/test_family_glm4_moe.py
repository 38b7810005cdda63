"""GLM-4.5 MoE (Glm4MoeForCausalLM) against transformers: fp32 and int4 logits (the grouped sigmoid
router from standard operators, the experts in ONNX Runtime's MoE/QMoE), genai's greedy generation,
routing that the groups and the correction bias decide, the multi-token-prediction layer left out,
and config.json parsing against Glm4MoeConfig."""

import copy
import json
import shutil

import numpy as np
import pytest
import torch
import transformers
from conftest import TINY
from family_runner import assert_grouped_routing
from helpers import GENAI_PROMPT, PROMPT, assert_parity, build, make_checkpoint
from safetensors.numpy import load_file, save_file
from test_family_moe import assert_rounded_parity, fake_quantize_experts
from test_genai import assert_same_greedy

import architectures
from builder.cli import main

# Every feature on: 8 experts in 4 groups of 2, the best 2 groups kept, top-3 experts, weights
# normalized and scaled; a shared expert; layer 0 dense; partial rotary over 16 of 32 dims (head_dim
# its own key: 4 heads of 32 on a hidden size of 64); q/k norms; q/k/v biases.
CONFIG = dict(TINY, eos_token_id=255, num_hidden_layers=3, head_dim=32, n_routed_experts=8, num_experts_per_tok=3,
              n_group=4, topk_group=2, first_k_dense_replace=1, n_shared_experts=1, moe_intermediate_size=32,
              routed_scaling_factor=2.5, norm_topk_prob=True, use_qk_norm=True, attention_bias=True,
              partial_rotary_factor=0.5)
# Every option the other way: one group, un-normalized unscaled weights, no shared expert (transformers
# still saves its zero-wide MLP), no dense layer, q/k norms or biases, the whole head rotated.
PLAIN = dict(TINY, eos_token_id=255, n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1,
             first_k_dense_replace=0, n_shared_experts=0, moe_intermediate_size=32, norm_topk_prob=False,
             partial_rotary_factor=1.0)
ROUTER_SCALE = 30.0  # random routers are near-uniform; scaled up, their choices are decisive


@pytest.fixture(scope="module")
def glm4_moe(tmp_path_factory):
    return make(tmp_path_factory.mktemp("glm4_moe"))


def make(folder, config=CONFIG):
    folder = make_checkpoint(folder, "Glm4MoeConfig", **config)
    tensors, rng = load_file(folder / "model.safetensors"), np.random.default_rng(1)
    for key, value in tensors.items():
        if key.endswith("_proj.bias"):  # transformers initializes biases to zero
            tensors[key] = (0.1 * rng.standard_normal(value.shape)).astype(value.dtype)
        if key.endswith("mlp.gate.weight"):
            tensors[key] = value * ROUTER_SCALE
        if key.endswith("e_score_correction_bias"):  # of the order of the sigmoid scores it corrects
            tensors[key] = (0.3 * rng.standard_normal(value.shape)).astype(value.dtype)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


def routers(model):
    return [m for m in model.modules() if type(m).__name__ == "Glm4MoeTopkRouter"]


def router_logits(model, ids):
    """Every sparse layer's router logits (tokens, experts) for a forward pass over `ids`."""
    seen = []
    hooks = [m.register_forward_hook(lambda m, i, o: seen.append(o[0].detach().float().numpy())) for m in routers(model)]
    with torch.no_grad():
        model(torch.tensor([ids]))
    for h in hooks:
        h.remove()
    return seen


def test_routing_is_decisive_and_groups_and_bias_change_it(glm4_moe):
    # The parity tests below prove the router only if its choices are clear-cut (no near-tie an
    # ulp could flip) and if both the group restriction and the bias change some token's experts.
    model = transformers.AutoModelForCausalLM.from_pretrained(glm4_moe, dtype=torch.float32).eval()
    biases = [r.e_score_correction_bias.detach().numpy() for r in routers(model)]
    k, G, kept = CONFIG["num_experts_per_tok"], CONFIG["n_group"], CONFIG["topk_group"]
    seen = [router_logits(model, ids) for ids in (PROMPT, GENAI_PROMPT)]
    assert all(len(layer) == len(biases) == 2 for layer in seen)
    assert_grouped_routing([(logits, bias) for layer in seen for logits, bias in zip(layer, biases)], k, G, kept)


def test_fp32_matches_transformers(glm4_moe, tmp_path):
    assert_parity(build(glm4_moe, tmp_path / "out", "-p", "fp32"), glm4_moe, tolerance=1e-4)


def test_fp16_matches_transformers(glm4_moe, tmp_path):
    # float16 activations; the router still in float32, as transformers runs it.
    assert_parity(build(glm4_moe, tmp_path / "out", "-p", "fp16"), glm4_moe, tolerance=1e-2)


def test_plain_options_match_transformers(tmp_path):
    source = make(tmp_path / "plain", PLAIN)
    assert_parity(build(source, tmp_path / "out", "-p", "fp32"), source, tolerance=1e-4)


def test_next_token_layer_and_stacked_experts(glm4_moe, tmp_path, capsys):
    # The hub's multi-token-prediction layer (model.layers.{num_hidden_layers}.*) is left out with
    # --no-mtp (built as mtp.onnx otherwise: tests/test_mtp.py; this one lacks its enorm, which is
    # refused by name); an extra layer config.json does not count is refused. Glm4MoeExperts' own
    # layout, gate_up_proj [E, 2I, H] (gate rows, then up) and down_proj [E, H, I], builds the same model.
    source = tmp_path / "stacked"
    shutil.copytree(glm4_moe, source)
    tensors = load_file(source / "model.safetensors")
    E, n = CONFIG["n_routed_experts"], CONFIG["num_hidden_layers"]
    for layer in (1, 2):
        p = f"model.layers.{layer}.mlp.experts."
        each = {x: [tensors.pop(f"{p}{e}.{x}_proj.weight") for e in range(E)] for x in ("gate", "up", "down")}
        tensors[p + "gate_up_proj"] = np.stack([np.concatenate(x) for x in zip(each["gate"], each["up"])])
        tensors[p + "down_proj"] = np.stack(each["down"])
    mtp = {k.replace("layers.2.", f"layers.{n}."): v for k, v in tensors.items() if k.startswith("model.layers.2.")}
    mtp[f"model.layers.{n}.eh_proj.weight"] = np.zeros((64, 128), np.float32)
    save_file({**tensors, **mtp}, source / "model.safetensors", metadata={"format": "pt"})
    assert_parity(build(source, tmp_path / "out", "-p", "fp32", "--no-mtp"), glm4_moe, tolerance=1e-4)
    capsys.readouterr()
    assert main(["-m", str(source), "-o", str(tmp_path / "head"), "-q", "-p", "fp32"]) == 2
    assert f"model.layers.{n}.enorm.weight" in capsys.readouterr().err
    config = json.loads((source / "config.json").read_text())
    (source / "config.json").write_text(json.dumps({**config, "num_nextn_predict_layers": 0}))
    assert main(["-m", str(source), "-o", str(tmp_path / "refused"), "-q", "-p", "fp32"]) == 2
    assert f"does not use: model.layers.{n}." in capsys.readouterr().err


@pytest.mark.parametrize("method, symmetric", [("rtn", True), ("search", False)], ids=["rtn", "default"])
def test_int4_matches_fake_quantized_transformers(glm4_moe, tmp_path, method, symmetric):
    # Every nn.Linear and the experts are rounded; the router is no Linear: float.
    flags = ("--quant-method", "rtn", "--symmetric") if method == "rtn" else ()  # the default: no flags
    out = build(glm4_moe, tmp_path / "out", "-p", "int4", "--accuracy-level", "0", *flags)
    assert_rounded_parity(out, glm4_moe, lambda model: fake_quantize_experts(model, symmetric=symmetric, method=method))


def test_genai_greedy_matches_transformers(glm4_moe, tmp_path):
    out = build(glm4_moe, tmp_path / "out", "-p", "fp32")
    assert json.loads((out / "genai_config.json").read_text())["model"]["type"] == "chatglm"
    assert_same_greedy(out, glm4_moe, GENAI_PROMPT)


@pytest.mark.parametrize("config", [
    {},
    dict(n_group=8, topk_group=4, n_routed_experts=256, routed_scaling_factor=2.5, use_qk_norm=True, head_dim=128,
         hidden_size=5120, num_attention_heads=96, first_k_dense_replace=3, num_hidden_layers=92,
         partial_rotary_factor=0.5, rope_theta=1_000_000, attention_bias=True),
    dict(num_local_experts=64, norm_topk_prob=False, n_shared_experts=2, rope_scaling={"type": "linear", "factor": 2.0},
         eos_token_id=[151329, 151336, 151338], pad_token_id=151329),
    dict(rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 10_000.0}),
])
def test_matches_transformers_config(config):
    config = {"head_dim": 128, **config}  # the hub's configs give it (the class's defaults do not divide: 4096 / 96)
    hf = transformers.Glm4MoeConfig(**copy.deepcopy(config))  # transformers fills in the dicts it is given
    architecture = "Glm4MoeForCausalLM"
    c = architectures.load(architecture).parse_config({**config, "architectures": [architecture]}, architecture)
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "rms_norm_eps", "max_position_embeddings", "bos_token_id", "eos_token_id",
                "pad_token_id", "tie_word_embeddings", "attention_bias", "moe_intermediate_size",
                "num_experts_per_tok", "n_shared_experts", "n_routed_experts", "routed_scaling_factor", "n_group",
                "topk_group", "first_k_dense_replace", "norm_topk_prob", "use_qk_norm", "hidden_act"):
        assert getattr(c, key) == getattr(hf, key), key
    assert c.num_nextn_predict_layers == hf.num_mtp_layers
    assert c.rope_parameters == dict(hf.rope_parameters)
    assert c.head_dim == getattr(hf, "head_dim", hf.hidden_size // hf.num_attention_heads)
    layer = transformers.models.glm4_moe.modeling_glm4_moe.Glm4MoeDecoderLayer
    small = transformers.Glm4MoeConfig(**{**config, **TINY, "num_hidden_layers": 4, "n_routed_experts": 8,
                                          "num_local_experts": 8, "head_dim": 16, "n_group": 1, "topk_group": 1})
    sparse = [type(layer(small, i).mlp).__name__ == "Glm4MoeMoE" for i in range(4)]
    assert [c.sparse(i) for i in range(4)] == sparse


@pytest.mark.parametrize("config, message", [
    (dict(n_group=3), "groups must split the experts evenly"),
    (dict(n_group=4, topk_group=5), "topk_group be 1 to n_group"),
    (dict(n_group=128), "the group score needs two"),
    (dict(n_group=8, topk_group=1, num_experts_per_tok=17), "of the 16 experts the chosen groups hold"),
    (dict(hidden_act="gelu"), "SwiGLU"),
])
def test_routing_it_cannot_compute_is_refused(config, message):
    from builder.errors import BuildError

    architecture = "Glm4MoeForCausalLM"
    with pytest.raises(BuildError, match=message):
        architectures.load(architecture).parse_config({"head_dim": 128, **config, "architectures": [architecture]},
                                                      architecture)
