"""Writes a random-weight checkpoint with the exact config, tensor names, shapes and dtype of a
named hub model, streamed to disk shard by shard (no torch, memory bounded by one chunk).

    python scripts/make_synthetic_checkpoint.py Llama-3.2-1B /data/llama-3.2-1b
    python scripts/make_synthetic_checkpoint.py --list

The values are random (normal, std 0.02; norm weights near their trained scale) so builds and
benchmarks exercise real arithmetic, but they are not a usable model. Tensors are written in
bfloat16, as the hub checkpoints are; shards hold at most 5 GB, with model.safetensors.index.json.
"""

from __future__ import annotations

import argparse
import copy
import json
import struct
import sys
from collections.abc import Iterator
from pathlib import Path

import ml_dtypes
import numpy as np

# Real hub config.json files, copied from public sources (tests/data/hub_configs/SOURCES.md says
# where from): the presets that have one take it as is.
HUB_CONFIGS = Path(__file__).resolve().parent.parent / "tests" / "data" / "hub_configs"


def hub_config(folder: str) -> dict:
    """The config.json of tests/data/hub_configs/`folder`."""
    return json.loads((HUB_CONFIGS / folder / "config.json").read_text())


SHARD_BYTES = 5 * 10**9
CHUNK_ELEMENTS = 1 << 24  # 32 MB of bf16 per write

LLAMA_3_2_1B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256, "hidden_size": 2048,
    "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
    "head_dim": 64, "hidden_act": "silu", "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0, "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
    "original_max_position_embeddings": 8192, "rope_type": "llama3"}, "tie_word_embeddings": True,
    "attention_bias": False, "mlp_bias": False, "bos_token_id": 128000, "eos_token_id": 128001,
    "torch_dtype": "bfloat16",
}
LLAMA_3_1_8B = {
    **LLAMA_3_2_1B, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "head_dim": 128,
    "rope_scaling": {**LLAMA_3_2_1B["rope_scaling"], "factor": 8.0}, "tie_word_embeddings": False,
}
QWEN3_0_6B = hub_config("Qwen__Qwen3-0.6B")  # the hub's config.json

GEMMA_3_1B_IT = hub_config("google__gemma-3-1b-it")  # the hub's config.json (as printed in a model README)
GEMMA_3_12B_IT = {
    "architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3", "boi_token_index": 255999,
    "eoi_token_index": 256000, "image_token_index": 262144, "mm_tokens_per_image": 256, "eos_token_id": [1, 106],
    "torch_dtype": "bfloat16",
    "text_config": {
        "model_type": "gemma3_text", "hidden_size": 3840, "intermediate_size": 15360, "num_hidden_layers": 48,
        "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 256, "query_pre_attn_scalar": 256,
        "rope_scaling": {"factor": 8.0, "rope_type": "linear"}, "rope_theta": 1000000.0,
        "rope_local_base_freq": 10000.0, "sliding_window": 1024, "sliding_window_pattern": 6,
        "vocab_size": 262208, "max_position_embeddings": 131072, "rms_norm_eps": 1e-6,
        "final_logit_softcapping": None, "attn_logit_softcapping": None,
    },
    "vision_config": {
        "model_type": "siglip_vision_model", "hidden_size": 1152, "intermediate_size": 4304, "num_hidden_layers": 27,
        "num_attention_heads": 16, "patch_size": 14, "image_size": 896, "vision_use_head": False,
    },
}
QWEN2_5_VL_7B = hub_config("Qwen__Qwen2.5-VL-7B-Instruct")  # the hub's config.json
QWEN3_VL_8B = {  # Qwen/Qwen3-VL-8B-Instruct's config.json, from memory
    "architectures": ["Qwen3VLForConditionalGeneration"], "model_type": "qwen3_vl", "image_token_id": 151655,
    "video_token_id": 151656, "vision_start_token_id": 151652, "vision_end_token_id": 151653,
    "tie_word_embeddings": False,
    "text_config": {
        "model_type": "qwen3_vl_text", "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36,
        "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936,
        "max_position_embeddings": 262144, "rms_norm_eps": 1e-6, "rope_theta": 5000000,
        "rope_scaling": {"mrope_interleaved": True, "mrope_section": [24, 20, 20], "rope_type": "default"},
        "bos_token_id": 151643, "eos_token_id": 151645, "tie_word_embeddings": False,
    },
    "vision_config": {
        "model_type": "qwen3_vl", "depth": 27, "hidden_size": 1152, "intermediate_size": 4304, "num_heads": 16,
        "out_hidden_size": 4096, "patch_size": 16, "num_position_embeddings": 2304,
        "deepstack_visual_indexes": [8, 16, 24], "spatial_merge_size": 2, "temporal_patch_size": 2,
        "hidden_act": "gelu_pytorch_tanh", "in_channels": 3,
    },
}
QWEN3_VL_30B_A3B = {  # Qwen/Qwen3-VL-30B-A3B-Instruct's config.json, from memory
    **QWEN3_VL_8B, "architectures": ["Qwen3VLMoeForConditionalGeneration"], "model_type": "qwen3_vl_moe",
    "text_config": {
        **QWEN3_VL_8B["text_config"], "model_type": "qwen3_vl_moe_text", "hidden_size": 2048,
        "intermediate_size": 6144, "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4,
        "moe_intermediate_size": 768, "num_experts": 128, "num_experts_per_tok": 8, "decoder_sparse_step": 1,
        "mlp_only_layers": [], "norm_topk_prob": True,
    },
    "vision_config": {**QWEN3_VL_8B["vision_config"], "out_hidden_size": 2048},
}
PHI_4_MINI = {
    "architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "vocab_size": 200064, "hidden_size": 3072,
    "intermediate_size": 8192, "num_hidden_layers": 32, "num_attention_heads": 24, "num_key_value_heads": 8,
    "hidden_act": "silu", "max_position_embeddings": 131072, "original_max_position_embeddings": 4096,
    "partial_rotary_factor": 0.75, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
    # The factor values are stand-ins (the real ones are tuned); their count and type are exact.
    "rope_scaling": {"type": "longrope", "short_factor": [1.0 + i / 48 for i in range(48)],
                     "long_factor": [1.0 + i for i in range(48)]},
    "sliding_window": 262144, "tie_word_embeddings": True, "bos_token_id": 199999, "eos_token_id": 199999,
    "pad_token_id": 199999, "torch_dtype": "bfloat16",
}
PHI_2 = {
    "architectures": ["PhiForCausalLM"], "model_type": "phi", "vocab_size": 51200, "hidden_size": 2560,
    "intermediate_size": 10240, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
    "hidden_act": "gelu_new", "max_position_embeddings": 2048, "layer_norm_eps": 1e-5, "partial_rotary_factor": 0.4,
    "qk_layernorm": False, "rope_scaling": None, "rope_theta": 10000.0, "tie_word_embeddings": False,
    "resid_pdrop": 0.1, "embd_pdrop": 0.0, "attention_dropout": 0.0, "bos_token_id": 50256, "eos_token_id": 50256,
    "torch_dtype": "float16",
}
STABLELM_2_1_6B = {
    "architectures": ["StableLmForCausalLM"], "model_type": "stablelm", "vocab_size": 100352, "hidden_size": 2048,
    "intermediate_size": 5632, "num_hidden_layers": 24, "num_attention_heads": 32, "num_key_value_heads": 32,
    "hidden_act": "silu", "max_position_embeddings": 4096, "layer_norm_eps": 1e-5, "partial_rotary_factor": 0.25,
    "rope_theta": 10000, "use_qkv_bias": True, "qk_layernorm": False, "use_parallel_residual": False,
    "tie_word_embeddings": False, "bos_token_id": 100257, "eos_token_id": 100257, "torch_dtype": "bfloat16",
}
STARCODER2_3B = {
    "architectures": ["Starcoder2ForCausalLM"], "model_type": "starcoder2", "vocab_size": 49152, "hidden_size": 3072,
    "intermediate_size": 12288, "num_hidden_layers": 30, "num_attention_heads": 24, "num_key_value_heads": 2,
    "hidden_act": "gelu_pytorch_tanh", "max_position_embeddings": 16384, "norm_epsilon": 1e-5, "norm_type": "layer_norm",
    "rope_theta": 999999.4420358813, "sliding_window": 4096, "use_bias": True, "attention_dropout": 0.1,
    "residual_dropout": 0.1, "embedding_dropout": 0.1, "bos_token_id": 0, "eos_token_id": 0, "torch_dtype": "float32",
}
NEMOTRON_MINI_4B = {
    "architectures": ["NemotronForCausalLM"], "model_type": "nemotron", "vocab_size": 256000, "hidden_size": 3072,
    "intermediate_size": 9216, "num_hidden_layers": 32, "num_attention_heads": 24, "num_key_value_heads": 8,
    "head_dim": 128, "hidden_act": "relu2", "max_position_embeddings": 4096, "norm_eps": 1e-5,
    "partial_rotary_factor": 0.5, "rope_theta": 10000, "tie_word_embeddings": False, "bos_token_id": 2,
    "eos_token_id": 3, "torch_dtype": "bfloat16",
}

AYA_23_8B = {
    "architectures": ["CohereForCausalLM"], "model_type": "cohere", "vocab_size": 256000, "hidden_size": 4096,
    "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "hidden_act": "silu", "max_position_embeddings": 8192, "layer_norm_eps": 1e-5, "logit_scale": 0.0625,
    "rope_theta": 10000, "use_qk_norm": False, "attention_bias": False, "tie_word_embeddings": True,
    "bos_token_id": 5, "eos_token_id": 255001, "pad_token_id": 0, "torch_dtype": "bfloat16",
}
COMMAND_R7B = {
    "architectures": ["Cohere2ForCausalLM"], "model_type": "cohere2", "vocab_size": 256000, "hidden_size": 4096,
    "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "head_dim": 128, "hidden_act": "silu", "max_position_embeddings": 132096, "layer_norm_eps": 1e-5,
    "logit_scale": 0.25, "rope_theta": 50000, "rope_scaling": None, "sliding_window": 4096,
    "sliding_window_pattern": 4, "attention_bias": False, "tie_word_embeddings": True, "bos_token_id": 5,
    "eos_token_id": 255001, "pad_token_id": 0, "torch_dtype": "bfloat16",
}
GLM_4_9B_CHAT_HF = {
    "architectures": ["GlmForCausalLM"], "model_type": "glm", "vocab_size": 151552, "hidden_size": 4096,
    "intermediate_size": 13696, "num_hidden_layers": 40, "num_attention_heads": 32, "num_key_value_heads": 2,
    "head_dim": 128, "hidden_act": "silu", "max_position_embeddings": 131072, "rms_norm_eps": 1.5625e-07,
    "rope_theta": 10000.0, "partial_rotary_factor": 0.5, "attention_bias": True, "tie_word_embeddings": False,
    "eos_token_id": [151329, 151336, 151338], "pad_token_id": 151329, "torch_dtype": "bfloat16",
}
GLM_4_9B_0414 = {
    **GLM_4_9B_CHAT_HF, "architectures": ["Glm4ForCausalLM"], "model_type": "glm4", "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-5,
}

OLMO_1B = {
    "architectures": ["OlmoForCausalLM"], "model_type": "olmo", "vocab_size": 50304, "hidden_size": 2048,
    "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 16, "num_key_value_heads": 16,
    "hidden_act": "silu", "max_position_embeddings": 2048, "rope_theta": 10000.0, "attention_bias": False,
    "clip_qkv": None, "tie_word_embeddings": True, "pad_token_id": 1, "eos_token_id": 50279, "torch_dtype": "bfloat16",
}
OLMO_2_1B = {
    "architectures": ["Olmo2ForCausalLM"], "model_type": "olmo2", "vocab_size": 100352, "hidden_size": 2048,
    "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 16, "num_key_value_heads": 16,
    "hidden_act": "silu", "max_position_embeddings": 4096, "rope_theta": 500000, "rms_norm_eps": 1e-6,
    "attention_bias": False, "tie_word_embeddings": False, "pad_token_id": 100277, "eos_token_id": 100257,
    "torch_dtype": "bfloat16",
}
OLMO_3_7B = {
    **OLMO_2_1B, "architectures": ["Olmo3ForCausalLM"], "model_type": "olmo3", "vocab_size": 100278,
    "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32, "num_attention_heads": 32,
    "num_key_value_heads": 32, "max_position_embeddings": 65536, "sliding_window": 4096,
    "rope_scaling": {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 8192,
                     "attention_factor": 1.2079441541679836, "beta_fast": 32, "beta_slow": 1},
}
EXAONE_4_32B = hub_config("LGAI-EXAONE__EXAONE-4.0-32B")  # the hub's config.json

HUNYUAN_7B_INSTRUCT = {
    "architectures": ["HunYuanDenseV1ForCausalLM"], "model_type": "hunyuan_v1_dense", "vocab_size": 128167,
    "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
    "num_key_value_heads": 8, "head_dim": 128, "hidden_act": "silu", "max_position_embeddings": 262144,
    "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
    "rope_scaling": {"alpha": 1000.0, "beta_fast": 32, "beta_slow": 1, "factor": 1.0, "mscale": 1.0,
                     "mscale_all_dim": 1.0, "type": "dynamic"},
    "attention_bias": False, "mlp_bias": False, "use_qk_norm": True, "use_cla": False, "tie_word_embeddings": True,
    "bos_token_id": 127958, "eos_token_id": 127960, "pad_token_id": 127961, "torch_dtype": "bfloat16",
}

