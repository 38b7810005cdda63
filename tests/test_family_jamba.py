"""Jamba (architectures/jamba.py: Mamba-1 layers with attention layers among them, Mixtral-style
experts on some layers) against transformers: the shared family proofs (tests/family_runner.py),
every KV, conv and SSM state fed back, on random Mamba parameters and biases; the Mamba-1 mixer
(builder/blocks/mamba1.py) against a numpy reference of its selective scan."""

import json

import numpy as np
import onnx_ir as ir
import onnxruntime as ort
import pytest
import torch
import transformers
from family_runner import CONFIG_FIELDS, FamilyTest, family_tests
from helpers import GENAI_PROMPT, PROMPT, make_checkpoint
from safetensors.numpy import load_file, save_file
from test_family_moe import ROUTER_SCALE, fake_quantize_experts, router_logits

import architectures
from builder.blocks.mamba1 import Mamba1Spec, Mamba1Weights, mamba1_mixer
from builder.blocks.short_conv import padding
from builder.errors import BuildError
from builder.graph import Graph
from builder.lazy import Weight
from builder.target import Target

# Four layers: Mamba (experts), attention (MLP), Mamba (experts), attention (MLP); 4 query heads of
# 16 over 2 KV heads, no rotary; a Mamba-1 mixer of 128 channels, state 8, a 4-tap conv, dt rank 4
# ("auto": 64 / 16); 4 experts, top 2 (un-normalized), routers scaled so the choice is decisive.
BASE = dict(
    vocab_size=256, hidden_size=64, intermediate_size=32, num_hidden_layers=4, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=256, attn_layer_period=2, attn_layer_offset=1,
    expert_layer_period=2, expert_layer_offset=0, num_experts=4, num_experts_per_tok=2, mamba_d_state=8,
    mamba_d_conv=4, mamba_expand=2, initializer_range=0.1,
)


def make(folder, config):
    """A tiny random Jamba whose A_log, D, dt_proj/conv1d/in/out_proj biases are random too
    (transformers initializes them to constants) and whose routers are scaled up."""
    make_checkpoint(folder, "JambaConfig", **config)
    tensors = load_file(folder / "model.safetensors")
    rng = np.random.default_rng(1)
    for key, value in tensors.items():
        if key.endswith(("mamba.D", ".bias")):
            tensors[key] = (0.5 * rng.standard_normal(value.shape)).astype(value.dtype)
        elif key.endswith("mamba.A_log"):
            tensors[key] = rng.uniform(-1, 1.5, value.shape).astype(value.dtype)
        elif key.endswith("router.weight"):
            tensors[key] = value * ROUTER_SCALE
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


VARIANTS = {
    # in_proj and out_proj biased, experts on the attention layers, a dt rank of its own
    "biases": dict(mamba_proj_bias=True, expert_layer_offset=1, mamba_dt_rank=6),
    # one attention layer (layer 2) among three Mamba layers, a 3-tap conv without bias, a wider
    # mixer (×3), a tied vocabulary
    "tied": dict(attn_layer_period=3, attn_layer_offset=2, mamba_d_conv=3, mamba_conv_bias=False, mamba_expand=3,
                 tie_word_embeddings=True),
}

# ai21labs/Jamba-v0.1's config.json in the hub's spelling (keys JambaConfig does not read as well), as
# public test fixtures quote it (the same values as AI21-Jamba-1.5-Mini's but its eos_token_id)
HUB = dict(
    attn_layer_offset=4, attn_layer_period=8, bos_token_id=1, eos_token_id=2, expert_layer_offset=1,
    expert_layer_period=2, hidden_act="silu", hidden_size=4096, initializer_range=0.02, intermediate_size=14336,
    mamba_conv_bias=True, mamba_d_conv=4, mamba_d_state=16, mamba_dt_rank=256, mamba_expand=2, mamba_proj_bias=False,
    model_type="jamba", num_attention_heads=32, num_experts=16, num_experts_per_tok=2, num_hidden_layers=32,
    num_key_value_heads=8, output_router_logits=False, pad_token_id=0, rms_norm_eps=1e-6, router_aux_loss_coef=0.001,
    tie_word_embeddings=False, use_cache=True, use_mamba_kernels=True, vocab_size=65536,
)

globals().update(family_tests(FamilyTest(
    "JambaForCausalLM", "JambaConfig", base=BASE, make=make, variants=VARIANTS,
    genai_type="granitemoehybrid", ragged=True, fp16_tolerance=2e-2, layer_lists=True,  # the layer periods
    quantize=fake_quantize_experts,
    config_raws=({}, HUB, dict(num_local_experts=8, mamba_dt_rank="auto", hidden_size=1024, attn_layer_offset=0)),
    config_fields=(*CONFIG_FIELDS, "rms_norm_eps", "layer_types", "num_experts", "num_experts_per_tok",
                   "expert_layer_period", "expert_layer_offset", "attn_layer_period", "attn_layer_offset",
                   "mamba_d_state", "mamba_d_conv", "mamba_expand", "mamba_dt_rank", "mamba_conv_bias",
                   "mamba_proj_bias"),
)))


