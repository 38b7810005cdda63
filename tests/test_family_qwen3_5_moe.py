"""Qwen3.5-MoE's text decoder (Qwen3.5's gated DeltaNet and gated attention layers, each with a
softmax-routed mixture of experts and a sigmoid-gated shared expert) against transformers: fp32
prefill and decode steps feeding back every KV, conv and recurrent state, both expert layouts,
int4 against the same rounding, the hub's multimodal layout, and onnxruntime-genai's greedy
generation as its `qwen3_5_moe_text` type; Qwen3-Next (fused DeltaNet projections, dense layers,
un-renormalized top k) the same way."""

import json
import shutil

import numpy as np
import pytest
import torch
import transformers
from helpers import GENAI_PROMPT, build, make_checkpoint
from safetensors.numpy import load_file, save_file
from family_runner import assert_steps_match
from test_family_moe import fake_quantize_experts

import architectures
from builder.options import PRECISION_DEFAULTS

# Both layer kinds (a linear layer first and last), 3 query heads over 1 KV head, partial rotary;
# 2 key heads each serving 2 of 4 value heads; a 4-tap conv; 8 experts of which 3 are chosen, a
# shared expert of another width. Sizes the int4 block (32) divides.
CONFIG = dict(
    vocab_size=256, hidden_size=64, num_hidden_layers=4, num_attention_heads=3, num_key_value_heads=1,
    head_dim=64, max_position_embeddings=256, linear_conv_kernel_dim=4, linear_key_head_dim=8,
    linear_value_head_dim=12, linear_num_key_heads=2, linear_num_value_heads=4,
    layer_types=["linear_attention", "full_attention", "linear_attention", "linear_attention"],
    num_experts=8, num_experts_per_tok=3, moe_intermediate_size=32, shared_expert_intermediate_size=64,
    initializer_range=0.1, eos_token_id=255, tie_word_embeddings=False,
)
PROMPT = [5, 17, 33, 12, 99, 100, 7, 8, 61, 42]  # longer than the kernel
ROUTER_SCALE = 10.0  # random routers are near-uniform; scaled up, their choices are decisive


def scale_routers(folder):
    tensors = load_file(folder / "model.safetensors")
    for key in tensors:
        if key.endswith("mlp.gate.weight"):
            tensors[key] = tensors[key] * ROUTER_SCALE
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    folder = tmp_path_factory.mktemp("qwen3_5_moe")
    make_checkpoint(folder, "Qwen3_5MoeTextConfig", **CONFIG)
    scale_routers(folder)
    return folder


def load(source):
    model = transformers.AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).eval()
    assert type(model).__name__ == "Qwen3_5MoeForCausalLM"
    return model


def test_routing_is_decisive(source):
    # The parity tests prove the router only if no top-k choice is a near-tie an ulp could flip.
    model = load(source)
    seen = []
    hooks = [layer.mlp.gate.register_forward_hook(lambda m, i, o: seen.append(o[0].numpy()))
             for layer in model.model.layers]
    with torch.no_grad():
        model(torch.tensor([PROMPT + GENAI_PROMPT]))
    for h in hooks:
        h.remove()
    k = CONFIG["num_experts_per_tok"]
    for logits in seen:
        top = np.sort(logits, -1)[:, ::-1]
        assert (top[:, k - 1] - top[:, k]).min() > 1e-3, "a near-tie in the top-k choice"
    assert len(seen) == CONFIG["num_hidden_layers"]


def test_fp32_prefill_and_decode_match_transformers(source, tmp_path):
    out = build(source, tmp_path / "out", "-p", "fp32")
    assert json.loads((out / "genai_config.json").read_text())["model"]["type"] == "qwen3_5_moe_text"
    assert_steps_match(out, load(source))


def test_stacked_experts_build_the_same_model(source, tmp_path):
    # The checkpoint holds per-expert Linears (experts.{e}.gate_proj, ..., as on the hub); stacked
    # instead: experts.gate_up_proj [E, 2I, H] (gate rows, then up) and experts.down_proj [E, H, I].
    stacked = tmp_path / "stacked"
    shutil.copytree(source, stacked)
    tensors, E = load_file(stacked / "model.safetensors"), CONFIG["num_experts"]
    for layer in range(CONFIG["num_hidden_layers"]):
        p = f"model.layers.{layer}.mlp.experts."
        each = {w: [tensors.pop(f"{p}{e}.{w}.weight") for e in range(E)] for w in ("gate_proj", "up_proj", "down_proj")}
        tensors[p + "gate_up_proj"] = np.stack([np.concatenate(x) for x in zip(each["gate_proj"], each["up_proj"])])
        tensors[p + "down_proj"] = np.stack(each["down_proj"])
    save_file(tensors, stacked / "model.safetensors", metadata={"format": "pt"})
    assert_steps_match(build(stacked, tmp_path / "out", "-p", "fp32"), load(source))


def test_int4_matches_fake_quantized_transformers(source, tmp_path):
    # Every Linear and expert rounded as the build rounds them, but the DeltaNet's in_proj_a /
    # in_proj_b and the shared-expert gate, which stay float as the router and conv kernels do.
    int4 = PRECISION_DEFAULTS["int4"]
    out = build(source, tmp_path / "out", "-p", "int4", "--accuracy-level", "0")
    model = load(source)
    small = {n: p.clone() for n, p in model.named_parameters() if n.endswith(("in_proj_a.weight", "in_proj_b.weight"))}
    fake_quantize_experts(model, 4, 32, int4["symmetric"], method=int4["quant_method"])
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name in small:
                p.copy_(small[name])
    assert_steps_match(out, model, min_cosine=0.999)