GRANITE_3_3_2B = {
    "architectures": ["GraniteForCausalLM"], "model_type": "granite", "vocab_size": 49159, "hidden_size": 2048,
    "intermediate_size": 8192, "num_hidden_layers": 40, "num_attention_heads": 32, "num_key_value_heads": 8,
    "hidden_act": "silu", "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 10000000.0,
    "embedding_multiplier": 12.0, "residual_multiplier": 0.22, "attention_multiplier": 0.015625,
    "logits_scaling": 8.0, "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": True,
    "bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 0, "torch_dtype": "bfloat16",
}
SMOLLM3_3B = {
    "architectures": ["SmolLM3ForCausalLM"], "model_type": "smollm3", "vocab_size": 128256, "hidden_size": 2048,
    "intermediate_size": 11008, "num_hidden_layers": 36, "num_attention_heads": 16, "num_key_value_heads": 4,
    "hidden_act": "silu", "max_position_embeddings": 65536, "rms_norm_eps": 1e-6, "rope_theta": 5000000.0,
    "no_rope_layers": [int((i + 1) % 4 != 0) for i in range(36)], "no_rope_layer_interval": 4,
    "use_sliding_window": False, "sliding_window": None, "attention_bias": False, "mlp_bias": False,
    "tie_word_embeddings": True, "bos_token_id": None, "eos_token_id": 128012, "pad_token_id": 128004,
    "torch_dtype": "bfloat16",
}
SEED_OSS_36B = {
    "architectures": ["SeedOssForCausalLM"], "model_type": "seed_oss", "vocab_size": 155136, "hidden_size": 5120,
    "intermediate_size": 27648, "num_hidden_layers": 64, "num_attention_heads": 80, "num_key_value_heads": 8,
    "head_dim": 128, "hidden_act": "silu", "max_position_embeddings": 524288, "rms_norm_eps": 1e-6,
    "rope_theta": 10000000.0, "attention_bias": True, "attention_out_bias": False, "mlp_bias": False,
    "tie_word_embeddings": False, "bos_token_id": 0, "eos_token_id": 2, "pad_token_id": 1, "torch_dtype": "bfloat16",
}
ERNIE_4_5_0_3B = {
    "architectures": ["Ernie4_5ForCausalLM"], "model_type": "ernie4_5", "vocab_size": 103424, "hidden_size": 1024,
    "intermediate_size": 3072, "num_hidden_layers": 18, "num_attention_heads": 16, "num_key_value_heads": 2,
    "head_dim": 128, "hidden_act": "silu", "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0, "use_bias": False, "tie_word_embeddings": True, "bos_token_id": 1, "eos_token_id": 2,
    "pad_token_id": 0, "torch_dtype": "bfloat16",
}
MINISTRAL_8B = {
    "architectures": ["MinistralForCausalLM"], "model_type": "ministral", "vocab_size": 131072, "hidden_size": 4096,
    "intermediate_size": 12288, "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8,
    "head_dim": 128, "hidden_act": "silu", "max_position_embeddings": 32768, "rms_norm_eps": 1e-5,
    "rope_theta": 100000000.0, "sliding_window": 32768, "tie_word_embeddings": False, "bos_token_id": 1,
    "eos_token_id": 2, "torch_dtype": "bfloat16",
}
MINISTRAL_3_3B = {  # the text decoder of Ministral-3-3B, as Ministral3ForCausalLM
    "architectures": ["Ministral3ForCausalLM"], "model_type": "ministral3", "vocab_size": 131072, "hidden_size": 3072,
    "intermediate_size": 9216, "num_hidden_layers": 26, "num_attention_heads": 32, "num_key_value_heads": 8,
    "head_dim": 128, "hidden_act": "silu", "max_position_embeddings": 262144, "rms_norm_eps": 1e-5,
    "rope_parameters": {"rope_type": "yarn", "type": "yarn", "rope_theta": 1000000.0, "factor": 16.0,
                        "original_max_position_embeddings": 16384, "beta_fast": 32.0, "beta_slow": 1.0,
                        "mscale": 1.0, "mscale_all_dim": 1.0, "llama_4_scaling_beta": 0.1},
    "sliding_window": None, "tie_word_embeddings": True, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 11,
    "torch_dtype": "bfloat16",
}
APERTUS_8B = {  # swiss-ai/Apertus-8B-2509, from memory (shapes confirmed: 21504-wide MLP, 8 KV heads of 128)
    "architectures": ["ApertusForCausalLM"], "model_type": "apertus", "vocab_size": 131072, "hidden_size": 4096,
    "intermediate_size": 21504, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "hidden_act": "xielu", "max_position_embeddings": 65536, "rms_norm_eps": 1e-5, "rope_theta": 12000000,
    "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192,
                     "low_freq_factor": 1.0, "high_freq_factor": 4.0},
    "qk_norm": True, "post_norm": False,  # keys of the hub's config.json (from memory) that transformers ignores
    "attention_bias": False, "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 3,
    "torch_dtype": "bfloat16",
}

# openai/gpt-oss-20b's shapes, in the bf16 layout transformers 5 saves (the hub's own checkpoint
# stores the experts in MXFP4: *_blocks and *_scales).
GPT_OSS_20B = {
    "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "vocab_size": 201088, "hidden_size": 2880,
    "intermediate_size": 2880, "num_hidden_layers": 24, "num_attention_heads": 64, "num_key_value_heads": 8,
    "head_dim": 64, "num_local_experts": 32, "num_experts_per_tok": 4, "experts_per_token": 4, "swiglu_limit": 7.0,
    "sliding_window": 128, "layer_types": ["sliding_attention", "full_attention"] * 12, "hidden_act": "silu",
    "max_position_embeddings": 131072, "initial_context_length": 4096, "rms_norm_eps": 1e-5, "rope_theta": 150000,
    "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0, "original_max_position_embeddings": 4096,
                     "rope_type": "yarn", "truncate": False},
    "attention_bias": True, "tie_word_embeddings": False, "eos_token_id": 200002, "pad_token_id": 199999,
    "torch_dtype": "bfloat16",
}
OLMOE_1B_7B = {
    "architectures": ["OlmoeForCausalLM"], "model_type": "olmoe", "vocab_size": 50304, "hidden_size": 2048,
    "intermediate_size": 1024, "num_hidden_layers": 16, "num_attention_heads": 16, "num_key_value_heads": 16,
    "hidden_act": "silu", "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
    "attention_bias": False, "clip_qkv": None, "num_experts": 64, "num_experts_per_tok": 8, "norm_topk_prob": False,
    "tie_word_embeddings": False, "bos_token_id": None, "eos_token_id": 50279, "pad_token_id": 1,
    "torch_dtype": "bfloat16",
}
QWEN3_30B_A3B = hub_config("Qwen__Qwen3-30B-A3B")  # the hub's config.json
# ibm-granite/granite-3.1-3b-a800m-instruct's shapes.
GRANITE_3_1_3B_A800M = {
    "architectures": ["GraniteMoeForCausalLM"], "model_type": "granitemoe", "vocab_size": 49155, "hidden_size": 1536,
    "intermediate_size": 512, "num_hidden_layers": 32, "num_attention_heads": 24, "num_key_value_heads": 8,
    "hidden_act": "silu", "max_position_embeddings": 131072, "rms_norm_eps": 1e-6, "rope_theta": 10000000.0,
    "rope_scaling": None, "attention_bias": False, "num_local_experts": 40, "num_experts_per_tok": 8,
    "embedding_multiplier": 12.0, "logits_scaling": 6.0, "residual_multiplier": 0.22,
    "attention_multiplier": 0.015625, "tie_word_embeddings": True, "bos_token_id": 0, "eos_token_id": 0,
    "pad_token_id": 0, "torch_dtype": "bfloat16",
}
# microsoft/Phi-3.5-MoE-instruct's shapes; its LongRoPE factors stand in as 1.0 (short) and 2.0 (long).
PHI_3_5_MOE = {
    "architectures": ["PhimoeForCausalLM"], "model_type": "phimoe", "vocab_size": 32064, "hidden_size": 4096,
    "intermediate_size": 6400, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "hidden_act": "silu", "max_position_embeddings": 131072, "original_max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
    "rope_scaling": {"type": "longrope", "short_factor": [1.0] * 64, "long_factor": [2.0] * 64,
                     "short_mscale": 1.243163121016122, "long_mscale": 1.243163121016122,
                     "original_max_position_embeddings": 4096},
    "sliding_window": 131072, "attention_bias": True, "lm_head_bias": True, "num_local_experts": 16,
    "num_experts_per_tok": 2, "router_jitter_noise": 0.01, "input_jitter_noise": 0.01, "tie_word_embeddings": False,
    "bos_token_id": 1, "eos_token_id": 32000, "torch_dtype": "bfloat16",
}

# baidu/ERNIE-4.5-21B-A3B-PT's shapes: layer 0 dense, the others 64 experts (top 6) and 2 shared.
ERNIE_4_5_21B_A3B = {
    "architectures": ["Ernie4_5_MoeForCausalLM"], "model_type": "ernie4_5_moe", "vocab_size": 103424,
    "hidden_size": 2560, "intermediate_size": 12288, "num_hidden_layers": 28, "num_attention_heads": 20,
    "num_key_value_heads": 4, "head_dim": 128, "hidden_act": "silu", "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "use_bias": False, "moe_num_experts": 64, "moe_k": 6,
    "moe_num_shared_experts": 2, "moe_intermediate_size": 1536, "moe_layer_start_index": 1, "moe_layer_interval": 1,
    "tie_word_embeddings": True, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0, "torch_dtype": "bfloat16",
}

# zai-org/GLM-4.5-Air's shapes, from memory (not checked against the hub): 46 layers, the first dense,
# the others 128 experts (top 8, one group) and one shared; 96 query heads of 128 on a hidden size of
# 4096; and the multi-token-prediction layer the hub checkpoint carries as layer 46.
GLM_4_5_AIR = {
    "architectures": ["Glm4MoeForCausalLM"], "model_type": "glm4_moe", "vocab_size": 151552, "hidden_size": 4096,
    "intermediate_size": 10944, "num_hidden_layers": 46, "num_attention_heads": 96, "num_key_value_heads": 8,
    "head_dim": 128, "hidden_act": "silu", "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
    "rope_theta": 1000000, "rope_scaling": None, "partial_rotary_factor": 0.5, "attention_bias": True,
    "use_qk_norm": False, "moe_intermediate_size": 1408, "n_routed_experts": 128, "num_experts_per_tok": 8,
    "n_shared_experts": 1, "n_group": 1, "topk_group": 1, "routed_scaling_factor": 1.0, "norm_topk_prob": True,
    "first_k_dense_replace": 1, "num_nextn_predict_layers": 1, "tie_word_embeddings": False,
    "eos_token_id": [151329, 151336, 151338], "pad_token_id": 151329, "torch_dtype": "bfloat16",
}

# LiquidAI/LFM2-1.2B's shapes, from memory (not checked against the hub): 16 layers, attention at
# 2, 5, 8, 10, 12 and 14, 3-tap convolutions elsewhere; the MLP 12288 adjusted to 8192.
LFM2_1_2B = {
    "architectures": ["Lfm2ForCausalLM"], "model_type": "lfm2", "vocab_size": 65536, "hidden_size": 2048,
    "intermediate_size": 12288, "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
    "max_position_embeddings": 128000, "norm_eps": 1e-5, "rope_theta": 1000000.0, "conv_L_cache": 3,
    "conv_bias": False, "block_auto_adjust_ff_dim": True, "block_ffn_dim_multiplier": 1.0, "block_multiple_of": 256,
    "full_attn_idxs": [2, 5, 8, 10, 12, 14],
    "layer_types": ["full_attention" if i in (2, 5, 8, 10, 12, 14) else "conv" for i in range(16)],
    "tie_embedding": True, "bos_token_id": 1, "eos_token_id": 7, "pad_token_id": 0, "torch_dtype": "bfloat16",
}

# rednote-hilab/dots.llm1.inst's shapes, from memory (not checked against the hub): 62 layers, the
# first dense, the others 128 experts (top 6, one group, weights normalized and times 2.5) and two
# shared; 32 heads of 128 on a hidden size of 4096, q/k norms; no sliding window.
DOTS_LLM1_INST = {
    "architectures": ["Dots1ForCausalLM"], "model_type": "dots1", "vocab_size": 152064, "hidden_size": 4096,
    "intermediate_size": 10944, "num_hidden_layers": 62, "num_attention_heads": 32, "num_key_value_heads": 32,
    "head_dim": 128, "hidden_act": "silu", "max_position_embeddings": 32768, "rms_norm_eps": 1e-5,
    "rope_theta": 10000000, "rope_scaling": None, "attention_bias": False, "moe_intermediate_size": 1408,
    "n_routed_experts": 128, "num_experts_per_tok": 6, "n_shared_experts": 2, "n_group": 1, "topk_group": 1,
    "routed_scaling_factor": 2.5, "norm_topk_prob": True, "first_k_dense_replace": 1, "sliding_window": None,
    "max_window_layers": 62, "tie_word_embeddings": False, "eos_token_id": 151649, "pad_token_id": 151643,
    "torch_dtype": "bfloat16",
}

# tencent/Hunyuan-A13B-Instruct's shapes, from memory (not checked against the hub): 32 layers of 64
# experts (top 8) 3072 wide and one shared MLP as wide; 32 query heads of 128, 8 KV heads; NTK-alpha
# rope; the original code's per-layer lists, which transformers ignores.
HUNYUAN_A13B_INSTRUCT = {
    "architectures": ["HunYuanMoEV1ForCausalLM"], "model_type": "hunyuan_v1_moe", "vocab_size": 128167,
    "hidden_size": 4096, "intermediate_size": 3072, "num_hidden_layers": 32, "num_attention_heads": 32,
    "num_key_value_heads": 8, "head_dim": 128, "hidden_act": "silu", "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
    "rope_scaling": {"alpha": 1000.0, "beta_fast": 32, "beta_slow": 1, "factor": 1.0, "mscale": 1.0,
                     "mscale_all_dim": 1.0, "type": "dynamic"},
    "num_experts": 64, "moe_topk": [8] * 32, "moe_intermediate_size": [3072] * 32, "num_shared_expert": [1] * 32,
    "use_mixed_mlp_moe": True, "use_qk_norm": True, "use_cla": False, "attention_bias": False, "mlp_bias": False,
    "tie_word_embeddings": True, "bos_token_id": 1, "eos_token_id": 127960, "pad_token_id": 127961,
    "torch_dtype": "bfloat16",
}

