"""gpt-oss (GptOssForCausalLM) against transformers: attention sinks, alternating sliding/full layers
(window 4, shorter than the prompt), YaRN, attention biases, 4 biased experts with the clamped
SwiGLU routed top-2 (MoE / QMoE nodes), and the hub's MXFP4 expert weights."""

import json

import numpy as np
import pytest
import torch
import transformers
from conftest import TINY
from fake_quant import cosine, fake_quantize, fake_quantize_model
from helpers import GENAI_PROMPT, OnnxDecoder, PROMPT, assert_parity, build, make_checkpoint, model_logits, relative_error
from safetensors.numpy import load_file, save_file
from test_genai import assert_same_greedy, transformers_greedy

import architectures
from builder.blocks.gpt_oss_experts import FP4_VALUES, mxfp4_decode
from builder.quantize import dequantize, quantize

# Weights at std 0.1 (sinks, router, experts) and a SwiGLU limit of 0.5 that the gate and up
# projections pass both ways, so the clamps, sinks and routing all matter.
CONFIG = {**TINY, "intermediate_size": 64, "head_dim": 16, "num_local_experts": 4, "num_experts_per_tok": 2,
          "sliding_window": 4, "num_hidden_layers": 3, "initializer_range": 0.1, "swiglu_limit": 0.5,
          "eos_token_id": 255}
EXPERTS = ("gate_up_proj", "down_proj")


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("gptoss"), "GptOssConfig", **CONFIG)


def router_margin(source, ids) -> float:
    """The smallest gap between the k-th and (k+1)-th router logits over tokens and layers."""
    model = transformers.AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).eval()
    logits = []
    for layer in model.model.layers:
        layer.mlp.router.register_forward_hook(lambda m, i, o: logits.append(o[0]))
    with torch.no_grad():
        model(torch.tensor([ids]))
    top = torch.topk(torch.cat(logits), CONFIG["num_experts_per_tok"] + 1).values
    return float((top[:, -2] - top[:, -1]).min())


def test_routing_is_decisive_and_clamps_bite(source):
    # No near-tie in the top-2 on the test prompts: fp32 rounding cannot flip an expert choice.
    assert router_margin(source, PROMPT + [0]) > 1e-3
    assert router_margin(source, transformers_greedy(source, GENAI_PROMPT)) > 1e-3


def test_fp32_matches_transformers(source, tmp_path):
    assert_parity(build(source, tmp_path / "out", "-p", "fp32"), source, tolerance=1e-4)


def fake_quantize_experts(model, bits=4, block_size=32):
    """The stored [E, in, out] expert matrices rounded per expert as the build does ([out, in] rows)."""
    with torch.no_grad():
        for layer in model.model.layers:
            for name in EXPERTS:
                p = getattr(layer.mlp.experts, name)
                for e in range(p.shape[0]):
                    p[e].copy_(fake_quantize(p[e].T, bits, block_size, True).T)


def test_int4_matches_fake_quantized_transformers(source, tmp_path):
    out = build(source, tmp_path / "out", "-p", "int4", "--accuracy-level", "0", "--quant-method", "rtn", "--symmetric")
    model = transformers.AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).eval()
    fake_quantize_model(model)  # q, k, v, o and lm_head; the router is no nn.Linear and stays float
    fake_quantize_experts(model)
    ref_prefill, ref_step, next_id = model_logits(model, PROMPT)
    got = OnnxDecoder(out).prefill_and_step(PROMPT, next_id)
    for g, want in zip(got, (ref_prefill, ref_step)):
        assert cosine(g, want) > 0.999 and relative_error(g, want) < 1e-4


def test_genai_greedy_matches_transformers(source, tmp_path):
    out = build(source, tmp_path / "out", "-p", "fp32")
    assert json.loads((out / "genai_config.json").read_text())["model"]["type"] == "gptoss"
    assert_same_greedy(out, source, GENAI_PROMPT)


# --- MXFP4 -----------------------------------------------------------------------------------------

