"""Falcon-H1 (Mamba-2 and attention side by side in every layer, μP multipliers) against
transformers: fp32 prefill and decode steps feeding back every KV, conv and SSM state, for the gated
norm after the gate (the released checkpoints'), before it, and none; int4 against fake
quantization; onnxruntime-genai's greedy generation (one prompt, and two of different lengths in a
batch); the state contract; the config against transformers.FalconH1Config."""

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import transformers
from fake_quant import fake_quantize_model
from helpers import GENAI_PROMPT, build
from safetensors.numpy import save_file
from test_family_granitemoehybrid import random_mamba
from family_runner import PROMPT, assert_ragged_batch_matches, assert_steps_match

from builder.options import PRECISION_DEFAULTS

# 3 layers; 3 query heads over 1 KV head; 6 Mamba heads of 16 channels (mamba_d_ssm 96, not
# expand · hidden) in 2 groups of B and C, a 4-tap conv with bias, in_proj and out_proj biased,
# chunks of 8 tokens; every multiplier away from 1, the five ssm_multipliers apart; the gated norm
# after the gate, as the released checkpoints have it.
CONFIG = dict(
    vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=256, mamba_d_ssm=96, mamba_n_heads=6, mamba_n_groups=2,
    mamba_d_state=16, mamba_d_conv=4, mamba_chunk_size=8, mamba_proj_bias=True, projectors_bias=True,
    mamba_rms_norm=True, mamba_norm_before_gate=False, rope_theta=1e4,
    embedding_multiplier=2.0, lm_head_multiplier=0.7, mlp_multipliers=[0.8, 1.3], key_multiplier=0.6,
    attention_in_multiplier=1.5, attention_out_multiplier=0.9, ssm_multipliers=[0.5, 1.2, 0.8, 1.6, 0.7],
    ssm_in_multiplier=1.4, ssm_out_multiplier=0.6,
    initializer_range=0.1, eos_token_id=255, pad_token_id=0, tie_word_embeddings=False,
)


def make(folder, **overrides):
    """A tiny random Falcon-H1 (random Mamba parameters and biases)."""
    tensors = random_mamba(folder, "FalconH1Config", {**CONFIG, **overrides}, "mamba", (".bias",))
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    return make(tmp_path_factory.mktemp("falcon_h1"))


def load(source):
    model = transformers.AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).eval()
    assert type(model).__name__ == "FalconH1ForCausalLM"
    return model


def test_fp32_prefill_and_decode_match_transformers(source, tmp_path):
    assert_steps_match(build(source, tmp_path / "out", "-p", "fp32"), load(source))


def test_an_infinite_limit_as_the_hub_spells_it(tmp_path):
    # "time_step_limit": [0.0, Infinity] (JSON's Infinity, as the hub's Mamba-2 configs write it)
    # was refused: "time_step_limit is Infinity; expected a finite number".
    source = make(tmp_path / "src")
    config = json.loads((source / "config.json").read_text())
    config["time_step_limit"] = [0.0, float("inf")]
    (source / "config.json").write_text(json.dumps(config))
    assert "Infinity]" in (source / "config.json").read_text()
    assert_steps_match(build(source, tmp_path / "out", "-p", "fp32"), load(source))


def test_prompt_over_several_chunks_and_shorter_than_the_kernel(source, tmp_path):
    # 40 tokens span five of transformers' 8-token chunks; 2 tokens read the conv's zero state.
    out = build(source, tmp_path / "out", "-p", "fp32")
    model = load(source)
    assert_steps_match(out, model, [int(t) for t in np.random.default_rng(0).integers(0, 255, 40)])
    assert_steps_match(out, model, [9, 4])


@pytest.mark.parametrize("variant", [
    # rms(y) · w · silu(z) (transformers' default), attention and MLP biases, tied embeddings (both
    # multipliers then stay in the graph), the time step clamped, one group, expand · hidden wide.
    dict(mamba_norm_before_gate=True, attention_bias=True, mlp_bias=True, tie_word_embeddings=True,
         time_step_limit=[0.05, 0.5], mamba_n_groups=1, mamba_d_ssm=None, mamba_expand=2, mamba_n_heads=8),
    # no norm: y · silu(z) alone; no Mamba biases.
    dict(mamba_rms_norm=False, mamba_proj_bias=False, projectors_bias=False, mamba_conv_bias=False),
], ids=["norm_before_gate", "no_norm"])
def test_variants(variant, tmp_path):
    source = make(tmp_path / "src", **variant)
    out = build(source, tmp_path / "out", "-p", "fp32")
    model = load(source)
    assert_steps_match(out, model)
    assert_steps_match(out, model, [int(t) for t in np.random.default_rng(2).integers(0, 255, 20)])


