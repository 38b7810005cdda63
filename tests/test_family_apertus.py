"""Apertus (architectures/apertus.py) against transformers: the shared family proofs
(tests/family_runner.py) and the xIELU parameters' checks. The checkpoints carry xIELU
parameters of their own per layer (not the initial ones), so a swapped or misread one shows."""

import shutil

import pytest
import torch
import transformers
from conftest import TINY
from family_runner import CONFIG_FIELDS, FamilyTest, family_tests
from helpers import make_checkpoint
from safetensors.torch import load_file, save_file

import architectures
from builder.cli import main

# llama3 scaling with a short pretraining length, so the scaled low frequencies differ from plain ones.
LLAMA3 = dict(rope_type="llama3", rope_theta=12_000_000.0, factor=8.0, original_max_position_embeddings=16,
              low_freq_factor=1.0, high_freq_factor=4.0)
VARIANTS = {
    "llama3": dict(rope_parameters=LLAMA3, pad_token_id=3),
    "biases-tied": dict(attention_bias=True, tie_word_embeddings=True, head_dim=32,
                        rope_parameters=dict(rope_type="default", rope_theta=10000.0)),
}


def apertus_checkpoint(folder, **config):
    """A tiny random Apertus checkpoint whose xIELU parameters differ per layer: alpha_p/alpha_n
    around their initial values, beta in [0.3, 0.7], and eps wide enough (−0.01 and −0.05) that the
    min(x, eps) clamp takes some activations."""
    make_checkpoint(folder, "ApertusConfig", **{**TINY, **config})
    path = folder / "model.safetensors"
    tensors = load_file(path)
    rng = torch.Generator().manual_seed(1)
    for i in range(TINY["num_hidden_layers"]):
        p = f"model.layers.{i}.mlp.act_fn."
        tensors[p + "alpha_p"] = tensors[p + "alpha_p"] + 0.5 * torch.randn(1, generator=rng)
        tensors[p + "alpha_n"] = tensors[p + "alpha_n"] + 0.5 * torch.randn(1, generator=rng)
        tensors[p + "beta"] = 0.3 + 0.4 * torch.rand((), generator=rng)
        tensors[p + "eps"] = torch.tensor(-0.01 - 0.04 * i)
    save_file(tensors, path, metadata={"format": "pt"})
    return folder


globals().update(family_tests(FamilyTest(
    "ApertusForCausalLM", "ApertusConfig", VARIANTS, make=lambda folder, config: apertus_checkpoint(folder, **config),
    # fp16: the biases-tied variant (the first); the llama3 one's logits move by 1.8e-2 in
    # transformers' own float16 run, this one's by 1e-3.
    fp16_tolerance=1e-2, genai_variant="llama3", ragged=True, layer_lists=True,  # make() edits each layer
    config_raws=(
        {},
        dict(rope_theta=500000.0),  # without rotary settings ApertusConfig keeps its own llama3 ones, theta too
        dict(rope_scaling=dict(rope_type="llama3", factor=8.0, original_max_position_embeddings=8192,
                               low_freq_factor=1.0, high_freq_factor=4.0), rope_theta=12000000, num_key_value_heads=8,
             intermediate_size=21504, eos_token_id=68, tie_word_embeddings=False),
        dict(rope_scaling=dict(rope_type="linear", factor=2.0), hidden_act="relu2", pad_token_id=None),
    ),
    config_fields=(*CONFIG_FIELDS, "rms_norm_eps", "attention_bias"),
)))


@pytest.fixture(scope="module")
def apertus(tmp_path_factory):
    return apertus_checkpoint(tmp_path_factory.mktemp("llama3"), **VARIANTS["llama3"])


def test_xielu_parameter_of_another_shape_is_refused(apertus, tmp_path, capsys):
    source = tmp_path / "src"
    shutil.copytree(apertus, source)
    tensors = load_file(source / "model.safetensors")
    tensors["model.layers.1.mlp.act_fn.alpha_p"] = torch.zeros(2)
    save_file(tensors, source / "model.safetensors", metadata={"format": "pt"})
    assert main(["-m", str(source), "-o", str(tmp_path / "out"), "-q", "-p", "fp32"]) == 2
    assert "error: model.layers.1.mlp.act_fn.alpha_p has shape [2]; xIELU's parameters are single values" in (
        capsys.readouterr().err)


def test_config_fixed_by_the_modeling_file():
    ours = architectures.load("ApertusForCausalLM").parse_config({"architectures": ["ApertusForCausalLM"]},
                                                                 "ApertusForCausalLM")
    theirs = transformers.ApertusConfig()
    assert ours.head_dim == theirs.hidden_size // theirs.num_attention_heads
    assert ours.qk_norm and not ours.mlp_bias
