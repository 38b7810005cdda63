"""LongCat-Flash (architectures/longcat_flash.py: two latent attentions, two dense MLPs and a shortcut
mixture of experts with zero experts per layer) against transformers: the shared family proofs
(tests/family_runner.py), the two caches per layer, routing that picks zero experts for some tokens
(and for every pick), the second attention's part, and the configs refused.

The int4 proof rounds the stacked experts too (LongcatFlashExperts' [E, 2I, H] / [E, H, I]), expert
by expert (test_family_moe's fake_quantize_experts), and keeps kv_b_proj and the router float, as
the build does."""

import json

import numpy as np
import onnxruntime as ort
import pytest
import torch
from family_runner import (
    CONFIG_FIELDS,
    FamilyTest,
    assert_steps_match,
    family_tests,
    load,
)
from helpers import PROMPT, build, make_checkpoint
from safetensors.numpy import load_file, save_file
from test_family_moe import fake_quantize_experts

import architectures
from builder.errors import BuildError

ARCHITECTURE = "LongcatFlashForCausalLM"
# 2 layers (4 attentions) of 3 heads: q_lora 48, kv_lora 32, rope 16, nope 24, v 20 (all different);
# 8 experts of 32 and 4 zero experts, top 3.
BASE = dict(vocab_size=256, hidden_size=64, ffn_hidden_size=96, expert_ffn_hidden_size=32, num_layers=2,
            num_attention_heads=3, q_lora_rank=48, kv_lora_rank=32, qk_rope_head_dim=16, head_dim=16,
            qk_nope_head_dim=24, v_head_dim=20, n_routed_experts=8, zero_expert_num=4, moe_topk=3,
            routed_scaling_factor=2.5, max_position_embeddings=256, initializer_range=0.1, bos_token_id=0,
            eos_token_id=255)
VARIANTS = {
    # YaRN with mscale_all_dim (the softmax scale's mscale²), a router bias transformers never applies
    "yarn": dict(router_bias=True, rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0,
                                                         original_max_position_embeddings=64, beta_fast=32,
                                                         beta_slow=1, mscale=1.0, mscale_all_dim=1.0)),
    # no zero experts, top 2 of 6; biased projections; a rotary of 8 (rotated before GroupQueryAttention)
    "plain-bias": dict(zero_expert_num=0, n_routed_experts=6, moe_topk=2, attention_bias=True,
                       qk_rope_head_dim=8, head_dim=8, tie_word_embeddings=True),
}
ROUTER_SCALE = 30.0  # random softmax routers are near-uniform; scaled up, their choices are decisive


def make(folder, config, zero_bias=0.0):
    make_checkpoint(folder, "LongcatFlashConfig", **config)
    tensors, rng = load_file(folder / "model.safetensors"), np.random.default_rng(1)
    E = config.get("n_routed_experts", 8)
    for key, value in tensors.items():
        if key.endswith("router.classifier.weight"):
            tensors[key] = value * ROUTER_SCALE
        if key.endswith("router.classifier.bias"):
            tensors[key] = rng.standard_normal(value.shape).astype(value.dtype)
        if key.endswith("e_score_correction_bias"):  # zeros from transformers; of the order of the scores
            bias = 0.1 * rng.standard_normal(value.shape)
            bias[E:] += zero_bias
            tensors[key] = bias.astype(value.dtype)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


def quantize(model, bits, block_size, symmetric, method="rtn"):
    """The build's rounding: every Linear and each stored expert (fake_quantize_experts) but kv_b_proj
    (absorbed into per-head MatMuls, float) and the router's classifier (float)."""
    kept = {n: p.clone() for n, p in model.named_parameters() if "kv_b_proj" in n or "classifier" in n}
    fake_quantize_experts(model, bits, block_size, symmetric, method)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name in kept:
                p.copy_(kept[name])


globals().update(family_tests(FamilyTest(
    ARCHITECTURE, "LongcatFlashConfig", VARIANTS, base=BASE, make=make, ragged=True,
    quantize=quantize, layer_lists=True,  # num_hidden_layers is 2·num_layers: the count stays
    # transformers 5.23's LongCat-Flash keeps weights for the zero experts (unread, and builder
    # leaves them so) and misses 5.25's logits by 1.03e-4 on the yarn variant: builder follows 5.25
    since=(5, 25),
    config_raws=(
        {},
        # LongCat-Flash-Chat's config.json: num_layers, its expert keys and the remote code's switches
        dict(vocab_size=131072, hidden_size=6144, ffn_hidden_size=12288, expert_ffn_hidden_size=2048, num_layers=28,
             num_attention_heads=64, kv_lora_rank=512, q_lora_rank=1536, qk_rope_head_dim=64, qk_nope_head_dim=128,
             v_head_dim=128, n_routed_experts=512, moe_topk=12, zero_expert_num=256, zero_expert_type="identity",
             routed_scaling_factor=6.0, norm_topk_prob=False, router_bias=False, rope_theta=10000000.0,
             max_position_embeddings=131072, rms_norm_eps=1e-5, mla_scale_q_lora=True, mla_scale_kv_lora=True,
             attention_method="MLA", bos_token_id=1, eos_token_id=2, pad_token_id=3, attention_bias=False),
        # transformers' generic names (its attribute_map)
        dict(intermediate_size=256, num_local_experts=16, num_experts_per_tok=4, moe_intermediate_size=64),
    ),
    config_fields=(*(f for f in CONFIG_FIELDS if f != "num_key_value_heads"), "num_layers", "ffn_hidden_size",
                   "expert_ffn_hidden_size", "n_routed_experts", "moe_topk", "zero_expert_num",
                   "routed_scaling_factor", "qk_head_dim", "rms_norm_eps", "q_lora_rank", "kv_lora_rank"),
)))