def test_routing_is_decisive(family_checkpoint):
    model = transformers.AutoModelForCausalLM.from_pretrained(family_checkpoint, dtype=torch.float32).eval()
    k = model.config.num_experts_per_tok
    seen = 0
    for ids in (PROMPT, GENAI_PROMPT):
        for logits in router_logits(model, ids):
            top = np.sort(logits, -1)[:, ::-1]
            assert (top[:, k - 1] - top[:, k]).min() > 1e-3, "a near-tie in the top-k choice"
            seen += 1
    assert seen, "no expert layer"


def test_state_contract(family_checkpoint):
    """Mamba layers carry (conv, SSM) in transformers' layout, attention layers a KV cache; genai's
    state section names them and their layer types."""
    config = json.loads((family_checkpoint / "config.json").read_text())
    c = architectures.load("JambaForCausalLM").parse_config(config, "JambaForCausalLM")
    theirs = transformers.JambaConfig(**{k: v for k, v in config.items() if k != "architectures"})
    assert c.layer_types == theirs.layer_types
    inner = c.mamba_expand * c.hidden_size
    for i, kind in enumerate(c.layer_types):
        state = c.layer_state(i)
        if kind == "linear_attention":
            assert state.names == ("conv", "recurrent")
            assert (state.conv.channels, state.conv.length) == (inner, c.mamba_d_conv - 1)
            assert state.recurrent.shape == (inner, c.mamba_d_state)
        else:
            assert state.names == ("key", "value")
    model = transformers.AutoModelForCausalLM.from_pretrained(family_checkpoint, dtype=torch.float32).eval()
    experts = [i for i, layer in enumerate(model.model.layers) if hasattr(layer.feed_forward, "router")]
    assert experts == [i for i in range(c.num_hidden_layers) if c.sparse(i)]


@pytest.mark.parametrize("raw, message", [
    (dict(attn_layer_offset=8), "attn_layer_offset"),
    (dict(expert_layer_offset=2), "expert_layer_offset"),
    (dict(mamba_dt_rank=0), "mamba_dt_rank"),
    (dict(mamba_d_conv=1), "mamba_d_conv"),
])
def test_bad_configs_refused(raw, message):
    with pytest.raises(BuildError, match=message):
        architectures.load("JambaForCausalLM").parse_config(dict(raw, architectures=["JambaForCausalLM"]),
                                                            "JambaForCausalLM")


def test_no_rotary_settings():
    """Jamba's attention has no rotary: config.json's rope keys are never read (JambaConfig has none)."""
    c = architectures.load("JambaForCausalLM").parse_config(
        dict(architectures=["JambaForCausalLM"], rope_theta=1e6, partial_rotary_factor=0.5), "JambaForCausalLM")
    assert c.rope_parameters is None


# The mixer alone against numpy: hidden 12, 10 channels, state 5, a 4-tap conv, dt rank 3.
SPEC = Mamba1Spec(intermediate=10, state_size=5, conv_kernel=4, dt_rank=3, eps=1e-6)
HIDDEN = 12


def _params(seed=0):
    rng = np.random.default_rng(seed)
    I, N, R, K, H = SPEC.intermediate, SPEC.state_size, SPEC.dt_rank, SPEC.conv_kernel, HIDDEN

    def r(*shape, scale=0.5):
        return (scale * rng.standard_normal(shape)).astype(np.float32)

    return dict(in_proj=r(2 * I, H), in_proj_bias=r(2 * I), conv=r(I, 1, K), conv_bias=r(I), x_proj=r(R + 2 * N, I),
                dt_proj=r(I, R), dt_bias=r(I), A_log=rng.uniform(-1, 1.5, (I, N)).astype(np.float32), D=r(I),
                out_proj=r(H, I), out_proj_bias=r(H), dt_norm=1 + r(R, scale=0.2), b_norm=1 + r(N, scale=0.2),
                c_norm=1 + r(N, scale=0.2))


def _mixer_session(p):
    g = Graph()
    target = Target(io_dtype=np.dtype(np.float32))
    f32 = ir.TensorType(ir.DataType.FLOAT)
    I, N, K = SPEC.intermediate, SPEC.state_size, SPEC.conv_kernel
    h = ir.Value(name="h", type=f32, shape=ir.Shape(("B", "S", HIDDEN)))
    mask = ir.Value(name="mask", type=ir.TensorType(ir.DataType.INT64), shape=ir.Shape(("B", "T")))
    conv = ir.Value(name="conv", type=f32, shape=ir.Shape(("B", I, K - 1)))
    ssm = ir.Value(name="ssm", type=f32, shape=ir.Shape(("B", I, N)))
    w = Mamba1Weights(**{k: Weight.constant(v) for k, v in p.items()})
    outputs = mamba1_mixer(g, h, w, SPEC, conv, ssm, padding(g, h, mask, target), target)
    for v, name in zip(outputs, ("y", "conv_out", "ssm_out")):
        v.name = name
    proto = ir.serde.serialize_model(g.model([h, mask, conv, ssm], list(outputs)))
    return ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])


