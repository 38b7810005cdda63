"""Cohere 2 MoE (architectures/cohere2_moe.py: Cohere 2's parallel layer with dense and sparse MLPs,
a softmax or sigmoid top-k router and shared experts) against transformers: the shared family
proofs (tests/family_runner.py), int4 with the stacked experts rounded too, decisive routing, the
features the proofs see (each changes the logits), the layers' kinds as transformers builds them,
and what builder refuses."""

import json

import numpy as np
import pytest
import torch
import transformers
from conftest import TINY
from family_runner import CONFIG_FIELDS, FamilyTest, assert_steps_match, family_tests, load
from helpers import GENAI_PROMPT, PROMPT, build, make_checkpoint, relative_error
from safetensors.numpy import load_file, save_file
from test_family_moe import fake_quantize_experts

import architectures
from builder.errors import BuildError

ARCHITECTURE = "Cohere2MoeForCausalLM"
# 4 query heads of 16 over 2 KV heads (head_dim its own key: 128 otherwise), experts of 32;
# weights of 0.1, so that every branch moves the logits.
BASE = dict(TINY, intermediate_size=32, head_dim=16, initializer_range=0.1)
VARIANTS = {
    # Every feature on: a dense first layer (48 wide) that is global and rotates (force_rope), a
    # global sparse layer without rotary, windows of 4 (shorter than the prompt); the sigmoid
    # router, top-3 of 8, normalized; two shared experts averaged in; q/k/v/o biases; LayerNorms;
    # an untied vocabulary; logit_scale 0.5.
    "sigmoid-average": dict(
        num_hidden_layers=4, layer_types=["full_attention", "sliding_attention", "full_attention", "sliding_attention"],
        mlp_layer_types=["dense", "sparse", "sparse", "sparse"], sliding_window=4, prefix_dense_intermediate_size=48,
        num_experts=8, num_experts_per_tok=3, expert_selection_fn="sigmoid", num_shared_experts=2,
        attention_bias=True, tie_word_embeddings=False, logit_scale=0.5),
    # The other way: the softmax router, top-2 of 4, one shared expert summed in; RMSNorms; a dense
    # global layer that does not rotate (prefix_dense_sliding_window_pattern 2); YaRN; tied.
    "softmax-sum-rms": dict(
        num_hidden_layers=3, layer_types=["sliding_attention", "full_attention", "full_attention"],
        mlp_layer_types=["sparse", "dense", "sparse"], sliding_window=3, prefix_dense_sliding_window_pattern=2,
        num_experts=4, num_experts_per_tok=2, num_shared_experts=1, shared_expert_combination_strategy="sum",
        rms_norm_eps=1e-6, logit_scale=2.0,
        rope_parameters=dict(rope_type="yarn", rope_theta=1e4, factor=4.0, original_max_position_embeddings=4)),
}
# Random routers are near uniform: drawn wider, their top-k choices are decisive (the sigmoid one
# less, so its weights do not saturate).
ROUTER_STD = {"softmax": 0.25, "sigmoid": 0.2}


def make(folder, config):
    """transformers' random checkpoint with wider routers and random attention biases (zero at init)."""
    make_checkpoint(folder, "Cohere2MoeConfig", **config)
    tensors, rng = load_file(folder / "model.safetensors"), np.random.default_rng(1)
    for key, value in tensors.items():
        if key.endswith("mlp.gate.weight"):
            std = ROUTER_STD[config.get("expert_selection_fn", "softmax")]
            tensors[key] = (std * rng.standard_normal(value.shape)).astype(value.dtype)
        elif key.endswith("_proj.bias"):
            tensors[key] = (0.1 * rng.standard_normal(value.shape)).astype(value.dtype)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


SPEC = FamilyTest(
    ARCHITECTURE, "Cohere2MoeConfig", VARIANTS, base=BASE, make=make, genai_type="llama", ragged=True,
    fp16_tolerance=1e-2, layer_lists=True, name="cohere2_moe",  # layer_lists: layer_types, mlp_layer_types
    # Cohere2MoeExperts holds the experts as stacked Parameters that the build's QMoE rounds.
    quantize=fake_quantize_experts,
    config_raws=(
        {},
        # first_k_dense_replace instead of the lists (Cohere2MoeConfig.__post_init__ reads it and
        # keeps none), rope_theta beside a null rope_scaling, a prefix with its own pattern
        dict(num_hidden_layers=10, first_k_dense_replace=3, prefix_dense_sliding_window_pattern=2,
             prefix_dense_intermediate_size=24576, rope_theta=50000.0, rope_scaling=None, num_experts=64,
             num_experts_per_tok=6, num_shared_experts=1, expert_selection_fn="sigmoid", norm_topk_prob=False,
             sliding_window=4096, max_position_embeddings=131072, eos_token_id=[255001, 255004]),
        # rope_scaling, which Cohere2MoeConfig keeps and never reads: the default rotary
        dict(rms_norm_eps=1e-5, layer_types=["full_attention"] * 40, shared_expert_combination_strategy="sum",
             rope_scaling=dict(type="yarn", factor=4.0, original_max_position_embeddings=8192)),
        # a top-level factor beside rope_parameters, which it does not take: the whole head rotates
        dict(partial_rotary_factor=0.5, rope_parameters=dict(rope_type="yarn", rope_theta=1e4, factor=4.0,
                                                             original_max_position_embeddings=2048)),
    ),
    config_fields=(*CONFIG_FIELDS, "head_dim", "rms_norm_eps", "layer_norm_eps", "logit_scale", "attention_bias",
                   "sliding_window", "layer_types", "mlp_layer_types", "prefix_dense_intermediate_size",
                   "prefix_dense_sliding_window_pattern", "sliding_window_pattern", "num_experts",
                   "num_experts_per_tok", "num_shared_experts", "shared_expert_combination_strategy",
                   "expert_selection_fn", "norm_topk_prob"),
)
globals().update(family_tests(SPEC))


