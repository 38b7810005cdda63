"""The `tokenizers` model, normalizer, pre-tokenizer and decoder for a SentencePiece vocabulary
stored in a GGUF file (`tokenizer.ggml.model == "llama"`: Llama 2, Mistral, Gemma, Phi-3 files).

The file keeps the pieces, their scores and types, but no merges: like transformers' GGUF loader
(transformers/integrations/gguf/gguf_tokenizer_mapping.py: sentencepiece_tokenizer, gemma_tokenizer,
phi3_tokenizer, with generate_merges in tokenization_utils_base.py) we make a byte-fallback BPE
whose merges are every split of a piece into two pieces, best score first. What splits the text
into pieces depends on the family, as there:

- Llama (and any other architecture): a `Metaspace` pre-tokenizer that prepends "▁" to the
  text's first segment unless it already starts with a space (LlamaTokenizer, legacy=False).
- Gemma 1/2/3: spaces replaced by "▁", nothing prepended; the merges follow the pieces' order in
  the file (Gemma's scores do not), and a piece of two or more real spaces is spelled with "▁".
- Phi-3: "▁" prepended to every segment by a normalizer (its hub tokenizer.json's form).
"""

from __future__ import annotations

import bisect
import contextlib
import gc
from collections.abc import Iterator
from operator import itemgetter
from typing import Any

GEMMA = ("gemma", "gemma2", "gemma3")
META = "\u2581"  # SentencePiece's visible space, "▁"


def respelled(tokens: list[str], arch: str) -> list[str]:
    """The pieces as the BPE model spells them: Gemma files store its whitespace pieces ("  ")
    with real spaces, which its tokenizer looks up as "▁▁"."""
    if arch not in GEMMA:
        return tokens
    return [META * len(t) if " " in t and not t.strip() else t for t in tokens]


def merges(tokens: list[str], scores: dict[str, float]) -> list[list[str]]:
    """Every split of a piece into two pieces of the vocabulary, best-scored piece first, then by
    longer left and right halves; pieces of one score in the scores' order (generate_merges' order:
    its within-piece order by the halves' ids never decides, as no two splits of a piece have
    halves of the same lengths). The halves are the vocabulary's own strings, not copies: a
    262,144-piece vocabulary has half a million merges."""
    own = {t: t for t in tokens}
    lengths = sorted({len(t) for t in tokens})
    found = []
    with _collector_paused():
        for piece, score in scores.items():
            # Both halves are pieces shorter than this one, so at most `shorter` long: a piece longer than
            # the rest is not cut at each of its characters (a 10^5-character one would take 10^10 steps).
            n = len(piece)
            shorter = lengths[bisect.bisect_left(lengths, n) - 1] if lengths[0] < n else 0
            for k in range(max(1, n - shorter), min(n - 1, shorter) + 1):
                left = own.get(piece[:k])
                if left is not None:
                    right = own.get(piece[k:])
                    if right is not None:
                        found.append((score, k, n - k, left, right))
        found.sort(key=itemgetter(0, 1, 2), reverse=True)  # stable: ties keep their order
        for i, (_, _, _, left, right) in enumerate(found):  # in place: each sort key freed as it goes
            found[i] = [left, right]
        return found


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off while half a million small lists and tuples are made,
    none of them in a cycle: it would otherwise walk them all, again and again (a quarter of the time)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def sentencepiece(meta: dict[str, Any], arch: str) -> dict[str, Any] | None:
    """The tokenizer.json parts for the file's vocabulary and architecture (None without the scores
    or merges a BPE needs)."""
    tokens = respelled(list(meta["tokenizer.ggml.tokens"]), arch)
    if meta.get("tokenizer.ggml.merges"):
        pairs = [m.split(" ") for m in meta["tokenizer.ggml.merges"]]
    elif arch in GEMMA:  # the order in the file, not the scores
        pairs = merges(tokens, {t: -i for i, t in enumerate(tokens)})
    elif meta.get("tokenizer.ggml.scores") is not None:
        pairs = merges(tokens, dict(zip(tokens, meta["tokenizer.ggml.scores"])))
    else:
        return None
    strip = {"type": "Strip", "content": " ", "start": 1, "stop": 0}  # the space the prefix added
    decoder = [{"type": "Replace", "pattern": {"String": META}, "content": " "}, {"type": "ByteFallback"},
               {"type": "Fuse"}]
    if arch in GEMMA:
        normalizer = {"type": "Replace", "pattern": {"String": " "}, "content": META}
        pre_tokenizer = {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithPrevious", "invert": False}
        tokenizer_class = "GemmaTokenizer"
    elif arch == "phi3":
        normalizer = {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": META}, {"type": "Replace", "pattern": {"String": " "}, "content": META}]}
        pre_tokenizer, decoder, tokenizer_class = None, [*decoder, strip], "TokenizersBackend"
    else:
        normalizer = None
        pre_tokenizer = {"type": "Metaspace", "replacement": META, "prepend_scheme": "first", "split": False}
        decoder, tokenizer_class = [*decoder, strip], "LlamaTokenizer"
    model = {"type": "BPE", "dropout": None, "unk_token": "<unk>" if arch in GEMMA else None,
             "continuing_subword_prefix": None, "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True,
             "ignore_merges": False, "vocab": {t: i for i, t in enumerate(tokens)}, "merges": pairs}
    return {"tokens": tokens, "normalizer": normalizer, "pre_tokenizer": pre_tokenizer,
            "decoder": {"type": "Sequence", "decoders": decoder}, "model": model, "tokenizer_class": tokenizer_class}
