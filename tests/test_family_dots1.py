"""dots.llm1 (Dots1ForCausalLM) against transformers: fp32 and int4 logits (GLM-4.5's grouped sigmoid
router and experts under Qwen3's attention, a sliding window on the last layer), genai's greedy
generation as a qwen3, routing that the groups and the correction bias decide, and config.json
parsing against Dots1Config."""

import copy
import json

import numpy as np
import pytest
import torch
import transformers
from conftest import TINY
from family_runner import assert_grouped_routing
from helpers import GENAI_PROMPT, PROMPT, assert_parity, build, make_checkpoint, relative_error
from safetensors.numpy import load_file, save_file
from test_family_moe import assert_rounded_parity, fake_quantize_experts
from test_genai import assert_same_greedy

import architectures
from builder.errors import BuildError

ARCHITECTURE = "Dots1ForCausalLM"
# Every feature on: 8 experts in 4 groups of 2, the best 2 groups kept, top-3 experts, weights
# normalized and scaled; two shared experts; layer 0 dense; q/k/v/o biases; head_dim its own key
# (4 heads of 32 on a hidden size of 64); the last layer sliding over 4 of the prompt's 10 tokens.
CONFIG = dict(TINY, eos_token_id=255, num_hidden_layers=3, head_dim=32, n_routed_experts=8, num_experts_per_tok=3,
              n_group=4, topk_group=2, first_k_dense_replace=1, n_shared_experts=2, moe_intermediate_size=32,
              routed_scaling_factor=2.5, norm_topk_prob=True, attention_bias=True, sliding_window=4,
              max_window_layers=2, rope_parameters={"rope_type": "default", "rope_theta": 50_000.0})
# Every option the other way: one group, un-normalized unscaled weights, no shared expert (transformers
# still saves its zero-wide MLP), no dense layer, no biases, no window.
PLAIN = dict(TINY, eos_token_id=255, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=0,
             moe_intermediate_size=32, sliding_window=None)
ROUTER_SCALE = 30.0  # random routers are near-uniform; scaled up, their choices are decisive


def make(folder, config=CONFIG):
    folder = make_checkpoint(folder, "Dots1Config", **config)
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


@pytest.fixture(scope="module")
def dots1(tmp_path_factory):
    return make(tmp_path_factory.mktemp("dots1"))


def routing(model, ids):
    """Every sparse layer's (router logits (tokens, experts), correction bias) over `ids`."""
    routers = [m for m in model.modules() if type(m).__name__ == "Dots1TopkRouter"]
    seen = []
    hooks = [r.register_forward_hook(lambda m, i, o: seen.append(o[0].detach().numpy())) for r in routers]
    with torch.no_grad():
        model(torch.tensor([ids]))
    for h in hooks:
        h.remove()
    return list(zip(seen, (r.e_score_correction_bias.numpy() for r in routers), strict=True))


def test_routing_is_decisive_and_groups_and_bias_change_it(dots1):
    # The parity tests prove the router only if its choices are clear-cut (no near-tie an ulp could
    # flip) and if both the group restriction and the bias change some token's experts.
    model = transformers.AutoModelForCausalLM.from_pretrained(dots1, dtype=torch.float32).eval()
    k, G, kept = CONFIG["num_experts_per_tok"], CONFIG["n_group"], CONFIG["topk_group"]
    seen = [routing(model, ids) for ids in (PROMPT, GENAI_PROMPT)]
    assert all(len(layers) == 2 for layers in seen)
    assert_grouped_routing([r for layers in seen for r in layers], k, G, kept)


def test_fp32_matches_transformers(dots1, tmp_path):
    # The last layer's window (4 of the prompt's 10 tokens) moves its logits: a build that ignored
    # it would fail (test_window_changes_the_logits).
    assert_parity(build(dots1, tmp_path / "out", "-p", "fp32"), dots1, tolerance=1e-4)


def test_window_changes_the_logits(dots1):
    model = transformers.AutoModelForCausalLM.from_pretrained(dots1, dtype=torch.float32).eval()
    with torch.no_grad():
        windowed = model(torch.tensor([PROMPT])).logits
        model.config.layer_types = ["full_attention"] * CONFIG["num_hidden_layers"]
        model.model.layers[2].self_attn.sliding_window = None
        unwindowed = model(torch.tensor([PROMPT])).logits
    assert torch.allclose(windowed[0, :4], unwindowed[0, :4], atol=1e-5)  # the first 4 tokens see no further back
    assert relative_error(unwindowed.numpy(), windowed.numpy()) > 100 * 1e-4  # 100 times the parity tolerance


def test_fp16_matches_transformers(dots1, tmp_path):
    # float16 activations; the router still in float32, as transformers runs it.
    assert_parity(build(dots1, tmp_path / "out", "-p", "fp16"), dots1, tolerance=1e-2)


def test_plain_options_match_transformers(tmp_path):
    source = make(tmp_path / "plain", PLAIN)
    assert_parity(build(source, tmp_path / "out", "-p", "fp32"), source, tolerance=1e-4)


