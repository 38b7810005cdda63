"""MiMo-V2-Flash (architectures/mimo_v2_flash.py: GLM-4.5's layer with value heads narrower or wider
than the query/key heads, sliding layers with twice the KV heads and attention sinks, a partial
rotary per layer type, DeepSeek-V3's router without shared experts) against transformers: the
shared family proofs (tests/family_runner.py), the per-layer KV shapes, routing that the groups and
the correction bias decide, the features the parity proves moving the logits, the hub's
config.json and multi-token-prediction tensors, and what builder refuses where transformers fails.

The int4 proof rounds the stacked experts too (MiMoV2FlashExperts' [E, 2I, H] / [E, H, I]
parameters, which the build's QMoE quantizes), one expert at a time (test_family_moe's
fake_quantize_experts)."""

import json

import onnxruntime as ort
import pytest
import torch
import transformers
from family_runner import (
    CONFIG_FIELDS, FamilyTest, assert_grouped_routing, assert_steps_match, family_tests, load, router_outputs,
    modules_named, spread_checkpoint,
)
from helpers import GENAI_PROMPT, PROMPT, build, make_checkpoint, relative_error
from safetensors.numpy import load_file, save_file
from test_family_moe import fake_quantize_experts

import architectures
from builder.errors import BuildError

ARCHITECTURE = "MiMoV2FlashForCausalLM"
FULL, SLIDING = "full_attention", "sliding_attention"
ROUTER_SCALE = 10.0  # random routers are near-uniform; scaled up (not to saturation), their choices are decisive
# 4 query heads on a hidden size of 64, 1 KV head in the full layers (2 in the sliding ones), experts of 32.
BASE = dict(vocab_size=256, hidden_size=64, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=1, max_position_embeddings=128, moe_intermediate_size=32)
VARIANTS = {
    # As the hub's: layer 0 full and dense, layers 1-2 sliding and sparse (the config's defaults),
    # query/key heads of 48 (16 dims rotated: the fused rotary), value heads of 32 (padded to 48),
    # values times 0.707, the window the hub's sliding_window_size + 1 (5, shorter than the prompt),
    # the default thetas; 8 experts in 4 groups of 2, the best 2 groups kept, top-3, weights
    # normalized and scaled by 2.5.
    "flash": dict(head_dim=48, v_head_dim=32, sliding_window_size=4, n_routed_experts=8, n_group=4, topk_group=2,
                  num_experts_per_tok=3, routed_scaling_factor=2.5),
    # The other way: value heads (28) wider than the query/key heads (20), all padded to 32; 2 KV
    # heads (4 in the sliding layers: no grouping there); a sliding layer first, a dense layer
    # between sparse ones; q/k/v biases; values times 1.5; YaRN on the full layer over half the head,
    # theta 1e3 on the sliding ones over the default 0.334 of it (explicit rotary both); a window of
    # 3; a tied vocabulary; one group, weights not normalized.
    "wide": dict(num_key_value_heads=2, head_dim=20, v_head_dim=28, sliding_window=3, attention_bias=True,
                 attention_value_scale=1.5, layer_types=[SLIDING, FULL, SLIDING], mlp_layer_types=["sparse", "dense", "sparse"],
                 tie_word_embeddings=True, norm_topk_prob=False, n_routed_experts=4, num_experts_per_tok=2,
                 rope_parameters={FULL: dict(rope_type="yarn", rope_theta=1e4, factor=4.0,
                                             original_max_position_embeddings=4, partial_rotary_factor=0.5),
                                  SLIDING: dict(rope_type="default", rope_theta=1e3)}),
}


def make(folder, config):
    """transformers' random checkpoint (the hub's tensor names: per-expert Linears,
    `attention_sink_bias`) with the routers scaled up and what transformers initializes to
    constants or near them randomized: the correction bias (zero; of the order of the sigmoid scores
    it corrects), the sinks (std 0.02: of the order of the scores, so they weigh) and the biases."""
    make_checkpoint(folder, "MiMoV2FlashConfig", **config)
    return spread_checkpoint(folder, ROUTER_SCALE, {"e_score_correction_bias": 0.3, "attention_sink_bias": 1.5,
                                                    "_proj.bias": 0.1})


# MiMo-V2-Flash's config.json in the hub's spelling: the remote code's keys beside transformers'
# (hybrid_layer_pattern, moe_layer_freq, swa_*, sink flags, rope_theta, partial_rotary_factor:
# transformers reads none of them), sliding_window_size, null routed_scaling_factor and n_shared_experts.
HUB = dict(
    vocab_size=152576, hidden_size=4096, intermediate_size=16384, num_hidden_layers=48, num_attention_heads=64,
    num_key_value_heads=4, head_dim=192, v_head_dim=128, swa_num_attention_heads=64, swa_num_key_value_heads=8,
    swa_head_dim=192, swa_v_head_dim=128, hybrid_layer_pattern=[0] + ([1] * 4 + [0]) + ([1] * 5 + [0]) * 7,
    moe_layer_freq=[0] + [1] * 47, sliding_window=128, sliding_window_size=128, attention_chunk_size=128,
    add_swa_attention_sink_bias=True, add_full_attention_sink_bias=False, attention_value_scale=0.707,
    max_position_embeddings=262144, rope_theta=5000000, swa_rope_theta=10000, partial_rotary_factor=0.334,
    n_routed_experts=256, num_experts_per_tok=8, moe_intermediate_size=2048, n_shared_experts=None,
    routed_scaling_factor=None, scoring_func="sigmoid", topk_method="noaux_tc", n_group=1, topk_group=1,
    norm_topk_prob=True, layernorm_epsilon=1e-5, hidden_act="silu", attention_bias=False, tie_word_embeddings=False,
    model_type="mimo_v2_flash",
)