# LiquidAI/LFM2-8B-A1B's shapes, from memory (not checked against the hub): 24 layers, attention at
# 2, 6, 10, 14, 18 and 21, 3-tap convolutions elsewhere; the first 2 layers dense (7168), then 32
# experts of 1792, 4 chosen by sigmoid scores plus an expert bias, normalized.
LFM2_8B_A1B = {
    "architectures": ["Lfm2MoeForCausalLM"], "model_type": "lfm2_moe", "vocab_size": 65536, "hidden_size": 2048,
    "intermediate_size": 7168, "moe_intermediate_size": 1792, "num_hidden_layers": 24, "num_attention_heads": 32,
    "num_key_value_heads": 8, "max_position_embeddings": 128000, "norm_eps": 1e-5, "rope_theta": 1000000.0,
    "conv_L_cache": 3, "conv_bias": False, "num_dense_layers": 2, "num_experts": 32, "num_experts_per_tok": 4,
    "use_expert_bias": True, "routed_scaling_factor": 1.0, "norm_topk_prob": True,
    "layer_types": ["full_attention" if i in (2, 6, 10, 14, 18, 21) else "conv" for i in range(24)],
    "tie_word_embeddings": True, "bos_token_id": 1, "eos_token_id": 7, "pad_token_id": 0, "torch_dtype": "bfloat16",
}

# Qwen/Qwen3.5-2B's text decoder, from memory (not checked against the hub; the hub saves it as
# Qwen3_5ForConditionalGeneration, this is its Qwen3_5ForCausalLM layout): 24 layers, every 4th full
# attention (8 query heads of 256, 2 KV heads, output gate, a quarter of the head rotated), the others
# gated DeltaNet (16 key and 16 value heads of 128, a 4-tap conv).
QWEN3_5_2B = {
    "architectures": ["Qwen3_5ForCausalLM"], "model_type": "qwen3_5_text", "vocab_size": 248320, "hidden_size": 2048,
    "intermediate_size": 6144, "num_hidden_layers": 24, "num_attention_heads": 8, "num_key_value_heads": 2,
    "head_dim": 256, "hidden_act": "silu", "max_position_embeddings": 262144, "rms_norm_eps": 1e-6,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25,
                        "mrope_section": [11, 11, 10], "mrope_interleaved": True},
    "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
    "linear_num_key_heads": 16, "linear_num_value_heads": 16,
    "layer_types": ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(24)],
    "tie_word_embeddings": True, "bos_token_id": None, "eos_token_id": 248044, "pad_token_id": None,
    "torch_dtype": "bfloat16", "mtp_num_hidden_layers": 1,
}

# ibm-granite/granite-4.0-h-tiny's shapes, from memory (not checked against the hub): 40 layers,
# attention (12 query heads, 4 KV heads, no rotary) at layers 5, 15, 25, 35, Mamba-2 elsewhere (48
# heads of 64, one group of B and C, state 128), 64 experts of 512 (top 6) beside a shared MLP of 1024.
GRANITE_4_0_H_TINY = {
    "architectures": ["GraniteMoeHybridForCausalLM"], "model_type": "granitemoehybrid", "vocab_size": 100352,
    "hidden_size": 1536, "intermediate_size": 512, "shared_intermediate_size": 1024, "num_hidden_layers": 40,
    "num_attention_heads": 12, "num_key_value_heads": 4, "hidden_act": "silu", "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5, "position_embedding_type": "nope", "embedding_multiplier": 12.0,
    "residual_multiplier": 0.22, "attention_multiplier": 0.0078125, "logits_scaling": 6.0,
    "num_local_experts": 64, "num_experts_per_tok": 6, "mamba_n_heads": 48, "mamba_d_head": 64,
    "mamba_n_groups": 1, "mamba_d_state": 128, "mamba_d_conv": 4, "mamba_expand": 2, "mamba_chunk_size": 256,
    "mamba_conv_bias": True, "mamba_proj_bias": False,
    "layer_types": ["attention" if i % 10 == 5 else "mamba" for i in range(40)],
    "tie_word_embeddings": True, "bos_token_id": 100257, "eos_token_id": 100257, "pad_token_id": 100256,
    "torch_dtype": "bfloat16",
}

# nvidia/NVIDIA-Nemotron-Nano-9B-v2's shapes, from memory (not checked against the hub; the pattern
# is approximate): 56 layers alternating Mamba-2 (128 heads of 80, 8 groups, state 128) and relu²
# MLPs of 15680, four of them attention (40 query heads of 128, 8 KV heads, no rotary).
NEMOTRON_NANO_9B_V2 = {
    "architectures": ["NemotronHForCausalLM"], "model_type": "nemotron_h", "vocab_size": 131072, "hidden_size": 4480,
    "intermediate_size": 15680, "num_hidden_layers": 56, "num_attention_heads": 40, "num_key_value_heads": 8,
    "head_dim": 128, "max_position_embeddings": 131072, "layer_norm_epsilon": 1e-5, "mlp_hidden_act": "relu2",
    "mamba_num_heads": 128, "mamba_head_dim": 80, "ssm_state_size": 128, "n_groups": 8, "conv_kernel": 4,
    "chunk_size": 128, "use_conv_bias": True, "use_bias": False, "time_step_min": 0.001,
    "hybrid_override_pattern": "M-M-M-MM-M-M-M*-M-M-M*-M-M-M-M*-M-M-M-M*-M-MM-M-M-M-M-M-",
    "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 12, "pad_token_id": 0,
    "torch_dtype": "bfloat16",
}

QWEN3_NEXT_80B_A3B = hub_config("Qwen__Qwen3-Next-80B-A3B-Thinking")  # the Thinking model's config.json: the Instruct model's shapes

# tiiuae/Falcon-H1-1.5B-Instruct's shapes, from memory (not checked against the hub): 24 layers, each
# Mamba-2 (24 heads of 64 over mamba_d_ssm 1536, one group, state 256) beside GQA attention (8 query
# heads of 128, 2 KV heads), a SwiGLU of 8192; μP multipliers away from 1 (values illustrative).
FALCON_H1_1_5B = {
    "architectures": ["FalconH1ForCausalLM"], "model_type": "falcon_h1", "vocab_size": 65537, "hidden_size": 2048,
    "intermediate_size": 8192, "num_hidden_layers": 24, "num_attention_heads": 8, "num_key_value_heads": 2,
    "head_dim": 128, "hidden_act": "silu", "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
    "rope_theta": 100000000000.0, "mamba_d_ssm": 1536, "mamba_n_heads": 24, "mamba_d_head": 64,
    "mamba_n_groups": 1, "mamba_d_state": 256, "mamba_d_conv": 4, "mamba_expand": 2, "mamba_chunk_size": 256,
    "mamba_conv_bias": True, "mamba_proj_bias": False, "mamba_rms_norm": True, "mamba_norm_before_gate": False,
    "projectors_bias": False, "attention_bias": False, "mlp_bias": False, "embedding_multiplier": 5.656854,
    "lm_head_multiplier": 0.0390625, "key_multiplier": 0.390625, "attention_in_multiplier": 1.0,
    "attention_out_multiplier": 0.9375, "ssm_in_multiplier": 1.25, "ssm_out_multiplier": 0.23570226,
    "mlp_multipliers": [0.8838834764831844, 0.5859375],
    "ssm_multipliers": [0.3535533905932738, 0.25, 0.3535533905932738, 0.5, 0.3535533905932738],
    "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 11, "pad_token_id": 0, "torch_dtype": "bfloat16",
}

NEMOTRON_3_NANO_30B_A3B = hub_config("nvidia__NVIDIA-Nemotron-3-Nano-30B-A3B-BF16")  # the hub's config.json

# deepseek-ai/DeepSeek-V3's shapes (also R1's), from memory (not checked against the hub): 61
# layers of MLA (128 heads; q rank 1536, kv rank 512, rope 64, nope 128, v 128; YaRN ×40), the
# first 3 dense, then 256 experts of 2048 (top 8 of the 4 best of 8 groups) and a shared expert.
# The hub's weights are FP8 blocks; this preset writes bf16.
DEEPSEEK_V3 = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "vocab_size": 129280,
    "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_hidden_layers": 61,
    "num_attention_heads": 128, "num_key_value_heads": 128, "n_shared_experts": 1, "n_routed_experts": 256,
    "routed_scaling_factor": 2.5, "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_rope_head_dim": 64,
    "v_head_dim": 128, "qk_nope_head_dim": 128, "n_group": 8, "topk_group": 4, "num_experts_per_tok": 8,
    "first_k_dense_replace": 3, "norm_topk_prob": True, "hidden_act": "silu", "max_position_embeddings": 163840,
    "rms_norm_eps": 1e-6, "rope_theta": 10000, "num_nextn_predict_layers": 1,
    "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096, "beta_fast": 32,
                     "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
    "tie_word_embeddings": False, "bos_token_id": 0, "eos_token_id": 1, "torch_dtype": "bfloat16",
}

