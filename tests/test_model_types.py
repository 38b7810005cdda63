"""The hub's other names for families builder builds (Family.model_types): checkpoints whose
`model_type` transformers 5.25 builds with an existing class (InternLM3, IQuest-Coder and EXAONE 3
as LlamaForCausalLM; Sarvam-MoE and Param2-MoE as Glm4MoeForCausalLM; Sarvam-MLA as
DeepseekV3ForCausalLM), written as the hub writes them (their own class name and auto_map, their
config class's keys, their stored tensor names: EXAONE 3's `transformer.h.*`, Sarvam's
`word_embeddings`, `attention.query_key_value`, `dense`, `expert_bias`), loaded by transformers
into the mapped class and built by builder to the same logits. Before the table, each was refused."""

import json

import numpy as np
import pytest
import transformers
from conftest import TINY
from helpers import assert_parity, build, make_checkpoint
from safetensors.numpy import load_file, save_file

import architectures
from builder.cli import main
from builder.inputs.renamed import renamed_name

# EXAONE 3's stored names (transformer.h.N.attn.attention.q_proj, c_fc_0, ...) from Llama's: the
# inverse of its conversion rules, as the hub checkpoints store them.
EXAONE_STORED = (
    (r"^model\.embed_tokens\.", "transformer.wte."), (r"^model\.layers\.", "transformer.h."),
    (r"^model\.norm\.", "transformer.ln_f."), (r"\.self_attn\.o_proj\.", ".attn.attention.out_proj."),
    (r"\.self_attn\.", ".attn.attention."), (r"\.input_layernorm\.", ".ln_1."),
    (r"\.post_attention_layernorm\.", ".ln_2."), (r"\.mlp\.gate_proj\.", ".mlp.c_fc_0."),
    (r"\.mlp\.up_proj\.", ".mlp.c_fc_1."), (r"\.mlp\.down_proj\.", ".mlp.c_proj."),
)
SARVAM_KEYS = {"n_routed_experts": "num_experts", "n_shared_experts": "num_shared_experts",
               "attention_bias": "use_qkv_bias"}
# model_type -> (transformers' config class, the hub's class name, config.json keys in the hub's
# spelling (its config class's attribute_map), the stored tensor names)
CASES = {
    "internlm3": ("InternLM3Config", "InternLM3ForCausalLM", {"attention_bias": "qkv_bias", "mlp_bias": "bias"}, ()),
    "iquestcoder": ("IQuestCoderConfig", "IQuestCoderForCausalLM", {}, ()),
    "exaone": ("ExaoneConfig", "ExaoneForCausalLM", {"num_hidden_layers": "num_layers",
                                                     "rms_norm_eps": "layer_norm_epsilon",
                                                     "hidden_act": "activation_function"}, EXAONE_STORED),
    # transformers saves these in the hub's own layout already (its conversion rules, reversed)
    "sarvam_moe": ("SarvamMoEConfig", "SarvamMoEForCausalLM", SARVAM_KEYS, ()),
    "param2moe": ("Param2MoeConfig", "Param2MoeForCausalLM", SARVAM_KEYS, ()),
    "sarvam_mla": ("SarvamMLAConfig", "SarvamMLAForCausalLM", {"n_routed_experts": "num_experts"}, ()),
}
# Every feature on: experts routed top-2 of 4 after a dense layer, a shared expert, q/k norms,
# fused q/k/v with biases (random: transformers initializes them to zero).
EXPERTS = dict(moe_intermediate_size=32, n_routed_experts=4, num_experts_per_tok=2, first_k_dense_replace=1,
               num_hidden_layers=3, n_shared_experts=1, initializer_range=0.1)
CONFIGS = {
    "sarvam_moe": dict(EXPERTS, use_qkv_bias=True),
    "param2moe": dict(EXPERTS, tie_word_embeddings=False),
    "sarvam_mla": dict(EXPERTS, num_key_value_heads=4, q_lora_rank=48, kv_lora_rank=32, qk_rope_head_dim=16,
                       qk_nope_head_dim=24, v_head_dim=20),
}


MAPPED = {"sarvam_moe": "Glm4MoeForCausalLM", "param2moe": "Glm4MoeForCausalLM", "sarvam_mla": "DeepseekV3ForCausalLM"}
GENAI = {"sarvam_moe": "chatglm", "param2moe": "chatglm"}


def hub_checkpoint(folder, model_type, **config):
    """A tiny random checkpoint of `model_type` as the hub stores it."""
    config_class, hub_class, keys, stored = CASES[model_type]
    make_checkpoint(folder, config_class, **{**TINY, "head_dim": 16, **CONFIGS.get(model_type, {}), **config})
    tensors = load_file(folder / "model.safetensors")
    rng = np.random.default_rng(1)
    for key, value in tensors.items():  # random biases; the sigmoid routers' correction bias spreads
        if key.endswith(("expert_bias", "e_score_correction_bias", ".bias")):  # their scores (no ties)
            tensors[key] = rng.standard_normal(value.shape).astype(value.dtype)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    raw = json.loads((folder / "config.json").read_text())
    raw = {keys.get(k, k): v for k, v in raw.items()}
    raw.update(architectures=[hub_class], auto_map={"AutoModelForCausalLM": f"modeling_{model_type}.{hub_class}"})
    (folder / "config.json").write_text(json.dumps(raw))
    if stored:
        tensors = load_file(folder / "model.safetensors")
        save_file({renamed_name(k, stored): v for k, v in tensors.items()}, folder / "model.safetensors",
                  metadata={"format": "pt"})
    return folder


