"""Writes examples/tiny-llama: a ~150 KB random Llama checkpoint with a byte-level tokenizer.

No torch: numpy draws the weights (seeded, so the files are the same on every run), safetensors
writes them in bfloat16 like most hub checkpoints. The tokenizer maps each UTF-8 byte to one token
(GPT-2's byte-to-unicode alphabet, no merges), which both transformers and onnxruntime-genai load.

    python scripts/make_tiny_checkpoint.py [--output examples/tiny-llama]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import ml_dtypes
import numpy as np
from safetensors.numpy import save_file

SPECIALS = ["<unk>", "<s>", "</s>"]
CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": len(SPECIALS) + 256,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "hidden_act": "silu",
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "torch_dtype": "bfloat16",
}


def byte_alphabet() -> list[str]:
    """GPT-2's printable stand-in character for each byte 0..255, in byte order."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def tokenizer_json() -> dict:
    vocab = {tok: i for i, tok in enumerate(SPECIALS)}
    vocab.update({ch: len(SPECIALS) + b for b, ch in enumerate(byte_alphabet())})
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": False, "special": True}
            for i, t in enumerate(SPECIALS)
        ],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": False, "vocab": vocab, "merges": []},
    }


def weights(seed: int = 0, config: dict = CONFIG) -> dict[str, np.ndarray]:
    """Random bfloat16 weights for `config` (CONFIG, or a variant of it such as another vocab_size)."""
    rng = np.random.default_rng(seed)
    c = config
    H, I, V, D = c["hidden_size"], c["intermediate_size"], c["vocab_size"], c["head_dim"]
    q, kv = c["num_attention_heads"] * D, c["num_key_value_heads"] * D

    def normal(*shape: int, std: float = 0.08) -> np.ndarray:
        return (rng.standard_normal(shape, dtype=np.float32) * std).astype(ml_dtypes.bfloat16)

    def norm() -> np.ndarray:
        return (1 + rng.standard_normal(H, dtype=np.float32) * 0.1).astype(ml_dtypes.bfloat16)

    t = {"model.embed_tokens.weight": normal(V, H, std=1.0), "model.norm.weight": norm(), "lm_head.weight": normal(V, H)}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        t |= {
            p + "input_layernorm.weight": norm(),
            p + "post_attention_layernorm.weight": norm(),
            p + "self_attn.q_proj.weight": normal(q, H),
            p + "self_attn.k_proj.weight": normal(kv, H),
            p + "self_attn.v_proj.weight": normal(kv, H),
            p + "self_attn.o_proj.weight": normal(H, q),
            p + "mlp.gate_proj.weight": normal(I, H),
            p + "mlp.up_proj.weight": normal(I, H),
            p + "mlp.down_proj.weight": normal(H, I),
        }
    return t


def write(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    save_file(weights(), folder / "model.safetensors", metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(CONFIG, indent=2) + "\n")
    (folder / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": 1, "eos_token_id": 2, "do_sample": False}, indent=2) + "\n")
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer_json(), indent=1, ensure_ascii=False) + "\n")
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
        "unk_token": "<unk>", "model_max_length": CONFIG["max_position_embeddings"], "clean_up_tokenization_spaces": False,
    }, indent=2) + "\n")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--output", type=Path, default=Path(__file__).resolve().parent.parent / "examples" / "tiny-llama")
    write(ap.parse_args().output)
