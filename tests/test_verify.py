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
