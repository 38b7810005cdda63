"""Phi (1.5/2), StableLM, StarCoder2 and Nemotron against transformers: the shared family proofs per
family (tests/family_runner.py: fp32, int4 and fp16 steps, genai's greedy generation), config
parsing; and the blocks they added (lm_head bias, LayerNorm q/k norms)."""


import numpy as np
import pytest
import transformers
from conftest import TINY
from family_runner import families_tests
from helpers import make_checkpoint
from safetensors.numpy import load_file, save_file
from test_blocks import np_layer_norm, run

from builder.blocks import AttentionSpec, AttentionWeights, lm_head, self_attention
from builder.lazy import Weight
from builder.target import Target

GPT = {**TINY, "eos_token_id": 255}
# Each family's features on: biases (made random below), partial rotary whose rotated dims are a
# multiple of 16, windows shorter than the 10-token prompt, tied and untied vocabularies, q/k norms.
VARIANTS = {
    # Phi-2's proportions: head 80, 32 of its dims rotate (partial_rotary_factor 0.4); lm_head bias.
    "phi2": ("PhiConfig", dict(hidden_size=320, partial_rotary_factor=0.4)),
    "phi-tied-qk-layernorm": ("PhiConfig", dict(hidden_size=256, tie_word_embeddings=True, qk_layernorm=True,
                                                 rope_theta=5000.0)),
    # StableLM-3B-4E1T: sequential branches, no biases, a quarter of the 64-wide head rotates.
    "stablelm-3b": ("StableLmConfig", dict(hidden_size=256)),
    # StableLM 2 12B: q/k/v biases, one LayerNorm per head on q and k, parallel branches.
    "stablelm2-12b": ("StableLmConfig", dict(hidden_size=256, use_qkv_bias=True, qk_layernorm=True,
                                             use_parallel_residual=True, tie_word_embeddings=True)),
    "starcoder2-window": ("Starcoder2Config", dict(sliding_window=4, rope_theta=999999.4)),
    "starcoder2-untied-no-bias": ("Starcoder2Config", dict(use_bias=False, tie_word_embeddings=False, head_dim=32)),
    "nemotron-bias": ("NemotronConfig", dict(head_dim=64, attention_bias=True, mlp_bias=True)),
    "nemotron-tied": ("NemotronConfig", dict(head_dim=64, partial_rotary_factor=0.25, tie_word_embeddings=True)),
}


def make(folder, config_class, config):
    """A tiny checkpoint of `config_class`, every bias random (transformers initializes them to zero)."""
    make_checkpoint(folder, config_class, **config)
    tensors = load_file(folder / "model.safetensors")
    rng = np.random.default_rng(1)
    for key in tensors:
        if key.endswith(".bias"):
            tensors[key] = rng.normal(0, 0.2, tensors[key].shape).astype(tensors[key].dtype)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


# The shared proofs (tests/family_runner.py) per family over its variants, fp16 within 1e-2 (two
# layers of float16 rounding); onnxruntime-genai 0.18 has no "stablelm" or "starcoder2" model type:
# "llama" is the same contract. The config proofs are CONFIG_CASES' below.
for config_class, architecture, genai_type in (("PhiConfig", "PhiForCausalLM", "phi"),
                                               ("StableLmConfig", "StableLmForCausalLM", "llama"),
                                               ("Starcoder2Config", "Starcoder2ForCausalLM", "llama"),
                                               ("NemotronConfig", "NemotronForCausalLM", "nemotron")):
    globals().update(families_tests(VARIANTS, {config_class: dict(
        architecture=architecture, genai_type=genai_type,
        make=lambda folder, config, cls=config_class: make(folder, cls, config),
    )}, base=GPT, config_raws=(), fp16_tolerance=1e-2))


