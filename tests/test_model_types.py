"""The hub's other names for families builder builds (Family.model_types): checkpoints whose
`model_type` transformers 5.25 builds with an existing class (InternLM3, IQuest-Coder and EXAONE 3
as LlamaForCausalLM), written as the hub writes them (their own class name and auto_map, their
config class's keys, EXAONE 3's `transformer.h.*` tensors), loaded by transformers into the mapped
class and built by builder to the same logits. Before the table, each was refused (auto_map)."""

import json

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
# model_type -> (transformers' config class, the hub's class name, config.json keys in the hub's
# spelling (its config class's attribute_map), the stored tensor names)
CASES = {
    "internlm3": ("InternLM3Config", "InternLM3ForCausalLM", {"attention_bias": "qkv_bias", "mlp_bias": "bias"}, ()),
    "iquestcoder": ("IQuestCoderConfig", "IQuestCoderForCausalLM", {}, ()),
    "exaone": ("ExaoneConfig", "ExaoneForCausalLM", {"num_hidden_layers": "num_layers",
                                                     "rms_norm_eps": "layer_norm_epsilon",
                                                     "hidden_act": "activation_function"}, EXAONE_STORED),
}


def hub_checkpoint(folder, model_type, **config):
    """A tiny random checkpoint of `model_type` as the hub stores it."""
    config_class, hub_class, keys, stored = CASES[model_type]
    make_checkpoint(folder, config_class, **{**TINY, "head_dim": 16, **config})
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
    assert type(model).__name__ == "LlamaForCausalLM"
    out = build(source, tmp_path / "out", "-p", "fp32")
    assert json.loads((out / "genai_config.json").read_text())["model"]["type"] == "llama"
    assert_parity(out, source, tolerance=1e-4)


def test_exaone_int4_reads_the_stored_names(tmp_path):
    source = hub_checkpoint(tmp_path / "src", "exaone")
    assert "transformer.h.0.attn.attention.q_proj.weight" in load_file(source / "model.safetensors")
    assert main(["-m", str(source), "-o", str(tmp_path / "out"), "-q", "-p", "int4"]) == 0


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
    for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "head_dim", "max_position_embeddings", "rms_norm_eps", "bos_token_id",
                 "eos_token_id", "pad_token_id", "tie_word_embeddings"):
        assert getattr(ours, name) == getattr(theirs, name), name
    assert ours.rope_parameters["rope_theta"] == theirs.rope_parameters["rope_theta"]


def test_listed_with_the_family():
    assert {"InternLM3ForCausalLM", "IQuestCoderForCausalLM", "ExaoneForCausalLM"} <= set(architectures.ARCHITECTURES)
    assert {t: a for t, (a, _) in architectures.MODEL_TYPES.items()} == {
        "internlm3": "InternLM3ForCausalLM", "iquestcoder": "IQuestCoderForCausalLM", "exaone": "ExaoneForCausalLM"}
