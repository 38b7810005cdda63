"""Malformed input files, one defect each: every one ends in exit code 2 and one `error:` line,
within bounded time and memory (tests/fuzz_cases.py's `cli` runs the CLI in-process with a time
limit and an address-space limit), and a file the format's own reader would refuse is refused."""

import builtins
import json
import os
import pathlib
import shutil
import struct
import time

import pytest
from fuzz_cases import DEEP, GGUFLayout, cli, gguf_field, gguf_tensors, gguf_value
from safetensors import safe_open

from builder.inputs.safetensors import read_header
from builder.errors import BuildError

EXAMPLE = pathlib.Path(__file__).resolve().parent.parent / "examples" / "tiny-llama"
NESTED = "[" * DEEP + "]" * DEEP


@pytest.fixture(scope="module")
def bases(tmp_path_factory):
    from fuzz_cases import make_bases

    return make_bases(tmp_path_factory.mktemp("bases"))


def refused(argv, message, seconds=10.0, memory=1 << 30):
    """Runs the CLI's dry run; asserts one `error:` line holding `message`, in bounded time and memory."""
    started = time.perf_counter()
    rc, stderr, problem = cli([*map(str, argv), "--dry-run", "-q"], seconds, memory)
    elapsed = time.perf_counter() - started
    assert problem is None, problem
    lines = stderr.splitlines()
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("error: "), stderr
    assert message in lines[0], lines[0]
    assert elapsed < seconds, elapsed
    return lines[0]


def copy(base, tmp_path):
    return shutil.copytree(base, tmp_path / base.name) if base.is_dir() else shutil.copyfile(base, tmp_path / base.name)


# ---- deeply nested JSON (RecursionError before)


@pytest.mark.parametrize("name", ["config.json", "generation_config.json", "model.safetensors.index.json",
                                  "tokenizer_config.json"])
def test_deeply_nested_json_in_the_model_folder(bases, tmp_path, name):
    folder = copy(bases["sharded" if name.startswith("model.") else "llama"], tmp_path)
    (folder / name).write_text('{"weight_map": ' + NESTED + "}" if name.startswith("model.") else NESTED)
    assert refused(["-m", folder], "(nested too deeply)").startswith(f"error: {folder / name}: ")


def test_deeply_nested_safetensors_header(bases, tmp_path):
    folder = copy(bases["llama"], tmp_path)
    header = ('{"a": ' + NESTED + "}").encode()
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header)
    refused(["-m", folder], "model.safetensors: corrupt safetensors header (nested too deeply)")


def test_deeply_nested_adapter_config(bases, tmp_path):
    adapter = copy(bases["adapter"], tmp_path)
    (adapter / "adapter_config.json").write_text('{"r": ' + NESTED + "}")
    refused(["-m", bases["llama"], "--adapter", adapter], "adapter_config.json: not valid JSON (nested too deeply)")


def test_deeply_nested_yaml_build_file(bases, tmp_path):
    path = tmp_path / "build.yaml"
    path.write_text(f"model: {bases['llama']}\nsearch: {NESTED}\n")
    refused(["--config", path], "build.yaml: not valid YAML (nested too deeply)")


@pytest.mark.parametrize("name", ["config.json", "build.yaml"])
def test_a_number_of_5000_digits(bases, tmp_path, name):
    """Python's int() takes at most 4300 digits: json and PyYAML raised a bare ValueError."""
    folder = copy(bases["llama"], tmp_path)
    if name == "config.json":
        (folder / name).write_text('{"hidden_size": ' + "1" * 5000 + "}")
        refused(["-m", folder], "config.json: not valid JSON (Exceeds the limit (4300 digits)")
    else:
        (tmp_path / name).write_text(f"model: {folder}\nblock_size: {'1' * 5000}\n")
        refused(["--config", tmp_path / name], "build.yaml: not valid YAML (Exceeds the limit (4300 digits)")


# ---- GGUF headers with absurd counts and lengths (IndexError, or minutes and a MemoryError, before)


