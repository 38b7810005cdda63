"""config.json parsing resolves every form and missing key to what transformers' config classes give."""

import pytest
import transformers

import architectures

CASES = {
    "llama-minimal": ("LlamaForCausalLM", {}),
    "llama-old-rope": ("LlamaForCausalLM", dict(rope_theta=500000.0, rope_scaling=dict(type="linear", factor=2.0))),
    "llama-rope-type": ("LlamaForCausalLM", dict(rope_theta=500000.0, rope_scaling=dict(
        rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
        original_max_position_embeddings=8192))),
    "llama-rope-parameters": ("LlamaForCausalLM", dict(rope_parameters=dict(rope_type="yarn", rope_theta=1e6, factor=4.0))),
    "llama-gqa-headdim": ("LlamaForCausalLM", dict(num_attention_heads=8, num_key_value_heads=2, head_dim=96, tie_word_embeddings=True)),
    "mistral-minimal": ("MistralForCausalLM", {}),
    "mistral-no-window": ("MistralForCausalLM", dict(sliding_window=None, rope_theta=1e6)),
    "qwen2-minimal": ("Qwen2ForCausalLM", {}),
    "qwen2-sliding": ("Qwen2ForCausalLM", dict(use_sliding_window=True, sliding_window=128, max_window_layers=20)),
    "qwen2-yarn-old": ("Qwen2ForCausalLM", dict(rope_scaling=dict(type="yarn", factor=4.0, original_max_position_embeddings=32768))),
    "qwen3-minimal": ("Qwen3ForCausalLM", {}),
    "qwen3-explicit": ("Qwen3ForCausalLM", dict(head_dim=64, num_key_value_heads=4, eos_token_id=[1, 2], tie_word_embeddings=True)),
}

CONFIG_CLASSES = {
    "LlamaForCausalLM": transformers.LlamaConfig,
    "MistralForCausalLM": transformers.MistralConfig,
    "Qwen2ForCausalLM": transformers.Qwen2Config,
    "Qwen3ForCausalLM": transformers.Qwen3Config,
}

FIELDS = (
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "hidden_act", "max_position_embeddings", "rms_norm_eps",
    "tie_word_embeddings", "bos_token_id", "eos_token_id", "pad_token_id", "sliding_window",
)


@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_transformers_config(case):
    arch, raw = CASES[case]
    ours = architectures.load(arch).parse_config(dict(raw, architectures=[arch]), arch)
    theirs = CONFIG_CLASSES[arch](**raw)
    for field in FIELDS:
        expected = getattr(theirs, field, None)
        if field == "head_dim" and expected is None:
            expected = theirs.hidden_size // theirs.num_attention_heads
        assert getattr(ours, field) == expected, f"{field}: {getattr(ours, field)!r} != {expected!r}"
    expected_rope = {k: v for k, v in theirs.rope_parameters.items() if k != "type"}
    assert {k: v for k, v in ours.rope_parameters.items() if k != "type"} == expected_rope
    their_layers = getattr(theirs, "layer_types", None)
    if their_layers is not None:
        assert ours.layer_types == their_layers
    elif getattr(theirs, "sliding_window", None) is None:
        assert set(ours.layer_types) == {"full_attention"}
    else:  # Mistral: the window applies to every layer
        assert set(ours.layer_types) == {"sliding_attention"}
    # o_proj bias: Qwen2 never has one; Llama and Qwen3 follow attention_bias.
    assert (ours.attention_bias and arch != "Qwen2ForCausalLM") == bool(getattr(theirs, "attention_bias", False) and arch != "Qwen2ForCausalLM")


def test_unknown_architecture_lists_supported():
    with pytest.raises(architectures.BuildError) as e:
        architectures.load("GPTNeoXForCausalLM")
    message = str(e.value)
    assert "GPTNeoXForCausalLM" in message
    for name in architectures.ARCHITECTURES:
        assert name in message


GEMMA_CASES = {
    "gemma-minimal": ("GemmaForCausalLM", {}),
    "gemma-legacy-gelu": ("GemmaForCausalLM", dict(hidden_act="gelu", head_dim=128)),
    "gemma2-minimal": ("Gemma2ForCausalLM", {}),
    "gemma2-explicit": ("Gemma2ForCausalLM", dict(sliding_window=512, query_pre_attn_scalar=144, num_hidden_layers=5)),
    "gemma3-minimal": ("Gemma3ForCausalLM", {}),
    "gemma3-old-rope": ("Gemma3ForCausalLM", dict(rope_theta=1e6, rope_local_base_freq=1e4,
                                                  rope_scaling={"rope_type": "linear", "factor": 8.0},
                                                  sliding_window=1024, num_hidden_layers=12)),
    "gemma3-pattern": ("Gemma3ForCausalLM", dict(sliding_window_pattern=3, num_hidden_layers=7)),
    "gemma3-new-rope": ("Gemma3ForCausalLM", dict(rope_parameters={
        "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 5e5},
        "sliding_attention": {"rope_type": "default", "rope_theta": 2e4}})),
}


