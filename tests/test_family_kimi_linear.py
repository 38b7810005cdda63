"""Kimi Linear (architectures/kimi_linear.py: Kimi Delta Attention layers among DeepSeek-V3's latent
attention without rotary, DeepSeek-V3's experts) against transformers: the shared family proofs
(tests/family_runner.py), every KV, conv and recurrent state fed back, on random decay parameters;
the hub's tensor names; the KDA recurrence (builder/blocks/kda.py) against a numpy reference."""

import json

import numpy as np
import onnx_ir as ir
import onnxruntime as ort
import pytest
import torch
from family_runner import CONFIG_FIELDS, FamilyTest, assert_steps_match, family_tests, load
from helpers import build, make_checkpoint
from safetensors.numpy import load_file, save_file
from test_family_moe import fake_quantize_experts

import architectures
from builder.blocks.kda import kda_rule
from builder.blocks.short_conv import padding
from builder.errors import BuildError
from builder.graph import Graph
from builder.target import Target

ARCH = "KimiLinearForCausalLM"
# Four layers: KDA, MLA, KDA, KDA (layer_types in transformers' spelling); 2 KDA heads of 8, a 4-tap
# conv; 3 MLA heads, rank 32, rope part 16, nope 24, v 20, biased projections (q_lora_rank: its own test); a dense
# first layer then 8 experts in 2 groups (the best 1 kept), top 2, a shared expert.
BASE = dict(
    vocab_size=256, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=4,
    num_attention_heads=3, num_key_value_heads=3, q_lora_rank=None, kv_lora_rank=32, qk_rope_head_dim=16,
    qk_nope_head_dim=24, v_head_dim=20, num_local_experts=8, num_experts_per_tok=2, n_group=2, topk_group=1,
    n_shared_experts=1, routed_scaling_factor=2.5, max_position_embeddings=256, attention_bias=True,
    linear_num_heads=2, linear_head_dim=8, linear_conv_kernel_dim=4,
    layer_types=["linear_attention", "full_attention", "linear_attention", "linear_attention"],
    initializer_range=0.1, eos_token_id=255, bos_token_id=0, pad_token_id=0, tie_word_embeddings=False,
)


def make(folder, config):
    """A tiny random Kimi Linear whose decay parameters (A_log, dt_bias), norms, biases and router
    correction biases are random (transformers initializes some to constants)."""
    make_checkpoint(folder, "KimiLinearConfig", **config)
    tensors = load_file(folder / "model.safetensors")
    rng = np.random.default_rng(1)
    for key, value in tensors.items():
        if key.endswith("A_log"):
            tensors[key] = np.log(rng.uniform(0.2, 2.0, value.shape)).astype(value.dtype)
        elif key.endswith("dt_bias"):
            tensors[key] = rng.uniform(-3, 1, value.shape).astype(value.dtype)
        elif key.endswith(("e_score_correction_bias", ".bias")):
            tensors[key] = rng.standard_normal(value.shape).astype(value.dtype)
        elif key.endswith("norm.weight"):
            tensors[key] = (1 + 0.3 * rng.standard_normal(value.shape)).astype(value.dtype)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


FLOAT = ("kv_b_proj", "forget_gate.", "b_proj", "g_a_proj", "g_b_proj")


def quantize(model, *args, **kwargs):
    """The build's int4 rounding: every Linear and each stored expert (fake_quantize_experts) but
    kv_b_proj (absorbed into per-head MatMuls) and KDA's small gate projections (f_a/f_b, b, g_a/g_b),
    which stay float."""
    kept = {n: p.clone() for n, p in model.named_parameters() if any(f in n for f in FLOAT)}
    fake_quantize_experts(model, *args, **kwargs)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name in kept:
                p.copy_(kept[name])


VARIANTS = {
    "biases": {},
    # no biases, a 3-tap conv, heads of 16, two MLA
    # layers, two dense layers, 4 groups of 2 experts (2 kept), top 3
    "plain": dict(attention_bias=False, linear_conv_kernel_dim=3, linear_head_dim=16,
                  linear_num_heads=3, layer_types=["linear_attention", "full_attention", "linear_attention",
                                                   "full_attention"],
                  first_k_dense_replace=2, n_group=4, topk_group=2, num_experts_per_tok=3),
}

