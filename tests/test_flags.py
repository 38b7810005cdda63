"""Options say what they do, or refuse: every flag either changes the build or stops it in one line."""

import json
import os
import pty
import shutil
import subprocess
import sys
from pathlib import Path

import onnx
import pytest
import yaml

import architectures
from builder import __version__
from builder.cli import main
from builder.options import BuildOptions

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "tiny-llama"


def run(capsys, *argv):
    rc = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return rc, captured.out.strip(), captured.err.strip()


def assert_refused(capsys, tmp_path, argv, message):
    out = tmp_path / "out"
    rc, _, err = run(capsys, *argv, "-o", out)
    assert rc == 2, err
    assert len(err.splitlines()) == 1 and err.startswith("error: "), err
    assert message in err, err
    assert not out.exists()


@pytest.fixture
def src(tiny_llama, tmp_path):
    """The tiny checkpoint with tokenizer files beside it, as on the hub."""
    folder = shutil.copytree(tiny_llama, tmp_path / "src")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(EXAMPLE / name, folder / name)
    return folder


def nodes(out):
    return onnx.load(out / "model.onnx", load_external_data=False).graph.node


# --float-layers


def test_float_layers_accepts_checkpoint_module_names(src, tmp_path, capsys):
    out = tmp_path / "out"
    rc, _, err = run(capsys, "-m", src, "-o", out, "-q", "--float-layers", "*.q_proj")
    assert rc == 0, err
    by_name = {n.name: n.op_type for n in nodes(out)}
    for i in range(2):  # q, k and v are one fused linear: a pattern naming q_proj keeps it all in float
        assert by_name[f"/model/layers.{i}/self_attn/qkv_proj/MatMul"] == "MatMul"
        assert not any(n.startswith(f"/model/layers.{i}/self_attn/qkv_proj/") and op == "MatMulNBits"
                       for n, op in by_name.items())
        for module in ("self_attn/o_proj", "mlp/gate_proj", "mlp/up_proj", "mlp/down_proj"):
            assert by_name[f"/model/layers.{i}/{module}/MatMulNBits"] == "MatMulNBits"
    assert by_name["/lm_head/MatMulNBits"] == "MatMulNBits"


def test_float_layers_graph_paths_still_work(src, tmp_path, capsys):
    out = tmp_path / "out"
    rc, _, err = run(capsys, "-m", src, "-o", out, "-q", "--float-layers", "model.layers.1.self_attn.qkv_proj")
    assert rc == 0, err
    ops = {n.name: n.op_type for n in nodes(out)}
    assert "/model/layers.1/self_attn/qkv_proj/MatMul" in ops and "/model/layers.0/self_attn/qkv_proj/MatMulNBits" in ops


@pytest.mark.parametrize("pattern", ["*.nonexistent", "model.layers.9.*", "*.input_layernorm"])
def test_float_layers_matching_nothing_is_refused(src, tmp_path, capsys, pattern):
    assert_refused(capsys, tmp_path, ["-m", src, "--float-layers", pattern],
                   f"--float-layers {pattern!r} matches no linear layer of the checkpoint")


# quantization options with a float precision


@pytest.mark.parametrize("flags, name", [
    (["--block-size", "64"], "--block-size"),
    (["--block-size", "32"], "--block-size"),  # even the int4 default: it does nothing for fp16
    (["--asymmetric"], "--asymmetric"),
    (["--accuracy-level", "4"], "--accuracy-level"),
    (["--exclude-lm-head"], "--exclude-lm-head"),
    (["--quantize-embeddings"], "--quantize-embeddings"),
    (["--float-layers", "*.q_proj"], "--float-layers"),
])
@pytest.mark.parametrize("precision", ["fp16", "fp32"])
def test_quantization_flags_with_a_float_precision_are_refused(src, tmp_path, capsys, flags, name, precision):
    assert_refused(capsys, tmp_path, ["-m", src, "-p", precision, *flags],
                   f"error: {name}: applies to int4/int8 builds only; -p {precision} has no quantized weights")


def test_quantization_keys_with_a_float_precision_in_yaml_are_refused(src, tmp_path, capsys):
    cfg = tmp_path / "b.yaml"
    cfg.write_text(yaml.safe_dump({"model": str(src), "precision": "bf16", "execution_provider": "cuda",
                                   "exclude_lm_head": True}))
    assert_refused(capsys, tmp_path, ["--config", cfg], "key 'exclude_lm_head': applies to int4/int8 builds only")


def test_float_build_record_rebuilds_and_quantized_defaults_resolve(src, tmp_path, capsys):
    rc, _, err = run(capsys, "-m", src, "-o", tmp_path / "a", "-q", "-p", "fp32")
    assert rc == 0, err
    record = yaml.safe_load((tmp_path / "a" / "build.yaml").read_text())
    assert record["block_size"] is None and record["float_layers"] is None
    rc, _, err = run(capsys, "--config", tmp_path / "a" / "build.yaml", "-o", tmp_path / "b", "-q")
    assert rc == 0, err
    assert (tmp_path / "a" / "model.onnx.data").read_bytes() == (tmp_path / "b" / "model.onnx.data").read_bytes()
    q = BuildOptions(model="x").target().quantization
    assert (q.block_size, q.symmetric, q.lm_head, q.embeddings, q.float_layers) == (32, True, True, False, ())


# checkpoint checks


def test_context_length_past_max_position_embeddings_is_refused(src, tmp_path, capsys):
    assert_refused(capsys, tmp_path, ["-m", src, "--context-length", "129"],
                   "--context-length 129 is past the model's maximum of 128 positions (max_position_embeddings)")
    rc, _, err = run(capsys, "-m", src, "-o", tmp_path / "ok", "-q", "--context-length", "128", "--dry-run")
    assert rc == 0, err


@pytest.mark.parametrize("where", ["", "text_config"])
@pytest.mark.parametrize("method", ["awq", "gptq", "fp8", "bitsandbytes", "mxfp4"])
def test_prequantized_checkpoint_is_refused(src, tmp_path, capsys, where, method):
    config = json.loads((src / "config.json").read_text())
    q = {"quant_method": method, "bits": 4}
    if where:
        config[where] = {"quantization_config": q}
    else:
        config["quantization_config"] = q
    (src / "config.json").write_text(json.dumps(config))
    assert_refused(capsys, tmp_path, ["-m", src], f"(quant_method {method!r}); builder reads float checkpoints only")


def test_missing_tokenizer_is_a_warning(tiny_llama, src, tmp_path, capsys):
    rc, _, err = run(capsys, "-m", tiny_llama, "-o", tmp_path / "a", "-q", "-p", "fp32")
    assert rc == 0 and (tmp_path / "a" / "model.onnx").is_file()
    assert err.splitlines() == [
        f"warning: {tiny_llama} has no tokenizer.json or tokenizer.model: the model is built, but onnxruntime-genai's "
        "tokenizer needs tokenizer.json (with tokenizer_config.json) or tokenizer.model beside it"]
    rc, _, err = run(capsys, "-m", src, "-o", tmp_path / "b", "-q", "-p", "fp32")
    assert rc == 0 and err == ""
