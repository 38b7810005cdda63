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
import json
import struct
import sys
from collections.abc import Iterator
from pathlib import Path

import ml_dtypes
import numpy as np

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
QWEN3_0_6B = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 151936, "hidden_size": 1024,
    "intermediate_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8,
    "head_dim": 128, "hidden_act": "silu", "max_position_embeddings": 40960, "rms_norm_eps": 1e-6,
    "rope_theta": 1000000, "tie_word_embeddings": True, "attention_bias": False, "bos_token_id": 151643,
    "eos_token_id": 151645, "torch_dtype": "bfloat16",
}

GEMMA_3_1B_IT = {
    "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "vocab_size": 262144, "hidden_size": 1152,
    "intermediate_size": 6912, "num_hidden_layers": 26, "num_attention_heads": 4, "num_key_value_heads": 1,
    "head_dim": 256, "query_pre_attn_scalar": 256, "sliding_window": 512, "sliding_window_pattern": 6,
    "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0, "rope_scaling": None, "max_position_embeddings": 32768,
    "final_logit_softcapping": None, "attn_logit_softcapping": None, "rms_norm_eps": 1e-6,
    "hidden_activation": "gelu_pytorch_tanh", "bos_token_id": 2, "eos_token_id": [1, 106], "pad_token_id": 0,
    "tie_word_embeddings": True, "torch_dtype": "bfloat16",
}
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

PRESETS: dict[str, dict] = {
    "Llama-3.2-1B": LLAMA_3_2_1B,
    "Llama-3.1-8B": LLAMA_3_1_8B,
    "Qwen3-0.6B": QWEN3_0_6B,
    "gemma-3-1b-it": GEMMA_3_1B_IT,
    "gemma-3-12b-it": GEMMA_3_12B_IT,
    "Phi-4-mini": PHI_4_MINI,
    "granite-3.3-2b-instruct": GRANITE_3_3_2B,
    "SmolLM3-3B": SMOLLM3_3B,
    "Seed-OSS-36B-Instruct": SEED_OSS_36B,
    "ERNIE-4.5-0.3B-PT": ERNIE_4_5_0_3B,
    "Ministral-8B-Instruct-2410": MINISTRAL_8B,
    "Ministral-3-3B": MINISTRAL_3_3B,
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


TENSORS = {
    "llama": llama_tensors, "mistral": llama_tensors, "qwen2": llama_tensors, "qwen3": llama_tensors,
    "granite": llama_tensors, "smollm3": llama_tensors, "seed_oss": llama_tensors, "ernie4_5": llama_tensors,
    "ministral": llama_tensors, "ministral3": llama_tensors,
    "gemma3_text": gemma3_text_tensors, "gemma3": gemma3_multimodal_tensors, "phi3": phi3_tensors,
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", choices=sorted(PRESETS))
    ap.add_argument("output", nargs="?", type=Path)
    ap.add_argument("--list", action="store_true", help="list the presets and their sizes")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.list or args.model is None:
        for name, cfg in sorted(PRESETS.items()):
            total = sum(int(np.prod(s)) * 2 for _, s in TENSORS[cfg["model_type"]](cfg))
            print(f"{name:24s} {total / 1e9:6.2f} GB  {cfg['architectures'][0]}")
        return 0
    if args.output is None:
        ap.error("give an output folder")
    total = write_checkpoint(args.output, PRESETS[args.model], args.seed)
    print(f"wrote {total / 1e9:.2f} GB to {args.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
