"""Granite 4.0 (Mamba-2 layers interleaved with attention, experts beside a shared MLP) against
transformers: fp32 prefill and decode steps feeding back every KV, conv and SSM state, int4
against fake quantization, onnxruntime-genai's greedy generation (one prompt, and two of different
lengths in a batch), and the state contract."""

import json
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import transformers
from helpers import GENAI_PROMPT, build, make_checkpoint
from safetensors.numpy import load_file, save_file
from family_runner import PROMPT, assert_ragged_batch_matches, assert_steps_match
from test_family_moe import fake_quantize_experts
from test_family_moe2 import ROUTER_SCALE

from builder.options import PRECISION_DEFAULTS

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
from recurrence_speed import recurrence_session  # noqa: E402

# Both layer kinds (a Mamba layer first and last); 3 query heads over 1 KV head; 6 Mamba heads of
# 32 channels in 2 groups of B and C (so the gated norm normalizes two groups apart), a 4-tap conv
# with bias, chunks of 8 tokens (the 10-token prompt spans two); every multiplier away from 1;
# 4 experts, top 2, beside the shared MLP.
CONFIG = dict(
    vocab_size=256, hidden_size=96, intermediate_size=64, shared_intermediate_size=64, num_hidden_layers=4,
    num_attention_heads=3, num_key_value_heads=1, max_position_embeddings=256,
    layer_types=["mamba", "attention", "mamba", "mamba"], mamba_n_heads=6, mamba_n_groups=2, mamba_d_state=16,
    mamba_d_conv=4, mamba_expand=2, mamba_chunk_size=8, num_local_experts=4, num_experts_per_tok=2,
    embedding_multiplier=2.0, residual_multiplier=0.5, attention_multiplier=0.2, logits_scaling=2.5,
    initializer_range=0.1, eos_token_id=255, tie_word_embeddings=False,
)
STEPS = 4


def random_mamba(folder, config_class, config, mixer, biases, edit=None):
    """Saves a tiny random Mamba-2 hybrid whose `{mixer}.dt_bias`, `.D`, `.A_log` and the tensors
    ending in `biases` are random too (transformers initializes them to constants); `edit(key,
    value)` may replace any other tensor. Returns the tensors, to be saved by the caller."""
    make_checkpoint(folder, config_class, **config)
    tensors = load_file(folder / "model.safetensors")
    rng = np.random.default_rng(1)
    for key, value in tensors.items():
        if key.endswith((f"{mixer}.dt_bias", f"{mixer}.D", *biases)):
            tensors[key] = (0.5 * rng.standard_normal(value.shape)).astype(value.dtype)
        elif key.endswith(f"{mixer}.A_log"):
            tensors[key] = rng.uniform(-1, 1.5, value.shape).astype(value.dtype)
        elif edit is not None:
            tensors[key] = edit(key, value)
    return tensors


def make(folder, **overrides):
    """A tiny random Granite 4.0 (random Mamba parameters; routers scaled up: random ones are
    near-uniform, and the top-2 choice must be decisive)."""
    tensors = random_mamba(folder, "GraniteMoeHybridConfig", {**CONFIG, **overrides}, "mamba", ("conv1d.bias",),
                           lambda key, v: v * ROUTER_SCALE if key.endswith("router.layer.weight") else v)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    return make(tmp_path_factory.mktemp("granitemoehybrid"))


def load(source):
    model = transformers.AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).eval()
    assert type(model).__name__ == "GraniteMoeHybridForCausalLM"
    return model


def test_fp32_prefill_and_decode_match_transformers(source, tmp_path):
    assert_steps_match(build(source, tmp_path / "out", "-p", "fp32"), load(source))


def test_prompt_over_several_chunks_and_shorter_than_the_kernel(source, tmp_path):
    # 40 tokens span five of transformers' 8-token chunks; 2 tokens read the conv's zero state.
    out = build(source, tmp_path / "out", "-p", "fp32")
    model = load(source)
    assert_steps_match(out, model, [int(t) for t in np.random.default_rng(0).integers(0, 255, 40)])
    assert_steps_match(out, model, [9, 4])


def test_rope_and_dense_variant(tmp_path):
    # position_embedding_type "rope" rotates the attention layers; no experts leaves the shared MLP
    # alone; one group of B and C; the time step clamped.
    source = make(tmp_path / "src", position_embedding_type="rope", num_local_experts=0, mamba_n_groups=1,
                  time_step_limit=[0.05, 0.5], layer_types=["attention", "mamba", "mamba"], num_hidden_layers=3)
    assert_steps_match(build(source, tmp_path / "out", "-p", "fp32"), load(source))


def test_an_infinite_limit_as_the_hub_spells_it(tmp_path):
    # "time_step_limit": [0.0, Infinity], as public Mamba-2 hybrid configs write it (JSON's
    # Infinity; transformers' own save writes {"__float__": "Infinity"}): refused before with
    # "time_step_limit is Infinity; expected a finite number".
    source = make(tmp_path / "src", time_step_limit=[0.05, 0.5], layer_types=["attention", "mamba", "mamba"],
                  num_hidden_layers=3)
    config = json.loads((source / "config.json").read_text())
    config["time_step_limit"] = [0.0, float("inf")]
    (source / "config.json").write_text(json.dumps(config))
    assert "Infinity]" in (source / "config.json").read_text()
    assert_steps_match(build(source, tmp_path / "out", "-p", "fp32"), load(source))


