"""Lara Mini (architectures/lara_mini.py: Qwen3.5's gated DeltaNet layers between Qwen3 attention
layers that slide and rotate or attend globally without positions, each with a softmax-routed
mixture of experts beside an ungated shared expert) against transformers: the shared family proofs
(tests/family_runner.py), every KV, conv and recurrent state fed back, int4 with the stacked experts
rounded too, the features that change the logits, the hub's fused `in_proj` and transformers' split
names, and what builder refuses.

Random where transformers initializes to constants: the DeltaNet's A_log and dt_bias, the attention
biases (zero); the routers scaled up so their top-k choices are decisive. transformers runs the
delta rule in chunks of 64 (its fixed chunk_size, longer than any prompt here), builder as ONNX
Runtime's LinearAttention: they agree within the fp32 tolerance of 1e-4."""

import json

import numpy as np
import pytest
import torch
import transformers
from conftest import TINY
from family_runner import RAGGED, FamilyTest, assert_steps_match, family_tests, load, router_outputs, modules_named
from helpers import GENAI_PROMPT, PROMPT, build, make_checkpoint, relative_error
from safetensors.numpy import load_file, save_file
from test_family_moe import fake_quantize_experts

import architectures
from builder.errors import BuildError

ARCHITECTURE = "LaraMiniForCausalLM"
ROUTER_SCALE = 10.0  # random routers are near-uniform; scaled up, their choices are decisive
# 4 query heads of 16 over 2 KV heads; 2 key heads of 8 each serving 2 of 4 value heads of 12, a
# 4-tap conv; top-3 of 8 experts beside a shared expert of another width.
BASE = dict(TINY, head_dim=16, eos_token_id=2, linear_key_head_dim=8, linear_value_head_dim=12,
            linear_num_key_heads=2, linear_num_value_heads=4, num_experts=8, num_experts_per_tok=3,
            moe_intermediate_size=32, shared_expert_intermediate_size=48, initializer_range=0.1)
VARIANTS = {
    # Every feature on: both layer kinds (a linear layer first and last), sliding layers (a window of 4,
    # shorter than the prompts) around a full one, attention biases, an untied vocabulary.
    "biases": dict(num_hidden_layers=5, sliding_window=4, attention_bias=True, tie_word_embeddings=False,
                   layer_types=["linear_attention", "sliding_attention", "full_attention", "sliding_attention",
                                "linear_attention"]),
    # The other way: LaraMiniConfig's own layer_types over 6 layers (linear, sliding, linear, full,
    # sliding, linear), 1 key head serving 3 value heads, a 3-tap conv, top-2 of 4 un-normalized,
    # YaRN on the sliding layers, a tied vocabulary.
    "pattern": dict(num_hidden_layers=6, sliding_window=5, linear_num_key_heads=1, linear_num_value_heads=3,
                    linear_conv_kernel_dim=3, num_experts=4, num_experts_per_tok=2, norm_topk_prob=False,
                    shared_expert_intermediate_size=16,
                    rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0,
                                         original_max_position_embeddings=4)),
}


def make(folder, config):
    make_checkpoint(folder, "LaraMiniConfig", **config)
    tensors, rng = load_file(folder / "model.safetensors"), np.random.default_rng(1)
    for key, value in tensors.items():
        if key.endswith("mlp.gate.weight"):
            tensors[key] = value * ROUTER_SCALE
        elif key.endswith(("linear_attn.dt_bias", "_proj.bias")):
            tensors[key] = (0.5 * rng.standard_normal(value.shape)).astype(value.dtype)
        elif key.endswith("linear_attn.A_log"):
            tensors[key] = rng.uniform(-1, 1.5, value.shape).astype(value.dtype)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


def quantize(model, *args, **kwargs):
    """fake_quantize_experts but for the DeltaNet's in_proj_a / in_proj_b, which the build keeps float."""
    small = {n: p.clone() for n, p in model.named_parameters() if n.endswith(("in_proj_a.weight", "in_proj_b.weight"))}
    fake_quantize_experts(model, *args, **kwargs)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name in small:
                p.copy_(small[name])