# moonshotai/Kimi-K2-Instruct's shapes, from memory (not checked against the hub): DeepSeek-V3's
# class with 64 heads, 384 experts (top 8, one group), one dense layer, YaRN ×32.
KIMI_K2 = {
    **DEEPSEEK_V3, "vocab_size": 163840, "num_attention_heads": 64, "num_key_value_heads": 64, "n_routed_experts": 384,
    "routed_scaling_factor": 2.827, "n_group": 1, "topk_group": 1, "first_k_dense_replace": 1,
    "max_position_embeddings": 131072, "rope_theta": 50000.0,
    "rope_scaling": {"type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096, "beta_fast": 1.0,
                     "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0},
    "bos_token_id": 163584, "eos_token_id": 163585, "num_nextn_predict_layers": 0,
}

# meta-llama/Llama-4-Scout-17B-16E-Instruct's text decoder, from memory (not checked against the
# hub; the hub saves it as Llama4ForConditionalGeneration, this is its Llama4ForCausalLM layout): 48
# layers, every one 16 experts (top 1) beside a shared expert, chunked attention (8192) with the
# rotary on three of four layers, llama3 rope scaling; ~107B parameters. Build it with
# --context-length (its 10M positions' rotary tables alone are 5 GB).
LLAMA_4_SCOUT = {
    "architectures": ["Llama4ForCausalLM"], "model_type": "llama4_text", "vocab_size": 202048, "hidden_size": 5120,
    "intermediate_size": 8192, "intermediate_size_mlp": 16384, "num_hidden_layers": 48, "num_attention_heads": 40,
    "num_key_value_heads": 8, "head_dim": 128, "hidden_act": "silu", "max_position_embeddings": 10485760,
    "rms_norm_eps": 1e-5, "num_local_experts": 16, "num_experts_per_tok": 1, "interleave_moe_layer_step": 1,
    "use_qk_norm": True, "attention_chunk_size": 8192, "attn_temperature_tuning": True, "floor_scale": 8192,
    "attn_scale": 0.1, "rope_theta": 500000.0,
    # Equal frequency factors, as the Instruct model's text_config has them (RedHat's FP8 copy of its
    # config.json, tests/data/hub_configs/): no smoothing band.
    "rope_scaling": {"rope_type": "llama3", "factor": 16.0, "low_freq_factor": 1.0, "high_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192},
    "tie_word_embeddings": False, "bos_token_id": 200000, "eos_token_id": [200001, 200007, 200008],
    "pad_token_id": 200018, "torch_dtype": "bfloat16",
}

# google/gemma-4-E2B-it's text decoder, from memory (not checked against the hub; shapes
# approximate; the hub saves it as Gemma4ForConditionalGeneration, this is its Gemma4ForCausalLM
# layout): 35 layers, four sliding (512) then one full, the last 20 sharing the KV of the last
# layers that compute it (their MLPs twice as wide), per-layer inputs of 256.
GEMMA_4_E2B = {
    "architectures": ["Gemma4ForCausalLM"], "model_type": "gemma4_text", "vocab_size": 262144, "hidden_size": 1536,
    "intermediate_size": 6144, "num_hidden_layers": 35, "num_attention_heads": 8, "num_key_value_heads": 1,
    "head_dim": 256, "global_head_dim": 512, "hidden_activation": "gelu_pytorch_tanh",
    "max_position_embeddings": 131072, "rms_norm_eps": 1e-6, "sliding_window": 512,
    "layer_types": ["full_attention" if i % 5 == 4 else "sliding_attention" for i in range(35)],
    "num_kv_shared_layers": 20, "use_double_wide_mlp": True, "hidden_size_per_layer_input": 256,
    "vocab_size_per_layer_input": 262144, "final_logit_softcapping": 30.0, "tie_word_embeddings": True,
    "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0, "torch_dtype": "bfloat16",
}

# google/gemma-4-31B-it's text decoder, from memory (not checked against the hub; shapes
# approximate): 60 layers, five sliding (1024) then one full whose keys are its values
# (attention_k_eq_v: 4 KV heads of 512, no v_proj), no per-layer inputs, no KV sharing.
GEMMA_4_31B = {
    **GEMMA_4_E2B, "hidden_size": 5376, "intermediate_size": 21504, "num_hidden_layers": 60,
    "num_attention_heads": 32, "num_key_value_heads": 16, "num_global_key_value_heads": 4, "attention_k_eq_v": True,
    "sliding_window": 1024, "layer_types": ["full_attention" if i % 6 == 5 else "sliding_attention" for i in range(60)],
    "num_kv_shared_layers": 0, "use_double_wide_mlp": False, "hidden_size_per_layer_input": 0,
}

# openai/whisper-large-v3-turbo, from memory (not checked against the hub): large-v3's 32-layer
# encoder over 128 mel bins with 4 decoder layers instead of 32; the vocabulary with its 100
# language tokens; proj_out tied to the token embedding (not stored).
WHISPER_LARGE_V3_TURBO = {
    "architectures": ["WhisperForConditionalGeneration"], "model_type": "whisper", "vocab_size": 51866,
    "num_mel_bins": 128, "d_model": 1280, "encoder_layers": 32, "decoder_layers": 4, "num_hidden_layers": 32,
    "encoder_attention_heads": 20, "decoder_attention_heads": 20, "encoder_ffn_dim": 5120, "decoder_ffn_dim": 5120,
    "activation_function": "gelu", "max_source_positions": 1500, "max_target_positions": 448,
    "scale_embedding": False, "tie_word_embeddings": True, "bos_token_id": 50257, "eos_token_id": 50257,
    "pad_token_id": 50257, "decoder_start_token_id": 50258, "torch_dtype": "float16",
}

PRESETS: dict[str, dict] = {
    "Llama-3.2-1B": LLAMA_3_2_1B,
    "Llama-3.1-8B": LLAMA_3_1_8B,
    "Qwen3-0.6B": QWEN3_0_6B,
    "gemma-3-1b-it": GEMMA_3_1B_IT,
    "gemma-3-12b-it": GEMMA_3_12B_IT,
    "Qwen2.5-VL-7B-Instruct": QWEN2_5_VL_7B,
    "Qwen3-VL-8B-Instruct": QWEN3_VL_8B,
    "Qwen3-VL-30B-A3B-Instruct": QWEN3_VL_30B_A3B,
    "Phi-4-mini": PHI_4_MINI,
    "aya-23-8B": AYA_23_8B,
    "c4ai-command-r7b-12-2024": COMMAND_R7B,
    "glm-4-9b-chat-hf": GLM_4_9B_CHAT_HF,
    "GLM-4-9B-0414": GLM_4_9B_0414,
    "phi-2": PHI_2,
    "stablelm-2-1_6b": STABLELM_2_1_6B,
    "starcoder2-3b": STARCODER2_3B,
    "Nemotron-Mini-4B-Instruct": NEMOTRON_MINI_4B,
    "OLMo-1B-hf": OLMO_1B,
    "OLMo-2-0425-1B": OLMO_2_1B,
    "Olmo-3-7B": OLMO_3_7B,
    "EXAONE-4.0-32B": EXAONE_4_32B,
    "Hunyuan-7B-Instruct": HUNYUAN_7B_INSTRUCT,
    "granite-3.3-2b-instruct": GRANITE_3_3_2B,
    "SmolLM3-3B": SMOLLM3_3B,
    "Seed-OSS-36B-Instruct": SEED_OSS_36B,
    "ERNIE-4.5-0.3B-PT": ERNIE_4_5_0_3B,
    "Ministral-8B-Instruct-2410": MINISTRAL_8B,
    "Ministral-3-3B": MINISTRAL_3_3B,
    "Apertus-8B-2509": APERTUS_8B,
    "gpt-oss-20b": GPT_OSS_20B,
    "OLMoE-1B-7B-0924": OLMOE_1B_7B,
    "Qwen3-30B-A3B": QWEN3_30B_A3B,
    "granite-3.1-3b-a800m-instruct": GRANITE_3_1_3B_A800M,
    "Phi-3.5-MoE-instruct": PHI_3_5_MOE,
    "ERNIE-4.5-21B-A3B-PT": ERNIE_4_5_21B_A3B,
    "Hunyuan-A13B-Instruct": HUNYUAN_A13B_INSTRUCT,
    "GLM-4.5-Air": GLM_4_5_AIR,
    "dots.llm1.inst": DOTS_LLM1_INST,
    "LFM2-1.2B": LFM2_1_2B,
    "Qwen3.5-2B": QWEN3_5_2B,
    "LFM2-8B-A1B": LFM2_8B_A1B,
    "granite-4.0-h-tiny": GRANITE_4_0_H_TINY,
    "NVIDIA-Nemotron-Nano-9B-v2": NEMOTRON_NANO_9B_V2,
    "Qwen3-Next-80B-A3B-Instruct": QWEN3_NEXT_80B_A3B,
    "Falcon-H1-1.5B-Instruct": FALCON_H1_1_5B,
    "NVIDIA-Nemotron-3-Nano-30B-A3B": NEMOTRON_3_NANO_30B_A3B,
    "DeepSeek-V3": DEEPSEEK_V3,
    "Kimi-K2-Instruct": KIMI_K2,
    "Llama-4-Scout-17B-16E-Instruct": LLAMA_4_SCOUT,
    "gemma-4-E2B-it": GEMMA_4_E2B,
    "gemma-4-31B-it": GEMMA_4_31B,
    "whisper-large-v3-turbo": WHISPER_LARGE_V3_TURBO,
}


def llama_tensors(c: dict, prefix: str = "") -> Iterator[tuple[str, tuple[int, ...]]]:
    """Names and shapes of a Llama-family checkpoint (Llama, Mistral, Qwen2, Qwen3, and those with
    Llama's tensor names: Granite, SmolLM3, Seed-OSS, ERNIE 4.5, Ministral, Ministral 3)."""
    H, I, V = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    D = c.get("head_dim") or H // c["num_attention_heads"]
    q, kv = c["num_attention_heads"] * D, c.get("num_key_value_heads", c["num_attention_heads"]) * D
    qwen2, qwen3 = c["model_type"] == "qwen2", c["model_type"] == "qwen3"
    yield f"{prefix}model.embed_tokens.weight", (V, H)
    for i in range(c["num_hidden_layers"]):
        p = f"{prefix}model.layers.{i}."
        yield p + "input_layernorm.weight", (H,)
        yield p + "self_attn.q_proj.weight", (q, H)
        yield p + "self_attn.k_proj.weight", (kv, H)
        yield p + "self_attn.v_proj.weight", (kv, H)
        if qwen2 or c.get("attention_bias"):
            yield p + "self_attn.q_proj.bias", (q,)
            yield p + "self_attn.k_proj.bias", (kv,)
            yield p + "self_attn.v_proj.bias", (kv,)
        yield p + "self_attn.o_proj.weight", (H, q)
        if c.get("attention_out_bias", c.get("attention_bias")) and not qwen2:  # Seed-OSS: its own o bias
            yield p + "self_attn.o_proj.bias", (H,)
        if qwen3:
            yield p + "self_attn.q_norm.weight", (D,)
            yield p + "self_attn.k_norm.weight", (D,)
        yield p + "post_attention_layernorm.weight", (H,)
        yield p + "mlp.gate_proj.weight", (I, H)
        yield p + "mlp.up_proj.weight", (I, H)
        yield p + "mlp.down_proj.weight", (H, I)
    yield f"{prefix}model.norm.weight", (H,)
    if not c.get("tie_word_embeddings"):
        yield f"{prefix}lm_head.weight", (V, H)


def gemma3_text_tensors(c: dict, prefix: str = "model.") -> Iterator[tuple[str, tuple[int, ...]]]:
    """Gemma 3's decoder: q/k norms and four norms per layer; embeddings tied."""
    H, I, V, D = c["hidden_size"], c["intermediate_size"], c["vocab_size"], c["head_dim"]
    q, kv = c["num_attention_heads"] * D, c["num_key_value_heads"] * D
    yield f"{prefix}embed_tokens.weight", (V, H)
    for i in range(c["num_hidden_layers"]):
        p = f"{prefix}layers.{i}."
        for norm in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm"):
            yield p + f"{norm}.weight", (H,)
        yield p + "self_attn.q_proj.weight", (q, H)
        yield p + "self_attn.k_proj.weight", (kv, H)
        yield p + "self_attn.v_proj.weight", (kv, H)
        yield p + "self_attn.o_proj.weight", (H, q)
        yield p + "self_attn.q_norm.weight", (D,)
        yield p + "self_attn.k_norm.weight", (D,)
        yield p + "mlp.gate_proj.weight", (I, H)
        yield p + "mlp.up_proj.weight", (I, H)
        yield p + "mlp.down_proj.weight", (H, I)
    yield f"{prefix}norm.weight", (H,)


def siglip_tensors(v: dict, prefix: str = "vision_tower.vision_model.") -> Iterator[tuple[str, tuple[int, ...]]]:
    H, I, P = v["hidden_size"], v["intermediate_size"], v["patch_size"]
    yield prefix + "embeddings.patch_embedding.weight", (H, 3, P, P)
    yield prefix + "embeddings.patch_embedding.bias", (H,)
    yield prefix + "embeddings.position_embedding.weight", ((v["image_size"] // P) ** 2, H)
    for i in range(v["num_hidden_layers"]):
        p = f"{prefix}encoder.layers.{i}."
        for norm in ("layer_norm1", "layer_norm2"):
            yield p + f"{norm}.weight", (H,)
            yield p + f"{norm}.bias", (H,)
        for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
            yield p + f"self_attn.{proj}.weight", (H, H)
            yield p + f"self_attn.{proj}.bias", (H,)
        yield p + "mlp.fc1.weight", (I, H)
        yield p + "mlp.fc1.bias", (I,)
        yield p + "mlp.fc2.weight", (H, I)
        yield p + "mlp.fc2.bias", (H,)
    yield prefix + "post_layernorm.weight", (H,)
    yield prefix + "post_layernorm.bias", (H,)


def gemma3_multimodal_tensors(c: dict) -> Iterator[tuple[str, tuple[int, ...]]]:
    """The hub layout of gemma-3-4b/12b/27b-it: language_model.model.*, vision_tower.*, multi_modal_projector.*."""
    yield from gemma3_text_tensors(c["text_config"], "language_model.model.")
    yield from siglip_tensors(c["vision_config"])
    yield "multi_modal_projector.mm_input_projection_weight", (c["vision_config"]["hidden_size"], c["text_config"]["hidden_size"])
    yield "multi_modal_projector.mm_soft_emb_norm.weight", (c["vision_config"]["hidden_size"],)


def qwen2_5_vl_tensors(c: dict) -> Iterator[tuple[str, tuple[int, ...]]]:
    """The hub layout of Qwen2.5-VL: Qwen2's decoder (model.*, lm_head) and the vision tower visual.*
    (Conv3d patch embedding, fused qkv, SwiGLU with biases, the merger's ln_q and two-layer MLP)."""
    yield from llama_tensors(dict(c, model_type="qwen2"))
    v = c["vision_config"]
    H, I, m = v["hidden_size"], v["intermediate_size"], v["spatial_merge_size"]
    yield "visual.patch_embed.proj.weight", (H, v["in_chans"], v["temporal_patch_size"], v["patch_size"], v["patch_size"])
    for i in range(v["depth"]):
        p = f"visual.blocks.{i}."
        yield from ((p + f"norm{n}.weight", (H,)) for n in (1, 2))
        yield from ((p + f"attn.qkv.{kind}", shape) for kind, shape in (("weight", (3 * H, H)), ("bias", (3 * H,))))
        yield from ((p + f"attn.proj.{kind}", shape) for kind, shape in (("weight", (H, H)), ("bias", (H,))))
        for name, shape in _swiglu(p + "mlp.", I, H):
            yield name, shape
            yield name.replace(".weight", ".bias"), shape[:1]
    wide = H * m * m
    yield "visual.merger.ln_q.weight", (H,)
    yield from (("visual.merger.mlp.0." + k, s) for k, s in (("weight", (wide, wide)), ("bias", (wide,))))
    yield from (("visual.merger.mlp.2." + k, s) for k, s in (("weight", (v["out_hidden_size"], wide)),
                                                              ("bias", (v["out_hidden_size"],))))


def qwen3_vl_tensors(c: dict) -> Iterator[tuple[str, tuple[int, ...]]]:
    """The hub layout of Qwen3-VL: Qwen3's decoder under model.language_model.*, lm_head, and the
    vision tower model.visual.* (patch embedding with bias, pos_embed, LayerNorm blocks with
    linear_fc1/fc2, the merger and the DeepStack mergers)."""
    text = dict(c["text_config"], model_type="qwen3", tie_word_embeddings=c.get("tie_word_embeddings"))
    E, H = text.get("num_experts"), text["hidden_size"]
    for name, shape in llama_tensors(text):
        name = name.replace("model.", "model.language_model.", 1) if name.startswith("model.") else name
        if E and ".mlp." in name:  # Qwen3-VL-MoE: every layer's MLP a sparse block, experts stacked as x · W
            if name.endswith("gate_proj.weight"):
                p, I = name[: -len("gate_proj.weight")], text["moe_intermediate_size"]
                yield p + "gate.weight", (E, H)
                yield p + "experts.gate_up_proj", (E, H, 2 * I)
                yield p + "experts.down_proj", (E, I, H)
            continue
        yield name, shape
    v = c["vision_config"]
    H, I, m, P, T = v["hidden_size"], v["intermediate_size"], v["spatial_merge_size"], v["patch_size"], v["temporal_patch_size"]
    p = "model.visual."
    yield p + "patch_embed.proj.weight", (H, v["in_channels"], T, P, P)
    yield p + "patch_embed.proj.bias", (H,)
    yield p + "pos_embed.weight", (v["num_position_embeddings"], H)
    linear = lambda name, out, inp: ((f"{name}.weight", (out, inp)), (f"{name}.bias", (out,)))  # noqa: E731
    for i in range(v["depth"]):
        b = f"{p}blocks.{i}."
        yield from ((b + f"norm{n}.{k}", (H,)) for n in (1, 2) for k in ("weight", "bias"))
        yield from ((b + name, shape) for name, shape in linear("attn.qkv", 3 * H, H))
        yield from ((b + name, shape) for name, shape in linear("attn.proj", H, H))
        yield from ((b + name, shape) for name, shape in linear("mlp.linear_fc1", I, H))
        yield from ((b + name, shape) for name, shape in linear("mlp.linear_fc2", H, I))
    wide = H * m * m
    for merger, norm in [("merger.", H)] + [(f"deepstack_merger_list.{j}.", wide)
                                            for j in range(len(v["deepstack_visual_indexes"]))]:
        yield from ((p + merger + f"norm.{k}", (norm,)) for k in ("weight", "bias"))
        yield from ((p + merger + name, shape) for name, shape in linear("linear_fc1", wide, wide))
        yield from ((p + merger + name, shape) for name, shape in linear("linear_fc2", v["out_hidden_size"], wide))


def phi3_tensors(c: dict) -> Iterator[tuple[str, tuple[int, ...]]]:
    H, I, V = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    D = H // c["num_attention_heads"]
    qkv = (c["num_attention_heads"] + 2 * c["num_key_value_heads"]) * D
    yield "model.embed_tokens.weight", (V, H)
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        yield p + "input_layernorm.weight", (H,)
        yield p + "self_attn.qkv_proj.weight", (qkv, H)
        yield p + "self_attn.o_proj.weight", (H, c["num_attention_heads"] * D)
        yield p + "post_attention_layernorm.weight", (H,)
        yield p + "mlp.gate_up_proj.weight", (2 * I, H)
        yield p + "mlp.down_proj.weight", (H, I)
    yield "model.norm.weight", (H,)
    if not c.get("tie_word_embeddings"):
        yield "lm_head.weight", (V, H)


def cohere_tensors(c: dict) -> Iterator[tuple[str, tuple[int, ...]]]:
    """Cohere and Cohere 2: one LayerNorm per layer (weight only), q/k/v/o biases with attention_bias,
    Cohere's per-head q/k norms [heads, head_dim] with use_qk_norm."""
    H, I, V = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    heads, kv_heads = c["num_attention_heads"], c["num_key_value_heads"]
    D = c.get("head_dim") or H // heads
    yield "model.embed_tokens.weight", (V, H)
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        yield p + "input_layernorm.weight", (H,)
        for proj, rows in (("q_proj", heads * D), ("k_proj", kv_heads * D), ("v_proj", kv_heads * D)):
            yield p + f"self_attn.{proj}.weight", (rows, H)
            if c.get("attention_bias"):
                yield p + f"self_attn.{proj}.bias", (rows,)
        yield p + "self_attn.o_proj.weight", (H, heads * D)
        if c.get("attention_bias"):
            yield p + "self_attn.o_proj.bias", (H,)
        if c.get("use_qk_norm"):
            yield p + "self_attn.q_norm.weight", (heads, D)
            yield p + "self_attn.k_norm.weight", (kv_heads, D)
        yield p + "mlp.gate_proj.weight", (I, H)
        yield p + "mlp.up_proj.weight", (I, H)
        yield p + "mlp.down_proj.weight", (H, I)
    yield "model.norm.weight", (H,)
    if not c.get("tie_word_embeddings", True):
        yield "lm_head.weight", (V, H)


def glm_tensors(c: dict) -> Iterator[tuple[str, tuple[int, ...]]]:
    """GLM-4 and GLM-4-0414: q/k/v biases, fused gate_up_proj; GLM-4-0414's two extra post-norms."""
    H, I, V = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    D = c.get("head_dim") or H // c["num_attention_heads"]
    q, kv = c["num_attention_heads"] * D, c["num_key_value_heads"] * D
    yield "model.embed_tokens.weight", (V, H)
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        norms = ["input_layernorm", "post_attention_layernorm"]
        if c["model_type"] == "glm4":
            norms += ["post_self_attn_layernorm", "post_mlp_layernorm"]
        for norm in norms:
            yield p + f"{norm}.weight", (H,)
        for proj, rows in (("q_proj", q), ("k_proj", kv), ("v_proj", kv)):
            yield p + f"self_attn.{proj}.weight", (rows, H)
            if c.get("attention_bias", True):
                yield p + f"self_attn.{proj}.bias", (rows,)
        yield p + "self_attn.o_proj.weight", (H, q)
        yield p + "mlp.gate_up_proj.weight", (2 * I, H)
        yield p + "mlp.down_proj.weight", (H, I)
    yield "model.norm.weight", (H,)
    if not c.get("tie_word_embeddings"):
        yield "lm_head.weight", (V, H)


def olmo_tensors(c: dict) -> Iterator[tuple[str, tuple[int, ...]]]:
    """OLMo (no norm weights at all), OLMo 2/3 and EXAONE 4 (post-norms and q/k norms: over the
    whole projection in OLMo 2/3, per head in EXAONE 4)."""
    H, I, V = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    D = c.get("head_dim") or H // c["num_attention_heads"]
    q, kv = c["num_attention_heads"] * D, c.get("num_key_value_heads", c["num_attention_heads"]) * D
    post_norms, per_head = c["model_type"] != "olmo", c["model_type"] == "exaone4"
    yield "model.embed_tokens.weight", (V, H)
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        for proj, rows in (("q_proj", q), ("k_proj", kv), ("v_proj", kv)):
            yield p + f"self_attn.{proj}.weight", (rows, H)
            if c.get("attention_bias"):
                yield p + f"self_attn.{proj}.bias", (rows,)
        yield p + "self_attn.o_proj.weight", (H, q)
        if c.get("attention_bias"):
            yield p + "self_attn.o_proj.bias", (H,)
        if post_norms:
            yield p + "self_attn.q_norm.weight", (D if per_head else q,)
            yield p + "self_attn.k_norm.weight", (D if per_head else kv,)
            yield p + "post_attention_layernorm.weight", (H,)
            yield p + "post_feedforward_layernorm.weight", (H,)
        yield p + "mlp.gate_proj.weight", (I, H)
        yield p + "mlp.up_proj.weight", (I, H)
        yield p + "mlp.down_proj.weight", (H, I)
    if post_norms:
        yield "model.norm.weight", (H,)
    if not c.get("tie_word_embeddings"):
        yield "lm_head.weight", (V, H)


def gptstyle_tensors(c: dict) -> Iterator[tuple[str, tuple[int, ...]]]:
    """Phi (1.5/2), StableLM, StarCoder2 and Nemotron: LayerNorms with bias, their own module names."""
    kind = c["model_type"]
    H, I, V = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    D = c.get("head_dim") or H // c["num_attention_heads"]
    q, kv = c["num_attention_heads"] * D, c["num_key_value_heads"] * D
    qkv_bias = {"phi": True, "stablelm": c.get("use_qkv_bias"), "starcoder2": c.get("use_bias", True),
                "nemotron": c.get("attention_bias")}[kind]
    o_name, o_bias = ("dense", True) if kind == "phi" else ("o_proj", qkv_bias and kind != "stablelm")
    mlp = {"phi": ("fc1", "fc2", True), "starcoder2": ("c_fc", "c_proj", c.get("use_bias", True)),
           "nemotron": ("up_proj", "down_proj", c.get("mlp_bias"))}.get(kind)
    norms = ["input_layernorm"] if kind == "phi" or c.get("use_parallel_residual") else [
        "input_layernorm", "post_attention_layernorm"]
    yield "model.embed_tokens.weight", (V, H)
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        for norm in norms:
            yield p + f"{norm}.weight", (H,)
            yield p + f"{norm}.bias", (H,)
        for name, rows in (("q_proj", q), ("k_proj", kv), ("v_proj", kv)):
            yield p + f"self_attn.{name}.weight", (rows, H)
            if qkv_bias:
                yield p + f"self_attn.{name}.bias", (rows,)
        yield p + f"self_attn.{o_name}.weight", (H, q)
        if o_bias:
            yield p + f"self_attn.{o_name}.bias", (H,)
        if mlp is None:  # StableLM: Llama's gated MLP
            yield p + "mlp.gate_proj.weight", (I, H)
            yield p + "mlp.up_proj.weight", (I, H)
            yield p + "mlp.down_proj.weight", (H, I)
        else:
            yield p + f"mlp.{mlp[0]}.weight", (I, H)
            yield p + f"mlp.{mlp[1]}.weight", (H, I)
            if mlp[2]:
                yield p + f"mlp.{mlp[0]}.bias", (I,)
                yield p + f"mlp.{mlp[1]}.bias", (H,)
    final = "model.final_layernorm" if kind == "phi" else "model.norm"
    yield f"{final}.weight", (H,)
    yield f"{final}.bias", (H,)
    if not c.get("tie_word_embeddings", kind == "starcoder2"):
        yield "lm_head.weight", (V, H)
    if kind == "phi":
        yield "lm_head.bias", (V,)


def hunyuan_dense_tensors(c: dict) -> Iterator[tuple[str, tuple[int, ...]]]:
    """HunYuan dense: Llama's names, plus the per-head query_layernorm and key_layernorm."""
    D = c["head_dim"]
    for name, shape in llama_tensors(c):
        yield name, shape
        if name.endswith("self_attn.o_proj.weight"):
            yield name.replace("o_proj", "query_layernorm"), (D,)
            yield name.replace("o_proj", "key_layernorm"), (D,)


def hunyuan_moe_tensors(c: dict) -> Iterator[tuple[str, tuple[int, ...]]]:
    """HunYuan MoE: HunYuan dense's names with the MLP a router mlp.gate.wg, experts
    mlp.experts.{e}.*_proj and mlp.shared_mlp, all intermediate_size wide."""
    H, I, E = c["hidden_size"], c["intermediate_size"], c["num_experts"]
    mlp = (("gate_proj", (I, H)), ("up_proj", (I, H)), ("down_proj", (H, I)))
    for name, shape in hunyuan_dense_tensors(c):
        if ".mlp." not in name:
            yield name, shape
        elif name.endswith("mlp.gate_proj.weight"):
            p = name.removesuffix("gate_proj.weight")
            yield p + "gate.wg.weight", (E, H)
            for e in range(E):
                yield from ((p + f"experts.{e}.{proj}.weight", s) for proj, s in mlp)
            yield from ((p + f"shared_mlp.{proj}.weight", s) for proj, s in mlp)


def apertus_tensors(c: dict) -> Iterator[tuple[str, tuple[int, ...]]]:
    """Apertus: Qwen3's attention names (per-head q/k norms), attention_layernorm and
    feedforward_layernorm, an up/down MLP without gate, and xIELU's stored parameters per layer
    (alpha_p and alpha_n of shape [1], beta and eps scalars)."""
    norms = {"input_layernorm": "attention_layernorm", "post_attention_layernorm": "feedforward_layernorm"}
    for name, shape in llama_tensors(dict(c, model_type="qwen3")):
        if name.endswith("mlp.gate_proj.weight"):
            continue
        module = name.split(".")[-2]
        yield name.replace(module, norms.get(module, module)), shape
        if name.endswith("mlp.down_proj.weight"):
            p = name.removesuffix("down_proj.weight") + "act_fn."
            yield from ((p + "alpha_p", (1,)), (p + "alpha_n", (1,)), (p + "beta", ()), (p + "eps", ()))


def gpt_oss_tensors(c: dict) -> Iterator[tuple[str, tuple[int, ...]]]:
    """gpt-oss: Llama's attention with biases and per-head sinks; a router and stacked biased experts
    ([E, H, 2I] gate_up_proj, gate and up interleaved; [E, I, H] down_proj) instead of the MLP."""
    H, I, E = c["hidden_size"], c["intermediate_size"], c["num_local_experts"]
    for name, shape in llama_tensors(c):
        if ".mlp." in name:
            continue
        yield name, shape
        if name.endswith("self_attn.o_proj.bias"):
            p = name.removesuffix("self_attn.o_proj.bias")
            yield p + "self_attn.sinks", (c["num_attention_heads"],)
        if name.endswith("post_attention_layernorm.weight"):
            p = name.removesuffix("post_attention_layernorm.weight") + "mlp."
            yield p + "router.weight", (E, H)
            yield p + "router.bias", (E,)
            yield p + "experts.gate_up_proj", (E, H, 2 * I)
            yield p + "experts.gate_up_proj_bias", (E, 2 * I)
            yield p + "experts.down_proj", (E, I, H)
            yield p + "experts.down_proj_bias", (E, H)


def moe_tensors(c: dict) -> Iterator[tuple[str, tuple[int, ...]]]:
    """OLMoE (q/k norms over the whole projection) and Qwen3-MoE (per-head q/k norms): every
    expert its own gate/up/down Linear under mlp.experts.{e}, the router mlp.gate."""
    H, V, E = c["hidden_size"], c["vocab_size"], c["num_experts"]
    I = c.get("moe_intermediate_size") or c["intermediate_size"]
    D = c.get("head_dim") or H // c["num_attention_heads"]
    q, kv = c["num_attention_heads"] * D, c["num_key_value_heads"] * D
    whole = c["model_type"] == "olmoe"
    yield "model.embed_tokens.weight", (V, H)
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        yield p + "input_layernorm.weight", (H,)
        for name, rows in (("q", q), ("k", kv), ("v", kv)):
            yield p + f"self_attn.{name}_proj.weight", (rows, H)
        yield p + "self_attn.o_proj.weight", (H, q)
        yield p + "self_attn.q_norm.weight", (q if whole else D,)
        yield p + "self_attn.k_norm.weight", (kv if whole else D,)
        yield p + "post_attention_layernorm.weight", (H,)
        yield p + "mlp.gate.weight", (E, H)
        for e in range(E):
            yield p + f"mlp.experts.{e}.gate_proj.weight", (I, H)
            yield p + f"mlp.experts.{e}.up_proj.weight", (I, H)
            yield p + f"mlp.experts.{e}.down_proj.weight", (H, I)
    yield "model.norm.weight", (H,)
    if not c.get("tie_word_embeddings"):
        yield "lm_head.weight", (V, H)


def llama_with_experts(c: dict, experts) -> Iterator[tuple[str, tuple[int, ...]]]:
    """Llama's tensors with each layer's MLP replaced by `experts(layer prefix)`'s tensors, right
    after its post_attention_layernorm (Granite MoE's and Mixtral's layout)."""
    for name, shape in llama_tensors(c):
        if ".mlp." in name:
            continue
        yield name, shape
        if name.endswith("post_attention_layernorm.weight"):
            yield from experts(name.removesuffix("post_attention_layernorm.weight"))


def granitemoe_tensors(c: dict) -> Iterator[tuple[str, tuple[int, ...]]]:
    """Granite MoE: Llama's names but the MLP a router and stacked experts, input_linear [E, 2I, H]
    (gate rows, then up rows) and output_linear [E, H, I], under block_sparse_moe."""
    H, I, E = c["hidden_size"], c["intermediate_size"], c["num_local_experts"]

    def experts(p: str) -> Iterator[tuple[str, tuple[int, ...]]]:
        yield p + "block_sparse_moe.router.layer.weight", (E, H)
        yield p + "block_sparse_moe.input_linear.weight", (E, 2 * I, H)
        yield p + "block_sparse_moe.output_linear.weight", (E, H, I)

    yield from llama_with_experts(c, experts)

def mixtral_tensors(c: dict) -> Iterator[tuple[str, tuple[int, ...]]]:
    """Mixtral: Llama's attention and norms; the MLP a router block_sparse_moe.gate and per-expert
    w1 (gate), w3 (up), w2 (down) Linears under block_sparse_moe.experts.{e}."""
    H, I, E = c["hidden_size"], c["intermediate_size"], c["num_local_experts"]

    def experts(p: str) -> Iterator[tuple[str, tuple[int, ...]]]:
        yield p + "block_sparse_moe.gate.weight", (E, H)
        for e in range(E):
            yield p + f"block_sparse_moe.experts.{e}.w1.weight", (I, H)
            yield p + f"block_sparse_moe.experts.{e}.w3.weight", (I, H)
            yield p + f"block_sparse_moe.experts.{e}.w2.weight", (H, I)

    yield from llama_with_experts(c, experts)


def phimoe_tensors(c: dict) -> Iterator[tuple[str, tuple[int, ...]]]:
    """Phi-3.5-MoE: LayerNorms with biases, Llama's attention (biased), Mixtral's experts (w1, w3, w2 under
    block_sparse_moe.experts.{e}, the router block_sparse_moe.gate), an lm_head bias."""
    H, I, E, V = c["hidden_size"], c["intermediate_size"], c["num_local_experts"], c["vocab_size"]
    for name, shape in llama_tensors(c):
        if ".mlp." in name:
            continue
        yield name, shape
        if name.endswith("norm.weight"):
            yield name.replace(".weight", ".bias"), shape
        if name.endswith("post_attention_layernorm.weight"):
            p = name.removesuffix("post_attention_layernorm.weight") + "block_sparse_moe."
            yield p + "gate.weight", (E, H)
            for e in range(E):
                yield p + f"experts.{e}.w1.weight", (I, H)
                yield p + f"experts.{e}.w3.weight", (I, H)
                yield p + f"experts.{e}.w2.weight", (H, I)
    yield "lm_head.bias", (V,)


def ernie4_5_moe_tensors(c: dict) -> Iterator[tuple[str, tuple[int, ...]]]:
    """ERNIE 4.5 MoE: Llama's names; from moe_layer_start_index on, the MLP is a router mlp.gate with
    mlp.moe_statics.e_score_correction_bias, experts mlp.experts.{e}.*_proj and mlp.shared_experts."""
    H, E, I = c["hidden_size"], c["moe_num_experts"], c["moe_intermediate_size"]
    S = I * c["moe_num_shared_experts"]
    for name, shape in llama_tensors(c):
        layer = int(name.split(".")[2]) if ".mlp." in name else -1
        if layer < c["moe_layer_start_index"] or (layer + 1) % c["moe_layer_interval"]:
            yield name, shape
        elif name.endswith("mlp.gate_proj.weight"):
            p = name.removesuffix("gate_proj.weight")
            yield p + "gate.weight", (E, H)
            yield p + "moe_statics.e_score_correction_bias", (1, E)
            for e in range(E):
                yield p + f"experts.{e}.gate_proj.weight", (I, H)
                yield p + f"experts.{e}.up_proj.weight", (I, H)
                yield p + f"experts.{e}.down_proj.weight", (H, I)
            for proj, shape_ in (("gate_proj", (S, H)), ("up_proj", (S, H)), ("down_proj", (H, S))):
                yield p + f"shared_experts.{proj}.weight", shape_


def glm4_moe_tensors(c: dict) -> Iterator[tuple[str, tuple[int, ...]]]:
    """GLM-4.5: Llama's names with q/k/v biases and optional per-head q/k norms; below
    first_k_dense_replace a dense MLP, then a router mlp.gate (with e_score_correction_bias), experts
    mlp.experts.{e}.*_proj and mlp.shared_experts; after the last layer the multi-token-prediction
    layers (a whole layer plus eh_proj, enorm, hnorm, shared_head.norm)."""
    H, I, V, E = c["hidden_size"], c["intermediate_size"], c["vocab_size"], c["n_routed_experts"]
    M, n = c["moe_intermediate_size"], c["num_hidden_layers"]
    S = M * c["n_shared_experts"]
    D = c.get("head_dim") or H // c["num_attention_heads"]
    q, kv = c["num_attention_heads"] * D, c["num_key_value_heads"] * D
    mlp = (("gate_proj", (I, H)), ("up_proj", (I, H)), ("down_proj", (H, I)))
    shared = (("gate_proj", (S, H)), ("up_proj", (S, H)), ("down_proj", (H, S)))
    experts = (("gate_proj", (M, H)), ("up_proj", (M, H)), ("down_proj", (H, M)))
    yield "model.embed_tokens.weight", (V, H)
    for i in range(n + c.get("num_nextn_predict_layers", 1)):
        p = f"model.layers.{i}."
        yield p + "input_layernorm.weight", (H,)
        yield p + "post_attention_layernorm.weight", (H,)
        for proj, rows in (("q_proj", q), ("k_proj", kv), ("v_proj", kv)):
            yield p + f"self_attn.{proj}.weight", (rows, H)
            if c.get("attention_bias"):
                yield p + f"self_attn.{proj}.bias", (rows,)
        yield p + "self_attn.o_proj.weight", (H, q)
        if c.get("use_qk_norm"):
            yield p + "self_attn.q_norm.weight", (D,)
            yield p + "self_attn.k_norm.weight", (D,)
        if i < c["first_k_dense_replace"]:
            yield from ((p + f"mlp.{proj}.weight", shape) for proj, shape in mlp)
            continue
        yield p + "mlp.gate.weight", (E, H)
        yield p + "mlp.gate.e_score_correction_bias", (E,)
        for e in range(E):
            yield from ((p + f"mlp.experts.{e}.{proj}.weight", shape) for proj, shape in experts)
        yield from ((p + f"mlp.shared_experts.{proj}.weight", shape) for proj, shape in shared)
        if i >= n:  # a multi-token-prediction layer's own tensors
            yield p + "eh_proj.weight", (H, 2 * H)
            yield from ((p + f"{norm}.weight", (H,)) for norm in ("enorm", "hnorm", "shared_head.norm"))
    yield "model.norm.weight", (H,)
    if not c.get("tie_word_embeddings"):
        yield "lm_head.weight", (V, H)


def dots1_tensors(c: dict) -> Iterator[tuple[str, tuple[int, ...]]]:
    """dots.llm1: GLM-4.5's layout with per-head q/k norms always, o_proj biased with q/k/v (by
    attention_bias), and no multi-token-prediction layers."""
    for name, shape in glm4_moe_tensors({**c, "use_qk_norm": True, "num_nextn_predict_layers": 0}):
        yield name, shape
        if c.get("attention_bias") and name.endswith("self_attn.o_proj.weight"):
            yield name.removesuffix("weight") + "bias", (c["hidden_size"],)


def lfm2_tensors(c: dict) -> Iterator[tuple[str, tuple[int, ...]]]:
    """LFM2: per layer operator_norm and ffn_norm, then self_attn (q/k/v, out_proj, q/k_layernorm) or
    conv (in_proj to 3 × hidden, a depthwise conv.weight of conv_L_cache taps, out_proj), and the
    SwiGLU feed_forward w1/w3/w2 of the adjusted width; the final norm is model.embedding_norm."""
    H, V, n = c["hidden_size"], c["vocab_size"], c["num_hidden_layers"]
    D = H // c["num_attention_heads"]
    kv = c["num_key_value_heads"] * D
    I = int(2 * c["intermediate_size"] / 3)  # block_auto_adjust_ff_dim, multiplier 1.0
    I = c["block_multiple_of"] * -(-I // c["block_multiple_of"])
    yield "model.embed_tokens.weight", (V, H)
    for i in range(n):
        p = f"model.layers.{i}."
        yield p + "operator_norm.weight", (H,)
        yield p + "ffn_norm.weight", (H,)
        if c["layer_types"][i] == "conv":
            yield p + "conv.in_proj.weight", (3 * H, H)
            yield p + "conv.conv.weight", (H, 1, c["conv_L_cache"])
            yield p + "conv.out_proj.weight", (H, H)
        else:
            yield from ((p + f"self_attn.{proj}.weight", (rows, H)) for proj, rows in
                        (("q_proj", H), ("k_proj", kv), ("v_proj", kv)))
            yield p + "self_attn.out_proj.weight", (H, H)
            yield p + "self_attn.q_layernorm.weight", (D,)
            yield p + "self_attn.k_layernorm.weight", (D,)
        yield from ((p + f"feed_forward.{w}.weight", shape) for w, shape in
                    (("w1", (I, H)), ("w3", (I, H)), ("w2", (H, I))))
    yield "model.embedding_norm.weight", (H,)


def lfm2_moe_tensors(c: dict) -> Iterator[tuple[str, tuple[int, ...]]]:
    """LFM2-MoE: LFM2's tensors, each layer's feed_forward replaced: w1/w3/w2 at intermediate_size in
    the first num_dense_layers layers, then the router feed_forward.gate, expert_bias and
    experts.{e}.w1/w3/w2 as the hub saves them."""
    H, E, I, dense = c["hidden_size"], c["num_experts"], c["moe_intermediate_size"], c["num_dense_layers"]
    for name, shape in lfm2_tensors({"block_multiple_of": 256, **c}):  # its MLP width is dropped below
        if ".feed_forward." not in name:
            yield name, shape
        elif name.endswith("feed_forward.w1.weight"):  # the layer's feed-forward, in LFM2's place
            p = name.removesuffix("w1.weight")
            if int(name.split(".")[2]) < dense:
                D = c["intermediate_size"]
                yield from ((p + f"{w}.weight", s) for w, s in (("w1", (D, H)), ("w3", (D, H)), ("w2", (H, D))))
                continue
            yield p + "gate.weight", (E, H)
            yield p + "expert_bias", (E,)
            for e in range(E):
                yield from ((p + f"experts.{e}.{w}.weight", s) for w, s in (("w1", (I, H)), ("w3", (I, H)),
                                                                             ("w2", (H, I))))


def qwen3_5_tensors(c: dict) -> Iterator[tuple[str, tuple[int, ...]]]:
    """Qwen3.5's text decoder: per layer input/post_attention_layernorm and the SwiGLU mlp, then
    linear_attn (in_proj_qkv/z/b/a, conv1d.weight, A_log, dt_bias, the gated norm, out_proj) or
    self_attn (q_proj twice the query width: query and gate, k/v/o_proj, q/k_norm)."""
    H, V, n, I = c["hidden_size"], c["vocab_size"], c["num_hidden_layers"], c["intermediate_size"]
    D, q, kv = c["head_dim"], c["num_attention_heads"] * c["head_dim"], c["num_key_value_heads"] * c["head_dim"]
    Hv = c["linear_num_value_heads"]
    keys, values = c["linear_num_key_heads"] * c["linear_key_head_dim"], Hv * c["linear_value_head_dim"]
    yield "model.embed_tokens.weight", (V, H)
    for i in range(n):
        p = f"model.layers.{i}."
        yield p + "input_layernorm.weight", (H,)
        yield p + "post_attention_layernorm.weight", (H,)
        if c["layer_types"][i] == "linear_attention":
            a = p + "linear_attn."
            yield from ((a + name, shape) for name, shape in (
                ("in_proj_qkv.weight", (2 * keys + values, H)), ("in_proj_z.weight", (values, H)),
                ("in_proj_b.weight", (Hv, H)), ("in_proj_a.weight", (Hv, H)),
                ("conv1d.weight", (2 * keys + values, 1, c["linear_conv_kernel_dim"])), ("A_log", (Hv,)),
                ("dt_bias", (Hv,)), ("norm.weight", (c["linear_value_head_dim"],)), ("out_proj.weight", (H, values))))
        else:
            a = p + "self_attn."
            yield from ((a + name, shape) for name, shape in (
                ("q_proj.weight", (2 * q, H)), ("k_proj.weight", (kv, H)), ("v_proj.weight", (kv, H)),
                ("o_proj.weight", (H, q)), ("q_norm.weight", (D,)), ("k_norm.weight", (D,))))
        yield from ((p + f"mlp.{w}.weight", shape) for w, shape in
                    (("gate_proj", (I, H)), ("up_proj", (I, H)), ("down_proj", (H, I))))
    yield "model.norm.weight", (H,)
    if c.get("mtp_num_hidden_layers"):  # the hub's multi-token-prediction head: one full-attention layer
        yield from (("mtp." + name, shape) for name, shape in (
            ("fc.weight", (H, 2 * H)), ("pre_fc_norm_embedding.weight", (H,)), ("pre_fc_norm_hidden.weight", (H,)),
            ("norm.weight", (H,))))
        attention = {**c, "num_hidden_layers": 1, "layer_types": ["full_attention"], "mtp_num_hidden_layers": 0}
        yield from ((name.replace("model.layers.0.", "mtp.layers.0."), shape) for name, shape in qwen3_5_tensors(
            attention) if name.startswith("model.layers.0."))


def _swiglu(prefix: str, width: int, hidden: int) -> Iterator[tuple[str, tuple[int, ...]]]:
    """A SwiGLU MLP's gate_proj, up_proj and down_proj under `prefix`, `width` wide."""
    yield from ((prefix + f"{w}.weight", shape) for w, shape in
                (("gate_proj", (width, hidden)), ("up_proj", (width, hidden)), ("down_proj", (hidden, width))))


def _attention(prefix: str, heads: int, kv: int, head_dim: int, hidden: int) -> Iterator[tuple[str, tuple[int, ...]]]:
    """An attention's q/k/v/o_proj under `prefix` (no biases)."""
    q, k = heads * head_dim, kv * head_dim
    yield from ((prefix + f"{w}.weight", shape) for w, shape in
                (("q_proj", (q, hidden)), ("k_proj", (k, hidden)), ("v_proj", (k, hidden)), ("o_proj", (hidden, q))))


def _mamba2_tensors(p: str, H: int, heads: int, head_dim: int, groups: int, state: int, kernel: int,
                    conv_bias: bool, proj_bias: bool) -> Iterator[tuple[str, tuple[int, ...]]]:
    """A Mamba-2 mixer's tensors under `p`: in_proj (z, xBC, dt), conv1d, dt_bias, A_log, D, the gated norm, out_proj."""
    inner = heads * head_dim
    conv = inner + 2 * groups * state
    yield p + "in_proj.weight", (inner + conv + heads, H)
    if proj_bias:
        yield p + "in_proj.bias", (inner + conv + heads,)
    yield p + "conv1d.weight", (conv, 1, kernel)
    if conv_bias:
        yield p + "conv1d.bias", (conv,)
    yield from ((p + name, (heads,)) for name in ("dt_bias", "A_log", "D"))
    yield p + "norm.weight", (inner,)
    yield p + "out_proj.weight", (H, inner)
    if proj_bias:
        yield p + "out_proj.bias", (H,)


def granitemoehybrid_tensors(c: dict) -> Iterator[tuple[str, tuple[int, ...]]]:
    """Granite 4.0: per layer input/post_attention_layernorm, mamba.* or self_attn.*, the shared MLP
    (input_linear [2S, H], output_linear) and, with experts, block_sparse_moe (router, stacked experts)."""
    H, V, n = c["hidden_size"], c["vocab_size"], c["num_hidden_layers"]
    heads, kv, D = c["num_attention_heads"], c["num_key_value_heads"], H // c["num_attention_heads"]
    S, E, I = c["shared_intermediate_size"], c.get("num_local_experts", 0), c["intermediate_size"]
    inner = c["mamba_expand"] * H
    yield "model.embed_tokens.weight", (V, H)
    for i in range(n):
        p = f"model.layers.{i}."
        yield p + "input_layernorm.weight", (H,)
        yield p + "post_attention_layernorm.weight", (H,)
        if c["layer_types"][i] == "mamba":
            yield from _mamba2_tensors(p + "mamba.", H, c["mamba_n_heads"], inner // c["mamba_n_heads"],
                                       c["mamba_n_groups"], c["mamba_d_state"], c["mamba_d_conv"],
                                       c["mamba_conv_bias"], c["mamba_proj_bias"])
        else:
            yield from _attention(p + "self_attn.", heads, kv, D, H)
        yield p + "shared_mlp.input_linear.weight", (2 * S, H)
        yield p + "shared_mlp.output_linear.weight", (H, S)
        if E:
            yield p + "block_sparse_moe.router.layer.weight", (E, H)
            yield p + "block_sparse_moe.input_linear.weight", (E, 2 * I, H)
            yield p + "block_sparse_moe.output_linear.weight", (E, H, I)
    yield "model.norm.weight", (H,)
    if not c.get("tie_word_embeddings"):
        yield "lm_head.weight", (V, H)


def nemotron_h_tensors(c: dict) -> Iterator[tuple[str, tuple[int, ...]]]:
    """Nemotron-H, under the hub's backbone.* names: per layer its norm and one mixer (Mamba-2,
    attention, the relu² MLP's up_proj/down_proj, or relu² experts) by hybrid_override_pattern."""
    H, V, I = c["hidden_size"], c["vocab_size"], c["intermediate_size"]
    # The hub's older configs (Nemotron-H-8B/47B/56B) name the attention's head width attention_head_dim
    # (their remote configuration_nemotron_h.py's key); the checkpoint's projections are that wide.
    heads, kv = c["num_attention_heads"], c["num_key_value_heads"]
    D = c.get("head_dim") or c.get("attention_head_dim") or H // heads
    yield "backbone.embeddings.weight", (V, H)
    for i, kind in enumerate(c["hybrid_override_pattern"]):
        p = f"backbone.layers.{i}."
        yield p + "norm.weight", (H,)
        if kind == "M":
            yield from _mamba2_tensors(p + "mixer.", H, c["mamba_num_heads"], c["mamba_head_dim"], c["n_groups"],
                                       c["ssm_state_size"], c["conv_kernel"], c["use_conv_bias"], c["use_bias"])
        elif kind == "*":
            yield from _attention(p + "mixer.", heads, kv, D, H)
        elif kind == "E":  # the router and its bias, per-expert relu² MLPs, the shared MLP
            E, M, S = c["n_routed_experts"], c["moe_intermediate_size"], c["moe_shared_expert_intermediate_size"]
            yield p + "mixer.gate.weight", (E, H)
            yield p + "mixer.gate.e_score_correction_bias", (E,)
            for e in range(E):
                yield p + f"mixer.experts.{e}.up_proj.weight", (M, H)
                yield p + f"mixer.experts.{e}.down_proj.weight", (H, M)
            yield p + "mixer.shared_experts.up_proj.weight", (S, H)
            yield p + "mixer.shared_experts.down_proj.weight", (H, S)
        else:
            yield from ((p + f"mixer.{w}.weight", shape) for w, shape in (("up_proj", (I, H)), ("down_proj", (H, I))))
    yield "backbone.norm_f.weight", (H,)
    yield "lm_head.weight", (V, H)


def qwen3_5_moe_tensors(c: dict) -> Iterator[tuple[str, tuple[int, ...]]]:
    """Qwen3.5-MoE's text decoder: Qwen3.5's layers, each MLP the sparse block (router mlp.gate,
    per-expert gate/up/down_proj under mlp.experts.{e}, shared_expert and its [1, H] gate); lm_head
    untied."""
    H, E, I, S = c["hidden_size"], c["num_experts"], c["moe_intermediate_size"], c["shared_expert_intermediate_size"]
    for name, shape in qwen3_5_tensors({**c, "intermediate_size": c.get("intermediate_size") or 0}):  # no dense MLP
        if ".mlp." not in name:
            yield name, shape
        elif name.endswith("mlp.gate_proj.weight"):  # the layer's sparse block, in the dense MLP's place
            p = name[: -len("gate_proj.weight")]
            yield p + "gate.weight", (E, H)
            for e in range(E):
                yield from _swiglu(p + f"experts.{e}.", I, H)
            yield from _swiglu(p + "shared_expert.", S, H)
            yield p + "shared_expert_gate.weight", (1, H)
    if not c.get("tie_word_embeddings"):
        yield "lm_head.weight", (c["vocab_size"], H)


def qwen3_next_tensors(c: dict) -> Iterator[tuple[str, tuple[int, ...]]]:
    """Qwen3-Next: Qwen3.5's layers with the DeltaNet's fused in_proj_qkvz / in_proj_ba and a sparse
    block (router mlp.gate, per-expert gate/up/down_proj, shared_expert and its gate) in every layer."""
    H, n, E, I, S = (c["hidden_size"], c["num_hidden_layers"], c["num_experts"], c["moe_intermediate_size"],
                     c["shared_expert_intermediate_size"])
    Hk, Hv, Dk, Dv = (c["linear_num_key_heads"], c["linear_num_value_heads"], c["linear_key_head_dim"],
                      c["linear_value_head_dim"])
    fused = {"in_proj_qkv.weight": ("in_proj_qkvz.weight", (2 * Hk * Dk + 2 * Hv * Dv, H)),
             "in_proj_b.weight": ("in_proj_ba.weight", (2 * Hv, H))}
    dense = dict(c, layer_types=["full_attention" if (i + 1) % c["full_attention_interval"] == 0
                                 else "linear_attention" for i in range(n)])
    for name, shape in qwen3_5_tensors(dense):
        leaf = name.rsplit("linear_attn.", 1)[-1]
        if "linear_attn." in name and leaf in fused:
            yield name.replace(leaf, fused[leaf][0]), fused[leaf][1]
        elif name.endswith(("in_proj_z.weight", "in_proj_a.weight")):
            continue  # inside the fused projections
        elif ".mlp." in name:
            if name.endswith("mlp.gate_proj.weight"):  # the layer's sparse block, in the dense MLP's place
                p = name[: -len("gate_proj.weight")]
                yield p + "gate.weight", (E, H)
                for e in range(E):
                    yield from _swiglu(p + f"experts.{e}.", I, H)
                yield from _swiglu(p + "shared_expert.", S, H)
                yield p + "shared_expert_gate.weight", (1, H)
        else:
            yield name, shape
    yield "lm_head.weight", (c["vocab_size"], H)


def falcon_h1_tensors(c: dict) -> Iterator[tuple[str, tuple[int, ...]]]:
    """Falcon-H1: per layer input_layernorm, mamba.* beside self_attn.*, pre_ff_layernorm and the SwiGLU feed_forward."""
    H, V, n, I = c["hidden_size"], c["vocab_size"], c["num_hidden_layers"], c["intermediate_size"]
    heads, kv, D = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    inner = c["mamba_d_ssm"] or c["mamba_expand"] * H
    yield "model.embed_tokens.weight", (V, H)
    for i in range(n):
        p = f"model.layers.{i}."
        yield p + "input_layernorm.weight", (H,)
        yield p + "pre_ff_layernorm.weight", (H,)
        mamba = _mamba2_tensors(p + "mamba.", H, c["mamba_n_heads"], inner // c["mamba_n_heads"], c["mamba_n_groups"],
                                c["mamba_d_state"], c["mamba_d_conv"], c["mamba_conv_bias"], c["mamba_proj_bias"])
        yield from ((name, shape) for name, shape in mamba if c["mamba_rms_norm"] or not name.endswith("norm.weight"))
        yield from _attention(p + "self_attn.", heads, kv, D, H)
        yield from _swiglu(p + "feed_forward.", I, H)
    yield "model.final_layernorm.weight", (H,)
    if not c.get("tie_word_embeddings"):
        yield "lm_head.weight", (V, H)


def deepseek_v3_tensors(c: dict) -> Iterator[tuple[str, tuple[int, ...]]]:
    """DeepSeek-V3: per layer its norms, MLA's projections and norms, and a dense SwiGLU (the first
    first_k_dense_replace layers) or the router, per-expert SwiGLUs and the shared experts."""
    H, V, n, I, M = (c["hidden_size"], c["vocab_size"], c["num_hidden_layers"], c["intermediate_size"],
                     c["moe_intermediate_size"])
    heads, rank, rope, nope, v = (c["num_attention_heads"], c["kv_lora_rank"], c["qk_rope_head_dim"],
                                  c["qk_nope_head_dim"], c["v_head_dim"])
    qk, q_rank, E = nope + rope, c["q_lora_rank"], c["n_routed_experts"]
    yield "model.embed_tokens.weight", (V, H)
    for i in range(n):
        p = f"model.layers.{i}."
        yield p + "input_layernorm.weight", (H,)
        yield p + "post_attention_layernorm.weight", (H,)
        a = p + "self_attn."
        if q_rank is None:
            yield a + "q_proj.weight", (heads * qk, H)
        else:
            yield from ((a + "q_a_proj.weight", (q_rank, H)), (a + "q_a_layernorm.weight", (q_rank,)),
                        (a + "q_b_proj.weight", (heads * qk, q_rank)))
        yield from ((a + "kv_a_proj_with_mqa.weight", (rank + rope, H)), (a + "kv_a_layernorm.weight", (rank,)),
                    (a + "kv_b_proj.weight", (heads * (nope + v), rank)), (a + "o_proj.weight", (H, heads * v)))
        if i < c["first_k_dense_replace"]:
            yield from _swiglu(p + "mlp.", I, H)
            continue
        yield p + "mlp.gate.weight", (E, H)
        yield p + "mlp.gate.e_score_correction_bias", (E,)
        for e in range(E):
            yield from _swiglu(p + f"mlp.experts.{e}.", M, H)
        yield from _swiglu(p + "mlp.shared_experts.", M * c["n_shared_experts"], H)
    yield "model.norm.weight", (H,)
    yield "lm_head.weight", (V, H)


def llama4_tensors(c: dict) -> Iterator[tuple[str, tuple[int, ...]]]:
    """Llama 4's text decoder: per layer its norms, q/k/v/o_proj, and a feed_forward: the router,
    the transposed stacked experts (gate_up_proj [E, H, 2I], down_proj [E, I, H]) and the shared
    expert on the MoE layers, a SwiGLU of intermediate_size_mlp on the others."""
    H, V, n, I = c["hidden_size"], c["vocab_size"], c["num_hidden_layers"], c["intermediate_size"]
    heads, kv, D, E = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"], c["num_local_experts"]
    step = c.get("interleave_moe_layer_step", 1)
    yield "model.embed_tokens.weight", (V, H)
    for i in range(n):
        p = f"model.layers.{i}."
        yield p + "input_layernorm.weight", (H,)
        yield p + "post_attention_layernorm.weight", (H,)
        yield from _attention(p + "self_attn.", heads, kv, D, H)
        f = p + "feed_forward."
        if i % step == step - 1:
            yield f + "router.weight", (E, H)
            yield f + "experts.gate_up_proj", (E, H, 2 * I)
            yield f + "experts.down_proj", (E, I, H)
            yield from _swiglu(f + "shared_expert.", I, H)
        else:
            yield from _swiglu(f, c["intermediate_size_mlp"], H)
    yield "model.norm.weight", (H,)
    yield "lm_head.weight", (V, H)


def gemma4_tensors(c: dict) -> Iterator[tuple[str, tuple[int, ...]]]:
    """Gemma 4's text decoder: Gemma 3's sandwich-normed layers with a layer_scalar; full layers
    of global_head_dim (with attention_k_eq_v, num_global_key_value_heads and no v_proj); the last
    num_kv_shared_layers without k/v projections and, with use_double_wide_mlp, MLPs twice as wide;
    with hidden_size_per_layer_input, the per-layer table, its projections and each layer's gate;
    with enable_moe_block, each layer's router (proj, scale, per_expert_scale), stacked experts
    (gate_up_proj [E, 2M, H], down_proj [E, H, M]) and post_feedforward_layernorm_1/2, pre_feedforward_layernorm_2."""
    H, V, n, I = c["hidden_size"], c["vocab_size"], c["num_hidden_layers"], c["intermediate_size"]
    heads, P = c["num_attention_heads"], c.get("hidden_size_per_layer_input") or 0
    shared_from = n - c.get("num_kv_shared_layers", 0)
    yield "model.embed_tokens.weight", (V, H)
    if P:
        yield "model.embed_tokens_per_layer.weight", (c["vocab_size_per_layer_input"], n * P)
        yield "model.per_layer_model_projection.weight", (n * P, H)
        yield "model.per_layer_projection_norm.weight", (P,)
    for i in range(n):
        p = f"model.layers.{i}."
        full = c["layer_types"][i] == "full_attention"
        D = c["global_head_dim"] if full else c["head_dim"]
        kv = (c.get("num_global_key_value_heads") or c["num_key_value_heads"]) if full and c.get("attention_k_eq_v") \
            else c["num_key_value_heads"]
        for name in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                     "post_feedforward_layernorm"):
            yield p + f"{name}.weight", (H,)
        yield p + "layer_scalar", (1,)
        yield p + "self_attn.q_proj.weight", (heads * D, H)
        yield p + "self_attn.q_norm.weight", (D,)
        yield p + "self_attn.o_proj.weight", (H, heads * D)
        if i < shared_from:
            yield p + "self_attn.k_proj.weight", (kv * D, H)
            yield p + "self_attn.k_norm.weight", (D,)
            if not (full and c.get("attention_k_eq_v")):
                yield p + "self_attn.v_proj.weight", (kv * D, H)
        width = 2 * I if i >= shared_from and c.get("use_double_wide_mlp") else I
        yield from _swiglu(p + "mlp.", width, H)
        if c.get("enable_moe_block"):  # the router, the stacked GeGLU experts and their three norms
            E, M = c["num_experts"], c["moe_intermediate_size"]
            yield from ((p + name, shape) for name, shape in (
                ("router.proj.weight", (E, H)), ("router.scale", (H,)), ("router.per_expert_scale", (E,)),
                ("experts.gate_up_proj", (E, 2 * M, H)), ("experts.down_proj", (E, H, M)),
                ("post_feedforward_layernorm_1.weight", (H,)), ("pre_feedforward_layernorm_2.weight", (H,)),
                ("post_feedforward_layernorm_2.weight", (H,))))
        if P:
            yield p + "per_layer_input_gate.weight", (P, H)
            yield p + "per_layer_projection.weight", (H, P)
            yield p + "post_per_layer_input_norm.weight", (H,)
    yield "model.norm.weight", (H,)


def whisper_tensors(c: dict) -> Iterator[tuple[str, tuple[int, ...]]]:
    """The hub layout of openai/whisper-*: model.encoder.* (two convolutions, the positional
    table, the layers), model.decoder.* (token and position tables, layers with encoder_attn)."""
    d, V = c["d_model"], c["vocab_size"]

    def attention(p: str) -> Iterator[tuple[str, tuple[int, ...]]]:
        for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
            yield f"{p}{proj}.weight", (d, d)
            if proj != "k_proj":
                yield f"{p}{proj}.bias", (d,)

    def norm(p: str) -> Iterator[tuple[str, tuple[int, ...]]]:
        yield f"{p}.weight", (d,)
        yield f"{p}.bias", (d,)

    def mlp(p: str, ffn: int) -> Iterator[tuple[str, tuple[int, ...]]]:
        yield p + "fc1.weight", (ffn, d)
        yield p + "fc1.bias", (ffn,)
        yield p + "fc2.weight", (d, ffn)
        yield p + "fc2.bias", (d,)

    e = "model.encoder."
    yield e + "conv1.weight", (d, c["num_mel_bins"], 3)
    yield e + "conv1.bias", (d,)
    yield e + "conv2.weight", (d, d, 3)
    yield e + "conv2.bias", (d,)
    yield e + "embed_positions.weight", (c["max_source_positions"], d)
    for i in range(c["encoder_layers"]):
        p = f"{e}layers.{i}."
        yield from attention(p + "self_attn.")
        yield from norm(p + "self_attn_layer_norm")
        yield from mlp(p, c["encoder_ffn_dim"])
        yield from norm(p + "final_layer_norm")
    yield from norm(e + "layer_norm")
    t = "model.decoder."
    yield t + "embed_tokens.weight", (V, d)
    yield t + "embed_positions.weight", (c["max_target_positions"], d)
    for i in range(c["decoder_layers"]):
        p = f"{t}layers.{i}."
        yield from attention(p + "self_attn.")
        yield from norm(p + "self_attn_layer_norm")
        yield from attention(p + "encoder_attn.")
        yield from norm(p + "encoder_attn_layer_norm")
        yield from mlp(p, c["decoder_ffn_dim"])
        yield from norm(p + "final_layer_norm")
    yield from norm(t + "layer_norm")


TENSORS = {
    "llama": llama_tensors, "mistral": llama_tensors, "qwen2": llama_tensors, "qwen3": llama_tensors,
    "granite": llama_tensors, "smollm3": llama_tensors, "seed_oss": llama_tensors, "ernie4_5": llama_tensors,
    "ministral": llama_tensors, "ministral3": llama_tensors,
    "gemma3_text": gemma3_text_tensors, "gemma3": gemma3_multimodal_tensors, "phi3": phi3_tensors,
    "qwen2_5_vl": qwen2_5_vl_tensors, "qwen3_vl": qwen3_vl_tensors, "qwen3_vl_moe": qwen3_vl_tensors,
    "cohere": cohere_tensors, "cohere2": cohere_tensors, "glm": glm_tensors, "glm4": glm_tensors,
    "phi": gptstyle_tensors, "stablelm": gptstyle_tensors, "starcoder2": gptstyle_tensors, "nemotron": gptstyle_tensors,
    "olmo": olmo_tensors, "olmo2": olmo_tensors, "olmo3": olmo_tensors, "exaone4": olmo_tensors,
    "hunyuan_v1_dense": hunyuan_dense_tensors, "hunyuan_v1_moe": hunyuan_moe_tensors, "gpt_oss": gpt_oss_tensors,
    "olmoe": moe_tensors, "qwen3_moe": moe_tensors, "granitemoe": granitemoe_tensors,
    "phimoe": phimoe_tensors, "ernie4_5_moe": ernie4_5_moe_tensors, "glm4_moe": glm4_moe_tensors,
    "dots1": dots1_tensors,
    "apertus": apertus_tensors, "lfm2": lfm2_tensors, "lfm2_moe": lfm2_moe_tensors,
    "qwen3_5_text": qwen3_5_tensors, "granitemoehybrid": granitemoehybrid_tensors, "nemotron_h": nemotron_h_tensors,
    "qwen3_next": qwen3_next_tensors, "falcon_h1": falcon_h1_tensors, "deepseek_v3": deepseek_v3_tensors,
    "llama4_text": llama4_tensors, "gemma4_text": gemma4_tensors, "whisper": whisper_tensors,
    "mixtral": mixtral_tensors, "qwen3_5_moe_text": qwen3_5_moe_tensors,
}


def _values(name: str, count: int, rng: np.random.Generator) -> Iterator[np.ndarray]:
    """Random bf16 values for a tensor, a chunk at a time."""
    is_norm = "norm" in name and name.endswith("weight")
    for start in range(0, count, CHUNK_ELEMENTS):
        n = min(CHUNK_ELEMENTS, count - start)
        x = rng.standard_normal(n, dtype=np.float32)
        x = 1.0 + 0.1 * x if is_norm else 0.02 * x
        yield x.astype(ml_dtypes.bfloat16)


def write_safetensors(path: Path, tensors: list[tuple[str, tuple[int, ...]]], rng: np.random.Generator) -> None:
    header, offset = {}, 0
    for name, shape in tensors:
        nbytes = int(np.prod(shape)) * 2
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    header["__metadata__"] = {"format": "pt"}
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # keep the data 8-byte aligned, as safetensors writers do
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for name, shape in tensors:
            for chunk in _values(name, int(np.prod(shape)), rng):
                chunk.tofile(f)


def write_checkpoint(folder: Path, config: dict, seed: int = 0, shard_bytes: int = SHARD_BYTES) -> int:
    """Writes config.json and the shards; returns the bytes of weights written."""
    folder.mkdir(parents=True, exist_ok=True)
    tensors = list(TENSORS[config["model_type"]](config))
    shards: list[list[tuple[str, tuple[int, ...]]]] = [[]]
    size = 0
    for name, shape in tensors:
        nbytes = int(np.prod(shape)) * 2
        if shards[-1] and size + nbytes > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append((name, shape))
        size += nbytes
    rng = np.random.default_rng(seed)
    weight_map = {}
    for i, shard in enumerate(shards):
        fname = "model.safetensors" if len(shards) == 1 else f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        write_safetensors(folder / fname, shard, rng)
        weight_map.update({name: fname for name, _ in shard})
    total = sum(int(np.prod(s)) * 2 for _, s in tensors)
    if len(shards) > 1:
        (folder / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return total


SHRINK = {"vocab_size": 512, "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 3,
          "max_position_embeddings": 256, "original_max_position_embeddings": 64,
          "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 128, "max_window_layers": 3,
          "moe_num_experts": 4, "moe_k": 2, "n_routed_experts": 4, "num_local_experts": 4,
          "moe_shared_expert_intermediate_size": 128,
          "mamba_n_heads": 8, "mamba_d_state": 16, "mamba_num_heads": 8, "mamba_head_dim": 16, "ssm_state_size": 16,
          "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 32,
          "linear_value_head_dim": 32, "shared_expert_intermediate_size": 128, "shared_intermediate_size": 128,
          "mamba_d_ssm": 512, "kv_lora_rank": 64, "q_lora_rank": 96, "qk_rope_head_dim": 16, "qk_nope_head_dim": 32,
          "v_head_dim": 32, "n_group": 2, "topk_group": 1, "first_k_dense_replace": 1,
          "intermediate_size_mlp": 256, "attention_chunk_size": 16, "floor_scale": 16, "global_head_dim": 128,
          "hidden_size_per_layer_input": 32, "vocab_size_per_layer_input": 512}


def shrunk(config: dict) -> dict:
    """The preset with small dimensions (what the tests build): 4 query heads of 64, KV heads in the preset's ratio."""
    c = copy.deepcopy(config)
    if c["model_type"] == "whisper":  # its own keys; the 1500 encoder positions genai's 3000 frames need stay
        c.update(vocab_size=512, d_model=128, encoder_layers=2, decoder_layers=2, num_hidden_layers=2,
                 encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=256, decoder_ffn_dim=256,
                 max_target_positions=64, bos_token_id=1, eos_token_id=1, pad_token_id=1, decoder_start_token_id=2)
        return c
    text = c.get("text_config", c)
    heads, kv = text["num_attention_heads"], text["num_key_value_heads"]
    text.update({k: v for k, v in SHRINK.items() if k in text})
    text.update(hidden_size=256, num_attention_heads=4, num_key_value_heads=max(1, 4 * kv // heads))
    if "head_dim" in text:
        text["head_dim"] = 64
    if text.get("sliding_window"):
        text["sliding_window"] = min(text["sliding_window"], 16)
    if "partial_rotary_factor" in text:  # rotate a multiple of 16 of the 64 dims, as the preset does of its head
        rotated = max(16, round(int(64 * text["partial_rotary_factor"]) / 16) * 16)  # phi-2's 0.4 -> 0.5
        text["partial_rotary_factor"] = rotated / 64
    for key in ("no_rope_layers", "layer_types", "hybrid_override_pattern"):  # per-layer lists follow the layer count
        if isinstance(text.get(key), (list, str)):
            text[key] = text[key][: text["num_hidden_layers"]]
    if text.get("model_type") == "gemma4_text":  # both kinds, a shared layer with one to share
        text["layer_types"] = ["sliding_attention", "full_attention", "full_attention"]  # the last is global
        text["num_kv_shared_layers"] = min(text.get("num_kv_shared_layers", 0), 1)
    if text.get("model_type") == "llama4_text":  # its router scales one expert's input: top 1 stays
        text["num_experts_per_tok"] = 1
    if text.get("model_type") == "hunyuan_v1_moe":  # the original code's per-layer lists, at the shrunk sizes
        n = text["num_hidden_layers"]
        text.update(moe_topk=[2] * n, moe_intermediate_size=[text["intermediate_size"]] * n, num_shared_expert=[1] * n)
    rope = text.get("rope_scaling") or {}
    if "short_factor" in rope:  # one factor per rotated pair of the 64-wide head
        pairs = int(64 * text.get("partial_rotary_factor", 1.0)) // 2
        rope["short_factor"], rope["long_factor"] = [1.0] * pairs, [2.0] * pairs
    if "mrope_section" in rope:  # the sections of the 64-wide head's 32 frequencies, in the preset's proportions
        rope["mrope_section"] = [12, 10, 10] if rope.get("mrope_interleaved") else [8, 12, 12]
    if c.get("model_type") in ("qwen3_vl", "qwen3_vl_moe"):  # three blocks, DeepStack from the first two, 2 heads of 16
        c["vision_config"].update(depth=3, hidden_size=32, intermediate_size=64, num_heads=2,
                                  deepstack_visual_indexes=[0, 1], out_hidden_size=text["hidden_size"])
        return c
    if c.get("model_type") == "qwen2_5_vl":  # two blocks, a window one and a global one, 4 heads of 8
        c["vision_config"].update(depth=2, hidden_size=32, intermediate_size=64, num_heads=4, fullatt_block_indexes=[1],
                                  out_hidden_size=text["hidden_size"])
        return c
    if "vision_config" in c:
        # 16x16 patches: the 256 image tokens onnxruntime-genai expects, unpooled.
        patch = c["vision_config"].get("patch_size", 14)
        c["vision_config"].update(hidden_size=32, intermediate_size=64, num_hidden_layers=1, image_size=16 * patch)
    return c


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", choices=sorted(PRESETS))
    ap.add_argument("output", nargs="?", type=Path)
    ap.add_argument("--list", action="store_true", help="list the presets and their sizes")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--shrink", action="store_true", help="small dimensions, the layout kept (the tests' size)")
    args = ap.parse_args(argv)
    if args.list or args.model is None:
        for name, cfg in sorted(PRESETS.items()):
            total = sum(int(np.prod(s)) * 2 for _, s in TENSORS[cfg["model_type"]](cfg))
            print(f"{name:24s} {total / 1e9:6.2f} GB  {cfg['architectures'][0]}")
        return 0
    if args.output is None:
        ap.error("give an output folder")
    config = shrunk(PRESETS[args.model]) if args.shrink else PRESETS[args.model]
    total = write_checkpoint(args.output, config, args.seed)
    print(f"wrote {total / 1e9:.2f} GB to {args.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
