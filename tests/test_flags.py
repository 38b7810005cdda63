"""Options say what they do, or refuse: every flag either changes the build or stops it in one line."""

import dataclasses
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
from helpers import add_example_tokenizer

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
    return add_example_tokenizer(shutil.copytree(tiny_llama, tmp_path / "src"))


def nodes(out):
    return onnx.load(out / "model.onnx", load_external_data=False).graph.node


# --float-layers


def test_float_layers_accepts_checkpoint_module_names(src, tmp_path, capsys):
    out = tmp_path / "out"
    rc, _, err = run(capsys, "-m", src, "-o", out, "-q", "--float-layers", "*.q_proj")
    assert rc == 0, err
    by_name = {n.name: n.op_type for n in nodes(out)}
    for i in range(2):  # q, k and v are one fused linear: a pattern naming q_proj keeps it all in float
        assert by_name[f"/model/layers.{i}/self_attn/qkv_proj/FusedMatMul"] == "FusedMatMul"
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
    assert "/model/layers.1/self_attn/qkv_proj/FusedMatMul" in ops and "/model/layers.0/self_attn/qkv_proj/MatMulNBits" in ops


@pytest.mark.parametrize("pattern", ["*.nonexistent", "model.layers.9.*", "*.input_layernorm"])
def test_float_layers_matching_nothing_is_refused(src, tmp_path, capsys, pattern):
    assert_refused(capsys, tmp_path, ["-m", src, "--float-layers", pattern],
                   f"--float-layers {pattern!r} matches no linear layer of the checkpoint")


# --verify


@pytest.mark.parametrize("argv, message", [
    (["-p", "bf16", "-e", "cuda"], "--verify runs ONNX Runtime on the CPU, which has no bfloat16 kernels"),
    (["-p", "int4", "-e", "cuda", "--io-dtype", "bf16"], "--verify runs ONNX Runtime on the CPU, which has no bfloat16"),
    (["--dry-run"], "--verify and --dry-run together"),
])
def test_verify_is_refused_before_building(src, tmp_path, capsys, argv, message):
    assert_refused(capsys, tmp_path, ["-m", src, "--verify", *argv], message)


def test_verify_without_onnxruntime_is_refused_before_building(src, tmp_path, capsys, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "onnxruntime" else real(name, *a))
    assert_refused(capsys, tmp_path, ["-m", src, "--verify"], "--verify needs onnxruntime (the test extras")