SPEC = FamilyTest(
    ARCHITECTURE, "MiMoV2FlashConfig", VARIANTS, base=BASE, make=make, ragged=True, fp16_tolerance=1e-2,
    layer_lists=True, name="mimo_v2_flash",  # layer_types, mlp_layer_types
    # MiMoV2FlashExperts holds the experts as stacked Parameters, which the build's QMoE rounds:
    # rounded in the reference too, one expert at a time.
    quantize=fake_quantize_experts,
    config_raws=(
        {},
        HUB,
        # per-type rope dicts in the older "type" spelling, YaRN on the full layers, no factor on the
        # sliding ones; a window given both ways (sliding_window_size wins)
        dict(rope_parameters={FULL: dict(type="yarn", rope_theta=1e6, factor=4.0, original_max_position_embeddings=4096),
                              SLIDING: dict(rope_type="default", rope_theta=1e4)},
             sliding_window=64, sliding_window_size=31, num_hidden_layers=4, attention_value_scale=None),
    ),
    config_fields=(*CONFIG_FIELDS, "head_dim", "v_head_dim", "sliding_window", "layer_types", "mlp_layer_types",
                   "attention_value_scale", "attention_bias", "rms_norm_eps", "moe_intermediate_size",
                   "num_experts_per_tok", "n_routed_experts", "routed_scaling_factor", "n_group", "topk_group",
                   "norm_topk_prob"),
)
globals().update(family_tests(SPEC))


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    return {name: SPEC.checkpoint(tmp_path_factory.mktemp(name), name) for name in VARIANTS}


@pytest.mark.parametrize("variant, shapes", [
    ("flash", [(1, 48), (2, 48), (2, 48)]),  # the full layer's 1 KV head, the sliding layers' 2; heads of 48
    ("wide", [(4, 32), (2, 32), (4, 32)]),  # heads of 20 (keys) and 28 (values), both padded to 32
])
def test_each_layer_caches_its_own_heads(variant, shapes, checkpoints, tmp_path):
    # Each layer's KV is (its KV heads, the padded head): a cache of num_key_value_heads in every
    # layer, or of the key's head size, fails the first run.
    out = build(checkpoints[variant], tmp_path / "out", "-p", "fp32")
    session = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    inputs = {i.name: i.shape for i in session.get_inputs()}
    for layer, (heads, size) in enumerate(shapes):
        for kind in ("key", "value"):
            assert inputs[f"past_key_values.{layer}.{kind}"] == ["batch_size", heads, "past_sequence_length", size]


def routing(model, ids):
    """Every router's (logits (tokens, experts), correction bias) over `ids`."""
    routers = modules_named(model, "MiMoV2FlashTopkRouter")
    seen = router_outputs(model, routers, [ids])
    return list(zip(seen, (r.e_score_correction_bias.double().numpy() for r in routers), strict=True))


def test_routing_is_decisive_and_groups_and_bias_change_it(checkpoints):
    # The parity proofs prove the router only if its choices are clear-cut (no near-tie an ulp could
    # flip) and if both the group restriction and the correction bias change some token's experts.
    model, config = load(checkpoints["flash"]), VARIANTS["flash"]
    k, G, kept = config["num_experts_per_tok"], config["n_group"], config["topk_group"]
    assert_grouped_routing([r for ids in (PROMPT, GENAI_PROMPT) for r in routing(model, ids)], k, G, kept)


@pytest.mark.parametrize("change", ["sinks", "value_scale", "window"])
def test_the_features_move_the_logits(change, checkpoints):
    # A build that left out the sliding layers' sinks, the value scale or the window would fail the
    # fp32 proof: each changed in transformers moves its logits far past the tolerance.
    model = load(checkpoints["flash"])
    with torch.no_grad():
        want = model(torch.tensor([PROMPT])).logits.numpy()
        for layer in model.model.layers:
            attention = layer.self_attn
            if change == "sinks" and attention.sinks is not None:
                attention.sinks.zero_()
            elif change == "value_scale":
                attention.v_scale = 1.0
            elif change == "window" and attention.sliding_window is not None:
                model.config.sliding_window = len(PROMPT)  # the masks read the config's window
        got = model(torch.tensor([PROMPT])).logits.numpy()
    assert relative_error(got, want) > 100 * SPEC.tolerance


