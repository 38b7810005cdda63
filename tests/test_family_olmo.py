"""OLMo, OLMo 2, OLMo 3 and EXAONE 4 against transformers: the shared family proofs
(tests/family_runner.py: fp32 and int4 steps, genai greedy, OLMo 3's ragged batch) per
architecture, config.json parsing against their config classes, and their blocks against numpy."""

import numpy as np
import pytest
import transformers
from conftest import TINY
from family_runner import families_tests
from helpers import GENAI_PROMPT, make_checkpoint
from safetensors.numpy import load_file, save_file
from test_blocks import EPS, np_layer_norm, np_rms_norm, run

from builder.blocks import (
    AttentionSpec,
    AttentionWeights,
    ResidualStream,
    SequenceLengths,
    self_attention,
)
from builder.lazy import Weight
from builder.target import Target

BASE = {**TINY, "eos_token_id": 255}
# Each with its features on: clip_qkv that clamps (the tiny projections reach about ±0.5) and
# random q/k/v/o biases; GQA for the whole-projection k_norm; windows shorter than the 10-token
# prompt; OLMo 3's yarn on full layers; EXAONE 4's global layers without rotary.
VARIANTS = {
    "olmo": ("OlmoConfig", dict(clip_qkv=0.15, attention_bias=True, tie_word_embeddings=True, rope_theta=1000.0)),
    "olmo2": ("Olmo2Config", dict(attention_bias=True, rms_norm_eps=1e-6,
                                  rope_scaling={"rope_type": "linear", "factor": 2.0})),
    "olmo3": ("Olmo3Config", dict(num_hidden_layers=3, sliding_window=4, rope_theta=10_000.0,
                                  layer_types=["sliding_attention", "sliding_attention", "full_attention"],
                                  rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32})),
    "exaone4": ("Exaone4Config", dict(num_hidden_layers=3, sliding_window=4, sliding_window_pattern=2, rope_theta=1e4,
                                      rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                    "high_freq_factor": 4.0, "original_max_position_embeddings": 32})),
    "exaone4-global": ("Exaone4Config", dict(sliding_window=None, sliding_window_pattern=None, tie_word_embeddings=True,
                                             layer_types=["full_attention"] * 2, head_dim=32)),
}


def make(folder, config_class, config):
    """A tiny random checkpoint of `config_class` with random biases (transformers initializes them to zero)."""
    make_checkpoint(folder, config_class, **config)
    tensors = load_file(folder / "model.safetensors")
    rng = np.random.default_rng(1)
    for key, value in tensors.items():
        if key.endswith(".bias"):
            tensors[key] = (0.1 * rng.standard_normal(value.shape)).astype(value.dtype)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


# The shared proofs (tests/family_runner.py) per architecture, over its variants (OLMo 3's with a
# ragged batch in genai); the config proofs are CASES' below, which check more than the runner's.
for config_class, architecture, genai_type in (("OlmoConfig", "OlmoForCausalLM", "olmo"),
                                               ("Olmo2Config", "Olmo2ForCausalLM", "olmo"),
                                               ("Olmo3Config", "Olmo3ForCausalLM", "olmo"),
                                               ("Exaone4Config", "Exaone4ForCausalLM", "decoder")):
    globals().update(families_tests(VARIANTS, {config_class: dict(
        architecture=architecture, genai_type=genai_type, ragged=config_class == "Olmo3Config",
        make=lambda folder, config, cls=config_class: make(folder, cls, config),
        layer_lists=config_class in ("Olmo3Config", "Exaone4Config"),
    )}, base=BASE, config_raws=()))


def test_clip_qkv_clamps(tmp_path):
    # Without the clamp the tiny OLMo's logits differ from transformers': the test above would see it.
    import torch

    source = make(tmp_path / "src", "OlmoConfig", {**BASE, **VARIANTS["olmo"][1]})
    model = transformers.AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    seen = []
    model.model.layers[0].self_attn.q_proj.register_forward_hook(lambda m, i, o: seen.append(float(o.abs().max())))
    with torch.no_grad():
        model(torch.tensor([GENAI_PROMPT]))
    assert seen[0] > VARIANTS["olmo"][1]["clip_qkv"]


