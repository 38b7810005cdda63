"""Qwen2-MoE, Qwen3-MoE, Mixtral and OLMoE against transformers: fp32 and int4 logits (experts in
ONNX Runtime's MoE/QMoE), genai's greedy generation, decisive routing on the test prompts, and
config.json parsing against their config classes."""

import numpy as np
import pytest
import torch
import transformers
from conftest import TINY
from fake_quant import cosine, fake_quantize
from helpers import GENAI_PROMPT, OnnxDecoder, PROMPT, assert_parity, build, make_checkpoint, model_logits, relative_error
from safetensors.numpy import load_file, save_file
from test_genai import assert_same_greedy

import architectures
from builder.blocks.moe import stacked_gate_up
from builder.lazy import Weight

BASE = {**TINY, "eos_token_id": 255}
MOE = dict(num_experts_per_tok=2, norm_topk_prob=True)
# Each with its features on: 4-8 experts, top-2; Qwen2-MoE's shared expert and a dense layer,
# Qwen3-MoE's per-head q/k norms and un-normalized top-k, Mixtral's window shorter than the
# prompt, OLMoE's whole-projection q/k norms.
VARIANTS = {
    "qwen2_moe": ("Qwen2MoeConfig", dict(num_hidden_layers=3, num_experts=6, moe_intermediate_size=32,
                                         shared_expert_intermediate_size=96, mlp_only_layers=[1], **MOE)),
    "qwen3_moe": ("Qwen3MoeConfig", dict(num_experts=8, moe_intermediate_size=64, head_dim=32, num_experts_per_tok=2,
                                         norm_topk_prob=False)),
    "mixtral": ("MixtralConfig", dict(num_local_experts=4, sliding_window=4, rope_theta=1e4)),
    "olmoe": ("OlmoeConfig", dict(num_experts=8, intermediate_size=64, attention_bias=True, **MOE)),
}
ROUTER_SCALE = 30.0  # random routers are near-uniform; scaled up, their top-k choices are decisive


def make(folder, name):
    config_class, overrides = VARIANTS[name]
    make_checkpoint(folder, config_class, **{**BASE, **overrides})
    tensors = load_file(folder / "model.safetensors")
    rng = np.random.default_rng(1)
    for key, value in tensors.items():
        if key.endswith(".bias"):  # transformers initializes biases to zero
            tensors[key] = (0.1 * rng.standard_normal(value.shape)).astype(value.dtype)
        if key.endswith(("mlp.gate.weight", "block_sparse_moe.gate.weight")):
            tensors[key] = value * ROUTER_SCALE
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def variant(request, tmp_path_factory):
    return make(tmp_path_factory.mktemp(request.param), request.param)


def router_logits(model, ids):
    """Every sparse layer's router logits (tokens, experts) for a forward pass over `ids`."""
    seen = []
    hooks = [m.register_forward_hook(lambda m, i, o: seen.append(o[0].detach().float().numpy()))
             for m in model.modules() if type(m).__name__.endswith("TopKRouter")]
    with torch.no_grad():
        model(torch.tensor([ids]))
    for h in hooks:
        h.remove()
    return seen


def fake_quantize_experts(model, bits=4, block_size=32, symmetric=True, method="rtn"):
    """fake_quant.fake_quantize_model for MoE models: every Linear but the float shared-expert gate,
    and the experts' 3-D gate_up_proj [E, 2I, H] / down_proj [E, H, I] one expert at a time (a
    row-wise quantization: the fused gate_up rows round as the separate gate and up rows do).
    RTN through ONNX Runtime's quantizer, other methods through builder.quantize."""
    from builder.quantize import dequantize, quantize

    def rounded(w):
        if method == "rtn":
            return fake_quantize(w, bits, block_size, symmetric)
        m = quantize(w.detach().numpy(), bits, block_size, symmetric, np.float32, method)
        return torch.from_numpy(dequantize(m, w.shape[1], bits))

    with torch.no_grad():
        for name, module in model.named_modules():
            if isinstance(module, torch.nn.Linear) and not name.endswith("shared_expert_gate"):
                module.weight.copy_(rounded(module.weight))
            for p in (getattr(module, "gate_up_proj", None), getattr(module, "down_proj", None)):
                if isinstance(p, torch.nn.Parameter) and p.dim() == 3:
                    for e in range(p.shape[0]):
                        p[e].copy_(rounded(p[e]))


def test_routing_is_decisive(variant):
    model = transformers.AutoModelForCausalLM.from_pretrained(variant, dtype=torch.float32).eval()
    k = model.config.num_experts_per_tok
    for ids in (PROMPT, GENAI_PROMPT):
        for logits in router_logits(model, ids):
            top = np.sort(logits, -1)[:, ::-1]
            assert (top[:, k - 1] - top[:, k]).min() > 1e-3, "a near-tie in the top-k choice"


def test_fp32_matches_transformers(variant, tmp_path):
    assert_parity(build(variant, tmp_path / "out", "-p", "fp32"), variant, tolerance=1e-4)


def assert_rounded_parity(out, source, rounding, min_cosine=0.999, bound=1e-4):
    """The build's prefill and decode logits against transformers with `rounding(model)` applied
    to its weights (the same fake quantization the build's weights went through)."""
    model = transformers.AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).eval()
    rounding(model)
    ref_prefill, ref_step, next_id = model_logits(model, PROMPT)
    got = OnnxDecoder(out).prefill_and_step(PROMPT, next_id)
    for g, want in zip(got, (ref_prefill, ref_step)):
        assert cosine(g, want) > min_cosine and relative_error(g, want) < bound


