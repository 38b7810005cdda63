"""Outputs never destroy inputs: --overwrite replaces only a previous build, never an input or a
folder holding one; output folders follow the umask; `-o .` fails cleanly."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import build
from test_hub import COMMIT, fill_cache, run_builder

from builder.cli import main
from builder.errors import BuildError
from builder.output_folder import check_output

ROOT = Path(__file__).resolve().parent.parent


def run(capsys, *argv):
    rc = main(list(argv))
    return rc, capsys.readouterr().err


def snapshot(folder):
    """Every file under `folder` with its bytes: what must survive a refused build."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def copy_checkpoint(tiny_llama, folder):
    shutil.copytree(tiny_llama, folder)
    return folder


def test_output_that_is_the_input_is_refused(tiny_llama, tmp_path, capsys):
    ck = copy_checkpoint(tiny_llama, tmp_path / "ck")
    (ck / "build.yaml").write_text("even a build record does not make an input replaceable\n")
    before = snapshot(tmp_path)
    for argv in (["-m", str(ck)], ["-m", "unused/id", "-i", str(ck)]):
        rc, err = run(capsys, *argv, "-o", str(ck), "--overwrite", "-q")
        assert rc == 2 and err.startswith("error: ") and len(err.splitlines()) == 1, err
        assert "is the input" in err
        assert snapshot(tmp_path) == before


def test_output_that_holds_the_input_is_refused(tiny_llama, tmp_path, capsys):
    parent = tmp_path / "parent"
    copy_checkpoint(tiny_llama, parent / "ck")
    (parent / "build.yaml").write_text("a previous build's record\n")
    before = snapshot(tmp_path)
    for out in (parent, tmp_path, parent / "ck" / ".."):
        rc, err = run(capsys, "-m", str(parent / "ck"), "-o", str(out), "--overwrite", "-q")
        assert rc == 2 and "is the input" in err and len(err.splitlines()) == 1, err
        assert snapshot(tmp_path) == before


def test_output_that_holds_the_hub_snapshot_is_refused(tiny_llama, tmp_path):
    cache = tmp_path / "hub"
    fill_cache(cache, "tiny-org/tiny-llama", tiny_llama)
    for folder in (cache, cache / "models--tiny-org--tiny-llama"):  # so only the input rule can refuse
        (folder / "build.yaml").write_text("a previous build's record\n")
    before = snapshot(tmp_path)
    env = {"HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    for out in (cache, cache / "models--tiny-org--tiny-llama"):
        r = run_builder(env, "-m", "tiny-org/tiny-llama", "-o", str(out), "--overwrite", "-q", cwd=tmp_path)
        # Refused up front, before the hub lookup: no builder record there (test_output_safety.py).
        assert r.returncode == 2 and r.stderr.startswith("error: ") and "builder did not write" in r.stderr, r.stderr
        assert snapshot(tmp_path) == before
        # The input rule, which holds even for a folder whose contents would pass.
        with pytest.raises(BuildError, match="is the input"):
            check_output(out, True, [cache / "models--tiny-org--tiny-llama" / "snapshots" / COMMIT])


def test_unrelated_folder_is_never_emptied(tiny_llama, tmp_path, capsys):
    out = tmp_path / "photos"
    out.mkdir()
    (out / "holiday.jpg").write_bytes(b"\xff\xd8 precious")
    rc, err = run(capsys, "-m", str(tiny_llama), "-o", str(out), "--overwrite", "-q")
    assert rc == 2 and "no build.yaml" in err and len(err.splitlines()) == 1, err
    assert snapshot(out) == {"holiday.jpg": b"\xff\xd8 precious"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["photos"]


def test_previous_build_is_replaced(tiny_llama, tmp_path, capsys):
    out = build(tiny_llama, tmp_path / "out", "-p", "fp32")
    (out / "vision.onnx").write_text("from an older build")  # a file a build writes, but not this one
    rc, err = run(capsys, "-m", str(tiny_llama), "-o", str(out), "--overwrite", "-q", "-p", "fp32")
    assert rc == 0, err
    assert (out / "model.onnx").is_file() and not (out / "vision.onnx").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


@pytest.mark.parametrize("contents", ["empty", "previous build"])
def test_current_folder_as_output_fails_cleanly(tiny_llama, tmp_path, capsys, monkeypatch, contents):
    here = tmp_path / "here"
    if contents == "empty":
        here.mkdir()
    else:
        build(tiny_llama, here, "-p", "fp32")
    capsys.readouterr()  # the setup build's own output (its no-tokenizer warning)
    before = snapshot(tmp_path)
    monkeypatch.chdir(here)
    for out in (".", "..", str(here)):
        rc, err = run(capsys, "-m", str(tiny_llama), "-o", out, "--overwrite", "-q", "-p", "fp32")
        assert rc == 2 and "current folder" in err and len(err.splitlines()) == 1, err
        assert snapshot(tmp_path) == before
        assert sorted(p.name for p in tmp_path.iterdir()) == ["here"]  # no ..old-* or .partial-* left


def test_output_folder_follows_the_umask(tiny_llama, tmp_path):
    old = os.umask(0o022)
    try:
        out = build(tiny_llama, tmp_path / "out", "-p", "fp32")
        os.umask(0o027)
        other = build(tiny_llama, tmp_path / "other", "-p", "fp32")
    finally:
        os.umask(old)
    assert out.stat().st_mode & 0o777 == 0o755
    assert other.stat().st_mode & 0o777 == 0o750


# What `pip install -e .` installs: a finder asked only after sys.path (the current folder first) has
# no answer. It stands in for whatever install runs the tests (PYTHONPATH would put the checkout
# ahead of the installed finder and hide the shadowing).
EDITABLE_FINDER = """
import importlib.machinery, sys
ROOT = {root!r}
class Finder:
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        parent = name.rpartition(".")[0]
        if name in ("builder", "architectures"):
            return importlib.machinery.PathFinder.find_spec(name, [ROOT])
        if parent in ("builder", "architectures"):  # as setuptools' finder: a top-level package's children
            return importlib.machinery.PathFinder.find_spec(name, [ROOT + "/" + parent])
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in type(f).__module__ + getattr(f, "__module__", "")]
sys.meta_path.append(Finder)
"""

SHADOWS = {
    "architectures": ["architectures/"],
    "architectures-package": ["architectures/__init__.py"],
    "builder": ["builder/"],
    "builder-package": ["builder/__init__.py"],
    "parent-of-a-clone": ["builder/pyproject.toml", "builder/builder/", "builder/architectures/"],
}


@pytest.mark.parametrize("shadow", SHADOWS)
def test_python_m_builder_runs_from_any_folder(tmp_path, shadow):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(EDITABLE_FINDER.format(root=str(ROOT)))
    cwd = tmp_path / "cwd"
    for entry in SHADOWS[shadow]:
        path = cwd / entry
        if entry.endswith("/"):
            path.mkdir(parents=True)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("")
    env = dict(os.environ, PYTHONPATH=str(site))
    r = subprocess.run([sys.executable, "-m", "builder", "-m", str(ROOT / "examples" / "tiny-llama"), "-o", "out",
                        "-p", "fp32", "-q"], cwd=cwd, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert (cwd / "out" / "model.onnx").is_file() and (cwd / "out" / "genai_config.json").is_file()
