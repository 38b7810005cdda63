"""LFM2 (short convolutions with carried state, interleaved with attention) against transformers:
fp32 prefill and decode steps feeding back every KV and conv state, int4 against fake
quantization, onnxruntime-genai's greedy generation (one prompt, and two of different lengths in a
batch), and the state contract onnxruntime-genai 0.18 reads."""

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import transformers
from fake_quant import cosine, fake_quantize_model
from helpers import GENAI_PROMPT, build, make_checkpoint, relative_error
from safetensors.numpy import load_file, save_file
from test_genai import MAX_LENGTH, assert_same_greedy

from builder.options import PRECISION_DEFAULTS

# Both layer kinds, a conv layer first and last; 5 query heads over 1 KV head (odd, grouped);
# conv_bias on (random biases below: transformers initializes them to zero), a 4-tap kernel.
CONFIG = dict(
    vocab_size=256, hidden_size=80, intermediate_size=96, num_hidden_layers=4, num_attention_heads=5,
    num_key_value_heads=1, max_position_embeddings=128, conv_bias=True, conv_L_cache=4, block_multiple_of=16,
    initializer_range=0.1,  # varied greedy continuations (at 0.02 the tiny model repeats one token)
    layer_types=["conv", "full_attention", "conv", "conv"], eos_token_id=255,
)
PROMPT = [5, 17, 33, 12, 99, 100, 7, 8, 61, 42]  # longer than the kernel
STEPS = 4


def make(folder, **overrides):
    make_checkpoint(folder, "Lfm2Config", **{**CONFIG, **overrides})
    tensors = load_file(folder / "model.safetensors")
    rng = np.random.default_rng(1)
    for key, value in tensors.items():
        if key.endswith(".bias"):
            tensors[key] = (0.1 * rng.standard_normal(value.shape)).astype(value.dtype)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    return make(tmp_path_factory.mktemp("lfm2"))


def onnx_steps(folder, ids, next_ids):
    """ONNX Runtime's logits for a prefill of `ids`, then one decode step per id of `next_ids`, each
    fed every present state (KV and conv) of the step before; the first past states are what
    onnxruntime-genai allocates: empty KV, zero conv states of the declared shape."""
    session = ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
    inputs = {i.name: i for i in session.get_inputs()}
    names = [o.name for o in session.get_outputs()]
    state = {}
    for name, i in inputs.items():
        if name.startswith("past"):
            shape = [1 if d == "batch_size" else 0 if isinstance(d, str) else d for d in i.shape]
            state[name] = np.zeros(shape, np.float16 if i.type == "tensor(float16)" else np.float32)
    results, total = [], 0
    for chunk in [ids, *([t] for t in next_ids)]:
        total += len(chunk)
        feed = {"input_ids": np.array([chunk], np.int64), "attention_mask": np.ones((1, total), np.int64), **state}
        outs = dict(zip(names, session.run(None, feed)))
        results.append(outs["logits"][0].astype(np.float32))
        state = {n.replace("present", "past_key_values", 1) if n.endswith(("key", "value")) else
                 n.replace("present", "past", 1): v for n, v in outs.items() if n.startswith("present")}
    return results


def reference_steps(model, ids, steps):
    """transformers' logits for a prefill, then `steps` greedy decode steps with its cache; the ids fed."""
    with torch.no_grad():
        out = model(torch.tensor([ids]), use_cache=True)
        results, fed = [out.logits[0].numpy()], []
        for _ in range(steps):
            fed.append(int(out.logits[0, -1].argmax()))
            out = model(torch.tensor([[fed[-1]]]), past_key_values=out.past_key_values, use_cache=True)
            results.append(out.logits[0].numpy())
    return results, fed


def assert_steps_match(out, model, ids=PROMPT, tolerance=1e-4, min_cosine=None):
    """Prefill of `ids` and STEPS decode steps (every state fed back) against `model`'s."""
    want, fed = reference_steps(model, ids, STEPS)
    for step, (g, w) in enumerate(zip(onnx_steps(out, ids, fed), want)):
        assert relative_error(g, w) < tolerance, f"step {step}: relative error {relative_error(g, w):.2e}"
        assert (g.argmax(-1) == w.argmax(-1)).all(), f"step {step}: argmax differs"
        assert min_cosine is None or cosine(g, w) > min_cosine, f"step {step}: cosine {cosine(g, w)}"


def load(source):
    return transformers.AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).eval()


def test_fp32_prefill_and_decode_match_transformers(source, tmp_path):
    out = build(source, tmp_path / "out", "-p", "fp32")
    want, fed = reference_steps(load(source), PROMPT, STEPS)
    got = onnx_steps(out, PROMPT, fed)
    for step, (g, w) in enumerate(zip(got, want)):
        assert relative_error(g, w) < 1e-4, f"step {step}: relative error {relative_error(g, w):.2e}"
        assert (g.argmax(-1) == w.argmax(-1)).all(), f"step {step}: argmax differs"


def test_prompt_shorter_than_the_kernel(source, tmp_path):
    # Two tokens then steps: the conv reads the zero state it starts with, as transformers pads.
    out = build(source, tmp_path / "out", "-p", "fp32")
    want, fed = reference_steps(load(source), [9, 4], STEPS)
    for step, (g, w) in enumerate(zip(onnx_steps(out, [9, 4], fed), want)):
        assert relative_error(g, w) < 1e-4, f"step {step}"