def test_fp16_prefill_and_decode_close_to_transformers(source, tmp_path):
    # fp16 activations, the SSM state float32 (as transformers keeps it).
    from helpers import relative_error
    from family_runner import onnx_steps, reference_steps

    out = build(source, tmp_path / "out", "-p", "fp16")
    want, fed = reference_steps(load(source), PROMPT, STEPS)
    for step, (g, w) in enumerate(zip(onnx_steps(out, PROMPT, fed), want)):
        assert relative_error(g, w) < 1e-2, f"step {step}: relative error {relative_error(g, w):.2e}"


def test_state_contract(source, tmp_path):
    """Attention layers: KV only; Mamba layers: past.%d.conv (batch, conv_dim, kernel−1) and
    past.%d.recurrent (batch, heads, head_dim, state), transformers' cache layout; genai_config.json
    names both."""
    out = build(source, tmp_path / "out", "-p", "fp32")
    session = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    inputs = {i.name: i.shape for i in session.get_inputs()}
    outputs = {o.name: o.shape for o in session.get_outputs()}
    assert list(inputs) == ["input_ids", "attention_mask", "past.0.conv", "past.0.recurrent",
                            "past_key_values.1.key", "past_key_values.1.value", "past.2.conv", "past.2.recurrent",
                            "past.3.conv", "past.3.recurrent"]
    model = load(source)
    with torch.no_grad():
        ssm = model(torch.tensor([PROMPT]), use_cache=True).past_key_values.layers[3].recurrent_states[0]
    mamba = model.model.layers[0].mamba  # transformers keeps `kernel` inputs; the last kernel−1 are the state
    assert inputs["past.0.conv"] == outputs["present.0.conv"] == ["batch_size", mamba.conv_dim, mamba.conv_kernel_size - 1]
    assert inputs["past.3.recurrent"] == outputs["present.3.recurrent"] == ["batch_size", *ssm.shape[1:]]
    genai = json.loads((out / "genai_config.json").read_text())["model"]
    assert genai["type"] == "granitemoehybrid"
    decoder = genai["decoder"]
    assert decoder["inputs"]["past_recurrent_names"] == "past.%d.recurrent"
    assert decoder["outputs"]["present_conv_names"] == "present.%d.conv"
    assert decoder["layer_types"] == ["linear_attention", "full_attention", "linear_attention", "linear_attention"]


def test_int4_matches_fake_quantized_transformers(source, tmp_path):
    # Every Linear rounded (experts at the layer's QMoE block) but the router; the conv kernel,
    # A_log, D, dt_bias and the norms stay float.
    out = build(source, tmp_path / "out", "-p", "int4", "--accuracy-level", "0")
    model = load(source)
    int4 = PRECISION_DEFAULTS["int4"]
    fake_quantize_experts(model, 4, 32, int4["symmetric"], int4["quant_method"])  # the router is no nn.Linear
    assert_steps_match(out, model, tolerance=1e-3, min_cosine=0.999)
    floats = {t.name for t in onnx.load(out / "model.onnx").graph.initializer if t.data_type == onnx.TensorProto.FLOAT}
    for i in (0, 2, 3):
        for name in ("conv1d.weight", "conv1d.bias", "neg_exp_A_log", "D", "dt_bias", "norm.weight"):
            assert f"model.layers.{i}.mamba.{name}" in floats


def test_genai_greedy_matches_transformers(source, tmp_path):
    from test_genai import assert_same_greedy

    assert_same_greedy(build(source, tmp_path / "out", "-p", "fp32"), source, GENAI_PROMPT)


def test_genai_batch_of_different_lengths_matches_transformers(source, tmp_path):
    # genai pads the shorter row on the right: its conv and SSM states must be those after the
    # row's last real token, the padding after it leaving them as they were.
    out = build(source, tmp_path / "out", "-p", "fp32")
    assert_ragged_batch_matches(out, load(source))


@pytest.mark.parametrize("fused", [True, False], ids=["LinearAttention", "Scan"])
def test_gated_rule_matches_the_ssm_recurrence(fused):
    # Mamba-2's S ← S·exp(g) + k ⊗ v, o = Sᵀq in both forms (LinearAttention on CPU, the Scan on
    # other providers): 2 groups of B and C over 6 heads, a carried state, the second row
    # right-padded after 4 tokens (its state must stop there).
    from builder.blocks.linear_recurrence import RecurrentHeads

    heads, B, S = RecurrentHeads(2, 6, 8, 12), 2, 7
    rng = np.random.default_rng(3)
    keep = np.ones((B, S, 1), np.float32)
    keep[1, 4:] = 0
    feed = dict(q=rng.standard_normal((B, S, 2, 8)), k=rng.standard_normal((B, S, 2, 8)),
                v=rng.standard_normal((B, S, 6, 12)), decay=-np.abs(rng.standard_normal((B, S, 6))), keep=keep,
                past=0.3 * rng.standard_normal((B, 6, 8, 12)))
    feed = {name: x.astype(np.float32) for name, x in feed.items()}
    out, present = recurrence_session(fused, heads).run(None, feed)
    q, k = (np.repeat(feed[n].astype(np.float64), 3, axis=2) for n in ("q", "k"))
    state, want = feed["past"].astype(np.float64), np.zeros(feed["v"].shape)
    for t in range(S):
        s = state * np.exp(feed["decay"][:, t])[..., None, None] + k[:, t][..., None] * feed["v"][:, t][:, :, None, :]
        state = np.where(keep[:, t, :, None, None] > 0, s, state)
        want[:, t] = np.einsum("bhk,bhkv->bhv", q[:, t], state)
    real = keep[..., 0] > 0
    assert np.abs(out[real] - want[real]).max() < 1e-5
    assert np.abs(present - state).max() < 1e-5
