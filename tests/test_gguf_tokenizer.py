"""SentencePiece vocabularies in GGUF files (`tokenizer.ggml.model` "llama": Llama 2, Mistral, Gemma,
Phi-3): the tokenizer.json a build writes encodes text as transformers' own GGUF tokenizer does
(AutoTokenizer with `gguf_file=`), read back by transformers and by onnxruntime-genai.

onnxruntime-genai's SentencePiece path (onnxruntime-extensions, bpe_kernels.cc SpmTokenize) prefixes
"▁" to every text segment and, unless the tokenizer is Gemma's, splits runs of spaces with a regex
before the merges; transformers' Llama tokenizer (Metaspace, prepend_scheme "first") prefixes only
the text's start, and not when it already starts with a space, and merges across the whole text.
Those texts (GENAI_DIFFERS) are compared with transformers only; Gemma's form agrees everywhere.
"""

import json

import pytest
import transformers
from conftest import TINY
from gguf_files import SPM, write_gguf
from helpers import build, make_checkpoint

TEXTS = ["Hello world", "hello the world", "the\n the", "\n\nhello", "hello\n", "", "héllo wörld 12 1212",
         "é ü 😀 12", "Hello.(1):2", "in the world in"]
SPECIAL = ["<s>hello</s>", "[INST] hello the world [/INST]", "hello[INST]the", "<unk>",
           "<start_of_turn>user\nhello<end_of_turn>\n<start_of_turn>model\n", "<bos>hello<eos>", "<mask>x"]
SPACES = [" hello", "  hello\n\nworld", "   ", " ", "a  b   c    d", "hello  ", "the   the\n    the"]
# Where onnxruntime-genai differs (see the docstring): runs of spaces between words (Llama, Phi-3),
# and for Llama's first-segment-only prefix, leading spaces and text after a special token.
RUNS = {"a  b   c    d", "the   the\n    the"}
PREFIX = {" hello", "  hello\n\nworld", "   ", " ", "<s>hello</s>", "[INST] hello the world [/INST]", "hello[INST]the"}
GENAI_DIFFERS = {"llama": RUNS | PREFIX, "phi3": RUNS, "gemma2": set()}
CASES = {"llama": ("LlamaConfig", "llama", {}), "gemma2": ("Gemma2Config", "gemma", {"head_dim": 16}),
         "phi3": ("Phi3Config", "llama", {"pad_token_id": 0})}


def make_spm_gguf(tmp_path, arch):
    config_class, vocab, extra = CASES[arch]
    spm = SPM[vocab]
    source = make_checkpoint(tmp_path / "src", config_class, **{**TINY, "vocab_size": len(spm["tokens"]),
                                                                "bos_token_id": spm["bos"], "eos_token_id": spm["eos"],
                                                                **extra})
    return write_gguf(source, tmp_path / f"{arch}.gguf", "F32", vocab=vocab)


@pytest.mark.parametrize("arch", CASES)
def test_sentencepiece_encodes_like_transformers(tmp_path, arch):
    import onnxruntime_genai as og

    path = make_spm_gguf(tmp_path, arch)
    out = build(path, tmp_path / "out", "-p", "fp32")
    theirs = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    ours = transformers.AutoTokenizer.from_pretrained(out)
    genai = og.Tokenizer(og.Model(str(out)))  # adds no special tokens unless told, as its chat flow expects
    genai_bos = og.Tokenizer(og.Model(str(out)))
    genai_bos.update_options(add_special_tokens="true")
    differs = GENAI_DIFFERS[arch]
    compared = 0
    for text in TEXTS + SPECIAL + SPACES:
        want = theirs(text).input_ids
        assert ours(text).input_ids == want, text
        if text not in differs:
            assert genai_bos.encode(text).tolist() == want, text
            assert genai.encode(text).tolist() == theirs(text, add_special_tokens=False).input_ids, text
            compared += 1
    assert compared >= len(TEXTS) + 4
    assert theirs("hello the world").input_ids[0] == SPM[CASES[arch][1]]["bos"]  # add_bos_token by default
    config = json.loads((out / "tokenizer_config.json").read_text())
    assert config["chat_template"] == theirs.chat_template
    assert (config["bos_token"], config["eos_token"], config["add_bos_token"]) == (theirs.bos_token, theirs.eos_token,
                                                                                  True)
    ids = theirs("héllo wörld 😀 the\n world").input_ids
    assert genai.decode(ids) == theirs.decode(ids, skip_special_tokens=True)


