"""Arcee (a family added as one file, architectures/arcee.py) against transformers: the shared
family proofs (tests/family_runner.py) on a YaRN variant with biases and a tied one."""

from family_runner import CONFIG_FIELDS, FamilyTest, family_tests

# YaRN with a pretraining length shorter than the 10-token prompt, so the scaled frequencies matter.
YARN = dict(rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=4, beta_fast=32.0,
            beta_slow=1.0)
VARIANTS = {
    "tied": dict(tie_word_embeddings=True, bos_token_id=1, eos_token_id=2),
    "yarn-biases": dict(rope_parameters=YARN, attention_bias=True, mlp_bias=True, head_dim=32),
}

globals().update(family_tests(FamilyTest(
    "ArceeForCausalLM", "ArceeConfig", VARIANTS,
    genai_variant="yarn-biases", ragged=True, fp16_tolerance=1e-2,
    config_raws=({}, dict(rope_scaling=dict(type="yarn", factor=20.0, original_max_position_embeddings=4096),
                          num_key_value_heads=4, num_attention_heads=20, head_dim=128)),
    config_fields=(*CONFIG_FIELDS, "head_dim", "rms_norm_eps", "attention_bias", "mlp_bias"),
)))
