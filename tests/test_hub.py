"""Hub ids resolve through huggingface_hub's cache; offline and uncached fails in one line."""

import os
import shutil
import subprocess
import sys

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def fill_cache(cache, repo_id, source):
    """Lays `source`'s files out as huggingface_hub stores a downloaded snapshot."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    for f in source.iterdir():
        shutil.copyfile(f, snapshot / f.name)


def run_builder(env_extra, *argv, cwd):
    env = dict(os.environ, **env_extra)
    return subprocess.run([sys.executable, "-m", "builder", *argv], capture_output=True, text=True, env=env, cwd=cwd)


def test_hub_id_builds_from_cache_offline(tiny_llama, tmp_path):
    cache = tmp_path / "hub"
    fill_cache(cache, "tiny-org/tiny-llama", tiny_llama)
    env = {"HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    r = run_builder(env, "-m", "tiny-org/tiny-llama", "-q", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "tiny-llama-int4-cpu" / "model.onnx").is_file()


def test_uncached_id_offline_is_one_line(tmp_path):
    env = {"HF_HUB_CACHE": str(tmp_path / "empty-cache"), "HF_HUB_OFFLINE": "1"}
    r = run_builder(env, "-m", "nobody/not-cached", cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr.strip() == "error: nobody/not-cached is not in the Hugging Face cache and HF_HUB_OFFLINE is set"
    assert list(tmp_path.iterdir()) == []


def test_cache_dir_is_the_hugging_face_cache(tiny_llama, tmp_path):
    # onnxruntime-genai's builder spelling, -c/--cache_dir: where hub snapshots are looked up and stored.
    cache = tmp_path / "my-cache"
    fill_cache(cache, "tiny-org/tiny-llama", tiny_llama)
    env = {"HF_HUB_CACHE": str(tmp_path / "elsewhere"), "HF_HUB_OFFLINE": "1"}
    r = run_builder(env, "-m", "tiny-org/tiny-llama", "--cache_dir", str(cache), "-q", "-p", "fp32", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "tiny-llama-fp32-cpu" / "model.onnx").is_file()


def test_mistyped_relative_path_says_no_such_folder(tmp_path):
    (tmp_path / "examples" / "tiny-llama").mkdir(parents=True)
    home = tmp_path / "empty-home"  # HF_HUB_CACHE too, in case the environment sets it
    env = {"HF_HOME": str(home), "HF_HUB_CACHE": str(home / "hub"), "HF_HUB_OFFLINE": "1"}
    r = run_builder(env, "-m", "examples/tiny-lama", cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr.strip() == ("error: no such folder examples/tiny-lama (and not in the Hugging Face cache; "
                                "HF_HUB_OFFLINE is set); did you mean examples/tiny-llama?")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["examples"]
