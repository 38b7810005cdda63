"""--prune-lm-head: logits of each sequence's last real token alone, [batch, 1, vocab].

In ONNX Runtime those logits equal the full build's at each row's last real token (a right-padded
batch's shorter rows included). In onnxruntime-genai, which reads a logits output whose sequence
dimension is 1 as a pruned model and samples from its one row, greedy generation is token-equal to
the full build's for every way genai runs a decoder: one prompt, a right-padded batch, a chunked
prefill, beam search, and a second append_tokens; and equal to transformers' for a hybrid (LFM2)
and a windowed Gemma 3 batch. Packages of several models (Whisper, Gemma 3's image-and-text) are
refused."""

import json

import numpy as np
import onnxruntime as ort
import pytest
import transformers
from conftest import TINY
from helpers import GENAI_PROMPT, build, make_checkpoint, relative_error
from test_sliding_windows import EOS, RAGGED, assert_rows_match, genai_generate

from builder.cli import genai_extra_options, main
from builder.errors import BuildError

MAX_LENGTH = 30


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """(checkpoint, full build, pruned build) of a tiny Llama, fp32."""
    root = tmp_path_factory.mktemp("prune")
    source = make_checkpoint(root / "src", "LlamaConfig", **{**TINY, "eos_token_id": EOS})
    return source, build(source, root / "full", "-p", "fp32"), build(source, root / "pruned", "-p", "fp32", "--prune-lm-head")


def run(folder, batch: np.ndarray, mask: np.ndarray, past: dict | None = None) -> dict:
    """One ONNX Runtime run of `batch` (int64, batch x new) over `mask` (batch x total): past KV
    from `past`'s presents, else empty."""
    session = ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
    feed = {"input_ids": batch, "attention_mask": mask}
    for i in session.get_inputs():
        if i.name.startswith("past_key_values."):
            _, heads, _, size = i.shape
            feed[i.name] = past[i.name.replace("past_key_values", "present")] if past else \
                np.zeros((len(batch), heads, 0, size), np.float32)
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feed)))


def right_padded(prompts: list[list[int]], pad: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """input_ids and attention_mask of `prompts` padded on the right, as onnxruntime-genai pads them."""
    width = max(map(len, prompts))
    ids, mask = np.full((len(prompts), width), pad, np.int64), np.zeros((len(prompts), width), np.int64)
    for row, p in enumerate(prompts):
        ids[row, : len(p)], mask[row, : len(p)] = p, 1
    return ids, mask


def test_logits_are_one_row_per_sequence(llama):
    _, _, pruned = llama
    session = ort.InferenceSession(str(pruned / "model.onnx"), providers=["CPUExecutionProvider"])
    logits = next(o for o in session.get_outputs() if o.name == "logits")
    assert logits.shape == ["batch_size", 1, TINY["vocab_size"]]  # the fixed 1 genai reads as pruned


def test_right_padded_rows_take_their_last_real_token(llama):
    _, full, pruned = llama
    ids, mask = right_padded(RAGGED)
    want = run(full, ids, mask)["logits"]
    got = run(pruned, ids, mask)["logits"]
    assert got.shape == (len(RAGGED), 1, TINY["vocab_size"])
    for row, prompt in enumerate(RAGGED):
        assert relative_error(got[row, 0], want[row, len(prompt) - 1]) < 1e-6, f"row {row}"


def test_a_continued_sequence_and_a_decode_step_take_the_last_column(llama):
    # A second append_tokens or a prefill chunk: past KV and no padding; a decode step: one column.
    _, full, pruned = llama
    ids, n = np.array([GENAI_PROMPT], np.int64), len(GENAI_PROMPT)
    last = {}
    for folder in (full, pruned):
        past = run(folder, ids[:, :5], np.ones((1, 5), np.int64))
        more = run(folder, ids[:, 5:], np.ones((1, n), np.int64), past)
        step = run(folder, np.array([[9]], np.int64), np.ones((1, n + 1), np.int64), more)
        last[folder] = more["logits"][:, -1], step["logits"][:, -1]
    for got, want in zip(last[pruned], last[full]):
        assert relative_error(got, want) < 1e-6


def genai_run(folder, prompts: list[list[int]], **search) -> list[list[int]]:
    """onnxruntime-genai's greedy (or beam) generation of a right-padded batch with `search` options;
    each returned sequence's tokens after the padded prompt."""
    import onnxruntime_genai as og

    ids, _ = right_padded(prompts, json.loads((folder / "genai_config.json").read_text())["model"]["pad_token_id"])
    model = og.Model(str(folder))
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=MAX_LENGTH, batch_size=len(prompts), **search)
    generator = og.Generator(model, params)
    generator.append_tokens(ids.astype(np.int32))
    while not generator.is_done():
        generator.generate_next_token()
    rows = len(prompts) * search.get("num_return_sequences", 1)
    return [[int(t) for t in generator.get_sequence(r)][ids.shape[1]:] for r in range(rows)]