def test_multimodal_checkpoint_builds_its_text_decoder(tmp_path):
    # The hub's layout: Qwen3_5MoeForConditionalGeneration, the decoder under model.language_model.*.
    torch.manual_seed(0)
    vision = dict(depth=1, hidden_size=32, num_heads=2, intermediate_size=32, out_hidden_size=64, patch_size=4)
    config = transformers.Qwen3_5MoeConfig(text_config=CONFIG, vision_config=vision)
    model = transformers.Qwen3_5MoeForConditionalGeneration(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            if name.endswith("mlp.gate.weight"):
                p.mul_(ROUTER_SCALE)
    model.save_pretrained(tmp_path / "src")
    assert_steps_match(build(tmp_path / "src", tmp_path / "out", "-p", "fp32"), model)


def test_genai_greedy_matches_transformers(source, tmp_path):
    from test_genai import assert_same_greedy

    assert_same_greedy(build(source, tmp_path / "out", "-p", "fp32"), source, GENAI_PROMPT)


def test_config_matches_transformers():
    from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import Qwen3_5MoeGatedDeltaNet

    name = "Qwen3_5MoeForCausalLM"
    c = architectures.load(name).parse_config({"architectures": [name]}, name)
    want = transformers.Qwen3_5MoeTextConfig()
    for key in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                "head_dim", "num_experts", "num_experts_per_tok", "moe_intermediate_size",
                "shared_expert_intermediate_size", "layer_types", "linear_num_value_heads"):
        assert getattr(c, key) == getattr(want, key), key
    assert c.rope_parameters["partial_rotary_factor"] == want.rope_parameters["partial_rotary_factor"]
    with torch.device("meta"):
        layer = Qwen3_5MoeGatedDeltaNet(want, 0)
    state = next(s for s in map(c.layer_state, range(c.num_hidden_layers)) if s.conv)
    assert (state.conv.channels, state.conv.length) == (layer.conv_dim, layer.conv_kernel_size - 1)


# Qwen3-Next: the same layers with the DeltaNet's projections fused per key head, layer 1 dense
# (mlp_only_layers, intermediate_size 96), the top k not renormalized.
NEXT = dict(CONFIG, mlp_only_layers=[1], intermediate_size=96, norm_topk_prob=False)


@pytest.fixture(scope="module")
def next_source(tmp_path_factory):
    folder = tmp_path_factory.mktemp("qwen3_next")
    make_checkpoint(folder, "Qwen3NextConfig", **NEXT)
    scale_routers(folder)
    return folder


def test_qwen3_next_matches_transformers(next_source, tmp_path):
    model = transformers.AutoModelForCausalLM.from_pretrained(next_source, dtype=torch.float32).eval()
    assert type(model).__name__ == "Qwen3NextForCausalLM" and not hasattr(model.model.layers[1].mlp, "gate")
    out = build(next_source, tmp_path / "out", "-p", "fp32")
    assert_steps_match(out, model)
    assert json.loads((out / "genai_config.json").read_text())["model"]["type"] == "qwen3_5_moe_text"


def test_qwen3_next_int4_matches_fake_quantized_transformers(next_source, tmp_path):
    # in_proj_ba (split into b and a) stays float as Qwen3.5's in_proj_a / in_proj_b do.
    int4 = PRECISION_DEFAULTS["int4"]
    out = build(next_source, tmp_path / "out", "-p", "int4", "--accuracy-level", "0")
    model = transformers.AutoModelForCausalLM.from_pretrained(next_source, dtype=torch.float32).eval()
    small = {n: p.clone() for n, p in model.named_parameters() if n.endswith("in_proj_ba.weight")}
    fake_quantize_experts(model, 4, 32, int4["symmetric"], method=int4["quant_method"])
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name in small:
                p.copy_(small[name])
    assert_steps_match(out, model, min_cosine=0.999)


def test_qwen3_next_genai_greedy_matches_transformers(next_source, tmp_path):
    from test_genai import assert_same_greedy

    assert_same_greedy(build(next_source, tmp_path / "out", "-p", "fp32"), next_source, GENAI_PROMPT)


def test_qwen3_next_config_matches_transformers():
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextDecoderLayer

    name = "Qwen3NextForCausalLM"
    raw = dict(num_hidden_layers=6, mlp_only_layers=[0], decoder_sparse_step=2, full_attention_interval=3)
    c = architectures.load(name).parse_config({**raw, "architectures": [name]}, name)
    want = transformers.Qwen3NextConfig(**raw)
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_experts", "num_experts_per_tok",
                "num_key_value_heads", "head_dim", "linear_num_value_heads", "moe_intermediate_size", "shared_expert_intermediate_size", "norm_topk_prob", "layer_types"):
        assert getattr(c, key) == getattr(want, key), key
    small = transformers.Qwen3NextConfig(**raw, hidden_size=64, num_experts=4, num_experts_per_tok=2, vocab_size=16)
    with torch.device("meta"):
        layers = [Qwen3NextDecoderLayer(small, i) for i in range(6)]
    assert [c.sparse(i) for i in range(6)] == [hasattr(x.mlp, "gate") for x in layers]


def test_genai_batch_of_different_lengths_matches_transformers(source, tmp_path):
    # genai pads the shorter row on the right: its states must stop at its last real token.
    from family_runner import assert_ragged_batch_matches

    out = build(source, tmp_path / "out", "-p", "fp32")
    assert_ragged_batch_matches(out, load(source))