def test_verify_without_onnxruntime_in_a_fresh_interpreter(src, tmp_path):
    # A sitecustomize that hides onnxruntime, as on a machine without the test extras.
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import sys\n"
        "from importlib.machinery import PathFinder\n"
        "class Hide(PathFinder):\n"
        "    @classmethod\n"
        "    def find_spec(cls, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'onnxruntime':\n"
        "            return None\n"
        "        return PathFinder.find_spec(name, path, target)\n"
        "sys.meta_path[:] = [Hide if f is PathFinder else f for f in sys.meta_path]\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), *sys.path]))
    r = subprocess.run([sys.executable, "-m", "builder", "-m", str(src), "-o", str(tmp_path / "out"), "--verify"],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines() == ["error: --verify needs onnxruntime (the test extras: pip install -e '.[test]')"]
    assert not (tmp_path / "out").exists()


def run_on_a_terminal(argv, cwd):
    """Runs the CLI with stderr on a pseudo-terminal (where progress bars show); returns (rc, stderr)."""
    leader, follower = pty.openpty()
    p = subprocess.Popen([sys.executable, "-m", "builder", *map(str, argv)], stderr=follower,
                         stdout=subprocess.DEVNULL, cwd=cwd)
    os.close(follower)
    err = b""
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        err += chunk
    os.close(leader)
    return p.wait(), err.decode()


def test_quiet_is_silent_on_a_terminal_even_with_verify(src, tmp_path):
    rc, err = run_on_a_terminal(["-m", src, "-o", tmp_path / "out", "-q", "-p", "fp32", "--verify"], tmp_path)
    assert rc == 0 and err == "", repr(err)


def test_quiet_verify_still_fails_by_exit_code(src, tmp_path, capsys, monkeypatch):
    import builder.verify

    real = builder.verify.verify

    def failing(*args, **kwargs):
        return [dataclasses.replace(v, passed=False) for v in real(*args, **kwargs)]

    monkeypatch.setattr(builder.verify, "verify", failing)
    rc, out, err = run(capsys, "-m", src, "-o", tmp_path / "out", "-q", "-p", "fp32", "--verify")
    assert rc == 3 and err == "" and out == str(tmp_path / "out")


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
    assert (q.block_size, q.symmetric, q.lm_head, q.embeddings, q.float_layers) == (32, False, True, False, ())
    int8 = BuildOptions(model="x", precision="int8").target().quantization
    assert q.method == "search" and (int8.method, int8.symmetric) == ("rtn", True)


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
    if method in ("awq", "gptq", "fp8") and not where:  # read (tests/test_awq_gptq.py, test_fp8.py), but float
        assert_refused(capsys, tmp_path, ["-m", src], f"quantization_config says {method}, but no tensor is named")
        return
    assert_refused(capsys, tmp_path, ["-m", src], f"(quant_method {method!r}); builder reads float checkpoints only")


def test_missing_tokenizer_is_a_warning(tiny_llama, src, tmp_path, capsys):
    rc, _, err = run(capsys, "-m", tiny_llama, "-o", tmp_path / "a", "-q", "-p", "fp32")
    assert rc == 0 and (tmp_path / "a" / "model.onnx").is_file()
    assert err.splitlines() == [
        f"warning: {tiny_llama} has no tokenizer.json or tokenizer.model: the model is built, but onnxruntime-genai's "
        "tokenizer needs tokenizer.json (with tokenizer_config.json) or tokenizer.model beside it"]
    rc, _, err = run(capsys, "-m", src, "-o", tmp_path / "b", "-q", "-p", "fp32")
    assert rc == 0 and err == ""


# the command line itself


STAGES = ("resolve", "plan", "write weights", "genai files", "hashing inputs")


def test_verbose_prints_the_plan_and_stage_timings(src, tmp_path, capsys):
    rc, _, err = run(capsys, "-m", src, "-o", tmp_path / "v", "-v", "-p", "fp32")
    assert rc == 0, err
    assert "architecture     LlamaForCausalLM (llama), 2 layers" in err and "peak memory" in err
    lines = err.splitlines()
    for stage in STAGES:
        assert any(line.startswith(stage) and line.endswith(" s") for line in lines), stage
    rc, _, err = run(capsys, "-m", src, "-o", tmp_path / "d", "-p", "fp32")
    assert rc == 0, err
    assert "architecture " not in err and not any(l.startswith(STAGES) for l in err.splitlines())


def test_abbreviated_flags_are_refused(src, tmp_path, capsys):
    assert main(["-m", str(src), "-o", str(tmp_path / "out"), "--quant"]) == 2
    assert capsys.readouterr().err == ("error: unrecognized argument --quant; did you mean --quant-method or "
                                         "--quantize-embeddings?\n")
    assert not (tmp_path / "out").exists()


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"builder {__version__}"


def test_list_architectures(capsys):
    rc, out, _ = run(capsys, "--list-architectures")
    assert rc == 0
    listed = dict(line.split("\t") for line in out.splitlines())
    assert listed == {name: f"architectures/{module}.py" for name, module in architectures.ARCHITECTURES.items()}
    assert all((Path(architectures.__file__).parent.parent / path).is_file() for path in listed.values())


def test_onnxruntime_genai_builder_spellings(src, tmp_path, capsys):
    out = tmp_path / "out"
    rc, _, err = run(capsys, "--model_name", "ignored/by-input", "--input", src, "--output", out, "--precision", "int4",
                     "--execution_provider", "cpu", "-c", tmp_path / "cache", "-q", "--extra_options",
                     "int4_block_size=64", "accuracy_level=0", "int4_is_symmetric=false", "exclude_embeds=false",
                     "windowed_kv_cache=true")
    assert rc == 0, err
    nbits = [n for n in nodes(out) if n.op_type == "MatMulNBits"]
    attrs = [{a.name: a.i for a in n.attribute} for n in nbits]
    assert nbits and all(a["block_size"] == 64 and a["accuracy_level"] == 0 for a in attrs)
    assert all(len(n.input) == 4 and n.input[3] for n in nbits)  # asymmetric: zero points
    record = yaml.safe_load((out / "build.yaml").read_text())
    assert record["cache_dir"] == str(tmp_path / "cache") and record["symmetric"] is False


@pytest.mark.parametrize("pair, message", [
    ("use_qdq=maybe", "--extra_options use_qdq=maybe: not a valid value for use_qdq"),
    ("exclude_lm_head=true", "--extra_options exclude_lm_head=true: builder does not do this"),
    ("int4_algo_config=k_quant", "--extra_options int4_algo_config: builder has no such option; it maps block_size"),
    ("block_size=big", "--extra_options block_size=big: not a valid value for block_size"),
    ("block_size", "--extra_options block_size: expected KEY=VALUE"),
    ("block_size=48", "--block-size: 48 is not one of: 16, 32, 64, 128, 256"),
])
def test_unknown_extra_options_are_refused(src, tmp_path, capsys, pair, message):
    assert_refused(capsys, tmp_path, ["-m", src, "--extra_options", pair], message)


def test_extra_options_contradicting_a_flag_are_refused(src, tmp_path, capsys):
    assert_refused(capsys, tmp_path, ["-m", src, "--block-size", "32", "--extra_options", "block_size=64"],
                   "--extra_options block_size=64 contradicts --block-size 32")
