"""LFM2-MoE (Lfm2MoeForCausalLM: LFM2's conv and attention layers, dense first layers, sparse experts
behind a sigmoid router with an expert bias) against transformers: fp32 prefill and decode steps
feeding back every KV and conv state, the options the other way, transformers 5's stacked expert
layout, int4 against the same rounding, onnxruntime-genai's greedy generation (one prompt, and two
of different lengths in a batch) as its `lfm2_moe` type, and config.json parsing against
Lfm2MoeConfig."""

import copy
import json
import shutil

import numpy as np
import pytest
import torch
import transformers
from helpers import GENAI_PROMPT, PROMPT, build, make_checkpoint
from safetensors.numpy import load_file, save_file
from family_runner import assert_ragged_batch_matches, assert_steps_match
from test_family_moe import fake_quantize_experts
from test_genai import assert_same_greedy

import architectures
from builder.errors import BuildError
from builder.options import PRECISION_DEFAULTS

ARCHITECTURE = "Lfm2MoeForCausalLM"
# Every feature on: conv and attention layers (a conv layer first and last), 3 query heads over 1 KV
# head (odd, grouped), conv_bias and a 4-tap kernel, layer 0 dense, 8 experts of which 3 are chosen
# by sigmoid scores plus a (random) expert bias, weights normalized and scaled by 2.5. Sizes that
# the int4 block (32) divides, so the experts' QMoE rounds in the same blocks as the Linears.
CONFIG = dict(
    vocab_size=256, hidden_size=96, intermediate_size=64, moe_intermediate_size=32, num_hidden_layers=4,
    num_attention_heads=3, num_key_value_heads=1, max_position_embeddings=128, conv_bias=True, conv_L_cache=4,
    num_dense_layers=1, num_experts=8, num_experts_per_tok=3, use_expert_bias=True, routed_scaling_factor=2.5,
    norm_topk_prob=True, initializer_range=0.1,  # varied greedy continuations
    layer_types=["conv", "full_attention", "conv", "conv"], eos_token_id=255,
)
# Every option the other way: no expert bias, un-normalized unscaled weights, no dense layer, no conv bias.
PLAIN = dict(CONFIG, use_expert_bias=False, norm_topk_prob=False, routed_scaling_factor=1.0, num_dense_layers=0,
             conv_bias=False, conv_L_cache=3, layer_types=["full_attention", "conv", "conv", "full_attention"])
ROUTER_SCALE = 10.0  # random routers are near-uniform; scaled up, their choices are decisive


def make(folder, config=CONFIG):
    make_checkpoint(folder, "Lfm2MoeConfig", **config)
    tensors, rng = load_file(folder / "model.safetensors"), np.random.default_rng(1)
    for key, value in tensors.items():
        if key.endswith(".bias"):  # transformers initializes the conv biases to zero
            tensors[key] = (0.1 * rng.standard_normal(value.shape)).astype(value.dtype)
        if key.endswith("expert_bias"):  # zero too; of the order of the sigmoid scores it corrects
            tensors[key] = (0.3 * rng.standard_normal(value.shape)).astype(value.dtype)
        if key.endswith("feed_forward.gate.weight"):
            tensors[key] = value * ROUTER_SCALE
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    return make(tmp_path_factory.mktemp("lfm2_moe"))


def load(source):
    return transformers.AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).eval()


def test_routing_is_decisive_and_the_bias_changes_it(source):
    # The parity tests prove the router only if its choices are clear-cut (no near-tie an ulp
    # could flip) and if the expert bias changes some token's experts.
    model = load(source)
    blocks = [m for m in model.model.layers if hasattr(m.feed_forward, "gate")]
    seen = []
    hooks = [b.feed_forward.gate.register_forward_hook(lambda m, i, o: seen.append(o[0].numpy())) for b in blocks]
    with torch.no_grad():
        model(torch.tensor([PROMPT + GENAI_PROMPT]))
    for h in hooks:
        h.remove()
    k, changed = CONFIG["num_experts_per_tok"], 0
    for logits, block in zip(seen, blocks):
        s = 1 / (1 + np.exp(-logits.astype(np.float64)))
        choice = s + block.feed_forward.expert_bias.numpy()
        top = np.sort(choice, -1)[:, ::-1]
        assert (top[:, k - 1] - top[:, k]).min() > 1e-3, "a near-tie in the top-k choice"
        chosen = np.sort(np.argsort(-choice, -1)[:, :k], -1)
        changed += (chosen != np.sort(np.argsort(-s, -1)[:, :k], -1)).any(-1).sum()
    assert len(seen) == 3 and changed > 0, "the expert bias never changes the experts chosen"


def test_fp32_prefill_and_decode_match_transformers(source, tmp_path):
    assert_steps_match(build(source, tmp_path / "out", "-p", "fp32"), load(source))


def test_prompt_shorter_than_the_kernel(source, tmp_path):
    assert_steps_match(build(source, tmp_path / "out", "-p", "fp32"), load(source), ids=[9, 4])


def test_plain_options_match_transformers(tmp_path):
    plain = make(tmp_path / "plain", PLAIN)
    assert_steps_match(build(plain, tmp_path / "out", "-p", "fp32"), load(plain))