def test_int4_matches_fake_quantized_transformers(variant, tmp_path):
    out = build(variant, tmp_path / "out", "-p", "int4", "--accuracy-level", "0", "--quant-method", "rtn", "--symmetric")
    assert_rounded_parity(out, variant, fake_quantize_experts)


def test_search_quantized_experts_match_transformers(variant, tmp_path):
    # --quant-method search --asymmetric reaches the experts too (they were once always RTN).
    out = build(variant, tmp_path / "out", "-p", "int4", "--accuracy-level", "0", "--quant-method", "search",
                "--asymmetric")
    assert_rounded_parity(out, variant, lambda model: fake_quantize_experts(model, symmetric=False, method="search"))


def test_genai_greedy_matches_transformers(variant, tmp_path):
    assert_same_greedy(build(variant, tmp_path / "out", "-p", "fp32"), variant, GENAI_PROMPT)


@pytest.mark.parametrize("name, config", [
    ("Qwen3MoeConfig", {}),
    ("Qwen3MoeConfig", dict(use_sliding_window=True, mlp_only_layers=[0, 3], decoder_sparse_step=2,
                            rope_scaling={"type": "linear", "factor": 2.0})),
    ("Qwen2MoeConfig", {}), ("Qwen2MoeConfig", dict(use_sliding_window=True, max_window_layers=3, num_hidden_layers=6)),
    ("MixtralConfig", {}), ("MixtralConfig", dict(sliding_window=4096, rope_theta=1e4)),
    ("OlmoeConfig", {}),
    ("OlmoeConfig", dict(num_key_value_heads=4, rope_scaling={"rope_type": "dynamic", "factor": 2.0})),
])
def test_matches_transformers_config(name, config):
    hf = getattr(transformers, name)(**config)
    architecture = name.replace("Config", "ForCausalLM")
    c = architectures.load(architecture).parse_config({**config, "architectures": [architecture]}, architecture)
    assert c.num_experts == getattr(hf, "num_experts", getattr(hf, "num_local_experts", None))
    for key in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                "rms_norm_eps", "num_experts_per_tok", "max_position_embeddings", "bos_token_id", "eos_token_id",
                "pad_token_id", "tie_word_embeddings"):
        assert getattr(c, key) == getattr(hf, key), key
    assert c.moe_intermediate_size == getattr(hf, "moe_intermediate_size", hf.intermediate_size)
    assert c.norm_topk_prob == getattr(hf, "norm_topk_prob", True)
    assert c.rope_parameters == hf.rope_parameters
    windows = [getattr(hf, "sliding_window", None) if t == "sliding_attention" else None
               for t in getattr(hf, "layer_types", None) or ["sliding_attention"] * hf.num_hidden_layers]
    assert [c.window(i) for i in range(c.num_hidden_layers)] == [w or None for w in windows]
    dense = [i for i in range(hf.num_hidden_layers) if i in (getattr(hf, "mlp_only_layers", None) or [])
             or (i + 1) % getattr(hf, "decoder_sparse_step", 1)]
    assert [i for i in range(c.num_hidden_layers) if not c.sparse(i)] == dense


def test_stacked_gate_up_interleaves_one_expert_at_a_time():
    gates = [Weight.constant(np.full((2, 3), e, np.float32)) for e in range(3)]
    ups = [Weight.constant(np.full((2, 3), 10 + e, np.float32)) for e in range(3)]
    w = stacked_gate_up(gates, ups, np.float16).numpy()
    assert w.shape == (3, 4, 3) and w.dtype == np.float16
    assert w[:, :, 0].tolist() == [[0, 10, 0, 10], [1, 11, 1, 11], [2, 12, 2, 12]]


def test_onnxruntime_unnormalized_moe_depends_on_its_consumer():
    # Why builder/blocks/moe.py never sets normalize_routing_weights=0: ONNX Runtime 1.31's CPU MoE
    # then returns other values when its output feeds a node than when it is a graph output. 1.32
    # fixed it; the builds keep the normalized form, which both versions run right.
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 10, 64)).astype(np.float32)
    inits = dict(r=rng.standard_normal((64, 8)), shape=np.array([-1, 8]), w1=0.1 * rng.standard_normal((8, 128, 64)),
                 w2=0.1 * rng.standard_normal((8, 64, 64)))
    inits = [numpy_helper.from_array(v if k == "shape" else v.astype(np.float32), k) for k, v in inits.items()]
    results = {}
    for norm in (0, 1):
        for exposed in (True, False):
            nodes = [helper.make_node("Neg", ["x"], ["n"]), helper.make_node("MatMul", ["n", "r"], ["s"]),
                     helper.make_node("Reshape", ["s", "shape"], ["l"]),
                     helper.make_node("MoE", ["n", "l", "w1", "", "w2"], ["y"], domain="com.microsoft", k=2,
                                      activation_type="swiglu", swiglu_fusion=1, normalize_routing_weights=norm),
                     helper.make_node("Add", ["y", "x"], ["z"])]
            outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("z", "y")[: 1 + exposed]]
            graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
                                      outputs, inits)
            model = helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 21),
                                                                           helper.make_opsetid("com.microsoft", 1)])
            session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
            results[norm, exposed] = session.run(None, {"x": x})[0]
    assert np.array_equal(results[1, True], results[1, False])
    fixed = tuple(int(part) for part in ort.__version__.split(".")[:2]) >= (1, 32)
    assert np.allclose(results[0, True], results[0, False]) == fixed, ort.__version__
