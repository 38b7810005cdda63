"""Nothing outside the model folder is read, and nothing of the checkpoint is run.

A downloaded folder may hold links pointing anywhere and an index naming any path; its
tokenizer_config.json or config.json may name Python files for transformers to import. builder
refuses the first two in one line before reading anything, and --verify never runs the third.
"""

import hashlib
import io
import json
import os
import shutil
import stat
import sys
from pathlib import Path

import pytest

from builder.cli import main

EXAMPLE = Path(__file__).parent.parent / "examples" / "tiny-llama"  # a checkpoint with a tokenizer


def run(capsys, folder, out, *flags):
    """main() on `folder`; returns (exit code, stderr)."""
    capsys.readouterr()
    rc = main(["-m", str(folder), "-o", str(out), "-q", "-p", "fp32", *flags])
    return rc, capsys.readouterr().err.strip()


def assert_refused(rc, err, out, *words):
    assert rc == 2 and "\n" not in err and err.startswith("error: "), err
    assert all(w in err for w in words), err
    assert not out.exists()
    assert [p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}")] == []  # no staging left


def copy_of(source: Path, folder: Path) -> Path:
    shutil.copytree(source, folder)
    return folder


def secret(tmp_path) -> Path:
    """A private file elsewhere, as a home folder's keys are."""
    path = tmp_path / "elsewhere" / "secret.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text('{"not": "yours"}')
    path.chmod(0o600)
    return path


# -- the index --------------------------------------------------------------------------------

def indexed(tmp_path, source, name) -> Path:
    """A copy of `source`'s config with a model.safetensors.index.json naming every tensor's file
    `name`; the weights themselves lie in tmp_path/elsewhere."""
    from safetensors import safe_open

    weights = tmp_path / "elsewhere" / "model.safetensors"
    weights.parent.mkdir(exist_ok=True)
    shutil.copyfile(source / "model.safetensors", weights)
    folder = tmp_path / "model"
    folder.mkdir()
    shutil.copyfile(source / "config.json", folder / "config.json")
    with safe_open(weights, "np") as f:
        weight_map = {tensor: name for tensor in f.keys()}  # noqa: SIM118 - safe_open is not a mapping
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return folder


@pytest.mark.parametrize("kind", ["absolute", "dotdot"])
def test_index_naming_a_file_outside_is_refused(tiny_llama, tmp_path, capsys, kind):
    name = str(tmp_path / "elsewhere" / "model.safetensors") if kind == "absolute" else "../elsewhere/model.safetensors"
    folder = indexed(tmp_path, tiny_llama, name)
    rc, err = run(capsys, folder, tmp_path / "out")
    assert_refused(rc, err, tmp_path / "out", "model.safetensors.index.json: weight_map names", repr(name),
                   "not a file of this folder")


def test_index_naming_a_file_of_the_folder_builds(tiny_llama, tmp_path):
    folder = indexed(tmp_path, tiny_llama, "model.safetensors")
    shutil.copyfile(tiny_llama / "model.safetensors", folder / "model.safetensors")
    assert main(["-m", str(folder), "-o", str(tmp_path / "out"), "-q", "-p", "fp32"]) == 0


# -- links ------------------------------------------------------------------------------------

def test_tokenizer_link_to_a_private_file_outside_is_refused(tmp_path, capsys):
    folder = copy_of(EXAMPLE, tmp_path / "model")
    target = secret(tmp_path)
    (folder / "tokenizer.json").unlink()
    (folder / "tokenizer.json").symlink_to(target)
    rc, err = run(capsys, folder, tmp_path / "out")
    assert_refused(rc, err, tmp_path / "out", f"{folder / 'tokenizer.json'} is a link to {target}",
                   "outside the model folder")


def test_config_link_outside_is_refused(tiny_llama, tmp_path, capsys):
    folder = copy_of(tiny_llama, tmp_path / "model")
    (tmp_path / "elsewhere").mkdir()
    target = Path(shutil.copyfile(folder / "config.json", tmp_path / "elsewhere" / "config.json"))
    (folder / "config.json").unlink()
    (folder / "config.json").symlink_to(target)
    rc, err = run(capsys, folder, tmp_path / "out")
    assert_refused(rc, err, tmp_path / "out", "config.json is a link to", str(target))


