"""Every preset of scripts/make_synthetic_checkpoint.py, shrunk to a few MB with its layout kept
(names, fused tensors, multimodal parts, rope settings), builds: the benchmark checkpoints are
ones the architectures accept, and builds of them account for every tensor."""

import sys
from pathlib import Path

import onnxruntime as ort
import pytest
from helpers import build

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
from make_synthetic_checkpoint import PRESETS, TENSORS, shrunk, write_checkpoint  # noqa: E402


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_preset_layout_builds(name, tmp_path):
    config = shrunk(PRESETS[name])
    write_checkpoint(tmp_path / "src", config)
    out = build(tmp_path / "src", tmp_path / "out", "-p", "int4")
    session = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    assert session.get_outputs()[0].name == "logits"
    assert sum(1 for _ in TENSORS[config["model_type"]](config)) > 10


def test_every_preset_is_a_declared_family():
    # The presets are checked against the families' declarations (the registry): a preset whose
    # architecture no family declares would be a benchmark of nothing builder builds.
    import architectures

    declared = {a: f.name for f in architectures.families() for a in f.architectures}
    for name, config in PRESETS.items():
        assert architectures.canonical(config["architectures"][0]) in declared, name
