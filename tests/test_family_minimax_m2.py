"""MiniMax-M2 (architectures/minimax_m2.py: Mixtral's layer with whole-projection q/k norms, a
partial rotary and a sigmoid router with a correction bias) against transformers: the shared
family proofs (tests/family_runner.py), routing that the correction bias decides, and the configs
transformers cannot run refused.

The int4 proof rounds the stacked experts too (MiniMaxM2Experts' [E, 2I, H] / [E, H, I]
parameters, which the build's QMoE quantizes), expert by expert (test_family_moe's
fake_quantize_experts), at the runner's bounds."""

import numpy as np
import pytest
from family_runner import CONFIG_FIELDS, FamilyTest, family_tests, load, router_outputs
from helpers import GENAI_PROMPT, PROMPT, make_checkpoint
from safetensors.numpy import load_file, save_file
from test_family_moe import fake_quantize_experts

import architectures
from builder.errors import BuildError

ARCHITECTURE = "MiniMaxM2ForCausalLM"
# 4 query heads of 32 over 2 KV heads on a hidden size of 64 (head_dim its own key), experts of 32.
BASE = dict(vocab_size=256, hidden_size=64, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=32, max_position_embeddings=128, bos_token_id=1, eos_token_id=2)
VARIANTS = {
    # the hub's spelling: rotary_dim 16 of 32 (fused rotary), top-3 of 8 experts
    "hub": dict(rotary_dim=16, num_local_experts=8, num_experts_per_tok=3),
    # 24 of 32 dims rotated (explicit rotary) under YaRN scaled past a pretraining length of 4, top-2
    # of 4, a tied vocabulary
    "yarn-tied": dict(num_local_experts=4, num_experts_per_tok=2, tie_word_embeddings=True,
                      rope_parameters=dict(rope_type="yarn", rope_theta=1e4, factor=4.0,
                                           original_max_position_embeddings=4, partial_rotary_factor=0.75)),
}
ROUTER_SCALE = 10.0  # random routers are near-uniform; scaled up, their choices are decisive (sigmoid unsaturated)


def make(folder, config):
    make_checkpoint(folder, "MiniMaxM2Config", **config)
    tensors, rng = load_file(folder / "model.safetensors"), np.random.default_rng(1)
    for key, value in tensors.items():
        if key.endswith("block_sparse_moe.gate.weight"):
            tensors[key] = value * ROUTER_SCALE
        if key.endswith("e_score_correction_bias"):  # zeros from transformers; of the order of the scores
            tensors[key] = (0.3 * rng.standard_normal(value.shape)).astype(value.dtype)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


globals().update(family_tests(FamilyTest(
    ARCHITECTURE, "MiniMaxM2Config", VARIANTS, base=BASE, make=make,
    genai_type="mistral", ragged=True, fp16_tolerance=1e-2,
    quantize=fake_quantize_experts,  # MiniMaxM2Experts' stacked gate_up_proj/down_proj, rounded as QMoE rounds them
    config_raws=(
        {},
        # MiniMax-M2's config.json: rotary_dim beside head_dim, and the remote code's keys transformers ignores
        dict(vocab_size=200064, hidden_size=3072, intermediate_size=1536, num_hidden_layers=62, num_attention_heads=48,
             num_key_value_heads=8, head_dim=128, rotary_dim=64, rope_theta=5000000, max_position_embeddings=196608,
             num_local_experts=256, num_experts_per_tok=8, rms_norm_eps=1e-06, sliding_window=None,
             use_qk_norm=True, qk_norm_type="per_layer", scoring_func="sigmoid", use_routing_bias=True,
             shared_intermediate_size=0, use_mtp=True, num_mtp_modules=3, attn_type_list=[1] * 62,
             bos_token_id=None, eos_token_id=200020, tie_word_embeddings=False),
        # a factor given wins over rotary_dim; a scaled rope takes rotary_dim's
        dict(rotary_dim=64, partial_rotary_factor=0.25),
        dict(rotary_dim=32, rope_scaling=dict(type="yarn", factor=4.0, original_max_position_embeddings=8192)),
    ),
    config_fields=(*CONFIG_FIELDS, "head_dim", "rms_norm_eps", "num_local_experts", "num_experts_per_tok"),
)))


def routing(model, ids):
    """Every layer's (router logits (tokens, experts), correction bias) over `ids`, in float64."""
    blocks = [layer.mlp for layer in model.model.layers]
    seen = router_outputs(model, [b.gate for b in blocks], [ids])
    return list(zip(seen, (b.e_score_correction_bias.double().numpy() for b in blocks), strict=True))


def test_routing_is_decisive_and_the_bias_changes_it(family_checkpoint):
    # The parity proofs prove the router only if its choices are clear-cut (no near-tie an ulp
    # could flip) and if the correction bias changes some token's experts.
    model = load(family_checkpoint)
    k, by_bias = model.config.num_experts_per_tok, 0
    for ids in (PROMPT, GENAI_PROMPT):
        for logits, bias in routing(model, ids):
            s = 1 / (1 + np.exp(-logits))
            choice = s + bias
            top = np.sort(choice, -1)[:, ::-1]
            assert (top[:, k - 1] - top[:, k]).min() > 1e-3, "a near-tie in the top-k choice"
            chosen = np.sort(np.argsort(-choice, -1)[:, :k], -1)
            by_bias += (chosen != np.sort(np.argsort(-s, -1)[:, :k], -1)).any(-1).sum()
    assert by_bias > 0, "the correction bias never changes the experts chosen"


@pytest.mark.parametrize("config, message", [
    (dict(rotary_dim=64, head_dim=32), "rotary_dim is 64"),  # transformers' cos/sin outgrow the head
    (dict(num_local_experts=4, num_experts_per_tok=5), "num_experts_per_tok=5 of 4 experts"),  # its topk fails
    (dict(head_dim=None), "head_dim is null"),  # MiniMaxM2Config types it int
    (dict(hidden_act="gelu"), "SwiGLU"),  # a gelu-gated expert: no MoE/QMoE activation computes it
])
def test_what_it_cannot_build_is_refused(config, message):
    with pytest.raises(BuildError, match=message):
        architectures.load(ARCHITECTURE).parse_config({**config, "architectures": [ARCHITECTURE]}, ARCHITECTURE)


@pytest.mark.parametrize("modules, built", [(1, True), (0, False)])
def test_prediction_modules_after_the_last_layer(modules, built, tmp_path, capsys):
    # The hub's config.json counts num_mtp_modules; their tensors after the last layer are no part
    # of the decoder (transformers leaves them unread), and any other extra layer is refused.
    import json

    from builder.cli import main

    source = make(tmp_path / "src", {**BASE, **VARIANTS["hub"]})
    tensors = load_file(source / "model.safetensors")
    tensors["model.layers.2.input_layernorm.weight"] = tensors["model.layers.1.input_layernorm.weight"]
    save_file(tensors, source / "model.safetensors", metadata={"format": "pt"})
    raw = json.loads((source / "config.json").read_text())
    (source / "config.json").write_text(json.dumps({**raw, "num_mtp_modules": modules}))
    code = main(["-m", str(source), "-o", str(tmp_path / "out"), "-q", "-p", "fp32"])
    assert code == (0 if built else 2)
    assert built or "model.layers.2.input_layernorm.weight" in capsys.readouterr().err
