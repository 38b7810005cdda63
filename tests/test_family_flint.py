"""Flint (architectures/flint.py: Qwen3-MoE's layer with attention sinks, sliding layers that alone
rotate, a sigmoid router and an ungated shared expert) against transformers: the shared family
proofs (tests/family_runner.py), int4 with the stacked experts rounded too, the features that
change the logits, the sparse layers as transformers builds them, and what builder refuses.

Random where transformers initializes to constants or near them: the sinks (normal at 0.02), the
attention biases (zero); the routers scaled up so their top-k choices are decisive (a sigmoid
router with no bias: scaled moderately, its scores stay unsaturated)."""

import json

import numpy as np
import pytest
import torch
import transformers
from conftest import TINY
from family_runner import (
    CONFIG_FIELDS, FamilyTest, assert_steps_match, family_tests, load, router_outputs, modules_named,
)
from helpers import GENAI_PROMPT, PROMPT, build, make_checkpoint, relative_error
from safetensors.numpy import load_file, save_file
from test_family_moe import fake_quantize_experts

import architectures
from builder.errors import BuildError

ARCHITECTURE = "FlintForCausalLM"
ROUTER_SCALE = 10.0  # the router's logits a few units: decisive choices, unsaturated scores
# 4 query heads of 16 over 2 KV heads (head_dim its own key: FlintConfig's default is 128).
BASE = dict(TINY, head_dim=16, eos_token_id=2)
YARN = dict(rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=4)
VARIANTS = {
    # Every feature on: sliding layers (a window of 4, shorter than the prompts) between full ones,
    # attention biases, layer 0 dense, then top-3 of 8 experts renormalized beside a shared expert.
    "biases": dict(num_hidden_layers=4, sliding_window=4, attention_bias=True, mlp_only_layers=[0],
                   layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
                   num_experts=8, num_experts_per_tok=3, moe_intermediate_size=32, shared_expert_intermediate_size=48),
    # The other way: FlintConfig's own layer_types and mlp_only_layers ([0, 1]) over 6 layers, every
    # second layer sparse (layers 3 and 5), top-2 of 4 un-normalized, YaRN scaled past a pretraining
    # length of 4 on the sliding layers, a tied vocabulary.
    "pattern": dict(num_hidden_layers=6, sliding_window=5, decoder_sparse_step=2, num_experts=4,
                    num_experts_per_tok=2, norm_topk_prob=False, moe_intermediate_size=32,
                    shared_expert_intermediate_size=16, tie_word_embeddings=True, rope_parameters=YARN),
}


def make(folder, config):
    make_checkpoint(folder, "FlintConfig", seed=1, **config)  # seed 1: no near-tie over the prompts
    tensors, rng = load_file(folder / "model.safetensors"), np.random.default_rng(1)
    for key, value in tensors.items():
        if key.endswith("mlp.gate.weight"):
            tensors[key] = value * ROUTER_SCALE
        elif key.endswith(("_proj.bias", "self_attn.softmax_offset")):
            tensors[key] = rng.standard_normal(value.shape).astype(value.dtype)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


SPEC = FamilyTest(
    ARCHITECTURE, "FlintConfig", VARIANTS, base=BASE, make=make, genai_type="qwen3", genai_variant="pattern",
    ragged=True, fp16_tolerance=1e-2, layer_lists=True,  # layer_types, mlp_only_layers
    quantize=fake_quantize_experts,  # FlintExperts' stacked gate_up_proj/down_proj, rounded as QMoE rounds them
    config_raws=(
        {},
        # the hub's spellings: rope_theta beside a null rope_scaling, Qwen2-MoE's keys FlintConfig
        # ignores, null layer lists (its __post_init__ fills them)
        dict(num_hidden_layers=12, rope_theta=1e6, rope_scaling=None, use_sliding_window=False, max_window_layers=4,
             qkv_bias=True, layer_types=None, mlp_only_layers=None, sliding_window=1024, eos_token_id=[1, 2],
             tie_word_embeddings=True),
        dict(rope_scaling=dict(type="yarn", factor=4.0, original_max_position_embeddings=32768),
             mlp_only_layers=[], decoder_sparse_step=2),
    ),
    config_fields=(*CONFIG_FIELDS, "head_dim", "rms_norm_eps", "attention_bias", "sliding_window", "layer_types",
                   "mlp_only_layers", "decoder_sparse_step", "moe_intermediate_size", "shared_expert_intermediate_size",
                   "num_experts", "num_experts_per_tok", "norm_topk_prob"),
)
globals().update(family_tests(SPEC))


def test_routing_is_decisive(family_checkpoint):
    # The parity proofs prove the router only if its choices are clear-cut (no near-tie an ulp
    # could flip) and its weights not saturated (sigmoid scores away from 1).
    model = load(family_checkpoint)
    k = model.config.num_experts_per_tok
    seen = router_outputs(model, modules_named(model, "FlintTopKRouter"), [PROMPT + GENAI_PROMPT])
    assert seen
    for logits in seen:
        top = np.sort(logits, -1)[:, ::-1]
        assert (top[:, k - 1] - top[:, k]).min() > 1e-3, "a near-tie in the top-k choice"
        assert (1 / (1 + np.exp(-top[:, 0]))).max() < 0.999, "saturated scores"


@pytest.fixture(scope="module")
def biases(tmp_path_factory):
    return SPEC.checkpoint(tmp_path_factory.mktemp("biases"), "biases")


def test_the_sinks_change_the_logits(biases):
    # A build that left the sinks out would fail the fp32 proof: without them (a logit of -1e4)
    # the logits move far past its tolerance.
    model = load(biases)
    with torch.no_grad():
        want = model(torch.tensor([PROMPT])).logits.numpy()
        for layer in model.model.layers:
            layer.self_attn.sinks.fill_(-1e4)
        without = model(torch.tensor([PROMPT])).logits.numpy()
    assert relative_error(without, want) > 100 * 1e-4


