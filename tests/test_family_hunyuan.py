"""Explicit rotary (q and k rotated by RotaryEmbedding nodes before GroupQueryAttention, for rotary
dimensions its fused rotary refuses) and HunYuan dense (q/k norms after the rotary, NTK-alpha
rope) against transformers: fp32 prefill and decode, right-padded batches, int4, genai greedy."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import transformers
from conftest import TINY
from fake_quant import assert_quantized_parity
from helpers import GENAI_PROMPT, PROMPT, assert_parity, build, make_checkpoint, reference, relative_error
from test_genai import MAX_LENGTH, assert_same_greedy, transformers_greedy

import architectures
from builder.blocks import Rope, rotary_tables
from builder.blocks.rope import ExplicitRotary
from builder.graph import Graph
from builder.target import Target

LONG_PROMPT = PROMPT + [3, 14, 15, 92, 65, 35, 89, 79, 32, 38]  # 20 tokens
BASE = {**TINY, "eos_token_id": 255, "pad_token_id": 0}
ALPHA = {"type": "dynamic", "alpha": 1000.0, "factor": 1.0, "rope_theta": 10000.0}  # the hub's rope_scaling

VARIANTS = {
    # Phi3 with a 32-wide head and partial_rotary_factor 0.75: 24 rotary dims, not a multiple of 16.
    "phi3-rotary24": ("Phi3Config", dict(hidden_size=128, partial_rotary_factor=0.75)),
    # The same through LongRoPE's If (short and long tables; the 20-token prompt passes 16).
    "phi3-rotary24-longrope": ("Phi3Config", dict(
        hidden_size=128, max_position_embeddings=64, original_max_position_embeddings=16, tie_word_embeddings=True,
        rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.75,
                         "short_factor": [1.0 + 0.1 * i for i in range(12)],
                         "long_factor": [2.0 + 0.5 * i for i in range(12)]})),
    # HunYuan: NTK-alpha rope, biases, tied embeddings (Hunyuan-7B's layout, tiny).
    "hunyuan-alpha": ("HunYuanDenseV1Config", dict(head_dim=32, attention_bias=True, tie_word_embeddings=True,
                                                   rope_parameters=ALPHA)),
    # HunYuan with plain rope, untied, a 16-wide head (two query heads per KV head).
    "hunyuan-default": ("HunYuanDenseV1Config", dict(head_dim=16, rope_parameters={"rope_theta": 500.0})),
}


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def variant(request, tmp_path_factory):
    config_class, overrides = VARIANTS[request.param]
    return make_checkpoint(tmp_path_factory.mktemp(request.param), config_class, **{**BASE, **overrides})


@pytest.mark.parametrize("ids", [PROMPT, LONG_PROMPT], ids=["10-tokens", "20-tokens"])
def test_fp32_matches_transformers(variant, tmp_path, ids):
    assert_parity(build(variant, tmp_path / "out", "-p", "fp32"), variant, tolerance=1e-4, ids=ids)


def test_int4_matches_fake_quantized_transformers(variant, tmp_path):
    out = build(variant, tmp_path / "out", "-p", "int4", "--accuracy-level", "0")
    assert_quantized_parity(variant, out, exact=True, ids=LONG_PROMPT)


def test_genai_greedy_matches_transformers(variant, tmp_path):
    assert_same_greedy(build(variant, tmp_path / "out", "-p", "fp32"), variant, GENAI_PROMPT)


def test_attention_rotates_before_group_query_attention(variant, tmp_path):
    graph = onnx.load(build(variant, tmp_path / "out", "-p", "fp32") / "model.onnx", load_external_data=False).graph
    ops = [n.op_type for n in graph.node]
    assert ops.count("RotaryEmbedding") == 2 * TINY["num_hidden_layers"]  # q and k of every layer
    gqa = [n for n in graph.node if n.op_type == "GroupQueryAttention"]
    assert all(a.i == 0 for n in gqa for a in n.attribute if a.name == "do_rotary")


def run_batch(folder, ids: np.ndarray, mask: np.ndarray, past: dict | None):
    session = ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
    feed = {"input_ids": ids, "attention_mask": mask}
    for i in session.get_inputs()[2:]:
        feed[i.name] = past[i.name.replace("past_key_values", "present")] if past else \
            np.zeros((ids.shape[0], i.shape[1], 0, i.shape[3]), np.float32)
    outputs = session.run(None, feed)
    return outputs[0], dict(zip([o.name for o in session.get_outputs()], outputs))


@pytest.mark.parametrize("name", ["phi3-fused", "phi3-rotary24", "hunyuan-alpha"])
def test_right_padded_batch_matches_each_row(name, tmp_path):
    # Rows of 10 and 6 tokens, the shorter right-padded, then one decode step each: the positions
    # come per row from the mask (10 and 6 in the decode step), as GroupQueryAttention's own
    # rotary takes them ("phi3-fused", a 64-wide head, is that reference).
    config_class, overrides = VARIANTS.get(name, ("Phi3Config", {}))
    source = make_checkpoint(tmp_path / "src", config_class, **{**BASE, **overrides})
    out = build(source, tmp_path / "out", "-p", "fp32")
    rows = [PROMPT, PROMPT[3:9]]
    T = len(PROMPT)
    ids, mask = np.zeros((2, T), np.int64), np.zeros((2, T), np.int64)
    for b, row in enumerate(rows):
        ids[b, : len(row)], mask[b, : len(row)] = row, 1
    prefill, present = run_batch(out, ids, mask, None)
    refs = [reference(source, row) for row in rows]
    step_mask = np.zeros((2, T + 1), np.int64)
    for b, row in enumerate(rows):
        step_mask[b, : len(row) + 1] = 1
    step, _ = run_batch(out, np.array([[r[2]] for r in refs], np.int64), step_mask, present)
    for b, (row, (ref_prefill, ref_step, _)) in enumerate(zip(rows, refs)):
        assert relative_error(prefill[b, : len(row)], ref_prefill) < 1e-4
        assert relative_error(step[b], ref_step) < 1e-4


def test_rotary_tables_fuse_only_multiples_of_16():
    g, target = Graph(), Target(io_dtype=np.dtype(np.float32))
    rope = lambda dim: Rope.from_parameters({"rope_theta": 1e4}, dim, 32)  # noqa: E731
    assert isinstance(rotary_tables(g, rope(64), 32, target, "a_"), tuple)
    assert isinstance(rotary_tables(g, rope(24), 32, target, "b_"), ExplicitRotary)
    explicit = rotary_tables(g, rope(64), 32, target, "c_", explicit=True)
    assert isinstance(explicit, ExplicitRotary) and explicit.rotary_dim == 64


def test_ntk_alpha_rope_equals_transformers():
    config = transformers.HunYuanDenseV1Config(**{**TINY, "head_dim": 32, "rope_parameters": ALPHA})
    theirs = transformers.AutoModelForCausalLM.from_config(config).model.rotary_emb.inv_freq.numpy()
    ours = architectures.load("HunYuanDenseV1ForCausalLM").parse_config(config.to_dict(), "HunYuanDenseV1ForCausalLM")
    np.testing.assert_array_equal(ours.rope().inv_freq, theirs)


HUNYUAN_CASES = {
    "minimal": dict(head_dim=128),
    # Hunyuan-7B-Instruct's spelling: top-level rope_theta, legacy rope_scaling with `type`.
    "hub-7b": dict(hidden_size=4096, intermediate_size=14336, num_key_value_heads=8, head_dim=128, vocab_size=128167,
                   max_position_embeddings=262144, tie_word_embeddings=True, rope_theta=10000.0,
                   bos_token_id=127958, eos_token_id=127960, pad_token_id=127961, use_qk_norm=True, use_cla=False,
                   rope_scaling={"alpha": 1000.0, "beta_fast": 32, "beta_slow": 1, "factor": 1.0, "mscale": 1.0,
                                 "mscale_all_dim": 1.0, "type": "dynamic"}),
    "rope-parameters": dict(head_dim=64, num_attention_heads=16, eos_token_id=[2, 3], attention_bias=True,
                            rope_parameters={"rope_type": "dynamic", "alpha": 50.0, "factor": 1.0, "rope_theta": 1e6}),
    "linear": dict(head_dim=64, rope_scaling={"rope_type": "linear", "factor": 2.0}),
}


@pytest.mark.parametrize("case", sorted(HUNYUAN_CASES))
def test_hunyuan_matches_transformers_config(case):
    raw = HUNYUAN_CASES[case]
    ours = architectures.load("HunYuanDenseV1ForCausalLM").parse_config(dict(raw), "HunYuanDenseV1ForCausalLM")
    theirs = transformers.HunYuanDenseV1Config(**raw)
    for field in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                  "num_key_value_heads", "head_dim", "hidden_act", "max_position_embeddings", "rms_norm_eps",
                  "tie_word_embeddings", "bos_token_id", "eos_token_id", "pad_token_id", "attention_bias"):
        assert getattr(ours, field) == getattr(theirs, field), field
    strip = lambda d: {k: v for k, v in d.items() if k != "type"}  # noqa: E731
    assert strip(ours.rope_parameters) == strip(theirs.rope_parameters)
    assert ours.model_type == "hunyuandensev1"  # onnxruntime-genai's name for it


@pytest.mark.parametrize("name", ["phi3-rotary24", "hunyuan-default"])
def test_genai_right_padded_batch_matches_each_row(name, tmp_path):
    # onnxruntime-genai pads the shorter prompt on the right (pad_token_id 0 in the mask as 0s):
    # each row's greedy continuation must still be transformers' for that prompt alone.
    import onnxruntime_genai as og

    config_class, overrides = VARIANTS[name]
    source = make_checkpoint(tmp_path / "src", config_class, **{**BASE, **overrides})
    model = og.Model(str(build(source, tmp_path / "out", "-p", "fp32")))
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=MAX_LENGTH, batch_size=2)
    generator = og.Generator(model, params)
    rows = [GENAI_PROMPT, GENAI_PROMPT[:5]]
    generator.append_tokens(np.array([rows[0], rows[1] + [BASE["pad_token_id"]] * 3], np.int32))
    while not generator.is_done():
        generator.generate_next_token()
    for b, row in enumerate(rows):
        expected = transformers_greedy(source, row)
        got = [int(t) for t in generator.get_sequence(b)]
        got = row + got[len(rows[0]):]  # the padding stays in genai's sequence (and counts in max_length)
        n = min(len(got), len(expected))
        assert n > len(row) + 5 and got[:n] == expected[:n]