def test_routing_is_decisive(family_checkpoint):
    # The parity proofs prove the router only if its choices are clear-cut: no near-tie between
    # the k-th and the next logit (both selection functions pick the top-k logits).
    model = load(family_checkpoint)
    routers = [m for m in model.modules() if type(m).__name__ == "Cohere2MoeTopKRouter"]
    seen = []
    hooks = [r.register_forward_hook(lambda m, i, o: seen.append(o[0].numpy())) for r in routers]
    with torch.no_grad():
        model(torch.tensor([PROMPT + GENAI_PROMPT]))
    for h in hooks:
        h.remove()
    k = model.config.num_experts_per_tok
    assert seen and len(seen) == len(routers)
    for logits in seen:
        top = np.sort(logits, -1)[:, ::-1]
        assert (top[:, k - 1] - top[:, k]).min() > 1e-3, "a near-tie in the top-k choice"


def _set(model, change):
    layer, path, value = change
    target = model.model.layers[layer]
    *parents, name = path.split(".")
    for p in parents:
        target = getattr(target, p)
    setattr(target, name, value)


@pytest.mark.parametrize("variant, change", [
    ("sigmoid-average", (0, "self_attn.force_rope", False)),  # the dense global layer's rotary
    ("sigmoid-average", (2, "self_attn.force_rope", True)),  # a sparse global layer has none
    ("sigmoid-average", (1, "mlp.shared_expert_combination_strategy", "sum")),
    ("sigmoid-average", (1, "mlp.gate.norm_topk_prob", False)),
    ("sigmoid-average", (1, "mlp.gate.expert_selection_fn", "softmax")),
    ("softmax-sum-rms", (1, "self_attn.force_rope", True)),  # prefix pattern 2: no forced rotary
    ("softmax-sum-rms", (0, "mlp.shared_expert_combination_strategy", "average")),
])
def test_each_feature_changes_the_logits(variant, change, tmp_path):
    # A build that got one of these wrong would fail the fp32 proof: each moves transformers'
    # logits far past its tolerance.
    model = load(SPEC.checkpoint(tmp_path, variant))
    with torch.no_grad():
        want = model(torch.tensor([PROMPT])).logits.numpy()
        _set(model, change)
        changed = model(torch.tensor([PROMPT])).logits.numpy()
    assert relative_error(changed, want) > 100 * 1e-4


def test_unnormalized_sigmoid_router_without_shared_experts(tmp_path):
    # norm_topk_prob false: the sigmoid weights as they are; no shared experts at all.
    source = SPEC.checkpoint(tmp_path / "src", "sigmoid-average", norm_topk_prob=False, num_shared_experts=0)
    assert_steps_match(build(source, tmp_path / "out", "-p", "fp32"), load(source))


@pytest.mark.parametrize("raw", [
    dict(num_hidden_layers=6, first_k_dense_replace=2),
    dict(num_hidden_layers=7, first_k_dense_replace=3, prefix_dense_sliding_window_pattern=2, sliding_window_pattern=3),
    dict(num_hidden_layers=4, first_k_dense_replace=1, layer_types=["sliding_attention"] * 4),
    dict(num_hidden_layers=4, mlp_layer_types=["sparse", "dense", "sparse", "dense"],
         prefix_dense_sliding_window_pattern=1),
    dict(num_hidden_layers=3, first_k_dense_replace=5, layer_types=["full_attention"] * 3),  # every layer dense
])
def test_layers_are_transformers(raw):
    # Which layers slide, rotate and route, as Cohere2MoeDecoderLayer builds them.
    from transformers.models.cohere2_moe.modeling_cohere2_moe import (Cohere2MoeDecoderLayer,
                                                                        Cohere2MoeSparseMoeBlock)

    c = architectures.load(ARCHITECTURE).parse_config(dict(raw, architectures=[ARCHITECTURE]), ARCHITECTURE)
    small = transformers.Cohere2MoeConfig(**{**BASE, **raw, "num_experts": 4})
    with torch.device("meta"):
        layers = [Cohere2MoeDecoderLayer(small, i) for i in range(small.num_hidden_layers)]
    assert c.layer_types == small.layer_types
    assert [c.mlp_layer_types[i] == "sparse" for i in range(c.num_hidden_layers)] == [
        isinstance(layer.mlp, Cohere2MoeSparseMoeBlock) for layer in layers]
    assert [c.rotates(i) for i in range(c.num_hidden_layers)] == [
        layer.self_attn.sliding_window is not None or layer.self_attn.force_rope for layer in layers]