def test_int4_matches_fake_quantized_transformers(source, tmp_path):
    out = build(source, tmp_path / "out", "-p", "int4", "--accuracy-level", "0")
    model = load(source)
    conv_weights = [m.conv.conv.weight.clone() for m in model.model.layers if hasattr(m, "conv")]
    int4 = PRECISION_DEFAULTS["int4"]  # what the build does when not told
    fake_quantize_model(model, 4, 32, int4["symmetric"], method=int4["quant_method"])  # every Linear, not the Conv1d
    assert all(torch.equal(a, m.conv.conv.weight) for a, m in
               zip(conv_weights, [m for m in model.model.layers if hasattr(m, "conv")]))
    want, fed = reference_steps(model, PROMPT, STEPS)
    for step, (g, w) in enumerate(zip(onnx_steps(out, PROMPT, fed), want)):
        assert cosine(g, w) > 0.999 and relative_error(g, w) < 1e-4, f"step {step}"
    kernels = [t for t in onnx.load(out / "model.onnx").graph.initializer if t.name.endswith("conv.conv.weight")]
    assert len(kernels) == 3 and all(t.data_type == onnx.TensorProto.FLOAT for t in kernels)


def test_state_contract(source, tmp_path):
    """Attention layers: KV only; conv layers: past.%d.conv / present.%d.conv only, (batch, hidden,
    kernel−1); genai_config.json names them and lists the layer types (the lfm2 type needs them)."""
    out = build(source, tmp_path / "out", "-p", "fp32")
    session = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    inputs = {i.name: i.shape for i in session.get_inputs()}
    outputs = {o.name: o.shape for o in session.get_outputs()}
    assert sorted(inputs) == sorted(["input_ids", "attention_mask", "past.0.conv", "past_key_values.1.key",
                                     "past_key_values.1.value", "past.2.conv", "past.3.conv"])
    assert inputs["past.0.conv"] == outputs["present.0.conv"] == ["batch_size", 80, 3]
    assert sorted(outputs) == sorted(["logits", "present.0.conv", "present.1.key", "present.1.value",
                                      "present.2.conv", "present.3.conv"])
    decoder = json.loads((out / "genai_config.json").read_text())["model"]["decoder"]
    assert decoder["inputs"]["past_conv_names"] == "past.%d.conv"
    assert decoder["outputs"]["present_conv_names"] == "present.%d.conv"
    assert decoder["layer_types"] == CONFIG["layer_types"]
    assert decoder["conv_cache_size"] == 3


def test_genai_greedy_matches_transformers(source, tmp_path):
    assert_same_greedy(build(source, tmp_path / "out", "-p", "fp32"), source, GENAI_PROMPT)


RAGGED = [[7, 3, 11, 19, 23, 29, 31, 37, 41, 43, 47], [5, 17, 33, 12, 99]]


def assert_ragged_batch_matches(out, model):
    """onnxruntime-genai's greedy generation of RAGGED as one right-padded batch equals `model`'s,
    row by row (a row's state must be its last real token's, not the padding's)."""
    from test_sliding_windows import assert_rows_match, genai_generate

    generated = genai_generate(out, RAGGED, MAX_LENGTH)
    assert_rows_match(model, RAGGED, generated, MAX_LENGTH - max(map(len, RAGGED)))


def test_genai_batch_of_different_lengths_matches_transformers(source, tmp_path):
    # genai pads the shorter row on the right (as og.Tokenizer.encode_batch does): its conv state
    # must be the row's last real inputs, not the padding after them.
    out = build(source, tmp_path / "out", "-p", "fp32")
    assert_ragged_batch_matches(out, load(source))


def test_verify_feeds_the_conv_states(source, tmp_path):
    # --verify fed only KV inputs: ONNX Runtime refused the missing past.%d.conv (a traceback).
    from builder.cli import main

    assert main(["-m", str(source), "-o", str(tmp_path / "out"), "-q", "-p", "fp32", "--verify"]) == 0


CASES = {
    "defaults": {},
    "full-attn-idxs": dict(num_hidden_layers=6, full_attn_idxs=[1, 4]),
    "old-spellings": dict(block_ff_dim=4096, tie_embedding=False, block_ffn_dim_multiplier=1.5, block_multiple_of=64),
    "no-adjust": dict(intermediate_size=5000, block_auto_adjust_ff_dim=False, conv_L_cache=5),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_transformers_config(case):
    import architectures
    from transformers.models.lfm2.modeling_lfm2 import Lfm2MLP

    raw = {**CASES[case], "architectures": ["Lfm2ForCausalLM"]}
    c = architectures.load("Lfm2ForCausalLM").parse_config(raw, "Lfm2ForCausalLM")
    want = transformers.Lfm2Config(**CASES[case])
    assert c.layer_types == want.layer_types
    assert c.tie_word_embeddings == want.tie_word_embeddings
    states = [c.layer_state(i) for i in range(c.num_hidden_layers)]
    assert [s.kind for s in states] == want.layer_types
    for s in states:  # conv layers: their last conv_L_cache - 1 inputs; attention layers: a KV cache
        assert (s.conv is None) == (s.kind != "conv") and (s.kv is None) == (s.kind == "conv")
        assert s.conv is None or (s.conv.channels, s.conv.length) == (want.hidden_size, want.conv_L_cache - 1)
    assert c.rope_parameters["rope_theta"] == want.rope_parameters["rope_theta"]
    with torch.device("meta"):
        assert c.feed_forward_size == Lfm2MLP(want).w1.out_features
