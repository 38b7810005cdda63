"""Granite, SmolLM3, Seed-OSS, ERNIE 4.5, Ministral and Ministral 3 against transformers: the shared
family proofs per family (tests/family_runner.py: fp32 and int4 steps, onnxruntime-genai's greedy
tokens), config.json parsing, and Ministral 3's attention temperature block against its formula."""

import numpy as np
import onnx_ir as ir
import onnxruntime as ort
import pytest
import transformers
from family_runner import families_tests

import architectures
from builder.blocks import sequence_lengths
from builder.blocks.attention_positions import attention_temperature
from builder.graph import Graph
from builder.target import Target

YARN = dict(rope_type="yarn", rope_theta=1e6, factor=4.0, original_max_position_embeddings=4, beta_fast=32.0,
            beta_slow=1.0, mscale=1.0, mscale_all_dim=1.0)
# Every feature on, and tiny: windows shorter than the 10-token prompt, multipliers far from 1, a
# temperature that changes every 4 positions, biases, head_dim apart from hidden / heads.
VARIANTS = {
    "granite": ("GraniteConfig", dict(embedding_multiplier=3.0, residual_multiplier=0.5, attention_multiplier=0.09,
                                      logits_scaling=4.0, attention_bias=True, mlp_bias=True)),
    "granite-tied": ("GraniteConfig", dict(embedding_multiplier=12.0, residual_multiplier=0.22,
                                           attention_multiplier=0.015625, logits_scaling=8.0, tie_word_embeddings=True)),
    "smollm3": ("SmolLM3Config", dict(num_hidden_layers=4, no_rope_layer_interval=2, tie_word_embeddings=False,
                                      attention_bias=True, pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    "smollm3-window": ("SmolLM3Config", dict(num_hidden_layers=4, no_rope_layers=[1, 0, 0, 1], use_sliding_window=True,
                                             sliding_window=4, pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    "seed_oss": ("SeedOssConfig", dict(head_dim=32)),
    "seed_oss-out-bias": ("SeedOssConfig", dict(head_dim=16, attention_out_bias=True, mlp_bias=True,
                                                 tie_word_embeddings=True)),
    "ernie4_5": ("Ernie4_5Config", dict(use_bias=True, head_dim=32)),
    "ernie4_5-untied": ("Ernie4_5Config", dict(head_dim=16, tie_word_embeddings=False)),
    "ministral": ("MinistralConfig", dict(head_dim=16, sliding_window=4,
                                          layer_types=["sliding_attention", "full_attention"])),
    "ministral3": ("Ministral3Config", dict(head_dim=16, rope_parameters=dict(YARN, llama_4_scaling_beta=0.5))),
    "ministral3-window": ("Ministral3Config", dict(head_dim=32, sliding_window=4, tie_word_embeddings=True,
                                                   rope_parameters=dict(YARN, llama_4_scaling_beta=0.1))),
}
# The shared proofs (tests/family_runner.py) per family, over its variants, with its genai type and
# the variant genai runs (with a seed whose greedy continuation has no near-tie early on: Granite's
# logits / 4 narrow the gaps); the config proofs are CONFIG_CASES' below (windows, more fields).
globals().update(families_tests(VARIANTS, {
    "GraniteConfig": dict(architecture="GraniteForCausalLM", genai_type="granite", genai_variant="granite",
                          genai_seed=5),
    "SmolLM3Config": dict(architecture="SmolLM3ForCausalLM", genai_type="smollm3", genai_variant="smollm3-window"),
    "SeedOssConfig": dict(architecture="SeedOssForCausalLM", genai_type="llama", genai_variant="seed_oss"),
    "Ernie4_5Config": dict(architecture="Ernie4_5ForCausalLM", genai_type="ernie4_5", genai_variant="ernie4_5"),
    "MinistralConfig": dict(architecture="MinistralForCausalLM", genai_type="mistral"),
    "Ministral3Config": dict(architecture="Ministral3ForCausalLM", genai_type="mistral", genai_variant="ministral3",
                             genai_seed=1),
}, config_raws=()))


MINISTRAL3_HUB_ROPE = dict(type="yarn", rope_type="yarn", rope_theta=1e6, factor=16.0, beta_fast=32.0, beta_slow=1.0,
                           mscale=1.0, mscale_all_dim=1.0, original_max_position_embeddings=16384,
                           llama_4_scaling_beta=0.1)
CONFIG_CASES = {
    "granite-minimal": ("GraniteForCausalLM", {}),
    "granite-3.3": ("GraniteForCausalLM", dict(embedding_multiplier=12.0, residual_multiplier=0.22, logits_scaling=8.0,
                                               attention_multiplier=0.015625, rope_theta=1e7, num_key_value_heads=8)),
    "granite-old-rope": ("GraniteForCausalLM", dict(rope_scaling=dict(type="linear", factor=2.0))),
    "smollm3-minimal": ("SmolLM3ForCausalLM", {}),
    "smollm3-list": ("SmolLM3ForCausalLM", dict(num_hidden_layers=4, no_rope_layers=[1, 0, 1, 1], rope_theta=5e6)),
    "smollm3-sliding": ("SmolLM3ForCausalLM", dict(num_hidden_layers=8, use_sliding_window=True, sliding_window=512)),
    "smollm3-layer-types": ("SmolLM3ForCausalLM", dict(num_hidden_layers=2, sliding_window=64,
                                                       layer_types=["sliding_attention", "full_attention"])),
    "smollm3-yarn": ("SmolLM3ForCausalLM", dict(rope_scaling=dict(type="yarn", factor=2.0,
                                                                  original_max_position_embeddings=65536))),
    "seed_oss-minimal": ("SeedOssForCausalLM", {}),
    "seed_oss-36b": ("SeedOssForCausalLM", dict(hidden_size=5120, rope_theta=1e7, attention_out_bias=False)),
    "ernie4_5-minimal": ("Ernie4_5ForCausalLM", {}),
    "ernie4_5-bias": ("Ernie4_5ForCausalLM", dict(use_bias=True, rope_theta=10000.0, tie_word_embeddings=False)),
    "ministral-minimal": ("MinistralForCausalLM", dict(head_dim=128)),
    "ministral-8b": ("MinistralForCausalLM", dict(head_dim=128, sliding_window=32768, rope_theta=1e8,
                                                  layer_types=["full_attention"] + ["sliding_attention"] * 31)),
    "ministral3-minimal": ("Ministral3ForCausalLM", {}),
    "ministral3-theta-only": ("Ministral3ForCausalLM", dict(rope_theta=5e5)),
    "ministral3-hub": ("Ministral3ForCausalLM", dict(rope_parameters=MINISTRAL3_HUB_ROPE, tie_word_embeddings=True)),
    "ministral3-old-rope": ("Ministral3ForCausalLM", dict(rope_scaling=dict(
        type="yarn", factor=4.0, original_max_position_embeddings=64, llama_4_scaling_beta=0.2))),
}
CONFIG_CLASSES = {
    "GraniteForCausalLM": transformers.GraniteConfig, "SmolLM3ForCausalLM": transformers.SmolLM3Config,
    "SeedOssForCausalLM": transformers.SeedOssConfig, "Ernie4_5ForCausalLM": transformers.Ernie4_5Config,
    "MinistralForCausalLM": transformers.MinistralConfig, "Ministral3ForCausalLM": transformers.Ministral3Config,
}
FIELDS = (
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "hidden_act", "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings",
    "bos_token_id", "eos_token_id", "pad_token_id", "sliding_window", "embedding_multiplier", "residual_multiplier",
    "attention_multiplier", "logits_scaling", "no_rope_layers", "attention_out_bias", "use_bias", "mlp_bias",
)


@pytest.mark.parametrize("case", sorted(CONFIG_CASES))
def test_config_matches_transformers(case):
    arch, raw = CONFIG_CASES[case]
    ours = architectures.load(arch).parse_config(dict(raw, architectures=[arch]), arch)
    theirs = CONFIG_CLASSES[arch](**raw)
    for name in FIELDS:
        if hasattr(theirs, name):
            assert getattr(ours, name) == getattr(theirs, name), name
    assert ours.head_dim == (getattr(theirs, "head_dim", None) or theirs.hidden_size // theirs.num_attention_heads)
    strip = lambda d: {k: v for k, v in d.items() if k != "type"}  # noqa: E731
    assert strip(ours.rope_parameters) == strip(theirs.rope_parameters)
    # Layers without a `layer_types` (Granite, Seed-OSS, ERNIE, Ministral 3 as Mistral) share one window.
    types = getattr(theirs, "layer_types", None) if arch != "Ministral3ForCausalLM" else None
    window = getattr(theirs, "sliding_window", None)
    window = window if window and window < theirs.max_position_embeddings else None
    assert [ours.window(i) for i in range(ours.num_hidden_layers)] == (
        [window if t == "sliding_attention" else None for t in types] if types else [window] * ours.num_hidden_layers)


@pytest.mark.parametrize("prompt_lengths", [[10], [3, 7]])
def test_attention_temperature(prompt_lengths):
    # 1 + beta·log(1 + ⌊position / original⌋) for every new token of a first prompt (right-padded
    # to the longest in the batch), then of a decode step: as get_llama_4_attn_scale computes it.
    beta, original, width = 0.3, 3, max(prompt_lengths)
    g, target = Graph(), Target(io_dtype=np.dtype(np.float32))
    ids = ir.Value(name="input_ids", type=ir.TensorType(ir.DataType.INT64), shape=ir.Shape(["B", "S"]))
    mask = ir.Value(name="attention_mask", type=ir.TensorType(ir.DataType.INT64), shape=ir.Shape(["B", "T"]))
    out = attention_temperature(g, ids, sequence_lengths(g, mask), beta, original, target)
    out.name = "scale"
    proto = ir.serde.serialize_model(g.model([ids, mask], [out]))
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])

    def expected(positions):
        return (1 + beta * np.log(1 + np.floor(np.asarray(positions, np.float32) / original))).astype(np.float32)

    batch = len(prompt_lengths)
    prompt_mask = np.array([[1] * n + [0] * (width - n) for n in prompt_lengths], np.int64)
    got = session.run(None, {"input_ids": np.zeros((batch, width), np.int64), "attention_mask": prompt_mask})[0]
    np.testing.assert_allclose(got[..., 0], np.stack([expected(range(width))] * batch), rtol=1e-6)
    step_mask = np.array([[1] * (n + 1) + [0] * (width - n) for n in prompt_lengths], np.int64)
    got = session.run(None, {"input_ids": np.zeros((batch, 1), np.int64), "attention_mask": step_mask})[0]
    np.testing.assert_allclose(got[:, 0, 0], expected(prompt_lengths), rtol=1e-6)
