"""FP8 input: tiny checkpoints written here from a tiny transformers Llama, each linear weight
encoded by our own float8_e4m3fn encoder with the layout's scales (quant_method "fp8": 128×128
block weight_scale_inv; compressed-tensors: per-channel or per-tensor weight_scale), decoded again
by a reference written from the layouts' definitions (w = fp8 · scale, the scale broadcast over
its block), and the float model with those dequantized weights substituted in as transformers'
reference."""

import json
import re

import ml_dtypes
import numpy as np
import pytest
import torch
from conftest import TINY
from fake_quant import assert_quantized_parity
from helpers import GENAI_PROMPT, assert_parity, build, make_checkpoint
from test_genai import assert_same_greedy

from builder.cli import main
from builder.quantize import dequantize, quantize

E4M3 = ml_dtypes.float8_e4m3fn
E4M3_MAX = 448.0
LINEAR = re.compile(r"model\.layers\.\d+\.(self_attn|mlp)\.\w+_proj\.weight")
# K of 192 and 320, N of 96 (k/v), 192, 320: every 128×128 block grid has a partial block.
SIZES = dict(TINY, hidden_size=192, intermediate_size=320, eos_token_id=255)
BLOCK = (128, 128)


def encode(w: np.ndarray, block: tuple[int, int] | None, scale_dtype=np.float32):
    """float8_e4m3fn codes [N, K] and scales: per block [ceil(N/bn), ceil(K/bk)], per channel
    [N, 1] (block (1, K)) or per tensor [1] (block None); each scale maps its amax to 448."""
    n, k = w.shape
    bn, bk = block or (n, k)
    grid = np.zeros((-(-n // bn), -(-k // bk)), np.float32)
    for i in range(grid.shape[0]):
        for j in range(grid.shape[1]):
            grid[i, j] = np.abs(w[i * bn:(i + 1) * bn, j * bk:(j + 1) * bk]).max() / E4M3_MAX
    scale = np.maximum(grid, 1e-12).astype(scale_dtype)
    full = expand(scale, n, k, bn, bk)
    codes = np.clip(w / full, -E4M3_MAX, E4M3_MAX).astype(E4M3)  # round to nearest even, never saturated
    return codes, scale if block else scale.reshape(1)


def expand(scale: np.ndarray, n: int, k: int, bn: int, bk: int) -> np.ndarray:
    """A [ceil(N/bn), ceil(K/bk)] scale grid as [N, K] float32 (np.kron: every block its scale)."""
    return np.kron(scale.astype(np.float32), np.ones((bn, bk), np.float32))[:n, :k]


def write_fp8(src, dst, layout: str, input_scale: bool = False, drop: str | None = None, linear=LINEAR):
    """Writes `src` (a float checkpoint) as an FP8 checkpoint in `dst` and its reference, `dst`-deq:
    the float32 checkpoint of the dequantized weights. `drop`: a tensor left out of `dst`;
    `linear`: the weights stored in float8."""
    from safetensors.numpy import load_file, save_file

    tensors = load_file(src / "model.safetensors")
    config = json.loads((src / "config.json").read_text())
    out, deq = {}, {}
    for name, value in tensors.items():
        deq[name] = value.astype(np.float32)
        if not linear.fullmatch(name):
            out[name] = value
            continue
        module = name.removesuffix(".weight")
        w = value.astype(np.float32)
        n, k = w.shape
        if layout == "fp8-block":
            codes, scale = encode(w, BLOCK)
            out[module + ".weight_scale_inv"] = scale
            deq[name] = codes.astype(np.float32) * expand(scale, n, k, *BLOCK)
        else:
            block = (1, k) if layout == "ct-channel" else None
            dtype = ml_dtypes.bfloat16 if layout == "ct-channel" else np.float32  # llm-compressor: model dtype
            codes, scale = encode(w, block, dtype)
            out[module + ".weight_scale"] = scale
            deq[name] = codes.astype(np.float32) * scale.astype(np.float32).reshape(-1, 1)
            if input_scale:
                out[module + ".input_scale"] = np.array([0.05], np.float32)
        out[name] = codes
    if layout == "fp8-block":
        qc = {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3", "weight_block_size": list(BLOCK)}
    else:
        strategy = "channel" if layout == "ct-channel" else "tensor"
        qc = {"quant_method": "compressed-tensors", "format": "float-quantized", "quantization_status": "compressed",
              "ignore": ["lm_head"], "kv_cache_scheme": None,
              "config_groups": {"group_0": {
                  "targets": ["Linear"], "output_activations": None,
                  "weights": {"type": "float", "num_bits": 8, "symmetric": True, "dynamic": False,
                              "strategy": strategy, "block_structure": None},
                  "input_activations": {"type": "float", "num_bits": 8, "symmetric": True, "dynamic": True,
                                        "strategy": "token"}}}}
    dst.mkdir()
    out.pop(drop, None)
    out, deq = ({k: np.ascontiguousarray(v) for k, v in d.items()} for d in (out, deq))
    save_file(out, dst / "model.safetensors", metadata={"format": "pt"})
    (dst / "config.json").write_text(json.dumps({**config, "quantization_config": qc}))
    ref = dst.parent / f"{dst.name}-deq"
    ref.mkdir()
    save_file(deq, ref / "model.safetensors", metadata={"format": "pt"})
    (ref / "config.json").write_text(json.dumps({**config, "dtype": "float32"}))
    return dst, ref


def make(tmp_path, layout, **kw):
    src = make_checkpoint(tmp_path / "src", "LlamaConfig", dtype=torch.bfloat16, **SIZES)
    return write_fp8(src, tmp_path / layout, layout, **kw)


LAYOUTS = ["fp8-block", "ct-channel", "ct-tensor"]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_fp32_and_fp16_builds_equal_the_dequantized_model(tmp_path, layout):
    path, ref = make(tmp_path, layout, input_scale=layout == "ct-tensor")  # a dynamic scheme's input_scale: unused
    assert_parity(build(path, tmp_path / "fp32", "-p", "fp32"), ref, 1e-4)
    assert_parity(build(path, tmp_path / "fp16", "-p", "fp16"), ref, 1e-2)


@pytest.mark.parametrize("layout", ["fp8-block", "ct-channel"])
def test_int4_is_the_dequantized_model_requantized(tmp_path, layout):
    path, ref = make(tmp_path, layout)
    out = build(path, tmp_path / "int4", "-p", "int4", "--accuracy-level", "0")
    assert_quantized_parity(ref, out, exact=True)


def test_genai_greedy_matches_transformers(tmp_path):
    path, ref = make(tmp_path, "fp8-block")
    assert_same_greedy(build(path, tmp_path / "out", "-p", "fp32"), ref, GENAI_PROMPT)


CT_GROUP = {"targets": ["Linear"], "weights": {"type": "float", "num_bits": 8, "symmetric": True, "dynamic": False,
                                               "strategy": "channel"}}


@pytest.mark.parametrize("qc, message", [
    ({"quant_method": "fp8", "activation_scheme": "static", "weight_block_size": [128, 128]},
     "FP8 activation_scheme 'static' is not supported"),
    ({"quant_method": "fp8", "weight_block_size": [128, 128], "scale_fmt": "ue8m0"}, "FP8 scale_fmt 'ue8m0'"),
    ({"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {"group_0": CT_GROUP}},
     "compressed-tensors format 'pack-quantized' is not supported"),
    ({"quant_method": "compressed-tensors", "format": "float-quantized",
      "config_groups": {"group_0": {**CT_GROUP, "input_activations": {"type": "float", "num_bits": 8,
                                                                      "dynamic": False}}}},
     "input_activations is static"),
    ({"quant_method": "compressed-tensors", "format": "float-quantized",
      "config_groups": {"group_0": {**CT_GROUP, "weights": {**CT_GROUP["weights"], "strategy": "group"}}}},
     "compressed-tensors FP8 strategy 'group' is not supported"),
    ({"quant_method": "compressed-tensors", "format": "float-quantized", "kv_cache_scheme": {"num_bits": 8},
      "config_groups": {"group_0": CT_GROUP}}, "kv_cache_scheme"),
])
def test_unsupported_layouts_are_refused_in_one_line(tmp_path, capsys, qc, message):
    path, _ = make(tmp_path, "ct-channel")
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "quantization_config": qc}))
    capsys.readouterr()
    assert main(["-m", str(path), "-o", str(tmp_path / "out"), "-q"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and message in err, err
    assert not (tmp_path / "out").exists()


def test_int4_requantization_loss(capsys):
    """An e4m3 weight's values are not int4 codes times a MatMulNBits scale: int4 (and int8)
    re-quantization loses accuracy, measured here on a random normal weight encoded with 128×128
    block scales: the relative RMS error of int4/int8 RTN (block 32, symmetric, the defaults)
    against the exactly dequantized fp8 weight, next to fp8's own error and int4's on the float
    weight it came from."""
    w = np.random.default_rng(0).standard_normal((1024, 1024)).astype(np.float32)
    codes, scale = encode(w, BLOCK)
    fp8 = codes.astype(np.float32) * expand(scale, *w.shape, *BLOCK)

    def rms(a, b):
        return float(np.sqrt(np.mean((a - b) ** 2) / np.mean(b**2)))

    errors = {f"int{bits} of fp8": rms(dequantize(quantize(fp8, bits, 32), w.shape[1], bits), fp8) for bits in (4, 8)}
    errors["int4 of float"] = rms(dequantize(quantize(w, 4, 32), w.shape[1], 4), w)
    errors["fp8 of float"] = rms(fp8, w)
    with capsys.disabled():
        print("\nrequantization, relative RMS error: " + ", ".join(f"{k} {v:.4f}" for k, v in errors.items()))
    assert 0 < errors["int8 of fp8"] < errors["fp8 of float"] < errors["int4 of fp8"] < 0.15
    assert abs(errors["int4 of fp8"] - errors["int4 of float"]) < 0.1 * errors["int4 of float"]


def test_encoder_round_trips_e4m3():
    """The test's encoder: every code is an e4m3 value within ±448, and decoding is within half an
    e4m3 step (3 mantissa bits: 2^-4 relative) of the weight."""
    w = np.random.default_rng(1).standard_normal((200, 300)).astype(np.float32)
    codes, scale = encode(w, BLOCK)
    values = codes.astype(np.float32)
    assert np.isfinite(values).all() and np.abs(values).max() <= E4M3_MAX
    assert np.array_equal(values.astype(E4M3).astype(np.float32), values)
    s = expand(scale, *w.shape, *BLOCK)
    assert (np.abs(values * s - w) <= np.maximum(np.abs(w) * 2**-4, 2**-9 * s) * 1.0001).all()


def test_float8_weight_without_a_scale_is_refused(tmp_path, capsys):
    path, _ = make(tmp_path, "fp8-block", drop="model.layers.1.mlp.up_proj.weight_scale_inv")
    capsys.readouterr()
    assert main(["-m", str(path), "-o", str(tmp_path / "out"), "-q"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("model.layers.1.mlp.up_proj.weight is float8_e4m3fn but has no weight_scale_inv (fp8 scales "
                        "every float8 weight)"), err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("block", [BLOCK, None, (1, 200)], ids=["block", "tensor", "channel"])
def test_a_float8_weight_is_computed_a_block_of_rows_at_a_time(tmp_path, monkeypatch, block):
    """fp8 · scale was computed whole, 4 bytes a weight beside the result (a 1B FP8 checkpoint's
    int4 build peaked at 505 MB, now 416 MB); now a block of rows at a time as the writer or the
    quantizer asks, row ranges crossing the scale grid's blocks giving the same float32 values."""
    from builder.inputs.fp8 import FP8Linear
    from builder.inputs.mapping import TensorInfo
    from builder.lazy import Weight

    w = np.random.default_rng(3).standard_normal((300, 200)).astype(np.float32)
    codes, scale = encode(w, block)
    if block == (1, 200):
        scale = scale.reshape(300, 1)
    (tmp_path / "w").write_bytes(codes.tobytes() + scale.tobytes())
    layer = FP8Linear(TensorInfo("w", np.dtype(E4M3), (300, 200), tmp_path / "w", 0, codes.nbytes),
                      TensorInfo("s", np.dtype(np.float32), scale.shape, tmp_path / "w", codes.nbytes, scale.nbytes),
                      block)
    bn, bk = block or (300, 200)
    want = codes.astype(np.float32) * expand(scale.reshape(-(-300 // bn), -(-200 // bk)), 300, 200, bn, bk)
    monkeypatch.setattr("builder.materialize.ROW_BLOCK_BYTES", 70 * 200 * 4)  # blocks of 70 rows
    computed = []
    weight = Weight((300, 200), np.float32, lambda stack: _spy(layer.float32(stack), computed), ("w",))
    assert weight.numpy().tobytes() == want.tobytes()
    assert computed == [(0, 70), (70, 140), (140, 210), (210, 280), (280, 300)]
    assert weight.slice(0, 100, 260).transpose().numpy().tobytes() == np.ascontiguousarray(want[100:260].T).tobytes()
    q = weight.apply(lambda rows: quantize(rows, 4, 32, False, np.float32, "search"))
    assert q.data.tobytes() == quantize(want, 4, 32, False, np.float32, "search").data.tobytes()


def _spy(rows, seen: list):
    """A ComputedRows whose row ranges are recorded as they are computed."""
    from builder.materialize import ComputedRows

    inner = rows.rows
    return ComputedRows(lambda a, b: seen.append((a, b)) or inner(a, b), rows.shape, rows.block)