def zero_expert_share(model, ids=PROMPT):
    """Per layer, the share of the top-k picks that are zero experts (transformers' own routing)."""
    seen = []
    routers = [layer.mlp.router for layer in model.model.layers]
    hooks = [r.register_forward_hook(lambda m, i, o: seen.append(o[2])) for r in routers]
    with torch.no_grad():
        model(torch.tensor([ids]))
    for h in hooks:
        h.remove()
    E = model.config.n_routed_experts
    return [float((index >= E).float().mean()) for index in seen]


def test_zero_experts_are_chosen_for_some_picks(tmp_path):
    share = zero_expert_share(load(make(tmp_path / "src", {**BASE, **VARIANTS["yarn"]})))
    assert all(0 < s < 1 for s in share), share


def test_zero_experts_change_the_output(tmp_path):
    # Without the identity experts' term (transformers' own model, that term taken off each MoE's
    # output) the logits move: a build that ran only the routed experts would fail the fp32 proof.
    source = make(tmp_path / "src", {**BASE, **VARIANTS["yarn"]})
    model = load(source)
    E = model.config.n_routed_experts

    def without_identity(moe, inputs, output):
        h = inputs[0].reshape(-1, inputs[0].shape[-1])
        _, weight, index = moe.router(h)
        return output - (h * weight.masked_fill(index < E, 0.0).sum(-1, keepdim=True)).reshape(output.shape)

    with torch.no_grad():
        want = model(torch.tensor([PROMPT])).logits
        hooks = [layer.mlp.register_forward_hook(without_identity) for layer in model.model.layers]
        without = model(torch.tensor([PROMPT])).logits
        for h in hooks:
            h.remove()
    assert float((want - without).abs().max()) > 1e-2
    assert_steps_match(build(source, tmp_path / "out", "-p", "fp32"), model)


def test_every_pick_a_zero_expert(tmp_path):
    # Zero experts biased past every real one: each token's k picks are all identities, the routed
    # experts get no weight at all (their MoE node is fed only −inf and the floor).
    source = make(tmp_path / "src", {**BASE, **VARIANTS["yarn"]}, zero_bias=10.0)
    model = load(source)
    assert zero_expert_share(model) == [1.0, 1.0]
    assert_steps_match(build(source, tmp_path / "out", "-p", "fp32"), model)


def test_the_second_attention_matters(tmp_path):
    # Only layer 0's second attention (self_attn.1) changed: transformers' logits move, and the build
    # still matches (it reads self_attn.1, not self_attn.0 twice, into its own cache).
    source = make(tmp_path / "src", {**BASE, **VARIANTS["yarn"]})
    before = load(source)
    tensors = load_file(source / "model.safetensors")
    name = "model.layers.0.self_attn.1.kv_a_proj_with_mqa.weight"
    tensors[name] = np.random.default_rng(5).standard_normal(tensors[name].shape).astype(np.float32) * 0.3
    save_file(tensors, source / "model.safetensors", metadata={"format": "pt"})
    after = load(source)
    with torch.no_grad():
        moved = (before(torch.tensor([PROMPT])).logits - after(torch.tensor([PROMPT])).logits).abs().max()
    assert float(moved) > 1e-2
    assert_steps_match(build(source, tmp_path / "out", "-p", "fp32"), after)


def test_two_latent_caches_per_layer(family_checkpoint, tmp_path):
    """transformers' cache index layer·2 + j: 2·num_layers caches of one head of rope + rank."""
    out = build(family_checkpoint, tmp_path / "out", "-p", "fp32")
    rope = json.loads((family_checkpoint / "config.json").read_text())["qk_rope_head_dim"]
    session = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    past = {i.name: i.shape for i in session.get_inputs() if i.name.startswith("past")}
    assert len(past) == 2 * 2 * BASE["num_layers"]
    assert past["past_key_values.3.key"] == ["batch_size", 1, "past_sequence_length", rope + 32]
    decoder = json.loads((out / "genai_config.json").read_text())["model"]["decoder"]
    assert (decoder["num_hidden_layers"], decoder["head_size"], decoder["num_key_value_heads"]) == (4, rope + 32, 1)


@pytest.mark.parametrize("overrides, runs", [
    (dict(head_dim=64), False),  # transformers' rotary spans head_dim: its forward fails
    (dict(num_key_value_heads=1), False),  # its MLA repeats no KV heads
    (dict(qk_head_dim=48), False),  # its queries cannot split into nope + rope
    (dict(mla_scale_q_lora=False), True),  # transformers ignores it (the remote code would not scale)
    (dict(zero_expert_type="zero"), True),  # transformers ignores it (identity experts)
    (dict(hidden_act="gelu"), True),  # experts run as SwiGLU only
    (dict(moe_topk=8), True),  # every routed expert a candidate beside zero experts
    (dict(moe_topk=13), False),  # more picks than experts: transformers' top-k fails
])
def test_refused(overrides, runs):
    with pytest.raises(BuildError):
        architectures.load(ARCHITECTURE).parse_config({**BASE, **overrides, "architectures": [ARCHITECTURE]},
                                                      ARCHITECTURE)