SPEC = FamilyTest(
    ARCHITECTURE, "LaraMiniConfig", VARIANTS, base=BASE, make=make, genai_type="qwen3_5_text", ragged=True,
    fp16_tolerance=1e-2,  # measured 5.4e-3 (the first variant's worst step)
    layer_lists=True,  # layer_types
    quantize=quantize,  # LaraMiniExperts' stacked gate_up_proj/down_proj, rounded as QMoE rounds them
    config_raws=(
        {},
        # the hub's spellings: rope_theta beside a null rope_scaling, null layer_types (its
        # __post_init__ fills them), a list of eos ids, keys of Qwen3-Next LaraMiniConfig ignores
        dict(num_hidden_layers=12, rope_theta=1e6, rope_scaling=None, layer_types=None, eos_token_id=[1, 2],
             sliding_window=1024, full_attention_interval=2, decoder_sparse_step=2, mlp_only_layers=[0],
             intermediate_size=99, tie_word_embeddings=False),
        dict(rope_scaling=dict(type="yarn", factor=4.0, original_max_position_embeddings=32768), norm_topk_prob=False),
    ),
    config_fields=("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                   "head_dim", "hidden_act", "max_position_embeddings", "tie_word_embeddings", "bos_token_id",
                   "eos_token_id", "pad_token_id", "rms_norm_eps", "attention_bias", "sliding_window", "layer_types",
                   "linear_conv_kernel_dim", "linear_key_head_dim", "linear_value_head_dim", "linear_num_key_heads",
                   "linear_num_value_heads", "moe_intermediate_size", "shared_expert_intermediate_size",
                   "num_experts", "num_experts_per_tok", "norm_topk_prob"),
)
globals().update(family_tests(SPEC))


def test_routing_is_decisive(family_checkpoint):
    # The parity proofs prove the router only if its choices are clear-cut: no near-tie an ulp could flip.
    model = load(family_checkpoint)
    k = model.config.num_experts_per_tok
    seen = router_outputs(model, modules_named(model, "LaraMiniTopKRouter"), [PROMPT + GENAI_PROMPT, *RAGGED])
    assert len(seen) == 3 * model.config.num_hidden_layers
    for logits in seen:
        top = np.sort(logits, -1)[:, ::-1]
        assert (top[:, k - 1] - top[:, k]).min() > 1e-3, "a near-tie in the top-k choice"


@pytest.fixture(scope="module")
def biases(tmp_path_factory):
    return SPEC.checkpoint(tmp_path_factory.mktemp("biases"), "biases")


def test_full_layers_do_not_rotate(biases, tmp_path, monkeypatch):
    # The full-attention layers have no positional encoding: a build that rotated them too (as
    # Qwen3 does every layer) is far from transformers.
    from architectures.lara_mini import LaraMiniConfig

    model = load(biases)
    monkeypatch.setattr(LaraMiniConfig, "rotates", lambda self, layer: True)
    with pytest.raises(AssertionError, match="relative error"):
        assert_steps_match(build(biases, tmp_path / "out", "-p", "fp32"), model)


def test_sliding_layers_slide(biases, tmp_path, monkeypatch):
    # The window (4) is shorter than the prompt: a build whose sliding layers attended globally is
    # far from transformers.
    from architectures.lara_mini import LaraMiniConfig

    model = load(biases)
    monkeypatch.setattr(LaraMiniConfig, "window", lambda self, layer: None)
    with pytest.raises(AssertionError, match="relative error"):
        assert_steps_match(build(biases, tmp_path / "out", "-p", "fp32"), model)


def test_random_delta_net_parameters_change_the_logits(biases):
    # A_log and dt_bias are random here (transformers initializes them to constants): one misread
    # would fail the fp32 proof, as transformers itself moves far when they change.
    model = load(biases)
    with torch.no_grad():
        want = model(torch.tensor([PROMPT])).logits.numpy()
        for name in ("A_log", "dt_bias"):
            for layer in (model.model.layers[0], model.model.layers[4]):
                p = getattr(layer.linear_attn, name)
                saved = p.clone()
                p.fill_(0.5)
                assert relative_error(model(torch.tensor([PROMPT])).logits.numpy(), want) > 100 * 1e-4, name
                p.copy_(saved)


