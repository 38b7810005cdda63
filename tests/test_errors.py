"""Bad input and bad luck: one line on stderr, a non-zero exit, no output folder, never a traceback."""

import errno
import json
import shutil
import struct
from pathlib import Path

import numpy as np
import onnx_ir.external_data
import pytest
from helpers import add_example_tokenizer
from safetensors.numpy import load_file, save_file

from builder.cli import main

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "tiny-llama"


def run(capsys, *argv):
    rc = main([str(a) for a in argv])
    err = capsys.readouterr().err.strip()
    return rc, err


@pytest.fixture
def src(tiny_llama, tmp_path):
    """The tiny checkpoint with tokenizer files, as a hub folder has them (no missing-tokenizer warning)."""
    return add_example_tokenizer(shutil.copytree(tiny_llama, tmp_path / "src"))


def assert_refused(capsys, tmp_path, argv, message, code=2):
    out = tmp_path / "out"
    rc, err = run(capsys, *argv, "-q", "-o", out)
    assert rc == code, err
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and "Traceback" not in err, err
    assert message in err, err
    assert not out.exists()
    assert not list(tmp_path.glob(".out.*")), "a staging folder was left behind"


def edit_tensors(folder, fn):
    tensors = load_file(folder / "model.safetensors")
    fn(tensors)
    save_file(tensors, folder / "model.safetensors")


def test_missing_tensor(src, tmp_path, capsys):
    edit_tensors(src, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
    assert_refused(capsys, tmp_path, ["-m", src], "lacks tensor 'model.layers.1.mlp.up_proj.weight'")


def test_shape_disagrees_with_config(src, tmp_path, capsys):
    cfg = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps(dict(cfg, intermediate_size=96)))
    assert_refused(capsys, tmp_path, ["-m", src], "has shape [128, 64] but config.json implies [96, 64]")


def test_dtype_is_not_a_float(src, tmp_path, capsys):
    edit_tensors(src, lambda t: t.update({"model.norm.weight": np.ones(64, np.int64)}))
    assert_refused(capsys, tmp_path, ["-m", src], "'model.norm.weight' has dtype int64")


