"""Zamba2 (architectures/zamba2.py: Mamba-2 layers, some of them hybrid, running one of the shared
transformer blocks on [hidden, embeddings] with their own LoRA adapters) against transformers: the
shared family proofs (tests/family_runner.py), every KV, conv and SSM state fed back, on random
Mamba parameters, conv biases and adapters; then what each special feature changes, and refusals."""

import json

import numpy as np
import pytest
import torch
from fake_quant import fake_quantize_model
from family_runner import (
    CONFIG_FIELDS,
    FamilyTest,
    assert_steps_match,
    family_tests,
    load,
)
from helpers import build
from safetensors.numpy import load_file, save_file
from test_family_granitemoehybrid import random_mamba

import architectures
from builder.errors import BuildError

M, X = "linear_attention", "hybrid"
# Six layers, three hybrid ones (1, 3, 4) alternating over two shared blocks (0, 1, 0): layer 4
# reads layer 1's block with its own adapters. Heads of 2 · 48 / 4 = 24 (a KV cache of 24); 4 Mamba
# heads of 24 in 2 groups, chunks of 8 tokens (the 10-token prompt spans two).
BASE = dict(
    vocab_size=256, hidden_size=48, intermediate_size=64, num_hidden_layers=6, num_attention_heads=4,
    num_key_value_heads=4, max_position_embeddings=256, layers_block_type=[M, X, M, X, X, M], n_mamba_heads=4,
    mamba_ngroups=2, mamba_d_state=16, mamba_d_conv=4, mamba_expand=2, chunk_size=8, num_mem_blocks=2,
    adapter_rank=8, use_shared_attention_adapter=True, initializer_range=0.1,
)


def make(folder, config, adapters=True):
    """A tiny random Zamba2: random dt_bias, D, A_log and conv biases, and random adapters
    (transformers initializes B to small random values: scaled up so they matter), or zero ones."""
    def edit(key, value):
        if "_adapter_list." in key:
            return 3 * value if adapters else np.zeros_like(value)
        return value

    tensors = random_mamba(folder, "Zamba2Config", config, "mamba", ("conv1d.bias", "_proj.bias"), edit)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})


def quantize(model, bits, block_size, symmetric, method="rtn"):
    """fake_quantize_model after folding each application's adapters into its own (untied) copy of
    the shared weights, as the build folds them: the adapters then add zero."""
    with torch.no_grad():
        for j, k in zip(model.config.hybrid_layer_ids, range(99)):
            block = model.model.layers[j].shared_transformer
            pairs = [(block.feed_forward.gate_up_proj, block.feed_forward.gate_up_proj_adapter_list)]
            if model.config.use_shared_attention_adapter:
                a = block.self_attn
                pairs += [(a.q_proj, a.linear_q_adapter_list), (a.k_proj, a.linear_k_adapter_list),
                          (a.v_proj, a.linear_v_adapter_list)]
            for proj, adapters in pairs:
                lora = adapters[k]
                proj.weight = torch.nn.Parameter(proj.weight + lora[1].weight @ lora[0].weight)
                lora[1].weight = torch.nn.Parameter(torch.zeros_like(lora[1].weight))
    fake_quantize_model(model, bits, block_size, symmetric, method=method)


globals().update(family_tests(FamilyTest(
    "Zamba2ForCausalLM", "Zamba2Config", base=BASE, make=make, quantize=quantize,
    variants={
        # no rotary, GELU, biases on in_proj, out_proj, gate_up_proj and down_proj, untied
        "adapters": dict(add_bias_linear=True, tie_word_embeddings=False, time_step_min=0.3),
        # a rotary of theta 1000 on the shared blocks, 2 KV heads (no attention adapters), one
        # shared block for both hybrid layers, SiLU, tied
        "rope": dict(use_mem_rope=True, rope_parameters=dict(rope_type="default", rope_theta=1000.0),
                     use_shared_attention_adapter=False, num_key_value_heads=2, num_mem_blocks=1,
                     layers_block_type=[X, M, M, X, M, M], hidden_act="silu"),
    },
    genai_type="granitemoehybrid", ragged=True, fp16_tolerance=2e-2, layer_lists=True,  # layers_block_type
    config_raws=(
        {},
        # the hub's spellings: legacy layer names, derived keys written out, a top-level theta
        dict(hidden_size=2048, num_hidden_layers=6, layers_block_type=["mamba", "hybrid", "mamba", "mamba", "hybrid",
                                                                       "mamba"],
             attention_head_dim=128, attention_hidden_size=4096, mamba_headdim=64, n_mamba_heads=64,
             hybrid_layer_ids=[1, 4], kv_channels=64, num_query_groups=32, rope_theta=10000, use_mem_rope=True,
             use_shared_attention_adapter=True, num_mem_blocks=2, time_step_limit=None, use_long_context=True),
    ),
    config_fields=(*CONFIG_FIELDS, "rms_norm_eps", "head_dim", "layer_types", "hybrid_layer_ids", "num_mem_blocks",
                   "n_mamba_heads", "time_step_min", "add_bias_linear"),
)))