def test_transformers_names_and_another_class_spelling(tmp_path):
    # The hub (and save_pretrained) stores the DeltaNet's projections fused, `in_proj` rows
    # [q|k|v|z|b|a], and its gated norm as `out_norm`; transformers' names in memory (in_proj_qkv,
    # in_proj_z, in_proj_b, in_proj_a, norm), which it loads as they are, build the same model. And
    # config.json naming another class: transformers dispatches on model_type, and so does builder.
    source = SPEC.checkpoint(tmp_path / "src", "biases")
    model = load(source)
    tensors, split = load_file(source / "model.safetensors"), {}
    sizes = dict(in_proj_qkv=2 * 2 * 8 + 4 * 12, in_proj_z=4 * 12, in_proj_b=4, in_proj_a=4)
    assert "model.layers.0.linear_attn.in_proj.weight" in tensors
    for key, value in tensors.items():
        if key.endswith("linear_attn.in_proj.weight"):
            start = 0
            for name, rows in sizes.items():
                split[key.replace("in_proj.", f"{name}.")] = value[start:start + rows]
                start += rows
            assert start == value.shape[0]
        else:
            split[key.replace("linear_attn.out_norm.", "linear_attn.norm.")] = value
    save_file(split, source / "model.safetensors", metadata={"format": "pt"})
    raw = json.loads((source / "config.json").read_text())
    (source / "config.json").write_text(json.dumps({**raw, "architectures": ["LaraForCausalLM"]}))
    assert_steps_match(build(source, tmp_path / "out", "-p", "fp32"), model)


@pytest.mark.parametrize("raw", [dict(num_hidden_layers=7), dict(num_hidden_layers=3, linear_conv_kernel_dim=2)])
def test_layers_and_states_are_transformers(raw):
    from transformers.models.lara_mini.modeling_lara_mini import LaraMiniGatedDeltaNet

    c = architectures.load(ARCHITECTURE).parse_config(dict(raw, architectures=[ARCHITECTURE]), ARCHITECTURE)
    want = transformers.LaraMiniConfig(**raw)
    assert c.layer_types == want.layer_types
    assert [c.rotates(i) for i in range(c.num_hidden_layers)] == [t == "sliding_attention" for t in want.layer_types]
    with torch.device("meta"):
        layer = LaraMiniGatedDeltaNet(want, 0)
    state = c.layer_state(0)
    assert (state.conv.channels, state.conv.length) == (layer.conv_dim, layer.conv_kernel_size - 1)
    assert state.recurrent.shape == (layer.num_v_heads, layer.head_k_dim, layer.head_v_dim)
    for i, kind in enumerate(want.layer_types):
        if kind != "linear_attention":
            assert c.layer_state(i).kv.window == (want.sliding_window if kind == "sliding_attention" else None)


@pytest.mark.parametrize("raw, message", [
    (dict(hidden_act="gelu"), "SwiGLU"),  # transformers runs gelu experts; no MoE/QMoE activation computes them
    (dict(num_experts=4, num_experts_per_tok=5), "num_experts_per_tok=5 of 4 experts"),  # its topk fails
    (dict(num_hidden_layers=4, sliding_window=0), "sliding_window 0"),  # its sliding mask fails
    (dict(sliding_window=None), "sliding_window is null"),  # LaraMiniConfig types it int
    (dict(head_dim=None), "head_dim is null"),  # likewise
    (dict(linear_num_key_heads=3, linear_num_value_heads=4), "not a multiple"),  # LaraMiniConfig refuses it
    (dict(rope_parameters=dict(rope_type="linear", factor=2.0, partial_rotary_factor=0.5)),
     "partial_rotary_factor"),  # the sliding layers' cos/sin narrower than the head: transformers fails
])
def test_refused(raw, message):
    with pytest.raises(BuildError, match=message):
        architectures.load(ARCHITECTURE).parse_config(dict(raw, architectures=[ARCHITECTURE]), ARCHITECTURE)


@pytest.mark.parametrize("raw", [
    dict(num_hidden_layers=1, sliding_window=0),  # no sliding layer reads the window
    # no layer rotates: the partial factor under a scaled rope is never applied
    dict(num_hidden_layers=4, layer_types=["linear_attention", "full_attention"] * 2,
         rope_parameters=dict(rope_type="linear", factor=2.0, partial_rotary_factor=0.5)),
    dict(partial_rotary_factor=0.25),  # the default rotary ignores it: the whole head rotates
])
def test_what_transformers_runs_is_not_refused(raw):
    architectures.load(ARCHITECTURE).parse_config(dict(raw, architectures=[ARCHITECTURE]), ARCHITECTURE)
    config = transformers.LaraMiniConfig(**{**BASE, "num_hidden_layers": 5, **raw})
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        assert torch.isfinite(model(torch.tensor([PROMPT])).logits).all()
