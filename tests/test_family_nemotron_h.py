"""Nemotron-H (one mixer per layer: Mamba-2, attention without rotary, or a relu² MLP) against
transformers: fp32 prefill and decode steps feeding back every state, int4 against fake
quantization, onnxruntime-genai's greedy generation (one prompt, and a ragged batch), the hub's
`backbone.` layout and its config spellings."""

import json

import numpy as np
import onnxruntime as ort
import pytest
import torch
import transformers
from fake_quant import fake_quantize_model
from helpers import GENAI_PROMPT, build
from safetensors.numpy import load_file, save_file
from test_family_granitemoehybrid import random_mamba
from family_runner import assert_ragged_batch_matches, assert_steps_match

from builder.options import PRECISION_DEFAULTS

# Every layer kind, a Mamba layer first and last; 8 Mamba heads of 12 channels in 2 groups of B and
# C, a 4-tap conv with bias, in_proj/out_proj biases (use_bias), 8-token chunks; 3 query heads of
# 32 over 1 KV head, no rotary; dt clamped to [0.3, ∞) in prefill (0.3: it matters): time_step_limit
# in transformers 5.25, time_step_min in 5.23, so both say it.
CONFIG = dict(
    vocab_size=256, hidden_size=64, intermediate_size=96, layers_block_type=["linear_attention", "full_attention",
                                                                            "mlp", "linear_attention"],
    num_attention_heads=3, num_key_value_heads=1, head_dim=32, max_position_embeddings=256, mamba_num_heads=8,
    mamba_head_dim=12, n_groups=2, ssm_state_size=16, conv_kernel=4, chunk_size=8, use_bias=True,
    time_step_min=0.3, time_step_limit=(0.3, float("inf")), initializer_range=0.1, eos_token_id=255, pad_token_id=0, bos_token_id=1,
)
STEPS = 4


def make(folder, backbone=False, **overrides):
    """A tiny random Nemotron-H (random Mamba parameters and biases); `backbone`: under the hub's
    `backbone.` prefix."""
    tensors = random_mamba(folder, "NemotronHConfig", {**CONFIG, **overrides}, "mixer", (".bias",))
    if backbone:
        tensors = {k.replace("model.", "backbone.", 1): v for k, v in tensors.items()}
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    return make(tmp_path_factory.mktemp("nemotron_h"))


def load(source):
    model = transformers.AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).eval()
    assert type(model).__name__ == "NemotronHForCausalLM"
    return model


def test_fp32_prefill_and_decode_match_transformers(source, tmp_path):
    out = build(source, tmp_path / "out", "-p", "fp32")
    model = load(source)
    assert_steps_match(out, model)
    assert_steps_match(out, model, [int(t) for t in np.random.default_rng(0).integers(0, 255, 30)])  # 4 chunks
    assert_steps_match(out, model, [9, 4])  # shorter than the kernel


def test_hub_layout_and_spellings(tmp_path):
    # backbone.* tensors, hybrid_override_pattern and the older mamba_* keys.
    source = make(tmp_path / "src", backbone=True)
    config = json.loads((source / "config.json").read_text())
    del config["layers_block_type"]
    config.update(hybrid_override_pattern="M*-M", num_hidden_layers=4, mamba_n_groups=config.pop("n_groups"),
                  mamba_d_conv=config.pop("conv_kernel"))
    (source / "config.json").write_text(json.dumps(config))
    out = build(source, tmp_path / "out", "-p", "fp32")
    reference = make(tmp_path / "ref")
    assert_steps_match(out, load(reference))


@pytest.mark.parametrize("spelling", ["time_step_limit", "mamba_dt_limit"])
def test_an_infinite_limit_as_the_hub_spells_it(tmp_path, spelling):
    # The hub's configs (and NemotronHConfig's older key, mamba_dt_limit) write JSON's Infinity for
    # "no upper limit"; builder refused it ("time_step_limit is Infinity; expected a finite number").
    source = make(tmp_path / "src")
    text = (source / "config.json").read_text()
    config = json.loads(text)
    del config["time_step_limit"]
    config[spelling] = [0.3, float("inf")]
    (source / "config.json").write_text(json.dumps(config))  # Python writes Infinity, as the hub's files
    assert "Infinity]" in (source / "config.json").read_text()
    assert_steps_match(build(source, tmp_path / "out", "-p", "fp32"), load(source))


@pytest.mark.skipif(tuple(int(x) for x in transformers.__version__.split(".")[:2]) < (5, 25),
                    reason="transformers before 5.25 clamped dt at time_step_min; builder follows 5.25")
def test_time_step_min_is_no_clamp(tmp_path):
    # transformers 5.25 (and NVIDIA's own code) clamp dt to time_step_limit, [0, ∞) by default, not
    # to time_step_min, which only initializes the dt bias: a 0.3 there changes nothing.
    source = make(tmp_path / "src")
    config = json.loads((source / "config.json").read_text())
    del config["time_step_limit"]
    (source / "config.json").write_text(json.dumps(config))
    assert_steps_match(build(source, tmp_path / "out", "-p", "fp32"), load(source),
                       [int(t) for t in np.random.default_rng(0).integers(0, 255, 30)])