def test_truncated_and_corrupt_checkpoints(src, tmp_path, capsys):
    data = (src / "model.safetensors").read_bytes()
    (src / "model.safetensors").write_bytes(data[: len(data) // 2])
    assert_refused(capsys, tmp_path, ["-m", src], "truncated file")
    (src / "model.safetensors").write_bytes(struct.pack("<Q", 20) + b'{"a": [1, 2, oops]} ' + data[100:])
    assert_refused(capsys, tmp_path, ["-m", src], "corrupt safetensors header")


@pytest.mark.parametrize("value,flags,what", [
    (np.nan, [], "holds NaN"), (-np.inf, [], "holds an infinity"),
    (1e6, ["-e", "cuda"], "holds values up to 1e+06, past float16 scales' range")], ids=["nan", "inf", "fp16-scales"])
def test_a_weight_no_finite_scale_holds_is_refused(src, tmp_path, capsys, value, flags, what):
    """A NaN or an infinity in a checkpoint weight, or a block wider than float16 scales reach, gave
    the block a scale that is not finite: the int4 build finished and its model computed NaN."""
    def poison(tensors):
        tensors["model.layers.1.mlp.down_proj.weight"][3, 40] = value

    edit_tensors(src, poison)
    assert_refused(capsys, tmp_path, ["-m", src, "-p", "int4", *flags],
                   f"model.layers.1.mlp.down_proj.weight {what} (row 3, columns 32-63; 1 block in all): "
                   "a model built from it would compute NaN")


@pytest.mark.parametrize("tensor,value,flags,what", [
    ("model.layers.1.mlp.down_proj.weight", np.nan, ["-p", "fp32"], "holds NaN (at [3, 40] of the [64, 128] written"),
    ("model.layers.1.mlp.down_proj.weight", 1e5, ["-p", "fp16"],  # float32 in the checkpoint, past float16
     "holds a value past float16's range (±65,504) or an infinity (at [3, 40] of the [64, 128] written"),
    ("model.norm.weight", -np.inf, ["-p", "int4"], "holds an infinity (at [40] of the [64] written"),
    ("model.embed_tokens.weight", np.nan, ["-p", "fp16"], "holds NaN (at [3, 40] of the [256, 64] written")],
    ids=["fp32-nan", "fp16-overflow", "int4-norm-inf", "fp16-table-nan"])
def test_a_float_weight_that_is_not_finite_is_refused(src, tmp_path, capsys, tensor, value, flags, what):
    """A float weight written NaN or infinite (in the checkpoint, or a float32 value cast past
    float16's range for an fp16 build) made a model that computes NaN, built with exit code 0."""
    def poison(tensors):
        tensors[tensor][(3, 40) if tensors[tensor].ndim == 2 else 40] = value

    edit_tensors(src, poison)
    assert_refused(capsys, tmp_path, ["-m", src, *flags], f"{tensor} {what}; 1 in that block of rows): a model built "
                   "from it would compute NaN")


def test_pickle_only_checkpoint(src, tmp_path, capsys):
    (src / "model.safetensors").rename(src / "pytorch_model.bin")
    assert_refused(capsys, tmp_path, ["-m", src], "never unpickles")


def test_output_path_that_cannot_be_written(src, tmp_path, capsys):
    (tmp_path / "a-file").write_text("x")
    rc, err = run(capsys, "-m", src, "-q", "-o", tmp_path / "a-file" / "out")
    assert rc == 2 and "cannot write to" in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("failure, code, message", [
    (OSError(errno.ENOSPC, "No space left on device"), 2, "No space left on device; nothing was written"),
    (KeyboardInterrupt(), 130, "interrupted; nothing was written"),
])
def test_failure_in_the_middle_of_writing_weights(src, tmp_path, capsys, monkeypatch, failure, code, message):
    real = onnx_ir.external_data._write_tensor_at
    written = []

    def failing(tensor, file, offset):
        if len(written) >= 3:  # after some weights are on disk
            raise failure
        written.append(tensor.name)
        real(tensor, file, offset)

    monkeypatch.setattr(onnx_ir.external_data, "_write_tensor_at", failing)
    assert_refused(capsys, tmp_path, ["-m", src, "-p", "fp32"], message, code)
    assert len(written) == 3


def test_unknown_precision_flag_is_one_line(tiny_llama, capsys):
    assert main(["-m", str(tiny_llama), "-p", "int3"]) == 2
    assert capsys.readouterr().err.startswith("error: argument -p/--precision: invalid choice: 'int3'")


def test_debug_shows_the_traceback(tmp_path):
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "builder", "-m", str(tmp_path / "missing"), "--debug"],
                       capture_output=True, text=True)
    assert r.returncode != 0 and "Traceback" in r.stderr and "BuildError" in r.stderr


def test_progress_off_a_terminal_is_plain_lines(tiny_llama, tmp_path):
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "builder", "-m", str(tiny_llama), "-o", str(tmp_path / "out"), "-p", "fp32"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    lines = [l for l in r.stderr.splitlines() if l.startswith("reading, converting and writing weights:")]
    assert lines and lines[-1].startswith("reading, converting and writing weights: 100% (")
    assert all("ETA" in l and "\r" not in l for l in lines)
    assert len(lines) <= 11


@pytest.mark.parametrize("change, message", [
    ({"rope_parameters": {"rope_type": "mrope", "rope_theta": 10000.0}}, "unsupported rope_type 'mrope'; supported: default,"),
    ({"hidden_act": "swish_glu"}, "unsupported activation 'swish_glu'; supported: silu,"),
])
def test_unsupported_model_features(src, tmp_path, capsys, change, message):
    cfg = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**cfg, **change}))
    assert_refused(capsys, tmp_path, ["-m", src], message)
