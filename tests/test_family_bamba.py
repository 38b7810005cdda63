"""Bamba (architectures/bamba.py: Mamba-2 layers with attention layers among them, a SwiGLU MLP
after each) against transformers: the shared family proofs (tests/family_runner.py), every KV, conv
and SSM state fed back, on random Mamba parameters and biases."""

from family_runner import CONFIG_FIELDS, FamilyTest, family_tests
from safetensors.numpy import save_file
from test_family_granitemoehybrid import random_mamba

# An attention layer between Mamba layers (first and last); 3 query heads of 32 over 1 KV head,
# the rotary on their first 16 dims; 6 Mamba heads in 2 groups of B and C, a 4-tap conv, chunks of
# 8 tokens (the 10-token prompt spans two).
BASE = dict(
    vocab_size=256, hidden_size=96, intermediate_size=64, num_hidden_layers=4, num_attention_heads=3,
    num_key_value_heads=1, max_position_embeddings=256, attn_layer_indices=[1], mamba_n_heads=6, mamba_n_groups=2,
    mamba_d_state=16, mamba_d_conv=4, mamba_expand=2, mamba_chunk_size=8, initializer_range=0.1,
)


def make(folder, config):
    tensors = random_mamba(folder, "BambaConfig", config, "mamba", (".bias",))
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})


globals().update(family_tests(FamilyTest(
    "BambaForCausalLM", "BambaConfig", base=BASE, make=make,
    variants={
        # every bias on (random: transformers initializes them to zero), dt clamped from above
        "biases": dict(attention_bias=True, mlp_bias=True, mamba_proj_bias=True, time_step_limit=[0.0, 0.3]),
        # two attention layers, a tied vocabulary, a theta of its own, no conv bias
        "tied": dict(attn_layer_indices=[0, 2], tie_word_embeddings=True, mamba_conv_bias=False,
                     rope_parameters=dict(rope_type="default", rope_theta=1000.0)),
    },
    genai_type="granitemoehybrid", ragged=True, fp16_tolerance=2e-2, layer_lists=True,  # attn_layer_indices
    config_raws=(
        {},
        # the hub's spellings: a top-level factor BambaConfig replaces by 0.5, an infinite dt limit
        dict(attn_layer_indices=[9, 18, 27], partial_rotary_factor=1.0, rope_theta=10000.0,
             time_step_limit=[0.0, float("inf")], mamba_d_head=64, pad_token_id=0),
        dict(rope_parameters=dict(rope_type="default", rope_theta=1e6, partial_rotary_factor=1.0)),
    ),
    config_fields=(*CONFIG_FIELDS, "rms_norm_eps", "attention_bias", "mlp_bias", "layer_types", "mamba_d_head",
                   "time_step_limit"),
)))