@pytest.mark.parametrize("field, value, message", [
    ("tensor_count", 2**60, "1152921504606846976 tensors and 22 key/value pairs cannot fit in a file of"),
    ("kv_count", 2**60, "1152921504606846976 key/value pairs cannot fit"),
    ("key_length", 2**40, "a metadata key needs 1099511627776 bytes at byte 32, but the file ends"),
    ("string_length", 2**40, "the value of 'general.architecture' needs 1099511627776 bytes"),
    ("string_array_count", 2**40, "'tokenizer.ggml.tokens' declares 1099511627776 strings"),
    ("number_array_count", 2**40, "'tokenizer.ggml.token_type' declares 1099511627776 elements of 4 bytes"),
    ("n_dims", 1000, "has 1000 dimensions; GGUF allows 1 to 4"),
    ("offset", 2**40, "truncated file: tensor 'output.weight' ends at byte 1099511"),
    ("value_type", 99, "'general.architecture' has unknown value type 99"),
    ("tensor_type", 99, "tensor 'output.weight' has unknown GGML type 99"),
    ("dim", 2**63, "truncated file: tensor 'output.weight' ends at byte"),
])
def test_absurd_gguf_counts_and_lengths(bases, tmp_path, field, value, message):
    """The numeric-array case made gguf's GGUFReader loop for 25 s appending empty arrays until a
    MemoryError at 3 GB; the others were IndexError tracebacks. Now each is refused within 10 s and
    1 GB more address space (it takes milliseconds)."""
    path = tmp_path / "model.gguf"
    path.write_bytes(gguf_field(bases["gguf"].read_bytes(), field, value))
    refused(["-m", path], message, seconds=10.0, memory=1 << 30)


@pytest.mark.parametrize("mutation, message", [
    ("gguf_overlap", "overlaps 'output.weight', which ends at byte"),
    ("gguf_duplicate_tensor", "the tensor name 'output.weight' appears twice"),
    ("gguf_duplicate_key", "the key 'tokenizer.chat_template' appears twice"),
])
def test_gguf_tensors_that_alias_or_repeat(bases, tmp_path, mutation, message):
    """Two tensors over the same bytes were accepted and aliased each other silently."""
    path = tmp_path / "model.gguf"
    path.write_bytes(gguf_tensors(bases["gguf"].read_bytes(), mutation))
    refused(["-m", path], message)


def test_truncated_gguf_header(bases, tmp_path):
    path = tmp_path / "model.gguf"
    path.write_bytes(bases["gguf"].read_bytes()[:3000])
    refused(["-m", path], "corrupt GGUF header: the value of 'tokenizer.ggml.tokens' needs 8 bytes at byte")


def test_big_endian_gguf_is_refused(bases, tmp_path, monkeypatch):
    """gguf's reader reads a big-endian header, but its tensors were then mapped as little-endian:
    exit code 0 and a model of byte-swapped weights (the tiny Llama's logits all 0)."""
    import argparse

    import gguf
    from gguf.scripts.gguf_convert_endian import convert_byteorder

    path = shutil.copyfile(bases["gguf"], tmp_path / "model.gguf")
    monkeypatch.setattr(builtins, "input", lambda prompt: "YES")  # the converter asks before it rewrites
    convert_byteorder(gguf.GGUFReader(path, "r+"), argparse.Namespace(order="big", dry_run=False))
    refused(["-m", path], "a big-endian GGUF file, which builder does not read")


# ---- GGUF metadata that becomes config.json's values


@pytest.mark.parametrize("count, message", [
    (10**9, "llama.block_count is 1000000000 but the file has tensors for layers 0 to 1 (2 of them)"),
    (3, "llama.block_count is 3 but the file has tensors for layers 0 to 1"),
])
def test_block_count_disagreeing_with_the_tensors(bases, tmp_path, count, message):
    """Checked before any per-layer list is sized by it (10^9 layers: within 1 GB, in milliseconds)."""
    path = tmp_path / "model.gguf"
    path.write_bytes(gguf_value(bases["gguf"].read_bytes(), "llama.block_count", "u32", count))
    refused(["-m", path], message, seconds=5.0, memory=1 << 30)