@pytest.mark.parametrize("prompts, search", [
    ([GENAI_PROMPT], {}),
    (RAGGED, {}),  # right-padded: 8, 5 and 11 tokens
    ([GENAI_PROMPT], {"chunk_size": 3}),  # genai's chunked prefill: 3 + 3 + 2 tokens
    ([GENAI_PROMPT], {"num_beams": 3, "num_return_sequences": 3}),
    (RAGGED, {"num_beams": 2, "num_return_sequences": 2}),
], ids=["one-prompt", "right-padded-batch", "chunked-prefill", "beam-search", "right-padded-beams"])
def test_genai_generates_what_the_full_build_does(llama, prompts, search):
    _, full, pruned = llama
    want = genai_run(full, prompts, **search)
    best = want[:: search.get("num_return_sequences", 1)]  # each prompt's first (best) sequence
    assert min(map(len, best)) >= 5, "stopped too early to prove anything"
    assert genai_run(pruned, prompts, **search) == want


def test_genai_second_append_tokens(llama):
    import onnxruntime_genai as og

    def turns(folder):
        model = og.Model(str(folder))
        params = og.GeneratorParams(model)
        params.set_search_options(do_sample=False, max_length=MAX_LENGTH + 20)
        generator = og.Generator(model, params)
        for prompt in (GENAI_PROMPT, RAGGED[2]):
            generator.append_tokens(np.array([prompt], np.int32))
            for _ in range(6):
                generator.generate_next_token()
        return [int(t) for t in generator.get_sequence(0)]

    _, full, pruned = llama
    assert turns(pruned) == turns(full)


def test_right_padded_batch_matches_transformers(llama):
    source, _, pruned = llama
    model = transformers.AutoModelForCausalLM.from_pretrained(source).eval()
    assert_rows_match(model, RAGGED, genai_generate(pruned, RAGGED, MAX_LENGTH), MAX_LENGTH - max(map(len, RAGGED)))


def test_hybrid_right_padded_batch_matches_transformers(tmp_path):
    from family_runner import assert_ragged_batch_matches
    from test_family_lfm2 import make

    source = make(tmp_path / "src")
    out = build(source, tmp_path / "out", "-p", "fp32", "--prune-lm-head")
    assert_ragged_batch_matches(out, transformers.AutoModelForCausalLM.from_pretrained(source).eval())


def test_windowed_gemma3_right_padded_batch_matches_transformers(tmp_path):
    from test_sliding_windows import FAMILIES

    config_class, overrides = FAMILIES["gemma3"]
    source = make_checkpoint(tmp_path / "src", config_class, **{**TINY, "eos_token_id": EOS, **overrides})
    out = build(source, tmp_path / "out", "-p", "fp32", "--prune-lm-head")
    model = transformers.AutoModelForCausalLM.from_pretrained(source).eval()
    assert_rows_match(model, RAGGED, genai_generate(out, RAGGED, 40), 40 - max(map(len, RAGGED)))


def test_verify_compares_the_last_position(llama, tmp_path):
    source, _, _ = llama
    assert main(["-m", str(source), "-o", str(tmp_path / "out"), "-q", "-p", "fp32", "--prune-lm-head",
                 "--verify"]) == 0


def test_the_reference_builders_spelling():
    assert genai_extra_options(["prune_lm_head=true"], {}) == {"prune_lm_head": True}
    assert genai_extra_options(["prune_lm_head=false"], {}) == {"prune_lm_head": False}
    with pytest.raises(BuildError, match="contradicts"):
        genai_extra_options(["prune_lm_head=true"], {"prune_lm_head": False})


def test_packages_are_refused(tmp_path, capsys):
    from test_whisper import make_checkpoint as make_whisper

    source = make_whisper(tmp_path / "whisper")
    assert main(["-m", str(source), "-p", "fp32", "--prune-lm-head", "--dry-run"]) == 2
    assert "--prune-lm-head" in capsys.readouterr().err


def test_genai_refuses_ngram_decoding_on_it(llama):
    # Why it is not the default: n-gram speculative decoding verifies each drafted token against the
    # logits of its position, and onnxruntime-genai 0.18 refuses a model that returns the last alone.
    import onnxruntime_genai as og

    def ngram(folder):
        config = og.Config(str(folder))
        config.overlay(json.dumps({"speculative": {"ngram_size": 3, "max_draft_tokens": 4}}))
        model = og.Model(config)
        params = og.GeneratorParams(model)
        params.set_search_options(do_sample=False, max_length=MAX_LENGTH)
        og.Generator(model, params).append_tokens(np.array([GENAI_PROMPT], np.int32))

    _, full, pruned = llama
    ngram(full)
    with pytest.raises(RuntimeError, match="pruned last-token-only"):
        ngram(pruned)
