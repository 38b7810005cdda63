"""Friendlier failures: a mistyped flag or YAML key gets one line with the likely spelling, a missing
.gguf path is a missing file, the Python API names its own overwrite switch, an unusable digest
cache is skipped with a warning, and a closed stdout ends a dry run quietly."""

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from builder import BuildError, BuildOptions, save
from builder.cli import main

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "tiny-llama"


def run(capsys, *argv):
    rc = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return rc, captured.err


@pytest.mark.parametrize("argv, message", [
    (["--overwrit"], "error: unrecognized argument --overwrit; did you mean --overwrite?"),
    (["--precison", "fp32"], "error: unrecognized argument --precison; did you mean --precision?"),
    (["--dryrun"], "error: unrecognized argument --dryrun; did you mean --dry-run?"),
])
def test_mistyped_flag_is_one_line_with_a_suggestion(tmp_path, capsys, argv, message):
    rc, err = run(capsys, "-m", EXAMPLE, "-o", tmp_path / "out", *argv)
    assert rc == 2 and err == message + "\n"
    assert not (tmp_path / "out").exists()


def test_bad_flag_value_is_one_line_without_usage(capsys):
    rc, err = run(capsys, "-m", EXAMPLE, "-p", "int3")
    assert rc == 2 and len(err.splitlines()) == 1 and err.startswith("error: argument -p/--precision: invalid choice")
    assert "usage:" not in err


def test_help_is_unchanged(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: python -m builder") and "--overwrite" in out


def test_mistyped_yaml_key_suggests_the_key(tmp_path, capsys):
    cfg = tmp_path / "build.yaml"
    cfg.write_text(yaml.safe_dump({"model": str(EXAMPLE), "precison": "fp32"}))
    rc, err = run(capsys, "--config", cfg, "-o", tmp_path / "out")
    assert rc == 2 and err == f"error: {cfg}: key 'precison': unknown key; did you mean 'precision'?\n"


def test_unlike_yaml_key_lists_the_known_keys(tmp_path, capsys):
    cfg = tmp_path / "build.yaml"
    cfg.write_text(yaml.safe_dump({"model": str(EXAMPLE), "zzz": 1}))
    rc, err = run(capsys, "--config", cfg, "-o", tmp_path / "out")
    assert rc == 2 and len(err.splitlines()) == 1 and "key 'zzz': unknown key; known keys: accuracy_level, adapter, " in err


def offline(monkeypatch):
    """The hub lookup as huggingface_hub answers it offline: nothing cached."""
    import huggingface_hub
    from huggingface_hub.errors import LocalEntryNotFoundError

    def not_cached(*args, **kwargs):
        raise LocalEntryNotFoundError("offline")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", not_cached)


@pytest.mark.parametrize("flag, said", [("-m", ""), ("--input", "--input ")])
@pytest.mark.parametrize("name", ["missing.gguf", "sub/missing.gguf", "models/a/b/missing.gguf"])
def test_missing_gguf_is_no_such_file(tmp_path, capsys, monkeypatch, flag, said, name):
    offline(monkeypatch)  # "not in the Hugging Face cache" was the answer for the first two
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    rc, err = run(capsys, flag, name, "-o", tmp_path / "out")
    assert rc == 2 and err == f"error: {said}{name}: no such file\n"


def test_missing_gguf_suggests_the_closest_file(tmp_path, capsys):
    (tmp_path / "SmolLM2-135M-Q8_0.gguf").write_bytes(b"")
    rc, err = run(capsys, "-m", tmp_path / "SmolLM2-135M-Q8.gguf", "-o", tmp_path / "out")
    assert rc == 2 and err == (f"error: {tmp_path / 'SmolLM2-135M-Q8.gguf'}: no such file; "
                               f"did you mean {tmp_path / 'SmolLM2-135M-Q8_0.gguf'}?\n")


def test_a_file_that_is_not_gguf_is_not_a_folder(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("")
    rc, err = run(capsys, "--input", tmp_path / "notes.txt", "-o", tmp_path / "out")
    assert rc == 2 and err == f"error: --input {tmp_path / 'notes.txt'} is a file; --input takes a folder or a .gguf file\n"


def crafted_model(tiny_llama):
    from builder.pipeline import plan

    return plan(BuildOptions(model=str(tiny_llama), precision="fp32"), tiny_llama).model


def test_api_refusal_names_the_api_switch(tiny_llama, tmp_path):
    model = crafted_model(tiny_llama)
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(BuildError) as refused:
        save(model, out, source=tiny_llama)
    assert "save(..., overwrite=True)" in str(refused.value) and "--overwrite" not in str(refused.value)
    with pytest.raises(BuildError) as refused:
        save(model, out, overwrite=True, source=tiny_llama)
    assert "even with save(..., overwrite=True)" in str(refused.value) and "--overwrite" not in str(refused.value)
    assert [p.name for p in out.iterdir()] == ["notes.txt"]
    save(model, tmp_path / "new", source=tiny_llama)
    save(model, tmp_path / "new", overwrite=True, source=tiny_llama)  # a crafted folder is a previous output


def test_fifo_at_the_digest_cache_is_skipped_with_a_warning(tmp_path):
    cache = tmp_path / "cache" / "builder" / "sha256.json"
    cache.parent.mkdir(parents=True)
    os.mkfifo(cache)
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"))
    # Opening a FIFO for reading waits for a writer: without the check the build never ends.
    r = subprocess.run([sys.executable, "-m", "builder", "-m", str(EXAMPLE), "-o", str(tmp_path / "out"), "-q",
                        "-p", "fp32"], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stderr == f"warning: {cache} is not a regular file; input digests are not remembered there\n"
    assert stat.S_ISFIFO(os.lstat(cache).st_mode)  # never replaced either


def test_dry_run_into_a_closed_pipe_exits_quietly(tmp_path):
    read_end, write_end = os.pipe()
    os.close(read_end)  # as `| head -1` does once it has its line
    try:
        r = subprocess.run([sys.executable, "-m", "builder", "-m", str(EXAMPLE), "--dry-run"], stdout=write_end,
                           stderr=subprocess.PIPE, text=True, cwd=tmp_path, timeout=120)
    finally:
        os.close(write_end)
    assert r.returncode == 141 and r.stderr == ""
