"""MiniCPM5-MoE (architectures/minicpm5_moe.py: Llama's attention with a sigmoid output gate,
DeepSeek-V3's grouped sigmoid router, experts and shared experts) against transformers: the shared
family proofs (tests/family_runner.py), int4 with the stacked experts rounded too, routing that the
groups and the correction bias decide, the sparse layers as transformers builds them, and what
builder refuses."""

import pytest
import torch
import transformers
from conftest import TINY
from family_runner import (
    CONFIG_FIELDS, FamilyTest, assert_grouped_routing, assert_steps_match, family_tests, load, router_outputs,
    modules_named, spread_checkpoint,
)
from helpers import GENAI_PROMPT, PROMPT, build, make_checkpoint, relative_error
from test_family_moe import fake_quantize_experts

import architectures
from builder.errors import BuildError

ARCHITECTURE = "MiniCPM5MoeForCausalLM"
ROUTER_SCALE = 30.0  # random routers are near-uniform; scaled up, their choices are decisive
YARN = dict(rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=4)
VARIANTS = {
    # Every feature on: random biases on q (query and gate rows), k, v and o; 8 experts in 4 groups of 2, the best 2 groups kept, top-3 experts, weights
    # normalized and scaled by 2.5; two shared experts; layer 0 dense; head_dim its own key (4 heads
    # of 32 on a hidden size of 64), so q_proj holds 4 × (32 query + 32 gate) rows.
    "groups": dict(num_hidden_layers=3, head_dim=32, n_routed_experts=8, num_experts_per_tok=3, n_group=4,
                   attention_bias=True,
                   topk_group=2, n_shared_experts=2, moe_intermediate_size=32, routed_scaling_factor=2.5,
                   mlp_layer_types=["dense", "sparse", "sparse"]),
    # The other way: a dense layer between sparse ones, one group, un-normalized weights, one shared
    # expert, a tied vocabulary, YaRN shorter than the prompt (test_no_shared_expert: none).
    "pattern": dict(num_hidden_layers=3, head_dim=16, n_routed_experts=4, num_experts_per_tok=2,
                    n_shared_experts=1, moe_intermediate_size=32, norm_topk_prob=False,
                    mlp_layer_types=["sparse", "dense", "sparse"], tie_word_embeddings=True, rope_parameters=YARN),
}


def make(folder, config):
    """transformers' random checkpoint with the routers scaled up, a random correction bias (zero at
    init; of the order of the sigmoid scores it corrects) and random attention biases."""
    make_checkpoint(folder, "MiniCPM5MoeConfig", **config)
    # the attention biases are zero at init: random, so a bias read into the wrong rows shows
    return spread_checkpoint(folder, ROUTER_SCALE, {"e_score_correction_bias": 0.3, "_proj.bias": 0.1})


SPEC = FamilyTest(
    ARCHITECTURE, "MiniCPM5MoeConfig", VARIANTS, base=dict(TINY), make=make, genai_variant="groups", ragged=True,
    fp16_tolerance=1e-2, layer_lists=True, name="minicpm5_moe",  # layer_lists: mlp_layer_types
    # MiniCPM5MoeExperts holds the experts as stacked Parameters (gate_up_proj [E, 2I, H], down_proj
    # [E, H, I]) that the build's QMoE rounds: rounded in the reference too, one expert at a time.
    quantize=fake_quantize_experts,
    config_raws=(
        {},
        # the hub's spellings: first_k_dense_replace instead of mlp_layer_types, rope_theta beside a
        # null rope_scaling, num_local_experts (MiniCPM5MoeConfig's attribute_map)
        dict(num_hidden_layers=32, first_k_dense_replace=2, rope_theta=5e6, rope_scaling=None, num_local_experts=64,
             num_experts_per_tok=8, n_group=8, topk_group=4, head_dim=None, hidden_size=4096,
             eos_token_id=[1, 2], pad_token_id=None, tie_word_embeddings=True),
        dict(rope_scaling=dict(type="yarn", factor=4.0, original_max_position_embeddings=32768),
             mlp_layer_types=["sparse"] * 28, use_gated_attention=True),
    ),
    config_fields=(*CONFIG_FIELDS, "head_dim", "rms_norm_eps", "attention_bias", "moe_intermediate_size",
                   "num_experts_per_tok", "n_shared_experts", "n_routed_experts", "routed_scaling_factor", "n_group",
                   "topk_group", "norm_topk_prob", "mlp_layer_types"),
)
globals().update(family_tests(SPEC))


def test_no_shared_expert(tmp_path):
    # n_shared_experts 0: transformers still makes (and saves) the zero-wide MLP, and adds nothing.
    # (Not a variant: test_family_moe's fake_quantize_experts cannot round a zero-row Linear.)
    source = SPEC.checkpoint(tmp_path / "src", "pattern", n_shared_experts=0)
    assert_steps_match(build(source, tmp_path / "out", "-p", "fp32"), load(source))