# Config parsing: every field the build reads equals what transformers' config class resolves.
CONFIG_CASES = {
    "phi-minimal": ("PhiForCausalLM", {}),
    "phi-2": ("PhiForCausalLM", dict(hidden_size=2560, num_attention_heads=32, partial_rotary_factor=0.4,
                                     vocab_size=51200, intermediate_size=10240, eos_token_id=50256)),
    "phi-old-rope": ("PhiForCausalLM", dict(rope_theta=5e4, rope_scaling=dict(type="linear", factor=2.0))),
    "phi-rope-parameters": ("PhiForCausalLM", dict(rope_parameters=dict(rope_type="default", rope_theta=1e4))),
    "stablelm-minimal": ("StableLmForCausalLM", {}),
    "stablelm-2-1.6b": ("StableLmForCausalLM", dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=24,
                                                    vocab_size=100352, use_qkv_bias=True, bos_token_id=100257,
                                                    eos_token_id=100257, rope_theta=10000)),
    "stablelm-2-12b": ("StableLmForCausalLM", dict(hidden_size=5120, num_key_value_heads=8, qk_layernorm=True,
                                                   use_parallel_residual=True, partial_rotary_factor=0.25)),
    "stablelm-rope-parameters": ("StableLmForCausalLM", dict(rope_parameters=dict(
        rope_type="linear", rope_theta=1e4, factor=2.0, partial_rotary_factor=0.5))),
    "starcoder2-minimal": ("Starcoder2ForCausalLM", {}),
    "starcoder2-3b": ("Starcoder2ForCausalLM", dict(rope_theta=999999.4420358813, sliding_window=4096,
                                                    max_position_embeddings=16384, bos_token_id=0, eos_token_id=0)),
    "starcoder2-rope-scaling": ("Starcoder2ForCausalLM", dict(rope_scaling=dict(rope_type="linear", factor=4.0))),
    "nemotron-minimal": ("NemotronForCausalLM", dict(num_key_value_heads=8)),
    "nemotron-mini-4b": ("NemotronForCausalLM", dict(hidden_size=3072, num_attention_heads=24, num_key_value_heads=8,
                                                     head_dim=128, partial_rotary_factor=0.5, rope_theta=10000)),
    "nemotron-rope-parameters": ("NemotronForCausalLM", dict(num_key_value_heads=8, rope_parameters=dict(
        rope_type="default", rope_theta=1e4, partial_rotary_factor=0.25))),
}
CONFIG_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "hidden_act", "max_position_embeddings", "tie_word_embeddings",
                 "bos_token_id", "eos_token_id", "pad_token_id", "layer_norm_eps", "norm_epsilon", "norm_eps",
                 "qk_layernorm", "use_qkv_bias", "use_parallel_residual", "sliding_window", "use_bias",
                 "attention_bias", "mlp_bias")


@pytest.mark.parametrize("case", sorted(CONFIG_CASES))
def test_config_matches_transformers(case):
    import architectures

    arch, raw = CONFIG_CASES[case]
    ours = architectures.load(arch).parse_config(dict(raw, architectures=[arch]), arch)
    theirs = getattr(transformers, arch.replace("ForCausalLM", "Config"))(**raw)
    for name in CONFIG_FIELDS:
        if hasattr(theirs, name) and name in type(ours).__dataclass_fields__:
            assert getattr(ours, name) == getattr(theirs, name), name
    assert ours.head_dim == (getattr(theirs, "head_dim", None) or theirs.hidden_size // theirs.num_attention_heads)
    strip = lambda d: {k: v for k, v in d.items() if k != "type"}  # noqa: E731
    assert strip(ours.rope_parameters) == strip(theirs.rope_parameters)


def test_nemotron_without_kv_heads_is_refused():
    # transformers' NemotronConfig leaves num_key_value_heads None, and its attention cannot be built.
    import architectures
    from builder.errors import BuildError

    with pytest.raises(BuildError, match="num_key_value_heads"):
        architectures.load("NemotronForCausalLM").parse_config({"architectures": ["NemotronForCausalLM"]},
                                                              "NemotronForCausalLM")


# The blocks these families added, against numpy.
FP32 = Target(io_dtype=np.dtype(np.float32))
RNG = np.random.default_rng(0)


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_lm_head_bias(tied):
    x = RNG.standard_normal((1, 3, 8)).astype(np.float32)
    w, b = RNG.standard_normal((5, 8)).astype(np.float32), RNG.standard_normal(5).astype(np.float32)

    def graph(g, inp):
        shared = g.weight("table", Weight.constant(w)) if tied else None
        return [lm_head(g, inp, Weight.constant(w), FP32, shared=shared, bias=Weight.constant(b))]

    np.testing.assert_allclose(run(graph, x)[0], x @ w.T + b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("per_head", [False, True], ids=["shared-with-bias", "per-head"])
def test_layer_norm_on_q_and_k(per_head):
    # Identity projections and no rotary: the present key is k_norm(x) itself.
    heads, D = 2, 16
    H = heads * D
    x = RNG.standard_normal((1, 1, H)).astype(np.float32)
    shape = (heads, D) if per_head else (D,)
    nw, nb = RNG.standard_normal(shape).astype(np.float32), RNG.standard_normal(shape).astype(np.float32)
    eye = Weight.constant(np.eye(H, dtype=np.float32))

    def graph(g, inp):
        from builder.blocks import sequence_lengths

        mask = g.constant(np.ones((1, 1), np.int64))
        past = tuple(g.constant(np.zeros((1, heads, 0, D), np.float32)) for _ in range(2))
        w = AttentionWeights(o=eye, q=eye, k=eye, v=eye, q_norm=Weight.constant(nw), k_norm=Weight.constant(nw),
                             q_norm_bias=Weight.constant(nb), k_norm_bias=Weight.constant(nb))
        spec = AttentionSpec(heads, heads, D, norm_eps=1e-5, qk_layer_norm=True)
        _, key, _ = self_attention(g, inp, past, sequence_lengths(g, mask), None, w, spec, FP32)
        return [key]

    key = run(graph, x)[0]  # (1, heads, 1, D)
    want = np_layer_norm(x.reshape(heads, D), nw, nb)
    np.testing.assert_allclose(key.reshape(heads, D), want, rtol=1e-4, atol=1e-4)