def test_a_chain_of_links_is_judged_by_its_final_target(tiny_llama, tmp_path, capsys):
    # config.json -> hop.json (a link in the folder) -> a file outside: refused.
    folder = copy_of(tiny_llama, tmp_path / "model")
    target = secret(tmp_path)
    (folder / "hop.json").symlink_to(target)
    (folder / "config.json").rename(folder / "real-config.json")
    (folder / "config.json").symlink_to("hop.json")
    rc, err = run(capsys, folder, tmp_path / "out")
    assert_refused(rc, err, tmp_path / "out", "is a link to", str(target))
    # A chain that leaves the folder only to come back into it ends at a file of the folder.
    (folder / "hop.json").unlink()
    (tmp_path / "elsewhere" / "back.json").symlink_to(folder / "real-config.json")
    (folder / "hop.json").symlink_to(tmp_path / "elsewhere" / "back.json")
    assert main(["-m", str(folder), "-o", str(tmp_path / "out"), "-q", "-p", "fp32"]) == 0


def test_links_inside_the_folder_and_a_linked_folder_build(tiny_llama, tmp_path):
    real = copy_of(tiny_llama, tmp_path / "real")
    (real / "weights").mkdir()
    (real / "model.safetensors").rename(real / "weights" / "model.safetensors")
    (real / "model.safetensors").symlink_to("weights/model.safetensors")
    (tmp_path / "linked").symlink_to(real)  # the folder the user names may itself be a link
    assert main(["-m", str(tmp_path / "linked"), "-o", str(tmp_path / "out"), "-q", "-p", "fp32"]) == 0


def test_adapter_file_linked_outside_is_refused(tiny_llama, tmp_path, capsys):
    from test_lora import make_adapter

    adapter = make_adapter(tiny_llama, tmp_path / "adapter")
    moved = tmp_path / "elsewhere" / "adapter_model.safetensors"
    moved.parent.mkdir()
    (adapter / "adapter_model.safetensors").rename(moved)
    (adapter / "adapter_model.safetensors").symlink_to(moved)
    rc, err = run(capsys, tiny_llama, tmp_path / "out", "--adapter", str(adapter))
    assert_refused(rc, err, tmp_path / "out", "adapter_model.safetensors is a link to", "outside the adapter folder")


def test_gguf_link_in_a_folder_is_refused_but_a_gguf_named_directly_may_be_a_link(tmp_path, capsys):
    from test_gguf import make_gguf

    gguf = make_gguf(tmp_path / "elsewhere")
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "model.gguf").symlink_to(gguf)
    rc, err = run(capsys, folder, tmp_path / "out")
    assert_refused(rc, err, tmp_path / "out", "model.gguf is a link to", str(gguf))
    (tmp_path / "named.gguf").symlink_to(gguf)  # the user's own choice of file
    assert main(["-m", str(tmp_path / "named.gguf"), "-o", str(tmp_path / "out"), "-q", "-p", "fp32"]) == 0


