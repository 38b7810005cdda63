"""Safetensors headers, memory-mapped reads, sharding, accounting of every tensor, and bad files."""

import json
import struct

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import save_file

from builder.inputs.safetensors import SafetensorsCheckpoint
from builder.errors import BuildError


def test_reads_values_lazily_and_exactly(tmp_path):
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    b = (np.arange(6, dtype=np.float32) / 7).astype(ml_dtypes.bfloat16).reshape(2, 3)
    save_file({"a": a, "b": b}, tmp_path / "model.safetensors")
    ckpt = SafetensorsCheckpoint.open(tmp_path)
    wa, wb = ckpt.weight("a"), ckpt.weight("b")
    assert wa.shape == (3, 4) and wb.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(wa.transpose().numpy(), a.T)
    np.testing.assert_array_equal(wb.astype(np.float32).numpy(), b.astype(np.float32))
    assert wa.transpose().numpy().flags["C_CONTIGUOUS"]


def test_sharded_checkpoint_with_index(tmp_path):
    save_file({"x": np.ones((2, 2), np.float16)}, tmp_path / "model-00001-of-00002.safetensors")
    save_file({"y": np.zeros((3,), np.float16)}, tmp_path / "model-00002-of-00002.safetensors")
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
        "x": "model-00001-of-00002.safetensors", "y": "model-00002-of-00002.safetensors"}}))
    ckpt = SafetensorsCheckpoint.open(tmp_path)
    assert sorted(ckpt.tensors) == ["x", "y"]
    np.testing.assert_array_equal(ckpt.weight("y").numpy(), np.zeros(3, np.float16))


def test_unconsumed_tensor_fails_naming_it(tmp_path):
    save_file({"used": np.ones(2, np.float32), "stray.weight": np.ones(2, np.float32),
               "layers.0.rotary_emb.inv_freq": np.ones(2, np.float32)}, tmp_path / "model.safetensors")
    ckpt = SafetensorsCheckpoint.open(tmp_path)
    ckpt.weight("used")
    with pytest.raises(BuildError, match="stray.weight"):
        ckpt.check_consumed(ignore=["*.rotary_emb.inv_freq"])
    ckpt.consume("stray.weight")
    ckpt.check_consumed(ignore=["*.rotary_emb.inv_freq"])


def test_missing_tensor_and_wrong_shape(tmp_path):
    save_file({"w": np.ones((2, 3), np.float32)}, tmp_path / "model.safetensors")
    ckpt = SafetensorsCheckpoint.open(tmp_path)
    with pytest.raises(BuildError, match="lacks tensor 'nope'"):
        ckpt.weight("nope")
    with pytest.raises(BuildError, match=r"shape \[2, 3\] but config.json implies \[3, 2\]"):
        ckpt.weight("w", (3, 2))


def test_truncated_file(tmp_path):
    save_file({"w": np.ones((64, 64), np.float32)}, tmp_path / "model.safetensors")
    data = (tmp_path / "model.safetensors").read_bytes()
    (tmp_path / "model.safetensors").write_bytes(data[:-100])
    with pytest.raises(BuildError, match="truncated"):
        SafetensorsCheckpoint.open(tmp_path)


@pytest.mark.parametrize("header", [b"{not json", struct.pack("<Q", 10**12)])
def test_corrupt_header(tmp_path, header):
    body = struct.pack("<Q", len(header)) + header if not header.startswith(b"\x00") else header
    (tmp_path / "model.safetensors").write_bytes(body + b"\x00" * 16)
    with pytest.raises(BuildError, match="corrupt safetensors header"):
        SafetensorsCheckpoint.open(tmp_path)


def test_pickle_only_checkpoint_is_refused(tmp_path):
    (tmp_path / "pytorch_model.bin").write_bytes(b"\x80\x04")
    with pytest.raises(BuildError, match="never unpickles"):
        SafetensorsCheckpoint.open(tmp_path)