# Every kind again, the experts' layer among them: 8 relu² experts in 2 groups of which the router
# keeps the best one (n_group / topk_group), top 2 normalized and scaled, beside the shared MLP; with
# `latent`, the experts work in a 32-wide latent space between fc1/fc2_latent_proj.
EXPERTS = dict(layers_block_type=["linear_attention", "moe", "full_attention", "moe"], n_routed_experts=8,
               num_experts_per_tok=2, moe_intermediate_size=64, moe_shared_expert_intermediate_size=40, n_group=2,
               topk_group=1, routed_scaling_factor=2.5, norm_topk_prob=True)


def make_experts(folder, **overrides):
    make(folder, **{**EXPERTS, **overrides})
    tensors = load_file(folder / "model.safetensors")
    rng = np.random.default_rng(2)
    for key, value in tensors.items():  # a sigmoid router scaled up saturates (ties): the bias spreads it
        if key.endswith("e_score_correction_bias"):
            tensors[key] = rng.standard_normal(value.shape).astype(value.dtype)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


@pytest.fixture(scope="module", params=[None, 32], ids=["experts", "latent-experts"])
def experts_source(request, tmp_path_factory):
    return make_experts(tmp_path_factory.mktemp("nemotron_h_moe"), moe_latent_size=request.param)


def test_experts_fp32_prefill_and_decode_match_transformers(experts_source, tmp_path):
    # ONNX Runtime's MoE has no relu²: u·σ(10⁴u)·u through its SwiGLU with up as both halves.
    assert_steps_match(build(experts_source, tmp_path / "out", "-p", "fp32"), load(experts_source))


def test_experts_int4_matches_fake_quantized_transformers(experts_source, tmp_path):
    from fake_quant import fake_quantize

    out = build(experts_source, tmp_path / "out", "-p", "int4", "--accuracy-level", "0", "--quant-method", "rtn",
                "--symmetric")
    model = load(experts_source)
    with torch.no_grad():  # every Linear, and each stored expert alone; the router is no Linear
        for name, p in model.named_parameters():
            if ".experts." in name:
                for e in range(p.shape[0]):
                    p[e].copy_(fake_quantize(p[e], 4, 32, True))
    fake_quantize_model(model, 4, 32, True)
    assert_steps_match(out, model, tolerance=1e-3, min_cosine=0.999)


def test_experts_int4_verify_rounds_the_experts_as_the_build(experts_source, tmp_path, capsys):
    # --verify's reference rounded stacked gate_up_proj only: Nemotron-H's 3-D up_proj stayed float
    # and an int4 --verify of a correct build failed at cosine 0.991.
    from builder.cli import main

    rc = main(["-m", str(experts_source), "-o", str(tmp_path / "out"), "-p", "int4", "--verify"])
    assert rc == 0, capsys.readouterr().err


def test_experts_genai_greedy_and_ragged_batch_match_transformers(experts_source, tmp_path):
    from test_genai import assert_same_greedy

    out = build(experts_source, tmp_path / "out", "-p", "fp32")
    assert_same_greedy(out, experts_source, GENAI_PROMPT)
    assert_ragged_batch_matches(out, load(experts_source))


def test_state_contract(source, tmp_path):
    """Mamba layers: conv and SSM states; the attention layer: KV; the MLP layer: nothing, and no
    number: the states number the layers that carry one (layer 3's are slot 2's), as genai counts."""
    out = build(source, tmp_path / "out", "-p", "fp32")
    session = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    inputs = {i.name: i.shape for i in session.get_inputs()}
    outputs = [o.name for o in session.get_outputs()]
    assert list(inputs) == ["input_ids", "attention_mask", "past.0.conv", "past.0.recurrent",
                            "past_key_values.1.key", "past_key_values.1.value", "past.2.conv", "past.2.recurrent"]
    assert outputs == ["logits", "present.0.conv", "present.0.recurrent", "present.1.key", "present.1.value",
                       "present.2.conv", "present.2.recurrent"]
    assert inputs["past.0.conv"] == ["batch_size", 8 * 12 + 2 * 2 * 16, 3]
    assert inputs["past.2.recurrent"] == ["batch_size", 8, 12, 16]
    genai = json.loads((out / "genai_config.json").read_text())["model"]
    assert genai["type"] == "granitemoehybrid"
    assert genai["decoder"]["num_hidden_layers"] == 3
    assert genai["decoder"]["layer_types"] == ["linear_attention", "full_attention", "linear_attention"]


def test_int4_matches_fake_quantized_transformers(source, tmp_path):
    out = build(source, tmp_path / "out", "-p", "int4", "--accuracy-level", "0")
    model = load(source)
    int4 = PRECISION_DEFAULTS["int4"]
    fake_quantize_model(model, 4, 32, int4["symmetric"], method=int4["quant_method"])
    assert_steps_match(out, model, tolerance=1e-3, min_cosine=0.999)


def test_genai_greedy_matches_transformers(source, tmp_path):
    from test_genai import assert_same_greedy

    assert_same_greedy(build(source, tmp_path / "out", "-p", "fp32"), source, GENAI_PROMPT)


def test_genai_batch_of_different_lengths_matches_transformers(source, tmp_path):
    out = build(source, tmp_path / "out", "-p", "fp32")
    assert_ragged_batch_matches(out, load(source))


def test_verify_feeds_the_states_of_the_layers_that_have_them(source, tmp_path):
    # --verify counts the layers as genai_config.json does (those with a state) and feeds each its
    # KV or its conv and SSM states.
    from builder.cli import main

    assert main(["-m", str(source), "-o", str(tmp_path / "out"), "-q", "-p", "fp32", "--verify"]) == 0
