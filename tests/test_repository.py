"""The repository holds no build output: 16 build folders (build.yaml and genai_config.json with a
scratch machine's absolute paths) were once committed at its root."""

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_no_build_output_is_tracked():
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    output = [f for f in files if Path(f).name in ("build.yaml", "genai_config.json") or f.endswith((".onnx", ".onnx.data"))]
    assert output == []


def test_the_design_document_the_code_cites_is_here():
    assert (ROOT / "docs" / "DESIGN.md").is_file()
