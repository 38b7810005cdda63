"""Ministral and Ministral 3: Llama's decoder (architectures/llama.py) with their own rows.

Reference: transformers/models/ministral/modeling_ministral.py, ministral3/modeling_ministral3.py.
Ministral: sliding layers by `layer_types`. Ministral 3: YaRN by default, Mistral's one window for
every layer, and llama-4's attention temperature: each query times 1 + β·log(1 + ⌊position /
original context⌋), a per-token scale before GroupQueryAttention (the rotation is linear, so
scaling before it equals scaling after, as transformers does).
"""

from __future__ import annotations

from typing import Any

from architectures import llama
from builder.family import register

VARIANTS: dict[str, dict[str, Any]] = {
    "MinistralForCausalLM": dict(
        model_type="ministral", intermediate_size=14336, num_key_value_heads=8,
        max_position_embeddings=4096 * 32, sliding_window=4096,
    ),
    "Ministral3ForCausalLM": dict(
        model_type="ministral3", vocab_size=131072, intermediate_size=14336, num_hidden_layers=34,
        num_key_value_heads=8, head_dim=128, max_position_embeddings=262144, rms_norm_eps=1e-5, pad_token_id=11,
        rope_parameters=dict(  # when config.json gives no rotary settings
            type="yarn", rope_theta=1e6, factor=16.0, original_max_position_embeddings=16384, beta_fast=32.0,
            beta_slow=1.0, mscale_all_dim=1.0, mscale=1.0, llama_4_scaling_beta=0.1, max_position_embeddings=262144),
    ),
}

# onnxruntime-genai 0.18 knows no "ministral" or "ministral3": Mistral's contract (a plain decoder),
# so genai_config.json names that.
STRUCTURE: dict[str, dict[str, Any]] = {
    "MinistralForCausalLM": dict(model_type="mistral", attention_bias=False, mlp_bias=False),
    # Mistral's modeling: one window for every layer whatever `layer_types` says.
    "Ministral3ForCausalLM": dict(model_type="mistral", layer_types=None, llama_4_scaling=True, attention_bias=False,
                                  mlp_bias=False),
}


FAMILY = register(llama.FAMILY.with_(name="ministral", variants=VARIANTS, structure=STRUCTURE))

__all__ = ["FAMILY", "STRUCTURE", "VARIANTS"]