def test_adapters_change_the_logits(tmp_path):
    """Failing-before: with the adapters zeroed the logits move; the build follows each."""
    config = {**BASE, "add_bias_linear": True}
    make(tmp_path / "with", config)
    make(tmp_path / "without", config, adapters=False)
    with_, without = load(tmp_path / "with"), load(tmp_path / "without")
    ids = torch.tensor([[5, 9, 17, 33, 2]])
    with torch.no_grad():
        assert (with_(ids).logits - without(ids).logits).abs().max() > 1e-2
    assert_steps_match(build(tmp_path / "without", tmp_path / "out", "-p", "fp32"), without)


def test_embeddings_concatenation_matters(tmp_path):
    """Failing-before: the shared block reads [hidden, embeddings]; zeroing the input norm's second
    half (the embeddings') changes transformers' logits, and the build follows."""
    make(tmp_path / "src", BASE)
    tensors = load_file(tmp_path / "src" / "model.safetensors")
    model = load(tmp_path / "src")
    ids = torch.tensor([[5, 9, 17, 33, 2]])
    with torch.no_grad():
        before = model(ids).logits
    H = BASE["hidden_size"]
    for j in (1, 3):  # the two blocks' first layers
        key = f"model.layers.{j}.shared_transformer.input_layernorm.weight"
        tensors[key] = tensors[key].copy()
        tensors[key][H:] = 0
    save_file(tensors, tmp_path / "src" / "model.safetensors", metadata={"format": "pt"})
    model = load(tmp_path / "src")
    with torch.no_grad():
        assert (model(ids).logits - before).abs().max() > 1e-2
    assert_steps_match(build(tmp_path / "src", tmp_path / "out", "-p", "fp32"), model)


def test_later_applications_read_the_first_copy(tmp_path):
    """Tied, the third hybrid layer (4) runs block 0 as stored under layer 1 (its own adapter is
    layer 1's list entry 2; transformers saves no copy under layer 4); untied, its own copy."""
    make(tmp_path / "src", BASE)
    names = load_file(tmp_path / "src" / "model.safetensors")
    assert "model.layers.1.shared_transformer.feed_forward.gate_up_proj_adapter_list.2.0.weight" in names
    assert not any(n.startswith("model.layers.4.shared_transformer.") for n in names)
    c = architectures.load("Zamba2ForCausalLM").parse_config(json.loads((tmp_path / "src" / "config.json").read_text()),
                                                             "Zamba2ForCausalLM")
    assert [c.shared_block_layer(j) for j in c.hybrid_layer_ids] == [1, 3, 1]
    untied = architectures.load("Zamba2ForCausalLM").parse_config({**BASE, "tie_word_embeddings": False},
                                                                  "Zamba2ForCausalLM")
    assert [untied.shared_block_layer(j) for j in untied.hybrid_layer_ids] == [1, 3, 4]  # transformers ties none


@pytest.mark.parametrize("raw, message", [
    (dict(layers_block_type=[M, "attention", M, X, X, M]), "Zamba2 layers are"),
    (dict(num_key_value_heads=2), "k/v adapters"),
    (dict(n_mamba_heads=5), "n_mamba_heads"),
    (dict(layers_block_type=None), "transformers' default has 54"),
])
def test_refusals(raw, message):
    with pytest.raises(BuildError, match=message):
        architectures.load("Zamba2ForCausalLM").parse_config({**BASE, **raw}, "Zamba2ForCausalLM")
