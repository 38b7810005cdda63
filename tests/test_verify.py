"""--verify compares the built model with transformers and fails the command when they disagree."""

import pytest
from conftest import TINY
from helpers import make_checkpoint

from builder.cli import main
from builder.graph import Graph


@pytest.mark.parametrize("precision", ["fp32", "fp16", "int4", "int8"])
def test_verify_passes_on_a_correct_build(tiny_llama, tmp_path, capsys, precision):
    rc = main(["-m", str(tiny_llama), "-o", str(tmp_path / "out"), "-p", precision, "--verify"])
    err = capsys.readouterr().err
    assert rc == 0, err
    line = next(l for l in err.splitlines() if l.startswith("verify:"))
    assert line.endswith("PASS") and "cosine" in line
    if precision == "fp32":
        assert "top-1 agreement 100%" in line


def test_verify_catches_a_wrong_model(tiny_llama, tmp_path, capsys, monkeypatch):
    # Break the graph the way a plausible bug would: interleaved instead of half-split rotary.
    real = Graph.node

    def wrong_rotary(self, op_type, inputs, attributes, *args, **kwargs):
        if op_type == "GroupQueryAttention":
            attributes = dict(attributes, rotary_interleaved=1)
        return real(self, op_type, inputs, attributes, *args, **kwargs)

    monkeypatch.setattr(Graph, "node", wrong_rotary)
    rc = main(["-m", str(tiny_llama), "-o", str(tmp_path / "out"), "-p", "fp32", "--verify"])
    err = capsys.readouterr().err
    assert rc == 3
    assert next(l for l in err.splitlines() if l.startswith("verify:")).endswith("FAIL")


@pytest.mark.parametrize("config", ["PhiConfig", "Starcoder2Config"])
def test_verify_passes_mixed_builds_of_families_with_other_names(tmp_path, capsys, config):
    # The reference must round the same layers to 8 bits as the graph: Phi's attention output is
    # `self_attn.dense` in transformers and o_proj in the graph (the preset's every o_proj).
    source = make_checkpoint(tmp_path / "src", config, **{**TINY, "num_hidden_layers": 9})
    rc = main(["-m", str(source), "-o", str(tmp_path / "out"), "-p", "int4", "--mixed", "--quant-method", "rtn",
               "--symmetric", "--accuracy-level", "0", "--verify"])
    err = capsys.readouterr().err
    assert rc == 0, err
    line = next(l for l in err.splitlines() if l.startswith("verify:"))
    # At accuracy level 0 only float summation order is left (Phi with dense at 4 bits: 0.9974).
    assert line.endswith("PASS") and float(line.split("cosine ")[1].split(",")[0]) > 0.99999, line


EXPERT_SCALE = 3.0


def test_verify_rounds_stacked_experts_as_the_build(tmp_path, capsys):
    # transformers 5 keeps a mixture of experts' weights as 3-D parameters, no Linear: the int4
    # reference once left them in float, and a model with decisive routing failed (cosine 0.99x).
    # Expert intermediate 48: the QMoE block is 16 (expert_block_size), not the dense layers' 32.
    from safetensors.numpy import load_file, save_file

    source = make_checkpoint(tmp_path / "src", "Qwen3MoeConfig", **{**TINY, "eos_token_id": 255}, num_experts=8,
                             moe_intermediate_size=48, head_dim=32, num_experts_per_tok=2, norm_topk_prob=False)
    tensors = load_file(source / "model.safetensors")
    for key in [k for k in tensors if k.endswith("mlp.gate.weight")]:
        tensors[key] = tensors[key] * 30.0  # random routers are near-uniform; scaled, their choices are decisive
    for key in [k for k in tensors if ".mlp.experts." in k]:
        tensors[key] = tensors[key] * EXPERT_SCALE
    save_file(tensors, source / "model.safetensors", metadata={"format": "pt"})
    rc = main(["-m", str(source), "-o", str(tmp_path / "out"), "-p", "int4", "--accuracy-level", "0", "--verify"])
    err = capsys.readouterr().err
    line = next(l for l in err.splitlines() if l.startswith("verify:"))
    assert rc == 0 and line.endswith("PASS"), line
    # At accuracy level 0 only float summation order is left.
    assert float(line.split("cosine ")[1].split(",")[0]) > 0.99999, line


def test_verify_rounds_gpt_oss_experts_symmetric_and_transposed(tmp_path, capsys):
    # gpt-oss keeps its experts as x @ W ([E, H, 2I], [E, I, H]) and the build quantizes them
    # symmetric whatever was asked: an asymmetric (the int4 default) reference measured 0.994, a
    # float one 0.993.
    from test_family_gptoss import CONFIG

    source = make_checkpoint(tmp_path / "src", "GptOssConfig", **CONFIG)
    rc = main(["-m", str(source), "-o", str(tmp_path / "out"), "-p", "int4", "--accuracy-level", "0", "--verify"])
    err = capsys.readouterr().err
    line = next(l for l in err.splitlines() if l.startswith("verify:"))
    assert rc == 0 and float(line.split("cosine ")[1].split(",")[0]) > 0.99999, line


@pytest.mark.parametrize("family", ["hunyuan_moe", "qwen2_moe"])
def test_verify_keeps_routers_that_are_linears_in_float(tmp_path, capsys, family):
    # The build keeps every router in float; transformers has some as Linears (HunYuan's gate.wg,
    # Qwen2-MoE's shared_expert_gate), which the reference once rounded: relative 0.015 and 2.7e-4.
    import test_family_hunyuan_moe
    import test_family_moe

    source = (test_family_hunyuan_moe.make(tmp_path / "src") if family == "hunyuan_moe"
              else test_family_moe.make(tmp_path / "src", family))
    rc = main(["-m", str(source), "-o", str(tmp_path / "out"), "-p", "int4", "--accuracy-level", "0",
               "--quant-method", "rtn", "--symmetric", "--verify"])
    err = capsys.readouterr().err
    line = next(l for l in err.splitlines() if l.startswith("verify:"))
    assert rc == 0 and float(line.split("(relative ")[1].split(")")[0]) < 1e-5, line


def test_verify_keeps_an_int8_builds_tied_lookup_float(tmp_path, capsys):
    # An int8 build's tied vocabulary looks tokens up in a float table beside its 8-bit lm_head;
    # the reference rounded lm_head in place and so the embedding transformers ties to it: a
    # correct int8 build of a tied Gemma 4 was 9.4e-2 away at accuracy level 0 (now 2e-6).
    import test_family_gemma4

    source = test_family_gemma4.make(tmp_path / "src")
    rc = main(["-m", str(source), "-o", str(tmp_path / "out"), "-p", "int8", "--accuracy-level", "0", "--verify"])
    line = next(l for l in capsys.readouterr().err.splitlines() if l.startswith("verify:"))
    assert rc == 0 and float(line.split("relative ")[1].split(")")[0]) < 1e-4, line


@pytest.mark.parametrize("flags", [["--quantize-embeddings"], ["--int8-layers", "*embed_tokens"]])
def test_verify_rounds_an_untied_lookup_the_build_quantizes(tiny_llama, tmp_path, capsys, flags):
    # The reference left the table float: a correct --quantize-embeddings build failed at level 0
    # (cosine 0.9973, top-1 84%); now its logits are the build's to float32 precision.
    out = tmp_path / "out"
    assert main(["-m", str(tiny_llama), "-o", str(out), "-p", "int4", "--accuracy-level", "0", *flags, "--verify"]) == 0
    report = capsys.readouterr().err
    assert "cosine 1.000000" in report and "PASS" in report