@pytest.mark.parametrize("eps", [float("nan"), float("inf"), -0.5, 0.0])
def test_gguf_norm_epsilon_must_be_positive_and_finite(bases, tmp_path, eps):
    """A NaN epsilon built with exit code 0 a model whose every logit is NaN."""
    path = tmp_path / "model.gguf"
    path.write_bytes(gguf_value(bases["gguf"].read_bytes(), "llama.attention.layer_norm_rms_epsilon", "f32", eps))
    refused(["-m", path], "the GGUF metadata's llama.attention.layer_norm_rms_epsilon must be a positive finite "
                          f"number, got {eps!r}")


def test_gguf_head_width_past_every_tensor(bases, tmp_path):
    """attention.key_length 10^9 sized the rotary tables (a 1.9 GB array, MemoryError) before any
    tensor's shape was compared with it."""
    path = tmp_path / "model.gguf"
    path.write_bytes(gguf_value(bases["gguf"].read_bytes(), "llama.attention.key_length", "u32", 10**9))
    refused(["-m", path], "llama.attention.key_length is 1000000000, larger than any tensor dimension (261)",
            memory=1 << 30)


@pytest.mark.parametrize("key, kind, value, message", [
    ("tokenizer.ggml.bos_token_id", "u32", 10**6, "tokenizer.ggml.bos_token_id must be the id of one of its 261"),
    ("tokenizer.ggml.merges", "arr_str", ["a b c"], "tokenizer.ggml.merges must be a list of strings, each two"),
    ("tokenizer.ggml.token_type", "arr_i32", [1, 2], "tokenizer.ggml.token_type must be a list of integers, one"),
    ("tokenizer.ggml.pre", "arr_str", ["qwen2"], "tokenizer.ggml.pre must be a string"),
])
def test_gguf_tokenizer_metadata_is_checked_before_the_build(bases, tmp_path, key, kind, value, message):
    """The tokenizer is written after the weights: a bos id past the vocabulary was an IndexError
    traceback there, a list-valued pre-tokenizer name a TypeError, a three-piece merge a
    tokenizer.json that tokenizers cannot load."""
    path = tmp_path / "model.gguf"
    path.write_bytes(gguf_value(bases["gguf"].read_bytes(), key, kind, value))
    refused(["-m", path], message)


def test_gguf_bos_token_spelled_outside_the_byte_alphabet(bases, tmp_path):
    """A byte-level vocabulary's BOS token with a space in it is respelled in tokenizer.json's
    vocabulary; the post-processor looked it up by its original spelling: a KeyError traceback
    after the weights were written."""
    from gguf import GGUFReader
    from tokenizers import Tokenizer

    tokens = GGUFReader(bases["gguf"]).fields["tokenizer.ggml.tokens"].contents()
    bos = GGUFReader(bases["gguf"]).fields["tokenizer.ggml.bos_token_id"].contents()
    tokens[bos] = "<|begin of text|>"
    path = tmp_path / "model.gguf"
    data = gguf_value(bases["gguf"].read_bytes(), "tokenizer.ggml.tokens", "arr_str", tokens)
    path.write_bytes(gguf_value(data, "tokenizer.ggml.add_bos_token", "bool", True))
    rc, stderr, problem = cli(["-m", str(path), "-o", str(tmp_path / "out"), "-q", "-p", "fp32"])
    assert problem is None and rc == 0, problem or stderr
    assert Tokenizer.from_file(str(tmp_path / "out" / "tokenizer.json")).encode("hi").ids[0] == bos


