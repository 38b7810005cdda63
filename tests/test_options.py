"""YAML builds and their validation, build records that rebuild byte for byte, dry runs."""

import hashlib
import json
from pathlib import Path

import onnx
import pytest
import yaml

from builder.cli import main
from builder.options import BuildOptions, fields

ROOT = Path(__file__).resolve().parent.parent


def run(capsys, *argv):
    rc = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return rc, captured.out.strip(), captured.err.strip()


def write_yaml(path, data):
    path.write_text(yaml.safe_dump(data))
    return path


def test_yaml_build_and_flag_override(tiny_llama, tmp_path, capsys):
    cfg = write_yaml(tmp_path / "b.yaml", {
        "model": str(tiny_llama), "output": str(tmp_path / "from-yaml"), "precision": "int4", "block_size": 16,
        "float_layers": ["model.layers.0.*"], "search": {"top_k": 7, "temperature": 0.5}, "context_length": 64,
    })
    rc, _, err = run(capsys, "--config", cfg, "-q", "--block-size", "64", "-o", tmp_path / "from-flag")
    assert rc == 0, err
    out = tmp_path / "from-flag"
    assert not (tmp_path / "from-yaml").exists()
    model = onnx.load(out / "model.onnx", load_external_data=False)
    nbits = [n for n in model.graph.node if n.op_type == "MatMulNBits"]
    assert nbits and all(dict((a.name, a.i) for a in n.attribute)["block_size"] == 64 for n in nbits)
    assert not any(n.name.startswith("/model/layers.0/") for n in nbits)
    cos = next(t for t in model.graph.initializer if t.name == "model.rotary_emb.cos_cache")
    assert list(cos.dims)[0] == 64
    genai = json.loads((out / "genai_config.json").read_text())
    assert genai["model"]["context_length"] == 64
    assert genai["search"]["top_k"] == 7 and genai["search"]["temperature"] == 0.5


@pytest.mark.parametrize("data, message", [
    ({"modle": "x"}, "key 'modle': unknown key; did you mean 'model'?"),
    ({"model": "x", "precision": "int3"}, "key 'precision': 'int3' is not one of: int4, int8, fp16, bf16, fp32"),
    ({"model": "x", "block_size": "32"}, "key 'block_size': expected an integer, got '32'"),
    ({"model": "x", "block_size": 48}, "key 'block_size': 48 is not one of: 16, 32, 64, 128, 256"),
    ({"model": "x", "symmetric": "yes"}, "key 'symmetric': expected true or false, got 'yes'"),
    ({"model": "x", "float_layers": "lm_head"}, "key 'float_layers': expected a list of strings"),
    ({"model": "x", "search": {"topk": 3}}, "key 'search': unknown key 'topk'; allowed: do_sample, "),
    ({"model": "x", "search": {"top_k": 0.5}}, "key 'search': top_k must be int, got 0.5"),
    ({"model": "x", "precision": "fp16", "io_dtype": "fp32"}, "key 'io_dtype': a fp16 model's activations are fp16"),
    ({"model": "x", "precision": "int4", "bits": 8}, "key 'bits': 8 contradicts precision 'int4'"),
    ({"model": "x", "io_dtype": "bf16"}, "key 'precision': -p int4 with io_dtype bf16 -e cpu is not supported"),
    ({"model": "x", "context_length": 0}, "key 'context_length': 0 is not a positive number of positions"),
])
def test_yaml_validation_is_one_line_naming_file_and_key(tmp_path, capsys, data, message):
    cfg = write_yaml(tmp_path / "bad.yaml", data)
    rc, _, err = run(capsys, "--config", cfg, "-o", tmp_path / "out")
    assert rc == 2 and len(err.splitlines()) == 1
    assert err.startswith(f"error: {cfg}: "), err
    assert message in err, err
    assert not (tmp_path / "out").exists()


def test_flag_errors_name_the_flag(tiny_llama, tmp_path, capsys):
    rc, _, err = run(capsys, "-m", tiny_llama, "--context-length", "-3", "-o", tmp_path / "out")
    assert rc == 2 and err == "error: --context-length: -3 is not a positive number of positions"
    rc, _, err = run(capsys, "-m", tiny_llama, "-p", "int4", "--bits", "8", "-o", tmp_path / "out")
    assert rc == 2 and err == "error: --bits: 8 contradicts precision 'int4'"


def test_bad_yaml_files(tmp_path, capsys):
    (tmp_path / "broken.yaml").write_text("model: [unclosed\n")
    rc, _, err = run(capsys, "--config", tmp_path / "broken.yaml")
    assert rc == 2 and "not valid YAML at line" in err
    rc, _, err = run(capsys, "--config", tmp_path / "missing.yaml")
    assert rc == 2 and "no such config file" in err
    (tmp_path / "list.yaml").write_text("- a\n- b\n")
    rc, _, err = run(capsys, "--config", tmp_path / "list.yaml")
    assert rc == 2 and "expected a mapping" in err


def digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_build_record_rebuilds_byte_identical(tiny_llama, tmp_path, capsys):
    rc, _, err = run(capsys, "-m", tiny_llama, "-o", tmp_path / "a", "-q", "--asymmetric", "--block-size", "16")
    assert rc == 0, err
    record = yaml.safe_load((tmp_path / "a" / "build.yaml").read_text())
    assert record["precision"] == "int4" and record["symmetric"] is False and record["block_size"] == 16
    assert record["input"] == str(tiny_llama.resolve())
    assert record["record"]["sha256"]["model.safetensors"] == digest(tiny_llama / "model.safetensors")
    assert record["record"]["sha256"]["config.json"] == digest(tiny_llama / "config.json")
    rc, _, err = run(capsys, "--config", tmp_path / "a" / "build.yaml", "--output", tmp_path / "b", "-q")
    assert rc == 0, err
    for name in ("model.onnx", "model.onnx.data", "genai_config.json"):
        assert digest(tmp_path / "a" / name) == digest(tmp_path / "b" / name), name


def test_dry_run_reads_no_weights_and_writes_nothing(tiny_llama, tmp_path, capsys, monkeypatch):
    import builder.inputs.safetensors

    def no_reads(info):
        raise AssertionError(f"dry run mapped {info.name}")

    monkeypatch.setattr(builder.inputs.safetensors, "mapped", no_reads)
    rc, out, err = run(capsys, "-m", tiny_llama, "-o", tmp_path / "out", "--dry-run", "-p", "int4")
    assert rc == 0, err
    assert not (tmp_path / "out").exists()
    assert "LlamaForCausalLM (llama), 2 layers" in out
    params = sum(p.numel() for p in __import__("transformers").AutoModelForCausalLM.from_pretrained(tiny_llama).parameters())
    assert f"parameters       {params:,}" in out
    assert "com.microsoft::GroupQueryAttention 2" in out and "com.microsoft::MatMulNBits 11" in out
    assert "model.onnx.data" in out and "peak memory" in out and "disk needed" in out


def test_dry_run_predicts_output_sizes(tiny_llama, tmp_path, capsys):
    rc, plan, _ = run(capsys, "-m", tiny_llama, "-o", tmp_path / "out", "--dry-run", "-p", "fp16")
    rc, _, _ = run(capsys, "-m", tiny_llama, "-o", tmp_path / "out", "-p", "fp16", "-q")
    data = (tmp_path / "out" / "model.onnx.data").stat().st_size
    predicted = next(line for line in plan.splitlines() if "model.onnx.data" in line).split()[-2:]
    value, unit = float(predicted[0]), predicted[1]
    assert abs(value * {"KB": 1e3, "MB": 1e6, "GB": 1e9}[unit] - data) <= 0.05e3 * {"KB": 1, "MB": 1e3, "GB": 1e6}[unit]


def test_disk_full_is_refused_before_writing(tiny_llama, tmp_path, capsys, monkeypatch):
    import shutil
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**9, 10**9 - 1000, 1000))
    rc, _, err = run(capsys, "-m", tiny_llama, "-o", tmp_path / "out")
    assert rc == 2 and "has 1.0 KB free but the build writes" in err
    assert not (tmp_path / "out").exists()


def test_remote_code_is_refused(tiny_llama, tmp_path, capsys):
    import shutil

    src = tmp_path / "src"
    shutil.copytree(tiny_llama, src)
    cfg = json.loads((src / "config.json").read_text())
    cfg.update(architectures=["MyCustomForCausalLM"], auto_map={"AutoModelForCausalLM": "modeling_custom.MyCustomForCausalLM"})
    (src / "config.json").write_text(json.dumps(cfg))
    rc, _, err = run(capsys, "-m", src, "-o", tmp_path / "out")
    assert rc == 2 and "trust_remote_code" in err and "never runs" in err


def test_every_option_is_documented_in_configs_readme():
    readme = (ROOT / "configs" / "README.md").read_text()
    for f in fields():
        assert f"`{f.name}`" in readme, f.name


def test_shipped_configs_are_valid():
    files = sorted((ROOT / "configs").glob("*.yaml"))
    assert len(files) >= 28
    for path in files:
        data = yaml.safe_load(path.read_text())
        options = BuildOptions.from_dict(data)
        assert options.model and "/" in options.model, path
        assert (options.precision, options.execution_provider) in {("int4", "cpu"), ("fp16", "cuda")}, path
        assert path.stem == f"{options.model.split('/')[1]}-{options.precision}-{options.execution_provider}", path


def test_python_api_quantization_defaults_are_the_command_line_ones():
    # Quantization() defaulted to round-to-nearest symmetric while the CLI's int4 is the scale
    # search with zero points: the same model quantized differently from Python and the shell.
    from builder.options import BuildOptions
    from builder.target import Quantization

    for precision, bits in (("int4", 4), ("int8", 8)):
        cli = BuildOptions(model="x", precision=precision).target().quantization
        api = Quantization(bits=bits)
        assert (api.method, api.symmetric) == (cli.method, cli.symmetric)
    assert (Quantization().method, Quantization().symmetric) == ("search", False)
    assert (Quantization(bits=8).method, Quantization(bits=8).symmetric) == ("rtn", True)