CASES = {
    "olmo-minimal": ("OlmoForCausalLM", {}),
    "olmo-explicit": ("OlmoForCausalLM", dict(clip_qkv=8.0, num_key_value_heads=8, rope_theta=5e5, tie_word_embeddings=True,
                                              rope_scaling={"type": "linear", "factor": 2.0})),
    "olmo2-minimal": ("Olmo2ForCausalLM", {}),
    "olmo2-explicit": ("Olmo2ForCausalLM", dict(rms_norm_eps=1e-6, rope_theta=5e5, head_dim=64, eos_token_id=[1, 2],
                                                rope_parameters={"rope_type": "yarn", "rope_theta": 5e5, "factor": 4.0})),
    "olmo3-minimal": ("Olmo3ForCausalLM", {}),
    "olmo3-yarn": ("Olmo3ForCausalLM", dict(rope_theta=5e5, sliding_window=1024, num_hidden_layers=8, rope_scaling={
        "rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 8192, "attention_factor": 1.2,
        "beta_fast": 32, "beta_slow": 1})),
    "olmo3-theta": ("Olmo3ForCausalLM", dict(rope_theta=1e4, rope_scaling={"type": "linear", "factor": 2.0})),
    "olmo3-layer-types": ("Olmo3ForCausalLM", dict(num_hidden_layers=3, layer_types=["full_attention"] * 3,
                                                   rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e4},
                                                                    "sliding_attention": {"rope_type": "default", "rope_theta": 2e4}})),
    "exaone4-minimal": ("Exaone4ForCausalLM", {}),
    "exaone4-32b": ("Exaone4ForCausalLM", dict(head_dim=128, num_key_value_heads=8, sliding_window_pattern=4, rope_theta=1e6,
                                               max_position_embeddings=131072, rope_scaling={
                                                   "rope_type": "llama3", "factor": 16.0, "low_freq_factor": 1.0,
                                                   "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})),
    "exaone4-global": ("Exaone4ForCausalLM", dict(sliding_window=None, sliding_window_pattern=None,
                                                  layer_types=["full_attention"] * 32, tie_word_embeddings=True)),
}
CONFIG_CLASSES = {"OlmoForCausalLM": transformers.OlmoConfig, "Olmo2ForCausalLM": transformers.Olmo2Config,
                  "Olmo3ForCausalLM": transformers.Olmo3Config, "Exaone4ForCausalLM": transformers.Exaone4Config}
FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
          "num_key_value_heads", "hidden_act", "max_position_embeddings", "tie_word_embeddings", "bos_token_id",
          "eos_token_id", "pad_token_id")


@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_transformers_config(case):
    import architectures

    arch, raw = CASES[case]
    ours = architectures.load(arch).parse_config(dict(raw, architectures=[arch]), arch)
    theirs = CONFIG_CLASSES[arch](**raw)
    for name in FIELDS + ("rms_norm_eps", "clip_qkv", "attention_bias", "sliding_window", "layer_types"):
        if hasattr(theirs, name):
            assert getattr(ours, name) == getattr(theirs, name), name
    assert ours.head_dim == (getattr(theirs, "head_dim", None) or theirs.hidden_size // theirs.num_attention_heads)
    strip = lambda d: {k: v for k, v in d.items() if k != "type"}  # noqa: E731
    expected = theirs.rope_parameters
    if "full_attention" in expected:
        assert {t: strip(ours.rope_parameters[t]) for t in ours.layer_types} == \
            {t: strip(expected[t]) for t in ours.layer_types}
    else:
        assert strip(ours.rope_parameters) == strip(expected)
    if arch == "Exaone4ForCausalLM":
        assert [ours.rotates(i) for i in range(ours.num_hidden_layers)] == \
            [theirs.sliding_window is None or t == "sliding_attention" for t in theirs.layer_types]


@pytest.mark.parametrize("raw", [dict(sliding_window_pattern="LLLG"), dict(sliding_window=None)])
def test_exaone4_needs_layer_types_where_transformers_does(raw):
    import architectures

    with pytest.raises(architectures.BuildError, match="layer_types"):
        architectures.load("Exaone4ForCausalLM").parse_config(raw, "Exaone4ForCausalLM")
    with pytest.raises((TypeError, ZeroDivisionError)):
        transformers.Exaone4Config(**raw)


def test_weightless_layer_norm_stream():
    # OLMo's LayerNorm: no weight, no bias; the stream's width gives the ones and zeros.
    x = np.random.default_rng(0).standard_normal((2, 3, 16)).astype(np.float32)

    def graph(g, inp):
        stream = ResidualStream(g, inp, EPS, Target(io_dtype=np.dtype(np.float32)), layer_norm=True, hidden_size=16)
        with g.scope("n1"):
            h = stream.norm(None)
        stream.add(g.op.Mul(h, g.constant(3.0, np.float32)))
        with g.scope("n2"):
            return [stream.norm(None)]

    (out,) = run(graph, x)
    one, zero = np.ones(16, np.float32), np.zeros(16, np.float32)
    np.testing.assert_allclose(out, np_layer_norm(x + 3 * np_layer_norm(x, one, zero), one, zero), rtol=1e-5, atol=1e-5)


def test_attention_whole_projection_qk_norm_and_clip():
    # OLMo 2's q/k RMSNorm over all heads at once, and OLMo's clamp of q, k and v, against numpy.
    rng = np.random.default_rng(0)
    S, H, heads, kv, D, clip = 5, 16, 4, 2, 8, 0.3
    x = rng.standard_normal((1, S, H)).astype(np.float32)
    wq, wk, wv = (rng.standard_normal((n * D, H)).astype(np.float32) for n in (heads, kv, kv))
    wo = rng.standard_normal((H, heads * D)).astype(np.float32)
    nq, nk = ((1 + 0.2 * rng.standard_normal(n * D)).astype(np.float32) for n in (heads, kv))

    def graph(g, inp):
        empty = g.constant(np.zeros((1, kv, 0, D), np.float32))
        lengths = SequenceLengths(g.constant([S - 1], np.int32), g.constant(S, np.int32))
        weights = AttentionWeights(o=Weight.constant(wo), q=Weight.constant(wq), k=Weight.constant(wk),
                                   v=Weight.constant(wv), q_norm=Weight.constant(nq), k_norm=Weight.constant(nk))
        spec = AttentionSpec(heads, kv, D, norm_eps=EPS, qk_norm_whole=True, clip_qkv=clip)
        return [self_attention(g, inp, (empty, empty), lengths, None, weights, spec, Target(io_dtype=np.dtype(np.float32)))[0]]

    (out,) = run(graph, x)
    q, k, v = (np.clip(x[0] @ w.T, -clip, clip) for w in (wq, wk, wv))
    q, k = np_rms_norm(q, nq), np_rms_norm(k, nk)
    heads_out = []
    for h in range(heads):
        group = slice(h // (heads // kv) * D, (h // (heads // kv) + 1) * D)
        scores = q[:, h * D:(h + 1) * D] @ k[:, group].T / np.sqrt(D) + np.triu(np.full((S, S), -np.inf), 1)
        p = np.exp(scores - scores.max(-1, keepdims=True))
        heads_out.append((p / p.sum(-1, keepdims=True)) @ v[:, group])
    np.testing.assert_allclose(out[0], np.concatenate(heads_out, -1) @ wo.T, rtol=1e-4, atol=1e-5)
