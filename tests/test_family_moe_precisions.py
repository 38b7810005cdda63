"""Every mixture-of-experts family in fp16, bf16 and int8 against transformers, on the tiny
checkpoints of the family tests (decisive routing asserted there).

- fp16: weights and activations round to 2^-11 relative at every op; the bound is 1e-2 of the
  largest logit, as for the dense families (test_parity_llama), and the argmax must agree.
- bf16: ONNX Runtime's CPU provider has no bfloat16 attention, so the `-p bf16 -e cuda` graph is
  widened to float32 (every bfloat16 tensor, type and Cast made float32; bfloat16 values are
  exact in float32) and run on the CPU against transformers on the same bfloat16-rounded
  weights: that proves the graph and its weights to float32 precision (1e-4), not bfloat16's
  arithmetic, which only a GPU runs.
- int8 (QMoE 8-bit experts, MatMulNBits 8-bit attention) at accuracy_level 0 against
  transformers with the same 8-bit fake quantization: cosine and a relative bound, because
  ONNX Runtime 1.31's 8-bit QMoE rounds its activations to int8 whatever the accuracy level
  (measured: see INT8_BOUND).
"""

import numpy as np
import onnx_ir as ir
import pytest
import torch
import transformers
from fake_quant import fake_quantize_model
from helpers import OnnxDecoder, PROMPT, assert_parity, build, make_checkpoint, model_logits, relative_error
from test_family_moe import assert_rounded_parity

FAMILIES = ["qwen2_moe", "qwen3_moe", "mixtral", "olmoe", "granitemoe", "phimoe", "ernie4_5_moe", "gptoss"]


def make(folder, name):
    """The family test's tiny checkpoint."""
    import test_family_erniemoe
    import test_family_gptoss
    import test_family_moe
    import test_family_moe2

    if name in test_family_moe.VARIANTS:
        return test_family_moe.make(folder, name)
    if name in test_family_moe2.VARIANTS:
        return test_family_moe2.make(folder, name)
    if name == "ernie4_5_moe":
        return test_family_erniemoe.make(folder)
    return make_checkpoint(folder, "GptOssConfig", **test_family_gptoss.CONFIG)


@pytest.fixture(scope="module", params=FAMILIES)
def family(request, tmp_path_factory):
    return make(tmp_path_factory.mktemp(request.param), request.param)


def test_fp16_matches_transformers(family, tmp_path):
    assert_parity(build(family, tmp_path / "out", "-p", "fp16"), family, tolerance=1e-2)


def widened(folder, out):
    """The bf16 model with every bfloat16 tensor, value type and Cast made float32."""
    model = ir.load(folder / "model.onnx")
    bf16, f32 = ir.DataType.BFLOAT16, ir.DataType.FLOAT
    for value in model.graph.initializers.values():
        if value.const_value.dtype == bf16:
            value.const_value = ir.Tensor(value.const_value.numpy().astype(np.float32), name=value.name)
    for value in [*model.graph.inputs, *model.graph.outputs, *(o for n in model.graph for o in n.outputs),
                  *model.graph.initializers.values()]:
        if value.dtype == bf16:
            value.dtype = f32
    for node in model.graph:
        if node.op_type == "Cast" and node.attributes["to"].as_int() == bf16:
            node.attributes["to"] = ir.AttrInt64("to", f32)
        assert all(a.type != ir.AttributeType.TENSOR or a.as_tensor().dtype != bf16 for a in node.attributes.values())
    out.mkdir()
    ir.save(model, out / "model.onnx", external_data="model.onnx.data")
    return out


def test_bf16_graph_and_weights_match_transformers(family, tmp_path):
    out = build(family, tmp_path / "bf16", "-p", "bf16", "-e", "cuda")
    assert any(v.const_value.dtype == ir.DataType.BFLOAT16 for v in ir.load(out / "model.onnx").graph.initializers.values())
    model = transformers.AutoModelForCausalLM.from_pretrained(family, dtype=torch.float32).eval()
    with torch.no_grad():  # the weights and the rotary tables as the bf16 build stores them
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    model.model.rotary_emb.register_forward_hook(lambda m, i, o: tuple(t.to(torch.bfloat16).float() for t in o))
    ref_prefill, ref_step, next_id = model_logits(model, PROMPT)
    prefill, step = OnnxDecoder(widened(out, tmp_path / "widened")).prefill_and_step(PROMPT, next_id)
    for got, want in ((prefill, ref_prefill), (step, ref_step)):
        assert relative_error(got, want) < 1e-4 and (got.argmax(-1) == want.argmax(-1)).all()


def fake_quantize_8bit(model):
    """transformers' model with every expert and attention weight rounded as the int8 build does;
    routers stay float."""
    import test_family_gptoss
    from test_family_moe import fake_quantize_experts

    if model.config.model_type == "gpt_oss":
        fake_quantize_model(model, bits=8)  # q, k, v, o and lm_head; the router is no nn.Linear
        test_family_gptoss.fake_quantize_experts(model, bits=8)
        return
    routers = {n: m.weight.clone() for n, m in model.named_modules() if type(m).__name__.endswith("TopKRouter")}
    fake_quantize_experts(model, bits=8)  # every nn.Linear (Phi-MoE's router is one) and the experts
    with torch.no_grad():
        for name, weight in routers.items():
            model.get_submodule(name).weight.copy_(weight)


# ONNX Runtime's 8-bit QMoE rounds activations to int8: measured 1.9e-4 to 2.1e-3 relative (cosine
# > 0.999998) on seven families, 9.7e-3 (cosine 0.99998) on gpt-oss, whose clamped SwiGLU and
# biased experts see larger activations. A wrong code or scale layout gives errors of order 1.
INT8_BOUND = 2e-2


def test_int8_matches_fake_quantized_transformers(family, tmp_path):
    out = build(family, tmp_path / "out", "-p", "int8", "--accuracy-level", "0")
    assert_rounded_parity(out, family, fake_quantize_8bit, min_cosine=0.9999, bound=INT8_BOUND)