@pytest.mark.parametrize("method, symmetric", [("rtn", True), ("search", False)], ids=["rtn", "default"])
def test_int4_matches_fake_quantized_transformers(dots1, tmp_path, method, symmetric):
    # Every nn.Linear and the experts are rounded; the router is no Linear: float.
    flags = ("--quant-method", "rtn", "--symmetric") if method == "rtn" else ()  # the default: no flags
    out = build(dots1, tmp_path / "out", "-p", "int4", "--accuracy-level", "0", *flags)
    assert_rounded_parity(out, dots1, lambda model: fake_quantize_experts(model, symmetric=symmetric, method=method))


def test_genai_greedy_matches_transformers(dots1, tmp_path):
    out = build(dots1, tmp_path / "out", "-p", "fp32")
    assert json.loads((out / "genai_config.json").read_text())["model"]["type"] == "qwen3"
    assert_same_greedy(out, dots1, GENAI_PROMPT)


@pytest.mark.parametrize("config", [
    dict(n_routed_experts=128, num_experts_per_tok=6, n_shared_experts=2),
    # dots.llm1.inst's settings: one group, the first layer dense, normalized and scaled, no window.
    dict(vocab_size=152064, hidden_size=4096, num_hidden_layers=62, head_dim=128, n_routed_experts=128,
         num_experts_per_tok=6, n_shared_experts=2, first_k_dense_replace=1, norm_topk_prob=True,
         routed_scaling_factor=2.5, rope_theta=10_000_000, sliding_window=None, max_position_embeddings=32768,
         rms_norm_eps=1e-5, eos_token_id=151649, pad_token_id=151643),
    dict(num_local_experts=16, num_experts_per_tok=4, n_shared_experts=1, n_group=4, topk_group=2,
         attention_bias=True, max_window_layers=40, max_position_embeddings=8192,
         rope_scaling={"type": "linear", "factor": 2.0}),
    dict(n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1, sliding_window=1024, num_hidden_layers=6,
         layer_types=["sliding_attention", "full_attention"] * 3,
         rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 10_000.0}),
])
def test_matches_transformers_config(config):
    hf = transformers.Dots1Config(**copy.deepcopy(config))  # transformers fills in the dicts it is given
    c = architectures.load(ARCHITECTURE).parse_config({**config, "architectures": [ARCHITECTURE]}, ARCHITECTURE)
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "rms_norm_eps", "max_position_embeddings", "bos_token_id", "eos_token_id",
                "pad_token_id", "tie_word_embeddings", "attention_bias", "moe_intermediate_size",
                "num_experts_per_tok", "n_shared_experts", "n_routed_experts", "routed_scaling_factor", "n_group",
                "topk_group", "first_k_dense_replace", "norm_topk_prob", "hidden_act", "sliding_window",
                "layer_types"):
        assert getattr(c, key) == getattr(hf, key), key
    assert c.rope_parameters == dict(hf.rope_parameters)
    assert c.head_dim == getattr(hf, "head_dim", hf.hidden_size // hf.num_attention_heads)
    assert [c.window(i) for i in range(c.num_hidden_layers)] == [
        hf.sliding_window if t == "sliding_attention" else None for t in hf.layer_types]
    modeling = transformers.models.dots1.modeling_dots1
    small = transformers.Dots1Config(**{**config, **TINY, "num_hidden_layers": 4, "head_dim": 16,
                                        "n_group": 1, "topk_group": 1, "layer_types": None})
    sparse = [isinstance(modeling.Dots1DecoderLayer(small, i).mlp, modeling.Dots1MoE) for i in range(4)]
    assert [c.sparse(i) for i in range(4)] == sparse


@pytest.mark.parametrize("config, message", [
    ({}, "n_routed_experts, num_experts_per_tok, n_shared_experts missing"),
    (dict(n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1, partial_rotary_factor=0.5,
          rope_scaling={"rope_type": "linear", "factor": 2.0}), "rotates the whole head"),
    (dict(n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1, max_window_layers=None),
     "max_window_layers is null"),
    (dict(n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1, n_group=3), "split the experts evenly"),
])
def test_what_transformers_cannot_build_is_refused(config, message):
    with pytest.raises(BuildError, match=message):
        architectures.load(ARCHITECTURE).parse_config({**config, "architectures": [ARCHITECTURE]}, ARCHITECTURE)


def test_a_partial_rotary_factor_is_ignored_as_transformers_does():
    # Dots1's default rotary (its own compute_default_rope_parameters) rotates the whole head, and
    # transformers runs such a config; builder refused it ("rotates the whole head").
    raw = dict(TINY, n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1, partial_rotary_factor=0.5,
               architectures=[ARCHITECTURE])
    hf = transformers.Dots1Config(**raw)
    model = transformers.AutoModelForCausalLM.from_config(hf)
    c = architectures.load(ARCHITECTURE).parse_config(raw, ARCHITECTURE)
    assert "partial_rotary_factor" not in c.rope_parameters
    assert model.model.rotary_emb.inv_freq.shape == (c.head_dim // 2,)


def test_dense_only_needs_no_expert_keys():
    # Every layer dense (first_k_dense_replace past the last layer): transformers builds no router,
    # and neither key is needed.
    raw = dict(TINY, first_k_dense_replace=2, architectures=[ARCHITECTURE])
    c = architectures.load(ARCHITECTURE).parse_config(raw, ARCHITECTURE)
    assert not any(c.sparse(i) for i in range(c.num_hidden_layers))