# moonshotai/Kimi-Linear-48B-A3B-Instruct's config.json in the hub's spelling (KimiLinearConfig's
# attribute_map names, the linear_attn_config sub-dict, keys transformers does not read)
HUB = dict(
    model_type="kimi_linear", vocab_size=163840, hidden_size=2304, intermediate_size=9216, moe_intermediate_size=1024,
    num_hidden_layers=27, num_attention_heads=32, num_key_value_heads=32, kv_lora_rank=512, q_lora_rank=None,
    qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, mla_use_nope=True, hidden_act="silu",
    rms_norm_eps=1e-5, model_max_length=1048576, num_experts=256, num_experts_per_token=8, num_shared_experts=1,
    moe_renormalize=True, moe_router_activation_func="sigmoid", num_expert_group=1, topk_group=1,
    routed_scaling_factor=2.446, first_k_dense_replace=1, use_grouped_topk=True, tie_word_embeddings=False,
    bos_token_id=163584, eos_token_id=163585, pad_token_id=163839,
    linear_attn_config=dict(full_attn_layers=[4, 8, 12, 16, 20, 24, 27],
                            kda_layers=[i for i in range(1, 28) if i not in (4, 8, 12, 16, 20, 24, 27)],
                            head_dim=128, num_heads=32, short_conv_kernel_size=4),
)

globals().update(family_tests(FamilyTest(
    ARCH, "KimiLinearConfig", base=BASE, make=make, variants=VARIANTS, genai_type="qwen3_5_text", ragged=True,
    layer_lists=True, quantize=quantize, name="kimi_linear",
    config_raws=({}, HUB, dict(num_hidden_layers=6, first_k_dense_replace=3, num_experts=16, num_expert_group=4, topk_group=2,
                                     num_experts_per_token=6)),
    config_fields=(*(f for f in CONFIG_FIELDS if f != "num_key_value_heads"), "rms_norm_eps", "layer_types",
                   "mlp_layer_types", "num_local_experts", "num_experts_per_tok", "n_group", "topk_group",
                   "n_shared_experts", "norm_topk_prob", "routed_scaling_factor", "q_lora_rank", "kv_lora_rank",
                   "linear_head_dim", "linear_num_heads", "linear_conv_kernel_dim"),
)))


def test_state_contract(family_checkpoint):
    """KDA layers carry (conv over q, k, v channels, kernel − 1) and (heads, head_dim, head_dim);
    MLA layers one KV head of rope + rank; the sparse layers are transformers'."""
    config = json.loads((family_checkpoint / "config.json").read_text())
    c = architectures.load(ARCH).parse_config(config, ARCH)
    D, heads = c.linear_head_dim, c.linear_num_heads
    for i, kind in enumerate(c.layer_types):
        state = c.layer_state(i)
        if kind == "linear_attention":
            assert (state.conv.channels, state.conv.length) == (3 * heads * D, c.linear_conv_kernel_dim - 1)
            assert state.recurrent.shape == (heads, D, D)
        else:
            assert (state.kv.heads, state.kv.head_size) == (1, c.qk_rope_head_dim + c.kv_lora_rank)
    model = load(family_checkpoint)
    assert [i for i, l in enumerate(model.model.layers) if hasattr(l.mlp, "gate")] == \
        [i for i in range(c.num_hidden_layers) if c.sparse(i)]


def test_checkpoints_carry_the_hub_names(family_checkpoint):
    """transformers saves the conversion's sources (the hub's names): separate q/k/v convs, the
    forget gate under self_attn, block_sparse_moe with per-expert w1/w3/w2; so every proof above
    reads them through MODEL_TYPES' renames and the concatenated conv."""
    names = set(load_file(family_checkpoint / "model.safetensors"))
    assert {"model.layers.0.self_attn.q_conv1d.weight", "model.layers.0.self_attn.A_log",
            "model.layers.2.block_sparse_moe.experts.0.w1.weight"} <= names
    assert not any(".forget_gate." in n or n.endswith("self_attn.conv1d.weight") for n in names)


@pytest.mark.parametrize("raw, message", [
    (dict(num_key_value_heads=2), "num_key_value_heads"),
    (dict(linear_conv_kernel_dim=1), "linear_conv_kernel_dim"),
    (dict(num_hidden_layers=2, mlp_layer_types=["dense"]), "mlp_layer_types"),
    (dict(num_hidden_layers=2, linear_attn_config=dict(full_attn_layers=[3], kda_layers=[1])), "full_attn_layers"),
    (dict(layer_types=["sliding_attention"] * 27), "layer_types"),
])
def test_bad_configs_refused(raw, message):
    with pytest.raises(BuildError, match=message):
        architectures.load(ARCH).parse_config(dict(raw, architectures=[ARCH]), ARCH)