def mxfp4_encode(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[..., K] float -> MXFP4 blocks uint8 [..., K/32, 16] and E8M0 scales [..., K/32]: per block of
    32 the smallest power of two 2^e with max|w| / 2^e <= 6, each value rounded to the nearest e2m1."""
    b = w.reshape(*w.shape[:-1], -1, 32).astype(np.float32)
    e = np.ceil(np.log2(np.maximum(np.abs(b).max(-1), 2.0**-100) / 6)).astype(np.int32)
    x = b / np.ldexp(np.float32(1), e)[..., None]
    codes = np.abs(np.abs(x)[..., None] - FP4_VALUES[:8]).argmin(-1).astype(np.uint8) | ((x < 0) << 3).astype(np.uint8)
    return np.ascontiguousarray(codes[..., 0::2] | (codes[..., 1::2] << 4)), np.ascontiguousarray(e + 127, np.uint8)


def test_mxfp4_decode_matches_transformers():
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    rng = np.random.default_rng(0)
    blocks = rng.integers(0, 256, (2, 6, 3, 16), dtype=np.uint8)
    scales = rng.integers(110, 140, (2, 6, 3), dtype=np.uint8)
    theirs = convert_moe_packed_tensors(torch.from_numpy(blocks), torch.from_numpy(scales), dtype=torch.float32)
    np.testing.assert_array_equal(mxfp4_decode(blocks, scales), theirs.transpose(1, 2).numpy())  # [E, out, in]


@pytest.fixture(scope="module")
def mxfp4_pair(source, tmp_path_factory):
    """The tiny model with MXFP4 experts as the hub stores them, and a float32 copy that holds exactly
    the dequantized weights."""
    tensors = load_file(source / "model.safetensors")
    root = tmp_path_factory.mktemp("mxfp4")
    packed, exact = dict(tensors), dict(tensors)
    for name in [n for n in tensors if n.endswith(EXPERTS)]:
        blocks, scales = mxfp4_encode(tensors.pop(name).transpose(0, 2, 1))  # [E, in, out] -> [E, out, in]
        del packed[name]
        packed[name + "_blocks"], packed[name + "_scales"] = blocks, scales
        exact[name] = np.ascontiguousarray(mxfp4_decode(blocks, scales).transpose(0, 2, 1))
    config = json.loads((source / "config.json").read_text())
    for folder, weights, extra in (("packed", packed, {"quantization_config": {
            "quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                                "model.embed_tokens", "lm_head"]}}),
                                   ("exact", exact, {})):
        (root / folder).mkdir()
        save_file(weights, root / folder / "model.safetensors", metadata={"format": "pt"})
        (root / folder / "config.json").write_text(json.dumps({**config, **extra}))
    return root / "packed", root / "exact"


def test_mxfp4_fp32_matches_transformers_on_dequantized_weights(mxfp4_pair, tmp_path):
    packed, exact = mxfp4_pair
    out = build(packed, tmp_path / "out", "-p", "fp32")
    assert_parity(out, exact, tolerance=1e-4)
    # transformers' own MXFP4 loader (on CPU it dequantizes) gives the same model.
    mine = transformers.AutoModelForCausalLM.from_pretrained(exact, dtype=torch.float32)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(packed, dtype=torch.float32)
    for name, p in mine.named_parameters():
        torch.testing.assert_close(theirs.get_parameter(name).float(), p, rtol=0, atol=0, msg=name)


def test_mxfp4_int4_matches_fake_quantized_dequantized_weights(mxfp4_pair, tmp_path):
    packed, exact = mxfp4_pair
    out = build(packed, tmp_path / "out", "-p", "int4", "--accuracy-level", "0", "--quant-method", "rtn", "--symmetric")
    model = transformers.AutoModelForCausalLM.from_pretrained(exact, dtype=torch.float32).eval()
    fake_quantize_model(model)
    fake_quantize_experts(model)
    with torch.no_grad():
        want = model(torch.tensor([PROMPT])).logits[0].numpy()
    got, _ = OnnxDecoder(out).run(PROMPT, None, len(PROMPT))
    assert relative_error(got, want) < 1e-4


def test_mxfp4_requantization_loss():
    # MXFP4 values times a power of two are exact in fp16/bf16/fp32; int4 (block 32, symmetric) and
    # int8 round them again: measured on gaussian weights encoded to MXFP4, one [out, in] expert.
    w = mxfp4_decode(*mxfp4_encode(np.random.default_rng(0).normal(0, 0.02, (256, 512)).astype(np.float32)))
    for dtype in (np.float16, torch.bfloat16):
        assert torch.equal(torch.from_numpy(w).to(dtype).float(), torch.from_numpy(w)) if dtype is torch.bfloat16 \
            else np.array_equal(w.astype(dtype).astype(np.float32), w)
    errors = {bits: np.linalg.norm(dequantize(quantize(w, bits, 32), 512, bits) - w) / np.linalg.norm(w)
              for bits in (4, 8)}
    assert 0.03 < errors[4] < 0.15 and errors[8] < 0.01, errors


# --- config parsing --------------------------------------------------------------------------------

CONFIG_CASES = {
    "minimal": {},
    # openai/gpt-oss-20b's config.json (rope_scaling with rope_type, no swiglu_alpha).
    "hub-20b": dict(num_hidden_layers=24, num_local_experts=32, experts_per_token=4, num_experts_per_tok=4,
                    head_dim=64, hidden_size=2880, intermediate_size=2880, sliding_window=128, rope_theta=150000,
                    initial_context_length=4096, max_position_embeddings=131072, eos_token_id=200002,
                    pad_token_id=199999, swiglu_limit=7.0, tie_word_embeddings=False,
                    layer_types=["sliding_attention", "full_attention"] * 12,
                    rope_scaling={"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
                                  "original_max_position_embeddings": 4096, "rope_type": "yarn", "truncate": False}),
    "rope-parameters": dict(num_hidden_layers=4, rope_parameters={"rope_type": "default", "rope_theta": 1e4},
                            num_key_value_heads=4, swiglu_alpha=2.0, sliding_window=64),
}


@pytest.mark.parametrize("case", sorted(CONFIG_CASES))
def test_config_matches_transformers(case):
    raw = CONFIG_CASES[case]
    ours = architectures.load("GptOssForCausalLM").parse_config(dict(raw), "GptOssForCausalLM")
    theirs = transformers.GptOssConfig(**raw)
    for field in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                  "num_key_value_heads", "head_dim", "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings",
                  "bos_token_id", "eos_token_id", "pad_token_id", "attention_bias", "sliding_window", "layer_types",
                  "num_local_experts", "num_experts_per_tok", "swiglu_alpha", "swiglu_limit"):
        assert getattr(ours, field) == getattr(theirs, field), field
    assert ours.rope_parameters == {k: v for k, v in theirs.rope_parameters.items() if k != "type"}
    assert ours.model_type == "gptoss"  # onnxruntime-genai's name for it


def test_only_gpt_oss_reads_a_prequantized_checkpoint(source, tmp_path):
    from builder.errors import BuildError
    from builder.inputs.checks import check_not_prequantized

    raw = {"quantization_config": {"quant_method": "mxfp4"}}
    check_not_prequantized(raw, tmp_path, architectures.load("GptOssForCausalLM").quant_methods)
    for accepted in ((), ("awq",)):
        with pytest.raises(BuildError, match="mxfp4"):
            check_not_prequantized(raw, tmp_path, accepted)


def test_default_int4_keeps_the_experts_symmetric(source, tmp_path, capsys):
    # int4's default has zero points; gpt-oss's QMoE experts are proved without them only, so they
    # stay symmetric, said in one warning, and the rest of the model takes the default.
    import onnx

    from builder.cli import main

    out = tmp_path / "out"
    assert main(["-m", str(source), "-o", str(out), "-p", "int4", "--accuracy-level", "0"]) == 0
    assert capsys.readouterr().err.count("gpt-oss experts are quantized symmetric") == 1  # once, not per layer
    graph = onnx.load(out / "model.onnx", load_external_data=False).graph
    qmoe = [n for n in graph.node if n.op_type == "QMoE"]
    linears = [n for n in graph.node if n.op_type == "MatMulNBits"]
    assert qmoe and all(len(n.input) < 12 or not n.input[11] for n in qmoe)  # no expert zero points
    assert linears and all(len(n.input) > 3 and n.input[3] for n in linears)  # attention: zero points