def test_sentencepiece_merges_of_a_very_long_piece_take_no_time():
    """Every split of every piece was tried: a 100 000-character piece took seconds (O(length^2))."""
    from builder.inputs.gguf.sentencepiece import merges

    tokens = ["a", "b", "ab", "ba", "a" * 100_000]
    started = time.perf_counter()
    found = merges(tokens, {t: -float(i) for i, t in enumerate(tokens)})
    assert time.perf_counter() - started < 0.5
    assert found == [["a", "b"], ["b", "a"]]


# ---- safetensors byte ranges, checked as the safetensors library checks them


def header_file(path, header, data_bytes):
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * data_bytes)
    return path


def library_refuses(path):
    try:
        with safe_open(path, "np") as f:
            list(f.keys())
    except Exception:
        return True
    return False


F32 = lambda begin, end, shape=(2,): {"dtype": "F32", "shape": list(shape), "data_offsets": [begin, end]}  # noqa: E731


@pytest.mark.parametrize("header, size, message", [
    ({"a": F32(0, 8), "b": F32(4, 12)}, 12, "tensor 'b' (bytes 4..12) overlaps tensor 'a', which ends at byte 8"),
    ({"a": F32(0, 8), "b": F32(0, 8)}, 8, "overlaps tensor 'a'"),
    ({"a": F32(0, 8), "b": F32(12, 20)}, 20, "tensor 'b' (bytes 12..20) leaves a gap after tensor 'a'"),
    ({"a": F32(4, 12)}, 12, "tensor 'a' (bytes 4..12) leaves a gap after the data's start"),
    ({"a": F32(0, 8)}, 12, "its tensors end at byte"),
])
def test_safetensors_ranges_must_tile_the_data(tmp_path, header, size, message):
    """Overlapping ranges were accepted and aliased two tensors; like the library, builder now
    also refuses gaps and bytes no tensor accounts for."""
    path = header_file(tmp_path / "model.safetensors", header, size)
    assert library_refuses(path)
    with pytest.raises(BuildError, match="corrupt safetensors header") as e:
        read_header(path)
    assert message in str(e.value)


def test_safetensors_ranges_in_any_order_and_empty_tensors_are_read(tmp_path):
    path = header_file(tmp_path / "model.safetensors", {"b": F32(8, 16), "e": F32(8, 8, (0,)), "a": F32(0, 8)}, 16)
    assert not library_refuses(path)
    data_start = path.stat().st_size - 16
    assert {n: (t.offset - data_start, t.nbytes) for n, t in read_header(path).items()} == {
        "b": (8, 8), "e": (8, 0), "a": (0, 8)}