def _transformers_fails(raw) -> bool:
    try:
        config = transformers.Cohere2MoeConfig(**{**BASE, "num_experts": 4, **raw})
        model = transformers.AutoModelForCausalLM.from_config(config).eval()
        with torch.no_grad():
            model(torch.tensor([PROMPT]))
    except Exception:  # noqa: BLE001 - any refusal
        return True
    return False


@pytest.mark.parametrize("raw, message, theirs", [
    (dict(sliding_window=None, layer_types=["full_attention"] * 2), "sliding_window is null", True),
    (dict(sliding_window=0), "sliding_window is 0", True),
    (dict(mlp_layer_types=["dense"]), "one of 'dense' or 'sparse' per layer", True),
    (dict(mlp_layer_types=["dense", "moe"]), "one of 'dense' or 'sparse' per layer", True),
    (dict(expert_selection_fn="sparsemax"), "expert_selection_fn 'sparsemax'", True),
    (dict(num_shared_experts=1, shared_expert_combination_strategy="max"), "takes average or sum", True),
    (dict(num_experts_per_tok=5), "num_experts_per_tok=5 of 4 experts", True),
    (dict(sliding_window_pattern=0), "pattern of 0", True),
    (dict(head_dim=None), "head_dim is null", True),
    (dict(rope_parameters=None), "rope_parameters is null", True),
    (dict(num_hidden_layers=2, first_k_dense_replace=3), "3 entries for 2 layers", True),
    (dict(hidden_act="gelu"), "SwiGLU", False),  # transformers runs gelu-gated experts; ONNX Runtime's MoE cannot
])
def test_refused(raw, message, theirs):
    with pytest.raises(BuildError, match=message):
        config = {**BASE, "num_experts": 4, **raw, "architectures": [ARCHITECTURE]}
        architectures.load(ARCHITECTURE).parse_config(config, ARCHITECTURE)
    assert _transformers_fails(raw) == theirs


def test_the_expert_checks_spare_dense_models():
    # The checks bite only where transformers fails: a dense-only model takes any router setting,
    # any activation, and a window of 0 when no layer slides.
    raw = dict(architectures=[ARCHITECTURE], num_hidden_layers=2, mlp_layer_types=["dense", "dense"],
               hidden_act="gelu", num_experts=0, expert_selection_fn="sparsemax", sliding_window=0,
               layer_types=["full_attention"] * 2)
    architectures.load(ARCHITECTURE).parse_config(raw, ARCHITECTURE)
    assert not _transformers_fails({k: v for k, v in raw.items() if k != "architectures"})


def test_the_model_type_selects_the_row(tmp_path):
    # transformers' auto classes build model_type cohere2_moe as Cohere2MoeForCausalLM whatever
    # config.json's architectures says; builder reads the row the same way.
    source = SPEC.checkpoint(tmp_path / "src", "softmax-sum-rms")
    raw = json.loads((source / "config.json").read_text())
    (source / "config.json").write_text(json.dumps({**raw, "architectures": ["Cohere2MoEForCausalLM"]}))
    assert_steps_match(build(source, tmp_path / "out", "-p", "fp32"), load(source))


def test_rope_scaling_is_not_read(tmp_path):
    # The hub's spelling of a scaled rotary (rope_theta beside rope_scaling, no rope_parameters):
    # transformers' Cohere2MoeConfig keeps rope_scaling as a field and rotates by the default rope
    # at rope_theta, and so does the build (which built YaRN from it before, far from transformers).
    source = SPEC.checkpoint(tmp_path / "src", "softmax-sum-rms")
    raw = json.loads((source / "config.json").read_text())
    rope = raw.pop("rope_parameters")
    raw.update(rope_theta=rope["rope_theta"],
               rope_scaling=dict(type="yarn", factor=4.0, original_max_position_embeddings=4))
    (source / "config.json").write_text(json.dumps(raw))
    model = load(source)
    assert model.config.rope_parameters == {"rope_type": "default", "rope_theta": rope["rope_theta"]}
    assert_steps_match(build(source, tmp_path / "out", "-p", "fp32"), model)