def hub_snapshot(cache: Path, repo_id: str, source: Path) -> Path:
    """`source` laid out as huggingface_hub caches a download: each file a blob named by its sha256,
    the snapshot's files relative links to them."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / ("0123456789abcdef" * 2 + "01234567")
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for f in sorted(source.iterdir()):
        digest = hashlib.sha256(f.read_bytes()).hexdigest()
        shutil.copyfile(f, repo / "blobs" / digest)
        (snapshot / f.name).symlink_to(Path("..") / ".." / "blobs" / digest)
    return snapshot


def test_hub_snapshot_linking_into_its_blobs_builds(tmp_path):
    snapshot = hub_snapshot(tmp_path / "hub", "tiny-org/tiny-llama", EXAMPLE)
    out = tmp_path / "out"
    assert main(["-m", str(snapshot), "-o", str(out), "-q", "-p", "fp32"]) == 0
    assert (out / "tokenizer.json").read_bytes() == (EXAMPLE / "tokenizer.json").read_bytes()


def test_hub_snapshot_linking_into_another_repository_is_refused(tmp_path, capsys):
    snapshot = hub_snapshot(tmp_path / "hub", "tiny-org/tiny-llama", EXAMPLE)
    other = hub_snapshot(tmp_path / "hub", "someone/else", EXAMPLE)
    target = (other / "tokenizer.json").resolve()
    (snapshot / "tokenizer.json").unlink()
    (snapshot / "tokenizer.json").symlink_to(target)
    rc, err = run(capsys, snapshot, tmp_path / "out")
    assert_refused(rc, err, tmp_path / "out", "tokenizer.json is a link to", str(target), "Hugging Face cache blobs")


@pytest.fixture
def umask_022():
    previous = os.umask(0o022)
    yield
    os.umask(previous)


def test_copied_tokenizer_files_are_no_more_readable_than_their_source(tmp_path, umask_022):
    folder = copy_of(EXAMPLE, tmp_path / "model")
    (folder / "tokenizer.json").chmod(0o600)
    (folder / "tokenizer_config.json").chmod(0o644)
    out = tmp_path / "out"
    assert main(["-m", str(folder), "-o", str(out), "-q", "-p", "fp32"]) == 0
    assert stat.S_IMODE((out / "tokenizer.json").stat().st_mode) == 0o600  # copyfile made it 0644
    assert stat.S_IMODE((out / "tokenizer_config.json").stat().st_mode) == 0o644
    assert (out / "tokenizer.json").read_bytes() == (folder / "tokenizer.json").read_bytes()


# -- --verify runs no checkpoint code ------------------------------------------------------------

EVIL = """
open({marker!r}, "w").write("ran")
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
class EvilTokenizer(PreTrainedTokenizerFast):
    pass
class EvilConfig(LlamaConfig):
    model_type = "evil_llama"
class EvilModel(LlamaForCausalLM):
    config_class = EvilConfig
"""


def evil_checkpoint(folder: Path, marker: Path, module: str) -> Path:
    """The example with a Python file that, once imported, leaves `marker` behind. Each test names
    its module differently: Python imports a module name once per process."""
    copy_of(EXAMPLE, folder)
    (folder / f"{module}.py").write_text(EVIL.format(marker=str(marker)))
    return folder


@pytest.fixture
def terminal(monkeypatch):
    """A user at a terminal who answers "y" to whatever transformers asks: it asks whether to run
    a checkpoint's code when trust_remote_code is left unset."""
    monkeypatch.setattr(sys, "stdin", io.StringIO("y\n" * 10))


def test_verify_never_imports_a_tokenizer_auto_map(tmp_path, capsys, terminal):
    marker = tmp_path / "ran"
    folder = evil_checkpoint(tmp_path / "model", marker, "tokenization_evil_a")
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.update(tokenizer_class="EvilTokenizer",
                  auto_map={"AutoTokenizer": ["tokenization_evil_a.EvilTokenizer", None]})
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    capsys.readouterr()
    rc = main(["-m", str(folder), "-o", str(tmp_path / "out"), "-p", "fp32", "--verify"])
    err = capsys.readouterr().err
    assert not marker.exists(), "the checkpoint's tokenizer code ran"
    assert rc == 0, err
    assert "the tokenizer needs its own code (auto_map in tokenizer_config.json)" in err
    assert next(line for line in err.splitlines() if line.startswith("verify:")).endswith("PASS")


def test_verify_never_imports_a_config_auto_map(tmp_path, capsys, terminal):
    # A known architecture whose model_type transformers does not know: transformers could load it
    # only with the checkpoint's own configuration and modeling code.
    marker = tmp_path / "ran"
    folder = evil_checkpoint(tmp_path / "model", marker, "modeling_evil_b")
    config = json.loads((folder / "config.json").read_text())
    config.update(model_type="evil_llama", auto_map={"AutoConfig": "modeling_evil_b.EvilConfig",
                                                     "AutoModelForCausalLM": "modeling_evil_b.EvilModel"})
    (folder / "config.json").write_text(json.dumps(config))
    rc, err = run(capsys, folder, tmp_path / "out", "--verify")
    assert not marker.exists(), "the checkpoint's model code ran"
    assert rc == 2 and "\n" not in err, err
    assert "only with its own code (auto_map in config.json), which builder never runs" in err