def test_state_contract(source, tmp_path):
    """Every layer: past_key_values.%d.key/value, then past.%d.conv (batch, conv_dim, kernel−1) and
    past.%d.recurrent (batch, heads, head_dim, state), transformers' cache layout; the presents in
    the same order; genai_config.json names all four."""
    out = build(source, tmp_path / "out", "-p", "fp32")
    session = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    inputs = {i.name: i.shape for i in session.get_inputs()}
    outputs = {o.name: o.shape for o in session.get_outputs()}
    per_layer = ["past_key_values.%d.key", "past_key_values.%d.value", "past.%d.conv", "past.%d.recurrent"]
    assert list(inputs) == ["input_ids", "attention_mask", *(n % i for i in range(3) for n in per_layer)]
    assert list(outputs) == ["logits", *(n.replace("past_key_values", "present").replace("past", "present") % i
                                         for i in range(3) for n in per_layer)]
    model = load(source)
    with torch.no_grad():
        cache = model(torch.tensor([PROMPT]), use_cache=True).past_key_values.layers[2]
    mamba = model.model.layers[0].mamba  # transformers keeps `kernel` inputs; the last kernel−1 are the state
    assert inputs["past.0.conv"] == outputs["present.0.conv"] == ["batch_size", mamba.conv_dim, mamba.conv_kernel_size - 1]
    assert inputs["past.2.recurrent"] == outputs["present.2.recurrent"] == ["batch_size", *cache.recurrent_states[0].shape[1:]]
    assert inputs["past_key_values.1.key"] == ["batch_size", 2, "past_sequence_length", 16]
    assert outputs["present.1.value"] == ["batch_size", 2, "total_sequence_length", 16]
    genai = json.loads((out / "genai_config.json").read_text())["model"]
    assert genai["type"] == "granitemoehybrid"
    decoder = genai["decoder"]
    assert decoder["inputs"]["past_key_names"] == "past_key_values.%d.key"
    assert decoder["inputs"]["past_conv_names"] == "past.%d.conv"
    assert decoder["inputs"]["past_recurrent_names"] == "past.%d.recurrent"
    assert decoder["outputs"]["present_recurrent_names"] == "present.%d.recurrent"
    assert decoder["conv_cache_size"] == 3
    # genai 0.18 allocates KV for "full_attention" layers only (a "hybrid" one would get none) and
    # finds every layer's conv and recurrent states by name.
    assert decoder["layer_types"] == ["full_attention"] * 3


def folded(model):
    """`model` with every multiplier moved into the weights it scales (then 1), as the build writes
    them: the values int4 rounds. (The int4 default's search rounding is not exactly equivariant
    to a row's scale: a near tie between two candidate scales can go the other way.)"""
    c = model.config
    with torch.no_grad():
        for layer in model.model.layers:
            m, a, f = layer.mamba, layer.self_attn, layer.feed_forward
            m.in_proj.weight.mul_(m.mup_vector[0, 0, :, None] * m.ssm_in_multiplier)
            if m.in_proj.bias is not None:
                m.in_proj.bias.mul_(m.mup_vector[0, 0])
            m.mup_vector.fill_(1.0)
            m.ssm_in_multiplier = 1.0
            for t in (m.out_proj.weight, m.out_proj.bias):
                if t is not None:
                    t.mul_(layer.ssm_out_multiplier)
            layer.ssm_out_multiplier = 1.0
            for proj, scale in ((a.q_proj, (layer.attention_in_multiplier, 1)),
                                (a.k_proj, (layer.attention_in_multiplier * a.key_multiplier, a.key_multiplier)),
                                (a.v_proj, (layer.attention_in_multiplier, 1)),
                                (a.o_proj, (layer.attn_out_multiplier, layer.attn_out_multiplier)),
                                (f.gate_proj, (f.gate_multiplier, f.gate_multiplier)),
                                (f.down_proj, (f.down_multiplier, f.down_multiplier))):
                proj.weight.mul_(scale[0])
                if proj.bias is not None:
                    proj.bias.mul_(scale[1])
            layer.attention_in_multiplier = layer.attn_out_multiplier = a.key_multiplier = 1.0
            f.gate_multiplier = f.down_multiplier = 1.0
        if not c.tie_word_embeddings:
            model.model.embed_tokens.weight.mul_(model.model.embedding_multiplier)
            model.lm_head.weight.mul_(model.model.lm_head_multiplier)
            model.model.embedding_multiplier = model.model.lm_head_multiplier = 1.0
    return model


