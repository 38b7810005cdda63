"""Writes a byte-level tokenizer.json (one token per byte, no merges) into a synthetic checkpoint
folder, with a multimodal config's image tokens (<start_of_image>, <end_of_image>,
<image_soft_token>) at the ids config.json gives them, so that onnxruntime-genai's processor can run
the built package on an image. Synthetic weights generate nothing meaningful; this measures the run.

    python scripts/byte_tokenizer.py /work/synth/gemma-3-12b-it
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable
from pathlib import Path

IMAGE_TOKENS = {"boi_token_index": "<start_of_image>", "eoi_token_index": "<end_of_image>",
                "image_token_index": "<image_soft_token>"}


def byte_chars() -> dict[int, str]:
    """GPT-2's byte-level alphabet: printable bytes stand for themselves, the rest for 256 + n."""
    printable = {*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)}
    chars, shifted = {}, 0
    for b in range(256):
        chars[b] = chr(b) if b in printable else chr(256 + shifted)
        shifted += b not in printable
    return chars


def save(folder: Path, vocab: dict[str, int], special: Iterable[str], **tokenizer_config: str) -> None:
    """tokenizer.json over `vocab` (byte-level, no merges) with the `special` tokens added, and
    tokenizer_config.json (a fast tokenizer, with `tokenizer_config`'s keys: eos_token, ...)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(t, special=True) for t in special])
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast",
                                                              **tokenizer_config}))


def byte_vocab() -> dict[str, int]:
    """One token per byte: its byte_chars character -> the byte."""
    return {c: b for b, c in byte_chars().items()}


def write(folder: Path) -> None:
    config = json.loads((folder / "config.json").read_text())
    vocab_size = (config.get("text_config") or config)["vocab_size"]
    special = {config[k]: name for k, name in IMAGE_TOKENS.items() if k in config}
    vocab = byte_vocab()
    vocab.update({special.get(i, f"<unused{i}>"): i for i in range(256, vocab_size)})
    save(folder, vocab, special.values())


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path)
    write(ap.parse_args().folder)