def _np_mixer(p, h, conv, ssm):
    """JambaMambaMixer on h (B, S, hidden) after `conv` (B, I, K−1) and `ssm` (B, I, N), in float64:
    (output, conv state, SSM state). The selective scan one token at a time, as its recurrence reads."""
    I, N, R, K = SPEC.intermediate, SPEC.state_size, SPEC.dt_rank, SPEC.conv_kernel
    silu = lambda v: v / (1 + np.exp(-v))
    rms = lambda v, w: v / np.sqrt((v * v).mean(-1, keepdims=True) + SPEC.eps) * w
    xz = h @ p["in_proj"].T + p["in_proj_bias"]
    x, z = xz[..., :I], xz[..., I:]
    window = np.concatenate([conv, x.transpose(0, 2, 1)], axis=2)  # (B, I, K−1+S)
    S = h.shape[1]
    xc = np.stack([(window[:, :, s:s + K] * p["conv"][:, 0]).sum(-1) for s in range(S)], axis=1) + p["conv_bias"]
    x = silu(xc)
    dbc = x @ p["x_proj"].T
    dt, b, c = rms(dbc[..., :R], p["dt_norm"]), rms(dbc[..., R:R + N], p["b_norm"]), rms(dbc[..., R + N:], p["c_norm"])
    dt = np.log1p(np.exp(dt @ p["dt_proj"].T + p["dt_bias"]))  # softplus, (B, S, I)
    A = -np.exp(p["A_log"].astype(np.float64))
    state, ys = ssm.astype(np.float64), []
    for s in range(S):
        state = np.exp(dt[:, s, :, None] * A) * state + (dt[:, s] * x[:, s])[:, :, None] * b[:, s, None, :]
        ys.append(state @ c[:, s, :, None])
    y = np.concatenate(ys, axis=2).transpose(0, 2, 1) + x * p["D"]
    y = y * silu(z)
    return y @ p["out_proj"].T + p["out_proj_bias"], window[:, :, -(K - 1):], state


def test_mamba1_mixer_matches_numpy_prompt_and_decode():
    """A 7-token prompt (longer than the 4-tap conv) from a random past state, then 3 decode steps,
    each fed the states the step before returned: output and both states against numpy."""
    p = _params()
    session = _mixer_session(p)
    rng = np.random.default_rng(3)
    I, N, K = SPEC.intermediate, SPEC.state_size, SPEC.conv_kernel
    conv = rng.standard_normal((2, I, K - 1)).astype(np.float32)
    ssm = rng.standard_normal((2, I, N)).astype(np.float32)
    ref_conv, ref_ssm, total = conv.astype(np.float64), ssm.astype(np.float64), 0
    for length in (7, 1, 1, 1):
        h = rng.standard_normal((2, length, HIDDEN)).astype(np.float32)
        total += length
        y, conv, ssm = session.run(None, dict(h=h, mask=np.ones((2, total), np.int64), conv=conv, ssm=ssm))
        want, ref_conv, ref_ssm = _np_mixer(p, h.astype(np.float64), ref_conv, ref_ssm)
        np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(conv, ref_conv, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(ssm, ref_ssm, rtol=1e-4, atol=1e-4)


def test_mamba1_mixer_padding_leaves_the_state():
    """A right-padded row (onnxruntime-genai's ragged batch): its present states are those after its
    last real token, and its real tokens' outputs are unchanged by the padding."""
    p = _params(1)
    session = _mixer_session(p)
    rng = np.random.default_rng(4)
    I, N, K = SPEC.intermediate, SPEC.state_size, SPEC.conv_kernel
    h = rng.standard_normal((2, 7, HIDDEN)).astype(np.float32)
    mask = np.array([[1] * 7, [1] * 5 + [0] * 2], np.int64)
    zeros = dict(conv=np.zeros((2, I, K - 1), np.float32), ssm=np.zeros((2, I, N), np.float32))
    y, conv, ssm = session.run(None, dict(h=h, mask=mask, **zeros))
    want, ref_conv, ref_ssm = _np_mixer(p, h[1:, :5].astype(np.float64), zeros["conv"][1:], zeros["ssm"][1:])
    np.testing.assert_allclose(y[1:, :5], want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(conv[1:], ref_conv, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ssm[1:], ref_ssm, rtol=1e-4, atol=1e-4)