def test_the_hub_checkpoint_builds(checkpoints, tmp_path):
    # config.json as the hub writes it (its own class name with auto_map, the remote code's keys, no
    # layer_types, mlp_layer_types or rope_parameters: transformers' defaults apply), the stored
    # `attention_sink_bias` and a multi-token-prediction layer (model.mtp.*), which transformers
    # leaves unread: built, and the same logits as transformers'.
    import shutil

    source = tmp_path / "src"
    shutil.copytree(checkpoints["flash"], source)
    raw = json.loads((source / "config.json").read_text())
    for key in ("layer_types", "mlp_layer_types", "rope_parameters", "routed_scaling_factor"):
        raw.pop(key)
    raw.update(sliding_window=4, sliding_window_size=4, hybrid_layer_pattern=[0, 1, 1], moe_layer_freq=[0, 1, 1],
               rope_theta=5000000, swa_rope_theta=10000, partial_rotary_factor=0.334, routed_scaling_factor=None,
               n_shared_experts=None, add_swa_attention_sink_bias=True, add_full_attention_sink_bias=False,
               architectures=[ARCHITECTURE], auto_map={"AutoModelForCausalLM": f"modeling_mimo_v2_flash.{ARCHITECTURE}"})
    (source / "config.json").write_text(json.dumps(raw))
    tensors = load_file(source / "model.safetensors")
    assert "model.layers.1.self_attn.attention_sink_bias" in tensors
    tensors["model.mtp.layers.0.input_layernorm.weight"] = tensors["model.norm.weight"]
    save_file(tensors, source / "model.safetensors", metadata={"format": "pt"})
    model = load(source)
    assert model.config.sliding_window == 5 and model.config.routed_scaling_factor == 1.0
    # the hub's null routed_scaling_factor is 1: the flash variant's 2.5 no longer applies
    assert_steps_match(build(source, tmp_path / "out", "-p", "fp32"), model)


def transformers_fails(raw):
    """Whether transformers refuses `raw` (over the flash variant): its config class, or building
    the model and running a forward."""
    try:
        config = transformers.MiMoV2FlashConfig(**{**BASE, **VARIANTS["flash"], **raw})
        with torch.no_grad():
            transformers.MiMoV2FlashForCausalLM(config).eval()(torch.tensor([PROMPT]))
    except Exception:  # noqa: BLE001 - any refusal of transformers' counts
        return True
    return False


@pytest.mark.parametrize("raw, message", [
    # a flat rotary dict: transformers' rotary reads rope_parameters[layer_type] (KeyError)
    (dict(rope_parameters=dict(rope_type="default", rope_theta=1e6)), "no full_attention entry"),
    (dict(rope_scaling=None), "no full_attention entry"),  # replaces the default with None
    (dict(rope_parameters={FULL: dict(rope_type="default"), SLIDING: dict(rope_type="default", rope_theta=1e4)}),
     "full_attention has no rope_theta"),
    (dict(num_key_value_heads=4), "sliding layers' 8 KV heads"),  # 4 query heads over 8: its matmul fails
    (dict(num_key_value_heads=2, num_attention_heads=6, hidden_size=96), "sliding layers' 4 KV heads"),
    (dict(mlp_layer_types=["dense", "sparse"]), "one 'dense' or 'sparse' per layer"),
    (dict(mlp_layer_types=["dense", "moe", "sparse"]), "one 'dense' or 'sparse' per layer"),
    (dict(n_routed_experts=1, num_experts_per_tok=1, n_group=1, topk_group=1), "the group score needs two"),
    (dict(head_dim=None), "head_dim"),  # MiMoV2FlashConfig types it int
    (dict(sliding_window_size=None, sliding_window=None), "sliding_window"),
])
def test_refused_where_transformers_fails(raw, message):
    assert transformers_fails(raw)
    with pytest.raises(BuildError, match=message):
        architectures.load(ARCHITECTURE).parse_config({**BASE, **VARIANTS["flash"], **raw,
                                                       "architectures": [ARCHITECTURE]}, ARCHITECTURE)


def test_longrope_is_refused():
    # transformers runs a LongRoPE layer type (short factors within original_max_position_embeddings,
    # long ones past it); builder's per-type tables have no such switch: refused in one line.
    longrope = dict(rope_type="longrope", rope_theta=1e4, short_factor=[1.0] * 8, long_factor=[2.0] * 8,
                    original_max_position_embeddings=64, partial_rotary_factor=0.334)
    raw = dict(rope_parameters={FULL: longrope, SLIDING: dict(rope_type="default", rope_theta=1e4)})
    assert not transformers_fails(raw)
    with pytest.raises(BuildError, match="rope_type 'longrope'"):
        architectures.load(ARCHITECTURE).parse_config({**BASE, **VARIANTS["flash"], **raw,
                                                       "architectures": [ARCHITECTURE]}, ARCHITECTURE)


def test_the_hub_model_type_selects_the_row():
    assert architectures.MODEL_TYPES["mimo_v2_flash"][0] == ARCHITECTURE
