"""build.yaml's input digests: each local file is read and hashed once per version of it, and a
changed file is never given its old digest."""

import hashlib
import os
import shutil
import time

import pytest
import yaml

from builder import digests
from builder.cli import main


def sha256(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def next_tick():
    """Past one tick of the file system's clock (4 ms on Linux before 6.13), so that the next
    write gets a new ctime: the tests shorten RECENT_NS, which otherwise guards against that."""
    time.sleep(0.05)


REAL_RECENT_NS = digests.RECENT_NS


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    # The files here were all just written, which alone keeps them from being remembered (the
    # last test); a ctime cannot be set back, so the tests shorten the wait instead.
    monkeypatch.setattr(digests, "RECENT_NS", -1)
    return tmp_path / "cache" / "builder" / "sha256.json"


@pytest.fixture
def hashed(monkeypatch):
    """The names of the files read and hashed."""
    names = []
    original = digests.file_sha256

    def counting(path):
        names.append(path.name)
        return original(path)

    monkeypatch.setattr(digests, "file_sha256", counting)
    return names


def build(source, out):
    assert main(["-m", str(source), "-o", str(out), "-p", "fp32", "-q"]) == 0
    return yaml.safe_load((out / "build.yaml").read_text())["record"]["sha256"]


def test_a_second_build_reads_no_input_for_its_digests(tiny_llama, tmp_path, cache, hashed):
    source = tmp_path / "src"
    shutil.copytree(tiny_llama, source)
    first = build(source, tmp_path / "a")
    assert "model.safetensors" in hashed and cache.is_file()
    assert first["model.safetensors"] == sha256(source / "model.safetensors")
    hashed.clear()
    assert build(source, tmp_path / "b") == first
    assert hashed == []


def test_a_rewritten_file_is_hashed_again(tiny_llama, tmp_path, cache, hashed):
    source = tmp_path / "src"
    shutil.copytree(tiny_llama, source)
    build(source, tmp_path / "a")
    weights = source / "model.safetensors"
    assert weights in digests.cached_sha256([weights])
    next_tick()
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1  # same size; its mtime set back: only the ctime (and the bytes) differ
    stat = weights.stat()
    weights.write_bytes(bytes(data))
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    hashed.clear()
    assert digests.cached_sha256([weights]) == {}
    assert digests.hash_inputs([weights]).result() == {"model.safetensors": sha256(weights)}
    assert hashed == ["model.safetensors"]


def test_a_file_changing_while_hashed_is_not_remembered(tmp_path, cache, monkeypatch):
    f = tmp_path / "weights.bin"
    f.write_bytes(b"before")
    original = digests.file_sha256

    def changes_during(path):
        digest = original(path)
        next_tick()
        path.write_bytes(b"after!")
        return digest

    monkeypatch.setattr(digests, "file_sha256", changes_during)
    digests.hash_inputs([f]).result()
    assert digests.cached_sha256([f]) == {}


def test_an_unusable_cache_only_costs_the_hashing(tiny_llama, tmp_path, monkeypatch, hashed):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the cache folder would be")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    for out in ("a", "b"):
        assert build(tiny_llama, tmp_path / out)["model.safetensors"] == sha256(tiny_llama / "model.safetensors")
    assert hashed.count("model.safetensors") == 2


def test_a_corrupt_cache_is_ignored_and_replaced(tmp_path, cache):
    f = tmp_path / "weights.bin"
    f.write_bytes(b"x" * 100)
    cache.parent.mkdir(parents=True)
    cache.write_text("{not json")
    assert digests.hash_inputs([f]).result() == {"weights.bin": sha256(f)}
    assert digests.cached_sha256([f]) == {f: sha256(f)}


def test_the_cache_keeps_the_newest_entries(tmp_path, cache, monkeypatch):
    monkeypatch.setattr(digests, "MAX_ENTRIES", 3)
    files = []
    for i in range(5):
        files.append(tmp_path / f"w{i}.bin")
        files[-1].write_bytes(bytes([i]) * 10)
        digests.hash_inputs([files[-1]]).result()
    assert list(digests.cached_sha256(files)) == files[2:]


def test_a_file_modified_seconds_ago_is_not_remembered(tmp_path, cache, monkeypatch):
    monkeypatch.setattr(digests, "RECENT_NS", REAL_RECENT_NS)
    f = tmp_path / "weights.bin"
    f.write_bytes(b"just written")
    assert digests.hash_inputs([f]).result() == {"weights.bin": sha256(f)}
    assert digests.cached_sha256([f]) == {}
    monkeypatch.setattr(digests, "RECENT_NS", -1)  # as if hashed seconds later
    digests.hash_inputs([f]).result()
    assert digests.cached_sha256([f]) == {f: sha256(f)}


def test_a_file_modified_just_before_a_long_hash_is_not_remembered(tmp_path, cache, monkeypatch):
    # Recency counts from the start of the hash: a rewrite during a hash longer than RECENT_NS
    # could otherwise keep the stamp on a coarse file system and be remembered with the old digest.
    monkeypatch.setattr(digests, "RECENT_NS", 200_000_000)
    f = tmp_path / "weights.bin"
    f.write_bytes(b"large")
    original = digests.file_sha256

    def slow(path):
        time.sleep(0.5)
        return original(path)

    monkeypatch.setattr(digests, "file_sha256", slow)
    digests.hash_inputs([f]).result()
    assert digests.cached_sha256([f]) == {}


def test_no_cache_without_an_absolute_home(tmp_path, monkeypatch):
    # No HOME and no passwd entry leave expanduser's `~` as it is: never a `~` folder in the cwd.
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")  # the XDG spec: ignore a relative path
    monkeypatch.setattr(digests.os.path, "expanduser", lambda path: path)
    assert digests.cache_path() is None
    f = tmp_path / "weights.bin"
    f.write_bytes(b"x")
    assert digests.hash_inputs([f]).result() == {"weights.bin": sha256(f)}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["weights.bin"]


def test_a_cache_file_python_cannot_parse_is_ignored(tmp_path, cache):
    cache.parent.mkdir(parents=True)
    cache.write_text("[" * 100_000)  # json raises RecursionError, not ValueError
    f = tmp_path / "weights.bin"
    f.write_bytes(b"x")
    assert digests.hash_inputs([f]).result() == {"weights.bin": sha256(f)}