def test_int4_matches_fake_quantized_transformers(source, tmp_path):
    # Every Linear rounded, the multipliers folded into them first; the conv kernel, A_log, D,
    # dt_bias and the norms stay float.
    out = build(source, tmp_path / "out", "-p", "int4", "--accuracy-level", "0")
    model = folded(load(source))
    assert_steps_match(build(source, tmp_path / "fp32", "-p", "fp32"), model)  # the fold itself is exact
    int4 = PRECISION_DEFAULTS["int4"]
    fake_quantize_model(model, 4, 32, int4["symmetric"], method=int4["quant_method"])
    assert_steps_match(out, model, tolerance=1e-3, min_cosine=0.999)
    floats = {t.name for t in onnx.load(out / "model.onnx").graph.initializer if t.data_type == onnx.TensorProto.FLOAT}
    for i in range(3):
        for name in ("conv1d.weight", "conv1d.bias", "neg_exp_A_log", "D", "dt_bias", "norm.weight"):
            assert f"model.layers.{i}.mamba.{name}" in floats


def test_genai_greedy_matches_transformers(source, tmp_path):
    from test_genai import assert_same_greedy

    assert_same_greedy(build(source, tmp_path / "out", "-p", "fp32"), source, GENAI_PROMPT)


def test_genai_batch_of_different_lengths_matches_transformers(source, tmp_path):
    # genai pads the shorter row on the right: its conv and SSM states must be those after the
    # row's last real token, and its KV past them masked.
    out = build(source, tmp_path / "out", "-p", "fp32")
    assert_ragged_batch_matches(out, load(source))


@pytest.mark.parametrize("raw", [
    {},  # FalconH1Config's defaults: mamba_d_ssm 1024 over 128 heads
    dict(hidden_size=1024, num_attention_heads=8, num_key_value_heads=2, head_dim=64, mamba_d_ssm=None,
         mamba_expand=2, mamba_n_heads=32, mamba_d_head="auto", mamba_n_groups=1, mamba_d_state=128,
         mamba_rms_norm=True, mamba_norm_before_gate=False, num_hidden_layers=4),
    dict(hidden_size=512, num_attention_heads=4, num_key_value_heads=4, mamba_d_ssm=768, mamba_n_heads=12, mamba_d_head=64,
         mamba_n_groups=3, time_step_limit=[0.0, 1.0], mlp_multipliers=[2.0, 0.5], num_hidden_layers=2),
], ids=["defaults", "expand", "d_ssm"])
def test_config_matches_transformers(raw):
    from architectures.falcon_h1 import FAMILY

    ref = transformers.FalconH1Config(**raw)
    c = FAMILY.parse_config(json.loads(ref.to_json_string()), "FalconH1ForCausalLM")
    mixer = transformers.models.falcon_h1.modeling_falcon_h1
    assert c.mamba_intermediate == (ref.mamba_d_ssm or ref.mamba_expand * ref.hidden_size)
    assert (c.mamba_d_head, c.mamba_n_heads, c.mamba_n_groups) == (ref.mamba_d_head, ref.mamba_n_heads, ref.mamba_n_groups)
    assert c.head_dim == getattr(ref, "head_dim", ref.hidden_size // ref.num_attention_heads)
    assert (c.num_key_value_heads, c.rms_norm_eps, c.vocab_size) == (ref.num_key_value_heads, ref.rms_norm_eps, ref.vocab_size)
    assert c.layer_types == ref.layers_block_type
    assert list(c.mlp_multipliers) == list(ref.mlp_multipliers) and list(c.ssm_multipliers) == list(ref.ssm_multipliers)
    assert tuple(c.mamba.time_step_limit) == tuple(ref.time_step_limit)
    vector = mixer.compute_mup_vector(ref)
    assert vector.shape[-1] == c.mamba.projection
    state = c.layer_state(0)
    assert (state.conv.channels, state.conv.length) == (c.mamba.conv_dim, ref.mamba_d_conv - 1)
    assert state.kv is not None and state.kind == "full_attention"
    assert c.model_type == "granitemoehybrid"


def test_verify_feeds_kv_and_states_of_every_layer(source, tmp_path):
    # --verify's own prefill + step against transformers: it must feed each layer's KV and its
    # conv and SSM states (it used to give a layer one or the other).
    build(source, tmp_path / "out", "-p", "fp32", "--verify")


@pytest.mark.parametrize("per_row", [False, True])
def test_multipliers_are_applied_a_block_of_rows_at_a_time(monkeypatch, per_row):
    """A scaled matrix (μP's multipliers: one number, or one per row such as in_proj's) is computed
    a block of rows at a time as it is written, each block with its own rows' multipliers."""
    from architectures.falcon_h1 import scaled
    from builder.lazy import Weight

    w = np.random.default_rng(0).standard_normal((10, 4)).astype(np.float32)
    m = np.arange(1, 11, dtype=np.float32) / 3 if per_row else 0.7
    monkeypatch.setattr("builder.materialize.ROW_BLOCK_BYTES", 3 * 4 * 4)  # blocks of 3 rows
    want = w * np.asarray(m, np.float32).reshape(-1, 1)
    got = scaled(Weight.constant(w), m)
    assert got.numpy().tobytes() == want.tobytes()
    assert got.transpose().numpy().tobytes() == np.ascontiguousarray(want.T).tobytes()