@pytest.mark.parametrize("case", sorted(GEMMA_CASES))
def test_gemma_matches_transformers_config(case):
    arch, raw = GEMMA_CASES[case]
    cls = {"GemmaForCausalLM": transformers.GemmaConfig, "Gemma2ForCausalLM": transformers.Gemma2Config,
           "Gemma3ForCausalLM": transformers.Gemma3TextConfig}[arch]
    theirs = cls(**raw)
    for variant in ([arch, "Gemma3ForConditionalGeneration"] if arch == "Gemma3ForCausalLM" else [arch]):
        given = dict(raw, architectures=[variant])
        if variant == "Gemma3ForConditionalGeneration":  # the same text model, nested as the hub's -it configs
            given = {"architectures": [variant], "text_config": dict(raw, model_type="gemma3_text")}
        ours = architectures.load(variant).parse_config(given, variant)
        for field in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                      "num_key_value_heads", "head_dim", "max_position_embeddings", "rms_norm_eps",
                      "tie_word_embeddings", "bos_token_id", "eos_token_id", "pad_token_id"):
            assert getattr(ours, field) == getattr(theirs, field), field
        act = getattr(theirs, "hidden_activation", None) or theirs.hidden_act
        assert ours.hidden_activation == act
        assert ours.layer_types == getattr(theirs, "layer_types", ours.layer_types)
        for field in ("sliding_window", "query_pre_attn_scalar", "final_logit_softcapping", "attn_logit_softcapping"):
            assert getattr(ours, field) == getattr(theirs, field, None), field
        expected = theirs.rope_parameters
        strip = lambda d: {k: v for k, v in d.items() if k != "type"}  # noqa: E731
        if "full_attention" in expected:
            assert {t: strip(p) for t, p in ours.rope_parameters.items()} == {t: strip(p) for t, p in expected.items()}
        else:
            assert strip(ours.rope_parameters) == strip(expected)


LONGROPE = {"short_factor": [1.0] * 48, "long_factor": [2.0] * 48}
PHI3_CASES = {
    "phi3-minimal": {},
    "phi3-mini-4k": dict(sliding_window=2047, rope_theta=10000.0),
    "phi3.5-type-longrope": dict(max_position_embeddings=131072, original_max_position_embeddings=4096,
                                 rope_scaling={"type": "longrope", **LONGROPE}),
    "phi4-mini-rope-type": dict(max_position_embeddings=131072, original_max_position_embeddings=4096,
                                partial_rotary_factor=0.75, tie_word_embeddings=True, num_attention_heads=24,
                                num_key_value_heads=8,
                                rope_scaling={"rope_type": "longrope", **LONGROPE}),
    "phi4-mini-rope-parameters": dict(max_position_embeddings=131072, original_max_position_embeddings=4096,
                                      num_attention_heads=24,
                                      rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                                                       "partial_rotary_factor": 0.75, **LONGROPE}),
    "phi4": dict(rope_theta=250000.0, num_key_value_heads=10, num_attention_heads=40, hidden_size=5120),
}


@pytest.mark.parametrize("case", sorted(PHI3_CASES))
def test_phi3_matches_transformers_config(case):
    raw = PHI3_CASES[case]
    ours = architectures.load("Phi3ForCausalLM").parse_config(dict(raw, architectures=["Phi3ForCausalLM"]),
                                                             "Phi3ForCausalLM")
    theirs = transformers.Phi3Config(**raw)
    for field in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                  "num_key_value_heads", "max_position_embeddings", "original_max_position_embeddings",
                  "rms_norm_eps", "tie_word_embeddings", "bos_token_id", "eos_token_id", "pad_token_id",
                  "sliding_window", "hidden_act"):
        assert getattr(ours, field) == getattr(theirs, field), field
    assert ours.head_dim == theirs.hidden_size // theirs.num_attention_heads
    strip = lambda d: {k: v for k, v in d.items() if k != "type"}  # noqa: E731
    assert strip(ours.rope_parameters) == strip(theirs.rope_parameters)