def test_gemma_merges_follow_the_file_order_not_the_scores():
    """Gemma's scores do not give its merge order (transformers' gemma_tokenizer): the pieces' order does."""
    from builder.inputs.gguf.sentencepiece import sentencepiece

    spm = SPM["gemma"]
    meta = {"tokenizer.ggml.tokens": spm["tokens"], "tokenizer.ggml.scores": spm["scores"]}
    gemma = sentencepiece(meta, "gemma")["model"]["merges"]
    llama = sentencepiece(meta, "llama")["model"]["merges"]
    order = [["▁", "▁"], ["\n", "\n"], ["▁", "t"], ["h", "e"], ["▁t", "he"]]  # "  " (as "▁▁"), "\n\n", "▁t", ...
    assert sorted(order, key=gemma.index) == order
    assert sorted(order[1:], key=llama.index) != order[1:]  # by score: another order
    assert "▁▁" in sentencepiece(meta, "gemma")["model"]["vocab"]  # "  " respelled, as its tokenizer looks it up


def test_tokenizer_json_in_pieces_is_json_dumps():
    from builder.inputs.gguf.tokenizer import json_pieces

    values = [{}, [], {"a": []}, [[]], {1: 2}, {"x": {1: "y"}}, "é😀", 3, None,
              {"b": None, "c": [1.5, float("nan"), True], "d": {"e": [{"f": "g"}]}},
              {"vocab": {f"p{i}😀": i for i in range(50)}, "merges": [["a", "b"]] * 37}]
    for value in values:
        for chunk in (1, 2, 3, 8192):
            assert "".join(json_pieces(value, chunk)) == json.dumps(value, ensure_ascii=False), (value, chunk)


def test_a_large_sentencepiece_vocabulary_is_written_in_little_memory(tmp_path):
    """Gemma's 262,144 pieces made 220 MB of transient Python objects for a 16 MB tokenizer.json:
    every merge's halves copied, and the whole file built as one string (four bytes a character,
    as the vocabulary has emoji) and then encoded; 106 MB now. Here 40,000 pieces: the most the
    writer holds at once, beyond the metadata it is given, 8.2 MB for a 1.0 MB file (13.4 MB before);
    what is left is the vocabulary and merges as Python objects."""
    import random
    import tracemalloc

    from builder.inputs.gguf.tokenizer import write_tokenizer

    rng = random.Random(0)
    alphabet = [chr(c) for c in range(ord("a"), ord("z") + 1)] + ["▁", "é", "😀", "🎉"]
    tokens = ["<pad>", "<eos>", "<bos>", "<unk>", *alphabet]
    seen = set(tokens)
    while len(tokens) < 40_000:
        piece = "".join(rng.choices(alphabet, k=rng.randint(2, 9)))
        if piece not in seen:
            seen.add(piece)
            tokens.append(piece)
    meta = {"general.architecture": "gemma3", "tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.scores": [0.0] * len(tokens), "tokenizer.ggml.token_type": [3] * 4 + [1] * (len(tokens) - 4),
            "tokenizer.ggml.bos_token_id": 2, "tokenizer.ggml.eos_token_id": 1, "tokenizer.ggml.unknown_token_id": 3,
            "tokenizer.ggml.padding_token_id": 0}
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        write_tokenizer(meta, tmp_path)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    size = (tmp_path / "tokenizer.json").stat().st_size
    merges = json.loads((tmp_path / "tokenizer.json").read_text(encoding="utf-8"))["model"]["merges"]
    assert len(merges) > 15_000
    print(f"peak {peak / 2**20:.1f} MB for a {size / 2**20:.1f} MB file")
    assert peak < 11 * size