@pytest.mark.parametrize("model_type", sorted(CASES))
def test_hub_checkpoint_matches_transformers(model_type, tmp_path):
    biases = dict(attention_bias=True, mlp_bias=True) if model_type == "internlm3" else {}
    source = hub_checkpoint(tmp_path / "src", model_type, tie_word_embeddings=model_type == "exaone", **biases)
    model = transformers.AutoModelForCausalLM.from_pretrained(source)  # no remote code: transformers' own mapping
    assert type(model).__name__ == MAPPED.get(model_type, "LlamaForCausalLM")
    out = build(source, tmp_path / "out", "-p", "fp32")
    assert json.loads((out / "genai_config.json").read_text())["model"]["type"] == GENAI.get(model_type, "llama")
    assert_parity(out, source, tolerance=1e-4)


@pytest.mark.parametrize("model_type, stored", [("exaone", "transformer.h.0.attn.attention.q_proj.weight"),
                                                 ("sarvam_moe", "model.layers.0.attention.query_key_value.weight")])
def test_int4_reads_the_stored_names(model_type, stored, tmp_path):
    source = hub_checkpoint(tmp_path / "src", model_type)
    assert stored in load_file(source / "model.safetensors")
    build(source, tmp_path / "out", "-p", "int4")  # every session opens


def test_fused_rows_that_do_not_add_up_are_refused(tmp_path, capsys):
    source = hub_checkpoint(tmp_path / "src", "sarvam_moe")
    raw = json.loads((source / "config.json").read_text())
    (source / "config.json").write_text(json.dumps({**raw, "num_key_value_heads": 1}))
    assert main(["-m", str(source), "-o", str(tmp_path / "out"), "-q", "-p", "fp32"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]  # after the checkpoint writer's progress
    assert err == ("error: model.layers.0.attention.query_key_value.bias has shape [128], not the 64 + 16 + 16 "
                   "rows its model type splits it into (config.json's heads and head_dim)")
    assert not (tmp_path / "out").exists()


def test_an_unknown_tensor_is_named_as_the_family_reads_it(tmp_path, capsys):
    source = hub_checkpoint(tmp_path / "src", "exaone")
    tensors = load_file(source / "model.safetensors")
    tensors["transformer.h.0.attn.attention.extra.weight"] = tensors["transformer.ln_f.weight"]
    save_file(tensors, source / "model.safetensors", metadata={"format": "pt"})
    assert main(["-m", str(source), "-o", str(tmp_path / "out"), "-q", "-p", "fp32"]) == 2
    err = capsys.readouterr().err
    assert "does not use: model.layers.0.self_attn.extra.weight" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("model_type", sorted(CASES))
def test_config_class_defaults_are_its_own(model_type):
    # config.json with nothing but the names: the row's defaults are the config class's, not Llama's
    config_class, hub_class, _, _ = CASES[model_type]
    ours = architectures.load(hub_class).parse_config({"architectures": [hub_class], "model_type": model_type}, hub_class)
    theirs = getattr(transformers, config_class)()
    latent = ("q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")
    heads = latent if model_type == "sarvam_mla" else ("num_key_value_heads", "head_dim")  # MLA: one latent KV head
    experts = ("moe_intermediate_size", "n_routed_experts", "n_shared_experts", "num_experts_per_tok",
               "routed_scaling_factor", "n_group", "topk_group", "first_k_dense_replace", "norm_topk_prob")
    for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", *heads,
                 "max_position_embeddings", "rms_norm_eps", "bos_token_id", "eos_token_id", "pad_token_id",
                 "tie_word_embeddings", *(experts if hasattr(theirs, "n_routed_experts") else ())):
        assert getattr(ours, name) == getattr(theirs, name), name
    assert ours.rope_parameters["rope_theta"] == theirs.rope_parameters["rope_theta"]


def test_listed_with_the_family():
    assert {"InternLM3ForCausalLM", "IQuestCoderForCausalLM", "ExaoneForCausalLM"} <= set(architectures.ARCHITECTURES)
    # (a subset: a family adds its own model types in its own module)
    assert {t: a for t, (a, _) in architectures.MODEL_TYPES.items()}.items() >= {
        "internlm3": "InternLM3ForCausalLM", "iquestcoder": "IQuestCoderForCausalLM", "exaone": "ExaoneForCausalLM",
        "sarvam_moe": "SarvamMoEForCausalLM", "param2moe": "Param2MoeForCausalLM", "sarvam_mla": "SarvamMLAForCausalLM",
        "phimoe": "PhimoeForCausalLM"}.items()  # microsoft/Phi-3.5-MoE-instruct says PhiMoEForCausalLM


@pytest.mark.parametrize("raw", [dict(qkv_bias=True), dict(bias=True), dict(qkv_bias=False, bias=True)])
def test_internlm3_with_two_bias_settings_is_refused_as_transformers_refuses_it(raw):
    # InternLM3Config.validate_architecture refuses qkv_bias != bias: Llama's layer has one setting
    with pytest.raises(Exception, match="qkv_bias"):  # huggingface_hub's strict-dataclass validation error
        transformers.InternLM3Config(**raw)
    family = architectures.load("InternLM3ForCausalLM")
    config = {**raw, "architectures": ["InternLM3ForCausalLM"], "model_type": "internlm3"}
    with pytest.raises(architectures.BuildError, match="one bias setting"):
        family.parse_config(config, "InternLM3ForCausalLM")