@pytest.mark.parametrize("entry, message", [
    ({"dtype": "F32", "shape": [2], "data_offsets": [0, "RAW"]}, "corrupt safetensors header entry for tensor 'a'"),
    ({"dtype": "F32", "shape": [2.0], "data_offsets": [0, 8]}, "corrupt safetensors header entry"),
    ({"dtype": "F32", "shape": [True, 2], "data_offsets": [0, 8]}, "corrupt safetensors header entry"),
    ({"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}, "corrupt safetensors header entry"),
    ({"dtype": "F32", "shape": [2], "data_offsets": [0, 8, 8]}, "corrupt safetensors header entry"),
    ({"dtype": "F4", "shape": [2], "data_offsets": [0, 8]}, "tensor 'a' has dtype 'F4'; supported: F64, F32"),
    ({"dtype": "F32", "shape": [2**32, 2**32], "data_offsets": [0, 0]}, "needs 73786976294838206464"),
])
def test_safetensors_entries_of_the_wrong_type(tmp_path, entry, message):
    """Offsets of 1e309 were an OverflowError traceback; a shape whose element count wraps around
    int64 (2^64 elements) was read as a 0-byte tensor."""
    raw = json.dumps({"a": entry}).replace('"RAW"', "1e309").encode()
    path = tmp_path / "model.safetensors"
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * 8)
    assert library_refuses(path)
    with pytest.raises(BuildError, match="model.safetensors") as e:
        read_header(path)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_overlapping_adapter_tensors(bases, tmp_path):
    from fuzz_cases import st_offsets

    adapter = copy(bases["adapter"], tmp_path)
    weights = adapter / "adapter_model.safetensors"
    weights.write_bytes(st_offsets(weights.read_bytes(), "overlap"))
    refused(["-m", bases["llama"], "--adapter", adapter], "adapter_model.safetensors: corrupt safetensors header")


# ---- unreadable input files (PermissionError tracebacks before)


def unreadable(monkeypatch, path):
    """Reading `path` raises PermissionError, as chmod 000 does for anyone but root (tests run as root)."""
    denied = PermissionError(13, "Permission denied", str(path))
    real_open, real_read_bytes = builtins.open, pathlib.Path.read_bytes

    def fake_open(file, *args, **kwargs):
        if os.fspath(file) == os.fspath(path):
            raise denied
        return real_open(file, *args, **kwargs)

    def fake_read_bytes(self):
        if os.fspath(self) == os.fspath(path):
            raise denied
        return real_read_bytes(self)

    monkeypatch.setattr(builtins, "open", fake_open)
    monkeypatch.setattr(pathlib.Path, "read_bytes", fake_read_bytes)


@pytest.mark.parametrize("base, name", [("llama", "config.json"), ("llama", "generation_config.json"),
                                        ("llama", "model.safetensors"), ("sharded", "model.safetensors.index.json"),
                                        ("gguf", ""), ("adapter", "adapter_config.json"),
                                        ("adapter", "adapter_model.safetensors")])
def test_unreadable_input_file(bases, tmp_path, monkeypatch, base, name):
    found = copy(bases[base], tmp_path)
    path = found / name if name else found
    unreadable(monkeypatch, path)
    argv = ["-m", bases["llama"], "--adapter", found] if base == "adapter" else ["-m", found]
    refused(argv, f"{path}: cannot read (Permission denied)")


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a chmod 000 file; test_unreadable_input_file fakes it")
def test_chmod_000_config(bases, tmp_path):
    folder = copy(bases["llama"], tmp_path)
    (folder / "config.json").chmod(0)
    refused(["-m", folder], "config.json: cannot read (Permission denied)")


def test_directory_in_place_of_the_weights(bases, tmp_path):
    folder = copy(bases["llama"], tmp_path)
    (folder / "model.safetensors").unlink()
    (folder / "model.safetensors").mkdir()
    refused(["-m", folder], "model.safetensors: cannot read (Is a directory)")


def test_rebuilt_layout_is_the_same_file(bases):
    """The fuzz cases' GGUF writer (a mutation changes one value and rewrites the header) writes the
    valid file back byte for byte, so a mutation changes only what it says."""
    data = bases["gguf"].read_bytes()
    assert GGUFLayout.parse(data).encode() == data


@pytest.mark.parametrize("precision", ["int4", "fp32"])
def test_a_gguf_block_whose_scale_is_nan_is_refused(bases, tmp_path, precision):
    """A damaged Q8_0 block (its fp16 scale NaN) was written as a NaN scale (int4: the block kept
    as stored) or NaN weights (fp32: dequantized): a model computing NaN, built without a word."""
    from gguf import GGUFReader

    path = tmp_path / "model.gguf"
    shutil.copyfile(bases["gguf_spm"], path)
    tensor = next(t for t in GGUFReader(path).tensors if t.name == "blk.0.ffn_down.weight")
    assert tensor.tensor_type.name == "Q8_0"
    with open(path, "r+b") as f:
        f.seek(tensor.data_offset + 34)  # the second block's fp16 scale
        f.write(struct.pack("<H", 0x7E00))
    out = tmp_path / "out"
    rc, stderr, problem = cli(["-m", str(path), "-o", str(out), "-q", "-p", precision])
    assert problem is None and rc == 2 and len(stderr.splitlines()) == 1, stderr
    assert "model.layers.0.mlp.down_proj.weight" in stderr and "a model built from it would compute NaN" in stderr
    assert not out.exists()