def test_no_rotary_settings():
    """KimiLinearConfig has no rope_parameters: the MLA never rotates, config.json's rope keys are unread."""
    c = architectures.load(ARCH).parse_config(dict(architectures=[ARCH], rope_theta=5e4,
                                                    rope_scaling=dict(type="yarn", factor=4.0)), ARCH)
    assert c.rope_parameters is None and c.softmax_scale == (128 + 64) ** -0.5


# The recurrence alone against numpy: 3 heads, key_dim 4, value_dim 5.
HEADS, DK, DV = 3, 4, 5


def _kda_session():
    g = Graph()
    target = Target(io_dtype=np.dtype(np.float32))
    f32 = ir.TensorType(ir.DataType.FLOAT)

    def inp(name, *shape):
        return ir.Value(name=name, type=f32, shape=ir.Shape(shape))

    q, k, decay = inp("q", "B", "S", HEADS, DK), inp("k", "B", "S", HEADS, DK), inp("g", "B", "S", HEADS, DK)
    v, beta, past = inp("v", "B", "S", HEADS, DV), inp("beta", "B", "S", HEADS), inp("past", "B", HEADS, DK, DV)
    mask = ir.Value(name="mask", type=ir.TensorType(ir.DataType.INT64), shape=ir.Shape(("B", "T")))
    out, present = kda_rule(g, q, k, v, decay, beta, padding(g, q, mask, target).keep, past, DK, np.float32)
    out.name, present.name = "out", "present"
    proto = ir.serde.serialize_model(g.model([q, k, v, decay, beta, mask, past], [out, present]))
    return ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])


def _np_kda(q, k, v, g, beta, state):
    """recurrent_kimi_delta_attention in float64: l2-normalized q (scaled by 1/√DK) and k; per token
    S ← exp(g) ⊙rows S, S ← S + k ⊗ β(v − Sᵀk), o = Sᵀq."""
    norm = lambda x: x / np.sqrt((x * x).sum(-1, keepdims=True) + 1e-6)
    q, k, state = norm(q) / np.sqrt(DK), norm(k), state.astype(np.float64)
    outs = []
    for t in range(q.shape[1]):
        state = state * np.exp(g[:, t])[..., None]
        delta = (v[:, t] - np.einsum("bhk,bhkv->bhv", k[:, t], state)) * beta[:, t, :, None]
        state = state + k[:, t, :, :, None] * delta[:, :, None, :]
        outs.append(np.einsum("bhk,bhkv->bhv", q[:, t], state))
    return np.stack(outs, 1), state


def _inputs(rng, batch, length):
    r = lambda *s: rng.standard_normal(s)
    return dict(q=r(batch, length, HEADS, DK), k=r(batch, length, HEADS, DK), v=r(batch, length, HEADS, DV),
                g=-rng.uniform(0.01, 2.0, (batch, length, HEADS, DK)),
                beta=rng.uniform(0.05, 0.95, (batch, length, HEADS)))


def test_kda_rule_matches_numpy_prompt_and_decode():
    """A 9-token prompt from a random state, then 3 decode steps fed the state returned before."""
    session, rng = _kda_session(), np.random.default_rng(0)
    state = rng.standard_normal((2, HEADS, DK, DV))
    ref, total = state, 0
    for length in (9, 1, 1, 1):
        x = _inputs(rng, 2, length)
        total += length
        feed = {n: a.astype(np.float32) for n, a in x.items()}
        out, state = session.run(None, dict(feed, mask=np.ones((2, total), np.int64), past=state.astype(np.float32)))
        want, ref = _np_kda(**x, state=ref)
        np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(state, ref, rtol=1e-4, atol=1e-5)


def test_kda_rule_padding_leaves_the_state():
    """A right-padded row: its present state is the one after its last real token."""
    session, rng = _kda_session(), np.random.default_rng(1)
    x = _inputs(rng, 2, 6)
    zero = np.zeros((2, HEADS, DK, DV))
    mask = np.array([[1] * 6, [1] * 4 + [0] * 2], np.int64)
    out, state = session.run(None, dict({n: a.astype(np.float32) for n, a in x.items()}, mask=mask,
                                        past=zero.astype(np.float32)))
    want, ref = _np_kda(**{n: a[1:, :4] for n, a in x.items()}, state=zero[1:])
    np.testing.assert_allclose(out[1:, :4], want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(state[1:], ref, rtol=1e-4, atol=1e-5)


def test_q_lora_rank(tmp_path):
    # The MLA's query through q_a_proj (biased), q_a_layernorm (eps 1e-6) and q_b_proj.
    source = make(tmp_path / "src", {**BASE, "q_lora_rank": 48})
    assert_steps_match(build(source, tmp_path / "out", "-p", "fp32"), load(source))
