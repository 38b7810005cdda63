"""builder/registry.py: the families come from the installed `builder.families` entry points, so a
package of one's own families registers the same way builder's own do, with no change to builder."""

import json
import os
import subprocess
import sys
from pathlib import Path

from helpers import make_checkpoint

from builder import registry

PLUGIN = '''
"""A family outside builder: Llama's math under another architecture name."""
from architectures.llama import FAMILY as LLAMA
from builder.family import register

FAMILY = register(LLAMA.with_(name="plugin_llama", variants={"PluginLlamaForCausalLM": dict(model_type="llama")},
                              structure={}, model_types={}))
'''


def plugin_path(folder: Path) -> Path:
    """A folder holding the package `plugin_families` and its distribution's metadata, which names
    it as a `builder.families` entry point (what pip writes for a pyproject.toml that declares it)."""
    (folder / "plugin_families").mkdir(parents=True)
    (folder / "plugin_families" / "__init__.py").write_text(PLUGIN)
    dist = folder / "plugin_families-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: plugin-families\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[builder.families]\nplugin = plugin_families\n")
    return folder


def run_builder(folder: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(folder), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "builder", *args], capture_output=True, text=True, env=env,
                          timeout=300)


def test_builders_own_families_come_from_its_entry_point():
    assert "architectures" in {p.value for p in registry.importlib.metadata.entry_points(group=registry.GROUP)}
    assert {"LlamaForCausalLM", "JambaForCausalLM", "WhisperForConditionalGeneration"} <= set(registry.architectures())


def test_another_packages_family_is_listed_and_built(tmp_path):
    folder = plugin_path(tmp_path / "site")
    listed = run_builder(folder, "--list-architectures")
    assert listed.returncode == 0, listed.stderr
    names = [line.split("\t")[0] for line in listed.stdout.splitlines()]
    assert "PluginLlamaForCausalLM" in names and "LlamaForCausalLM" in names  # beside builder's own

    source = make_checkpoint(tmp_path / "src", "LlamaConfig", vocab_size=256, hidden_size=64, intermediate_size=128,
                             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
    raw = json.loads((source / "config.json").read_text())
    (source / "config.json").write_text(json.dumps({**raw, "architectures": ["PluginLlamaForCausalLM"]}))
    built = run_builder(folder, "-m", str(source), "-o", str(tmp_path / "out"), "-p", "fp32", "-q")
    assert built.returncode == 0, built.stderr
    assert (tmp_path / "out" / "model.onnx").is_file()
    # without the plugin the same checkpoint is an unknown architecture
    assert "unsupported architecture 'PluginLlamaForCausalLM'" in run_builder(
        tmp_path / "empty", "-m", str(source), "-o", str(tmp_path / "out2"), "-p", "fp32", "-q").stderr