def test_full_layers_do_not_rotate(biases, tmp_path, monkeypatch):
    # The full-attention layers have no positional encoding: a build that rotated them too (as
    # Qwen3-MoE does every layer) is far from transformers.
    from architectures.flint import FlintConfig

    model = load(biases)
    monkeypatch.setattr(FlintConfig, "rotates", lambda self, layer: True)
    with pytest.raises(AssertionError, match="relative error"):
        assert_steps_match(build(biases, tmp_path / "out", "-p", "fp32"), model)


def test_no_layer_rotates(tmp_path):
    # Two layers, both full by FlintConfig's default: the rotary is never applied, so a partial
    # factor under a scaled rope (which transformers cannot apply) is built, not refused.
    rope = dict(YARN, partial_rotary_factor=0.5)
    source = make(tmp_path / "src", dict(BASE, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                                         shared_expert_intermediate_size=16, mlp_only_layers=[0],
                                         partial_rotary_factor=0.5, rope_parameters=rope))
    assert_steps_match(build(source, tmp_path / "out", "-p", "fp32"), load(source))


def test_transformers_names_and_another_class_spelling(tmp_path):
    # The names transformers holds in memory (`sinks`, the experts stacked [E, 2I, H] / [E, H, I]),
    # which it loads as they are, and config.json naming another class: transformers dispatches on
    # model_type, and so does builder.
    source = SPEC.checkpoint(tmp_path / "src", "biases")
    tensors, stacked = load_file(source / "model.safetensors"), {}
    for key, value in tensors.items():
        if ".experts." not in key:
            stacked[key.replace("self_attn.softmax_offset", "self_attn.sinks")] = value
    for i in (1, 2, 3):
        m = f"model.layers.{i}.mlp.experts."
        each = range(VARIANTS["biases"]["num_experts"])
        stacked[m + "gate_up_proj"] = np.stack([np.concatenate([tensors[f"{m}{e}.gate_proj.weight"],
                                                                tensors[f"{m}{e}.up_proj.weight"]]) for e in each])
        stacked[m + "down_proj"] = np.stack([tensors[f"{m}{e}.down_proj.weight"] for e in each])
    save_file(stacked, source / "model.safetensors", metadata={"format": "pt"})
    raw = json.loads((source / "config.json").read_text())
    (source / "config.json").write_text(json.dumps({**raw, "architectures": ["FlintLMHeadModel"]}))
    assert_steps_match(build(source, tmp_path / "out", "-p", "fp32"), load(source))


@pytest.mark.parametrize("raw", [
    dict(num_hidden_layers=6),
    dict(num_hidden_layers=6, mlp_only_layers=[2, 4], decoder_sparse_step=3),
    dict(num_hidden_layers=4, mlp_only_layers=[], num_experts=0),
])
def test_sparse_layers_are_transformers(raw):
    from transformers.models.flint.modeling_flint import FlintDecoderLayer, FlintSparseMoeBlock

    c = architectures.load(ARCHITECTURE).parse_config(dict(raw, architectures=[ARCHITECTURE]), ARCHITECTURE)
    small = transformers.FlintConfig(**{**BASE, **raw, "num_experts_per_tok": 2, "moe_intermediate_size": 8})
    with torch.device("meta"):
        sparse = [isinstance(FlintDecoderLayer(small, i).mlp, FlintSparseMoeBlock)
                  for i in range(small.num_hidden_layers)]
    assert [c.sparse(i) for i in range(c.num_hidden_layers)] == sparse
    assert c.layer_types == small.layer_types


@pytest.mark.parametrize("raw, message", [
    (dict(hidden_act="gelu"), "SwiGLU"),  # transformers runs gelu experts; no MoE/QMoE activation computes them
    (dict(num_experts=4, num_experts_per_tok=5), "num_experts_per_tok=5 of 4 experts"),  # its topk fails
    (dict(num_hidden_layers=4, sliding_window=0), "sliding_window 0"),  # its sliding mask fails
    (dict(sliding_window=None), "sliding_window is null"),  # FlintConfig types it int
    (dict(head_dim=None), "head_dim is null"),  # likewise
    (dict(decoder_sparse_step=0), "decoder_sparse_step"),  # its layers divide by it
    (dict(rope_parameters=dict(rope_type="linear", factor=2.0, partial_rotary_factor=0.5)),
     "partial_rotary_factor"),  # the sliding layers' cos/sin narrower than the head: transformers fails
])
def test_refused(raw, message):
    with pytest.raises(BuildError, match=message):
        architectures.load(ARCHITECTURE).parse_config(dict(raw, architectures=[ARCHITECTURE]), ARCHITECTURE)


@pytest.mark.parametrize("raw", [
    dict(num_hidden_layers=4, mlp_only_layers=[0, 1, 2, 3], hidden_act="gelu"),  # no layer has experts
    dict(num_hidden_layers=2, num_experts=4, num_experts_per_tok=5),  # likewise (layers 0 and 1 dense)
    dict(num_hidden_layers=3, sliding_window=0),  # no sliding layer reads the window
])
def test_what_transformers_runs_is_not_refused(raw):
    architectures.load(ARCHITECTURE).parse_config(dict(raw, architectures=[ARCHITECTURE]), ARCHITECTURE)
    model = transformers.AutoModelForCausalLM.from_config(transformers.FlintConfig(**{**BASE, **raw})).eval()
    with torch.no_grad():
        assert torch.isfinite(model(torch.tensor([PROMPT])).logits).all()
