"""LFM3 (architectures/lfm3.py: LFM2's short convolutions with gated Qwen3-style attention, full and
sliding, and sandwich norms) against transformers: the shared family proofs (tests/family_runner.py),
every KV and conv state fed back, on random biases; rotary settings transformers cannot run, refused."""

import numpy as np
import pytest
import torch
import transformers
from family_runner import CONFIG_FIELDS, FamilyTest, family_tests
from helpers import make_checkpoint
from safetensors.numpy import load_file, save_file

import architectures
from builder.errors import BuildError

# A conv layer first and last, a full and a sliding attention layer between; 4 query heads over 2
# KV heads; a 4-tap kernel; a window of 4 (the 10-token prompt is longer).
BASE = dict(
    vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, max_position_embeddings=128, conv_L_cache=4, sliding_window=4,
    layer_types=["conv", "full_attention", "sliding_attention", "conv"], pad_token_id=0, bos_token_id=1,
    eos_token_id=2, initializer_range=0.1,  # varied greedy continuations
)


def make(folder, config):
    make_checkpoint(folder, "Lfm3Config", **config)
    tensors = load_file(folder / "model.safetensors")
    rng = np.random.default_rng(1)
    for key, value in tensors.items():
        if key.endswith(".bias"):  # transformers initializes them to zero
            tensors[key] = (0.1 * rng.standard_normal(value.shape)).astype(value.dtype)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})


# Lfm3Config's default layout and rotary for 24 layers, as a config.json would spell them.
HUB_LAYERS = ["full_attention" if i % 4 == 2 else "sliding_attention" if i % 4 == 0 and i > 0 else "conv"
              for i in range(24)]

globals().update(family_tests(FamilyTest(
    "Lfm3ForCausalLM", "Lfm3Config", base=BASE, make=make,
    variants={
        # every feature on: the output gate, sandwich norms, conv and attention biases; the class's
        # rotary (proportional on the full layer, whole head on the sliding one)
        "gated": dict(conv_bias=True, attention_bias=True),
        # gate and sandwich norms off, untied; heads of 24 (rotated before the attention), a
        # quarter of the full layer's pairs rotating, linear scaling on the sliding layers
        "plain": dict(use_attention_gate=False, use_sandwich_norm=False, tie_word_embeddings=False, head_dim=24,
                      num_attention_heads=3, num_key_value_heads=1,
                      layer_types=["sliding_attention", "conv", "full_attention", "sliding_attention"],
                      rope_parameters={"full_attention": dict(rope_type="proportional", rope_theta=1e4,
                                                              partial_rotary_factor=0.25),
                                       "sliding_attention": dict(rope_type="linear", factor=2.0, rope_theta=500.0)}),
    },
    genai_type="lfm2", ragged=True, fp16_tolerance=2e-2, layer_lists=True,  # layer_types
    config_raws=(
        {},
        # the hub's spelling: transformers' saved keys, and LFM2's that Lfm3Config ignores
        dict(model_type="lfm3", layer_types=HUB_LAYERS, norm_eps=1e-5, conv_L_cache=7, conv_bias=False,
             use_sandwich_norm=True, use_attention_gate=True, sliding_window=256, rope_theta=1e6,
             rope_parameters={"full_attention": dict(rope_type="proportional", rope_theta=1e6,
                                                     partial_rotary_factor=0.5),
                              "sliding_attention": dict(rope_type="default", rope_theta=1e4)},
             block_auto_adjust_ff_dim=True, block_ff_dim=8192, block_multiple_of=256, full_attn_idxs=[2, 6],
             tie_embedding=False, dtype="bfloat16", use_cache=True),
        # rms_norm_eps read as norm_eps; top-level theta and factor filling the entries that lack them
        dict(rms_norm_eps=1e-6, rope_theta=5e5, partial_rotary_factor=0.25, num_hidden_layers=6,
             rope_parameters={"full_attention": dict(rope_type="yarn", factor=4.0, partial_rotary_factor=1.0),
                              "sliding_attention": dict(type="default")}),
    ),
    config_fields=(*(f for f in CONFIG_FIELDS if f != "hidden_act"),  # none: the MLP is SwiGLU
                   "head_dim", "norm_eps", "rms_norm_eps", "conv_bias", "conv_L_cache", "layer_types", "sliding_window",
                   "attention_bias", "use_sandwich_norm", "use_attention_gate"),
)))


# Rotary settings Lfm3Config accepts but its model cannot run: no entry for an attention type the
# layers have (a flat dict, the older rope_scaling, a missing or null entry: a KeyError or a
# TypeError), or a scaled rope on part of the head (cos/sin narrower than the head it multiplies).
REFUSED = {
    "flat": dict(rope_parameters=dict(rope_type="default", rope_theta=1e4)),
    "rope_scaling": dict(rope_scaling=dict(rope_type="linear", factor=2.0)),
    "missing": dict(rope_parameters={"full_attention": dict(rope_type="default", rope_theta=1e4)}),
    "null": dict(rope_parameters={"full_attention": None, "sliding_attention": dict(rope_type="default")}),
    "partial-yarn": dict(rope_parameters={
        "full_attention": dict(rope_type="yarn", factor=2.0, partial_rotary_factor=0.5,
                               original_max_position_embeddings=32),
        "sliding_attention": dict(rope_type="default")}),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_rotary_settings_transformers_cannot_run_are_refused(case):
    raw = {**BASE, **REFUSED[case]}
    with pytest.raises((KeyError, TypeError, RuntimeError)):
        model = transformers.Lfm3ForCausalLM(transformers.Lfm3Config(**raw))
        model(torch.tensor([[3, 5, 7]]))
    with pytest.raises(BuildError, match="rope"):
        architectures.load("Lfm3ForCausalLM").parse_config(dict(raw, architectures=["Lfm3ForCausalLM"]),
                                                           "Lfm3ForCausalLM")
