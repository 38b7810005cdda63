"""builder/provider_kernels.py and its generated data (scripts/provider_kernels.py): a wrong parse of
ORT's kernel lists fails here."""

import pytest

from builder.provider_kernels import KERNELS, RANGES, SCHEMA_SINCE, TYPES, missing, refusal

MS = "com.microsoft"


def has(provider, domain, op, opset=1):
    return not missing([(domain, op, opset)], provider)


def test_every_provider_parsed_with_a_plausible_count():
    assert set(KERNELS) == {"cpu", "cuda", "dml", "webgpu", "trt-rtx"}
    for provider, low in {"cpu": 250, "cuda": 180, "dml": 150, "webgpu": 90, "trt-rtx": 120}.items():
        assert len(KERNELS[provider]) > low, provider
    for ranges in RANGES.values():  # every range well formed
        for spans in ranges.values():
            assert all(lo >= 1 and (hi is None or hi >= lo) for lo, hi in spans)


@pytest.mark.parametrize("op", ["MatMulNBits", "GroupQueryAttention", "SkipSimplifiedLayerNormalization",
                                "GatherBlockQuantized", "RotaryEmbedding", "QMoE", "MoE"])
def test_cpu_contrib_ops(op):
    assert has("cpu", MS, op)


def test_cpu_onnx_ops_at_model_opsets():
    assert has("cpu", "", "DequantizeLinear", 21) and has("cpu", "ai.onnx", "DequantizeLinear", 23)
    assert has("cpu", "", "SimplifiedLayerNormalization", 1)  # ORT's, registered in the ONNX domain
    assert has("cpu", "", "RMSNormalization", 23) and has("cpu", "", "Attention", 23)
    assert has("cpu", "", "RotaryEmbedding", 23)
    assert KERNELS["cpu"]["ai.onnx::MatMul"][1] is None


def test_cuda():
    for op in ("GroupQueryAttention", "MatMulNBits", "GatherBlockQuantized", "SkipSimplifiedLayerNormalization",
               "QMoE"):
        assert has("cuda", MS, op), op
    assert has("cuda", "", "Attention", 23) and has("cuda", "", "RMSNormalization", 23)
    assert "bfloat16" in TYPES["cuda"]["ai.onnx::MatMul"]


def test_dml():
    # what DmlExecutionProvider registers (OperatorKernels.md): GQA, rotary, MatMulNBits, the skip norm ...
    for op in ("GroupQueryAttention", "RotaryEmbedding", "MatMulNBits", "SkipSimplifiedLayerNormalization"):
        assert has("dml", MS, op), op
    # ... and not GatherBlockQuantized, QMoE, MoE, nor the opset-23 Attention / RMSNormalization
    assert missing([(MS, "GatherBlockQuantized", 1), (MS, "QMoE", 1), (MS, "MoE", 1), ("", "Attention", 23),
                    ("", "RMSNormalization", 23)], "dml") == [
        "ai.onnx::Attention", "ai.onnx::RMSNormalization", "com.microsoft::GatherBlockQuantized",
        "com.microsoft::MoE", "com.microsoft::QMoE"]


def test_webgpu():
    for op in ("MatMulNBits", "GroupQueryAttention", "GatherBlockQuantized", "SkipSimplifiedLayerNormalization",
               "RotaryEmbedding"):
        assert has("webgpu", MS, op), op
    assert has("webgpu", "", "Cast", 21) and has("webgpu", "", "Range", 21)  # registered outside the table
    assert has("webgpu", "", "MatMul", 21) and not has("webgpu", "", "RMSNormalization", 23)


def test_trt_rtx():
    assert has("trt-rtx", "", "MatMul", 21) and has("trt-rtx", "", "RMSNormalization", 23)
    assert not has("trt-rtx", "", "MatMul", 26)  # past the parser's stated opset range
    assert not has("trt-rtx", "", "NonExistentOp", 21)
    assert not has("trt-rtx", MS, "SkipSimplifiedLayerNormalization") and not has("trt-rtx", MS, "MatMulNBits")
    assert has("trt-rtx", MS, "GroupQueryAttention") and has("trt-rtx", MS, "QMoE")


def test_opset_versioning():
    # An open kernel "N+" matches only the schema since_version N: DequantizeLinear's schema changed at
    # 23, so a provider whose newest kernel is 21+ has none at opset 23 but one at 21 and 22.
    assert SCHEMA_SINCE["ai.onnx::DequantizeLinear"][:5] == (10, 13, 19, 21, 23)
    assert RANGES["cuda"]["ai.onnx::DequantizeLinear"][-1] == (21, None)
    assert has("cuda", "", "DequantizeLinear", 22)
    assert missing([("", "DequantizeLinear", 23)], "cuda") == ["ai.onnx::DequantizeLinear"]
    # A closed range [a, b] ends at b: an ai.onnx op whose kernels stop before the model's schema
    assert RANGES["cpu"]["ai.onnx::Attention"][0] == (23, 23)
    assert has("cpu", "", "Attention", 23)
    # MatMul's schema is 13 at every opset from 13 on: the 13+ kernel serves opset 21 and 25
    assert has("webgpu", "", "MatMul", 21) and has("webgpu", "", "MatMul", 25)


def test_domain_forms_and_refusal():
    ops = [("", "MatMul", 21), ("ai.onnx", "MatMul", 21), ("ai.onnx", "Constant", 21), (MS, "QMoE", 1)]
    assert missing(ops, "cpu") == []
    assert missing(ops, "dml") == ["com.microsoft::QMoE"]
    assert refusal(ops, "cpu") is None
    line = refusal(ops, "dml")
    assert "\n" not in line and "com.microsoft::QMoE" in line and "dml" in line
    with pytest.raises(ValueError, match="unknown provider"):
        missing(ops, "tpu")


def test_ops_of_an_onnx_ir_model():
    import onnx_ir as ir

    from builder.provider_kernels import ops_of

    x = ir.Value(name="x", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([2]))
    n1 = ir.node("Relu", [x])
    n2 = ir.node("QMoE", [n1.outputs[0]], domain=MS)
    graph = ir.Graph([x], [n2.outputs[0]], nodes=[n1, n2], opset_imports={"": 21, MS: 1})
    ops = ops_of(ir.Model(graph, ir_version=10))
    assert ops == {("", "Relu", 21), (MS, "QMoE", 1)}
    assert missing(ops, "dml") == ["com.microsoft::QMoE"] and missing(ops, "cpu") == []