@pytest.fixture(scope="module")
def groups(tmp_path_factory):
    return SPEC.checkpoint(tmp_path_factory.mktemp("groups"), "groups")


def test_routing_is_decisive_and_groups_and_bias_change_it(groups):
    # The parity proofs prove the router only if its choices are clear-cut (no near-tie an ulp could
    # flip) and if both the group restriction and the bias change some token's experts.
    model = load(groups)
    routers = modules_named(model, "MiniCPM5MoeTopkRouter")
    seen = router_outputs(model, routers, [PROMPT + GENAI_PROMPT])
    config = VARIANTS["groups"]
    k, G, kept = config["num_experts_per_tok"], config["n_group"], config["topk_group"]
    assert len(seen) == 2
    assert_grouped_routing([(logits, r.e_score_correction_bias.numpy()) for logits, r in zip(seen, routers)], k, G, kept)


def test_the_gate_changes_the_logits(groups):
    # A build that left the output gate out (sigmoid(gate) = 1) would fail the fp32 proof: each
    # layer's gate rows (every head's second head_dim rows of q_proj) set to a bias of 1e4 move the
    # logits far past its tolerance.
    model, D = load(groups), VARIANTS["groups"]["head_dim"]
    with torch.no_grad():
        gated = model(torch.tensor([PROMPT])).logits.numpy()
        for layer in model.model.layers:
            proj = layer.self_attn.q_gate_proj
            heads = proj.out_features // (2 * D)
            proj.weight.view(heads, 2, D, -1)[:, 1] = 0.0
            proj.bias.view(heads, 2, D)[:, 1] = 1e4  # the gate rows' bias; the queries' kept
        ungated = model(torch.tensor([PROMPT])).logits.numpy()
    assert relative_error(ungated, gated) > 100 * 1e-4


@pytest.mark.parametrize("raw", [
    dict(num_hidden_layers=4, first_k_dense_replace=3),
    dict(num_hidden_layers=4, mlp_layer_types=["sparse", "dense", "dense", "sparse"]),
    dict(num_hidden_layers=2, mlp_layer_types=["dense", "sparse", "sparse"]),  # transformers reads the first two
])
def test_sparse_layers_are_transformers(raw):
    from transformers.models.minicpm5_moe.modeling_minicpm5_moe import MiniCPM5MoeDecoderLayer, MiniCPM5MoeMoE

    c = architectures.load(ARCHITECTURE).parse_config(dict(raw, architectures=[ARCHITECTURE]), ARCHITECTURE)
    small = transformers.MiniCPM5MoeConfig(**{**TINY, **raw, "head_dim": 16, "n_routed_experts": 4,
                                              "num_experts_per_tok": 2, "moe_intermediate_size": 8})
    with torch.device("meta"):
        sparse = [isinstance(MiniCPM5MoeDecoderLayer(small, i).mlp, MiniCPM5MoeMoE)
                  for i in range(small.num_hidden_layers)]
    assert [c.sparse(i) for i in range(c.num_hidden_layers)] == sparse


@pytest.mark.parametrize("raw, message", [
    (dict(use_gated_attention=False), "always gates its attention"),  # transformers refuses it too
    (dict(num_hidden_layers=3, mlp_layer_types=["dense", "sparse"]), "2 entries for 3 layers"),  # IndexError there
    (dict(n_routed_experts=1, num_experts_per_tok=1), "the group score needs two"),  # torch.topk(2) fails there
    (dict(n_routed_experts=8, n_group=3), "split the experts evenly"),
    (dict(n_routed_experts=8, num_experts_per_tok=9), "num_experts_per_tok=9"),
])
def test_refused(raw, message):
    with pytest.raises(BuildError, match=message):
        architectures.load(ARCHITECTURE).parse_config(dict(raw, architectures=[ARCHITECTURE]), ARCHITECTURE)


def test_the_hub_class_spelling_builds(tmp_path):
    # config.json's "MiniCPM5MoEForCausalLM" (with auto_map): transformers' config renames the class
    # and builds it; builder took it for an unknown architecture before the model_type dispatch.
    import json

    source = SPEC.checkpoint(tmp_path / "src", "pattern")
    raw = json.loads((source / "config.json").read_text())
    raw.update(architectures=["MiniCPM5MoEForCausalLM"],
               auto_map={"AutoModelForCausalLM": "modeling_minicpm5_moe.MiniCPM5MoEForCausalLM"})
    (source / "config.json").write_text(json.dumps(raw))
    assert_steps_match(build(source, tmp_path / "out", "-p", "fp32"), load(source))