def test_stacked_experts_build_the_same_model(source, tmp_path):
    # transformers 5's own layout: experts.gate_up_proj [E, 2I, H] (w1 rows, then w3) and down_proj [E, H, I].
    stacked = tmp_path / "stacked"
    shutil.copytree(source, stacked)
    tensors, E = load_file(stacked / "model.safetensors"), CONFIG["num_experts"]
    for layer in (1, 2, 3):
        p = f"model.layers.{layer}.feed_forward.experts."
        each = {w: [tensors.pop(f"{p}{e}.{w}.weight") for e in range(E)] for w in ("w1", "w3", "w2")}
        tensors[p + "gate_up_proj"] = np.stack([np.concatenate(x) for x in zip(each["w1"], each["w3"])])
        tensors[p + "down_proj"] = np.stack(each["w2"])
    save_file(tensors, stacked / "model.safetensors", metadata={"format": "pt"})
    assert_steps_match(build(stacked, tmp_path / "out", "-p", "fp32"), load(source))


def test_int4_matches_fake_quantized_transformers(source, tmp_path):
    # Every Linear and every expert rounded as the build rounds them; the router (no Linear), the
    # expert bias and the conv kernels stay float.
    int4 = PRECISION_DEFAULTS["int4"]  # what the build does when not told
    out = build(source, tmp_path / "out", "-p", "int4", "--accuracy-level", "0")
    model = load(source)
    fake_quantize_experts(model, 4, 32, int4["symmetric"], method=int4["quant_method"])
    assert_steps_match(out, model, min_cosine=0.999)


def test_genai_greedy_matches_transformers(source, tmp_path):
    out = build(source, tmp_path / "out", "-p", "fp32")
    assert json.loads((out / "genai_config.json").read_text())["model"]["type"] == "lfm2_moe"
    assert_same_greedy(out, source, GENAI_PROMPT)


def test_genai_batch_of_different_lengths_matches_transformers(source, tmp_path):
    out = build(source, tmp_path / "out", "-p", "fp32")
    assert_ragged_batch_matches(out, load(source))


# LFM2-8B-A1B's layout (from memory), the options the other way, the old tie_embedding spelling.
LAYERS = ["full_attention" if i in (2, 6, 10, 14, 18, 21) else "conv" for i in range(24)]
CASES = {
    "8b-a1b": dict(num_hidden_layers=24, layer_types=LAYERS, eos_token_id=7),
    "plain": dict(num_hidden_layers=3, layer_types=["conv", "conv", "full_attention"], num_dense_layers=0,
                  use_expert_bias=False, norm_topk_prob=False, routed_scaling_factor=2.0, conv_bias=True,
                  conv_L_cache=5, rope_theta=10_000.0),
    "old-spelling": dict(num_hidden_layers=2, layer_types=["conv", "full_attention"], tie_embedding=False,
                         num_dense_layers=3, intermediate_size=5000),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_transformers_config(case):
    from transformers.models.lfm2_moe.modeling_lfm2_moe import Lfm2MoeDecoderLayer

    config = CASES[case]
    c = architectures.load(ARCHITECTURE).parse_config({**config, "architectures": [ARCHITECTURE]}, ARCHITECTURE)
    want = transformers.Lfm2MoeConfig(**copy.deepcopy(config))
    for key in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                "norm_eps", "max_position_embeddings", "bos_token_id", "eos_token_id", "pad_token_id",
                "tie_word_embeddings", "conv_bias", "conv_L_cache", "moe_intermediate_size", "num_dense_layers",
                "num_experts", "num_experts_per_tok", "use_expert_bias", "routed_scaling_factor", "norm_topk_prob",
                "layer_types"):
        assert getattr(c, key) == getattr(want, key), key
    assert c.rope_parameters == dict(want.rope_parameters)
    state = next(s for s in map(c.layer_state, range(c.num_hidden_layers)) if s.conv)
    assert (state.conv.channels, state.conv.length) == (want.hidden_size, want.conv_L_cache - 1)
    small = transformers.Lfm2MoeConfig(**{**copy.deepcopy(config), "hidden_size": 64, "num_experts": 4,
                                          "num_experts_per_tok": 2, "vocab_size": 16})
    with torch.device("meta"):
        layers = [Lfm2MoeDecoderLayer(small, i) for i in range(small.num_hidden_layers)]
    assert [c.sparse(i) for i in range(c.num_hidden_layers)] == [hasattr(x.feed_forward, "gate") for x in layers]
    dense = [x.feed_forward.w1.out_features for x in layers if not hasattr(x.feed_forward, "gate")]
    assert all(size == c.feed_forward_size == want.intermediate_size for size in dense)


def test_block_keys_of_lfm2_are_not_read():
    # LFM2's MLP width adjustment and full_attn_idxs are no keys of Lfm2MoeConfig: the dense MLP is
    # intermediate_size as is, and a config.json without layer_types is refused (transformers'
    # model cannot be built from it either).
    raw = dict(num_hidden_layers=2, layer_types=["conv", "full_attention"], block_auto_adjust_ff_dim=True,
               block_ff_dim=4096, intermediate_size=5000, architectures=[ARCHITECTURE])
    assert architectures.load(ARCHITECTURE).parse_config(raw, ARCHITECTURE).feed_forward_size == 5000
    with pytest.raises(BuildError, match="layer_types"):
        architectures.load(ARCHITECTURE).parse_config(dict(num_hidden_layers=2, full_attn_idxs=[1],
                                                           architectures=[ARCHITECTURE]), ARCHITECTURE)
    with pytest.raises(BuildError, match="num_experts_per_tok"):
        architectures.load(ARCHITECTURE).parse_config(dict(raw, num_experts_per_tok=40), ARCHITECTURE)
