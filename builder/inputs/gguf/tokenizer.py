"""tokenizer.json and tokenizer_config.json from a GGUF file's metadata.

A GGUF carries its tokenizer as metadata (`tokenizer.ggml.*`): tokens, merges or scores, token
types, special ids, the pre-tokenizer's name and the chat template. We write the Hugging Face
`tokenizers` file that transformers builds from the same metadata (transformers/integrations/gguf/
gguf_tokenizer_mapping.py: byte_level_tokenizer, add_gguf_special_tokens, set_split_regex, and the
SentencePiece builders, see builder/inputs/gguf/sentencepiece.py), so both, and onnxruntime-genai, encode
text alike. Byte-level BPE (`gpt2`) and SentencePiece (`llama`) vocabularies are written; any other
kind (`t5`, `rwkv`, ...) builds with a warning and no tokenizer.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from builder.errors import BuildError
from builder.inputs.gguf.sentencepiece import GEMMA, sentencepiece

log = logging.getLogger("builder")

# Pre-tokenizer splits by llama.cpp's `tokenizer.ggml.pre` (transformers' GGUF_PRE_TOKENIZER_SPLITS).
_LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
           r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
          r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_GPT4O = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
          r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
          r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_TEKKEN = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
           r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
           r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
SPLITS = {
    **dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
                     "jina-v5-nano", "dbrx", "smaug-bpe"), _LLAMA3),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez"), _QWEN2),
    **dict.fromkeys(("gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"), _GPT4O),
    "tekken": _TEKKEN,
}
CONTROL, USER_DEFINED = 3, 4  # llama.cpp's token types
SPECIAL = {"bos_token": "bos_token_id", "eos_token": "eos_token_id", "unk_token": "unknown_token_id",
           "pad_token": "padding_token_id"}


def check_tokenizer_metadata(path: Path, meta: dict[str, Any]) -> None:
    """Refuses, naming the key, tokenizer metadata of the wrong type or out of range, before the
    build (the tokenizer is written after the weights): tokens, types and scores one per token,
    merges of two pieces, special ids of existing tokens."""

    def refuse(key: str, want: str) -> BuildError:
        return BuildError(f"{path}: the GGUF metadata's {key} must be {want}")

    for key in ("tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.chat_template", "general.architecture"):
        if not isinstance(meta.get(key, ""), str):
            raise refuse(key, "a string")
    tokens = meta.get("tokenizer.ggml.tokens", [])
    if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
        raise refuse("tokenizer.ggml.tokens", "a list of strings")
    for key, kind, want in (("tokenizer.ggml.token_type", int, "integers"),
                            ("tokenizer.ggml.scores", (int, float), "finite numbers")):
        values = meta.get(key)
        if values is None:
            continue
        if not (isinstance(values, list) and len(values) == len(tokens)
                and all(isinstance(v, kind) and not isinstance(v, bool) and math.isfinite(v) for v in values)):
            raise refuse(key, f"a list of {want}, one per token ({len(tokens)})")
    merges = meta.get("tokenizer.ggml.merges", [])
    if not isinstance(merges, list) or not all(isinstance(m, str) and len(m.split(" ")) == 2 for m in merges):
        raise refuse("tokenizer.ggml.merges", "a list of strings, each two pieces with a space between")
    for key in SPECIAL.values():
        token_id = meta.get(f"tokenizer.ggml.{key}")
        if token_id is not None and tokens and not (isinstance(token_id, int) and not isinstance(token_id, bool)
                                                    and 0 <= token_id < len(tokens)):
            raise refuse(f"tokenizer.ggml.{key}", f"the id of one of its {len(tokens)} tokens, not {token_id!r:.40}")


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's printable spelling of each byte (its encoder.py)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = printable[:], 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(printable, map(chr, chars)))


def _added(token_id: int, content: str, special: bool) -> dict[str, Any]:
    return {"id": token_id, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
            "normalized": False, "special": special}


def _byte_level(meta: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    tokens: list[str] = meta["tokenizer.ggml.tokens"]
    types = meta.get("tokenizer.ggml.token_type") or []
    spelled = bytes_to_unicode()
    alphabet = set(spelled.values())
    vocab = {t if set(t) <= alphabet else "".join(spelled[b] for b in t.encode("utf-8")): i for i, t in enumerate(tokens)}
    merges = [m.split(" ") for m in meta.get("tokenizer.ggml.merges") or []]
    ids = {name: meta.get(f"tokenizer.ggml.{key}") for name, key in SPECIAL.items()}
    added = {i: _added(i, tokens[i], True) for i in ids.values() if i is not None}
    for i, (token, kind) in enumerate(zip(tokens, types)):
        if kind == CONTROL and set(token) <= alphabet:  # one spelled otherwise is a llama.cpp mislabel
            added[i] = _added(i, token, True)
        elif kind == USER_DEFINED and i not in added:
            added[i] = _added(i, token, False)
    split = SPLITS.get(meta.get("tokenizer.ggml.pre"))
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": split is None}
    pre = byte_level if split is None else {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": split}, "behavior": "Isolated", "invert": False}, byte_level]}
    config = {name: None if i is None else tokens[i] for name, i in ids.items()}
    add_bos, add_eos = bool(meta.get("tokenizer.ggml.add_bos_token")), bool(meta.get("tokenizer.ggml.add_eos_token"))
    model = {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
             "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
             "vocab": vocab, "merges": merges}
    decoder = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
    tokenizer = _tokenizer_json(added, None, pre, decoder, model, config, ids, add_bos, add_eos)
    return tokenizer, {"add_bos_token": add_bos, "add_eos_token": add_eos, **config, "tokenizer_class": "GPT2Tokenizer"}


def _sentencepiece(meta: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]] | None:
    arch = meta.get("general.architecture", "")
    parts = sentencepiece(meta, arch)
    if parts is None:
        return None
    tokens, vocab = parts["tokens"], parts["model"]["vocab"]
    original: list[str] = meta["tokenizer.ggml.tokens"]
    types = meta.get("tokenizer.ggml.token_type") or []
    # transformers' order: control tokens special, user-defined ones (spelled as in the vocabulary)
    # plain, then the special roles not added yet (GemmaTokenizer's default mask_token among them).
    added = {i: _added(i, tokens[i], True) for i, kind in enumerate(types) if kind == CONTROL}
    for i, (token, kind) in enumerate(zip(original, types)):
        if kind == USER_DEFINED and i not in added and vocab.get(token) == i:
            added[i] = _added(i, token, False)
    ids = {name: meta.get(f"tokenizer.ggml.{key}") for name, key in SPECIAL.items()}
    config = {name: None if i is None else tokens[i] for name, i in ids.items()}
    roles = [i for i in ids.values() if i is not None]
    if arch in GEMMA and "<mask>" in vocab:
        roles.append(vocab["<mask>"])
    for i in roles:
        added.setdefault(i, _added(i, tokens[i], True))
    # llama.cpp adds BOS to a SentencePiece vocabulary unless the file says otherwise (so does transformers).
    add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", True))
    add_eos = bool(meta.get("tokenizer.ggml.add_eos_token"))
    tokenizer = _tokenizer_json(added, parts["normalizer"], parts["pre_tokenizer"], parts["decoder"], parts["model"],
                                config, ids, add_bos, add_eos)
    return tokenizer, {"add_bos_token": add_bos, "add_eos_token": add_eos, **config,
                       "tokenizer_class": parts["tokenizer_class"]}


def _tokenizer_json(added: dict[int, dict[str, Any]], normalizer: Any, pre: Any, decoder: Any, model: dict[str, Any],
                    config: dict[str, Any], ids: dict[str, int | None], add_bos: bool, add_eos: bool) -> dict[str, Any]:
    """tokenizer.json, with the post-processor that adds BOS / EOS (`config`'s tokens, `ids` their
    ids in the file, by role) as the file asks."""

    def template(seq: str, type_id: int) -> list[dict[str, Any]]:
        bos = [{"SpecialToken": {"id": config["bos_token"], "type_id": type_id}}] if add_bos and config["bos_token"] else []
        eos = [{"SpecialToken": {"id": config["eos_token"], "type_id": type_id}}] if add_eos and config["eos_token"] else []
        return [*bos, {"Sequence": {"id": seq, "type_id": type_id}}, *eos]

    # By the file's id: a token spelled outside the byte alphabet has another key in the vocabulary.
    used = {config[n]: ids[n] for n, flag in (("bos_token", add_bos), ("eos_token", add_eos)) if flag and config[n]}
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [added[i] for i in sorted(added)],
        "normalizer": normalizer,
        "pre_tokenizer": pre,
        "post_processor": {"type": "TemplateProcessing", "single": template("A", 0),
                           "pair": template("A", 0) + template("B", 1),
                           "special_tokens": {t: {"id": t, "ids": [used[t]], "tokens": [t]} for t in sorted(used)}},
        "decoder": decoder,
        "model": model,
    }


def json_pieces(value: Any, chunk: int = 8192) -> Iterator[str]:
    """`json.dumps(value, ensure_ascii=False)` in pieces: a dict or list longer than `chunk` is
    encoded `chunk` items at a time, a shorter one item by item. A 262,144-piece vocabulary's
    tokenizer.json is 16 MB of UTF-8 but a 52 MB string encoded whole (Python stores it four bytes
    a character, Gemma's vocabulary having characters beyond the BMP)."""
    if isinstance(value, dict) and value and all(isinstance(key, str) for key in value):
        items = list(value.items())
        opened, closed = "{", "}"
    elif isinstance(value, list) and value:
        items, opened, closed = value, "[", "]"
    else:  # a scalar, an empty container, or a dict with keys json converts itself
        yield json.dumps(value, ensure_ascii=False)
        return
    yield opened
    if len(items) > chunk:
        for start in range(0, len(items), chunk):
            part = items[start:start + chunk]
            yield (", " if start else "") + json.dumps(dict(part) if opened == "{" else part, ensure_ascii=False)[1:-1]
    else:
        for i, item in enumerate(items):
            if i:
                yield ", "
            if opened == "{":
                yield json.dumps(item[0], ensure_ascii=False) + ": "
                item = item[1]
            yield from json_pieces(item, chunk)
    yield closed


# What write_tokenizer holds at its peak, a token and a merge (the vocabulary's Python objects),
# with a margin over tracemalloc's peaks: gemma-3-270m's 262,144 SentencePiece tokens 103.5 MB;
# Qwen2.5's 151,936 byte-level tokens and 151,387 merges 59.4 MB; SmolLM2's 49,152 and 48,900 20.9 MB.
TOKEN_MEMORY, MERGE_MEMORY = 448, 64


def tokenizer_memory(meta: dict[str, Any]) -> int:
    """The bytes write_tokenizer will hold in memory for this metadata (the predicted peak's)."""
    tokens, merges = meta.get("tokenizer.ggml.tokens"), meta.get("tokenizer.ggml.merges")
    return (TOKEN_MEMORY * (len(tokens) if isinstance(tokens, list) else 0)
            + MERGE_MEMORY * (len(merges) if isinstance(merges, list) else 0))


def write_tokenizer(meta: dict[str, Any], folder: Path) -> list[str]:
    """Writes tokenizer.json and tokenizer_config.json into `folder`; returns their names (none
    for a vocabulary type not written, with a warning)."""
    kind = meta.get("tokenizer.ggml.model")
    made = None
    if "tokenizer.ggml.tokens" in meta:
        made = _byte_level(meta) if kind == "gpt2" else _sentencepiece(meta) if kind == "llama" else None
    if made is None:
        log.warning("warning: the GGUF's %r tokenizer is not written (byte-level BPE, 'gpt2', and SentencePiece, "
                    "'llama' with scores, are): the model is built, but onnxruntime-genai needs a tokenizer.json "
                    "beside it", kind)
        return []
    tokenizer, config = made
    config = {**config, "model_max_length": 10**30, "clean_up_tokenization_spaces": False}
    if meta.get("tokenizer.chat_template"):
        config["chat_template"] = meta["tokenizer.chat_template"]
    with open(folder / "tokenizer.json", "w", encoding="utf-8") as file:
        file.writelines(json_pieces(tokenizer))
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    return ["tokenizer.json", "tokenizer_config.json"]
