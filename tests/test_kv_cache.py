"""An int8 KV cache (--kv-cache int8-per-tensor / int8-per-channel with calibrated scales):
GroupQueryAttention stores clamp(round(x / scale)) and reads it back times the scale, so a decode
step over the int8 cache equals the float model's over the same values dequantized."""

import importlib.util
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from helpers import PROMPT, OnnxDecoder, build, relative_error
from test_flags import assert_refused

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "calibrate_kv_cache.py"


def calibrate_module():
    spec = importlib.util.spec_from_file_location("calibrate_kv_cache", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def float_build(tiny_llama, tmp_path_factory):
    return build(tiny_llama, tmp_path_factory.mktemp("kv") / "fp32", "-p", "fp32")


@pytest.fixture(scope="module")
def scales(float_build, tmp_path_factory):
    calibrate = calibrate_module()
    rng = np.random.default_rng(0)
    # the prompt below among the calibration text: a value past a channel's calibrated range is clipped
    windows = [np.array(PROMPT + [7], np.int64)] + [rng.integers(0, 256, 24).astype(np.int64) for _ in range(4)]
    keys, values = calibrate.absmax_per_channel(float_build, windows)
    folder = tmp_path_factory.mktemp("scales")
    paths = {}
    for scheme, per_tensor in (("int8-per-tensor", True), ("int8-per-channel", False)):
        paths[scheme] = folder / f"{scheme}.json"
        paths[scheme].write_text(json.dumps(calibrate.scales_file(keys, values, per_tensor)))
    return paths


def dequantized(cache: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """int8 (1, heads, T, size) times its scale: one number, or one per channel (heads·size)."""
    _, heads, _, size = cache.shape
    s = scale.reshape(1, heads, 1, size) if scale.size > 1 else scale.reshape(())
    return cache.astype(np.float32) * s


@pytest.mark.parametrize("scheme", ["int8-per-tensor", "int8-per-channel"])
def test_decode_over_the_int8_cache_is_the_float_model_over_its_values(tiny_llama, float_build, scales, tmp_path, scheme):
    out = build(tiny_llama, tmp_path / "out", "-p", "fp32", "--kv-cache", scheme, "--kv-cache-scales", str(scales[scheme]))
    model = onnx.load(out / "model.onnx", load_external_data=False)
    types = {v.name: v.type.tensor_type.elem_type for v in [*model.graph.input, *model.graph.output]}
    assert types["past_key_values.0.key"] == types["present.1.value"] == onnx.TensorProto.INT8
    gqa = [n for n in model.graph.node if n.op_type == "GroupQueryAttention"]
    assert all(n.input[12] == f"model.layers.{i}.attn.k_scale" for i, n in enumerate(gqa))
    genai = json.loads((out / "genai_config.json").read_text())
    assert genai["search"]["past_present_share_buffer"] is False  # as onnxruntime-genai's builder on CPU
    table = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer if t.name.endswith("_scale")}
    if not table:  # stored as external data
        from onnx.external_data_helper import load_external_data_for_model
        full = onnx.load(out / "model.onnx")
        table = {t.name: onnx.numpy_helper.to_array(t) for t in full.graph.initializer if t.name.endswith("_scale")}
        load_external_data_for_model  # noqa: B018 - imported for its side effect on onnx.load above

    quantized, floats = OnnxDecoder(out), OnnxDecoder(float_build)
    prefill, present = quantized.run(PROMPT, None, len(PROMPT))
    float_prefill, _ = floats.run(PROMPT, None, len(PROMPT))
    assert relative_error(prefill, float_prefill) < 2e-2  # the prompt attends over its own rounded keys
    past = {}
    for i in range(quantized.layers):
        for kind, side in (("key", "k"), ("value", "v")):
            past[f"present.{i}.{kind}"] = dequantized(present[f"present.{i}.{kind}"],
                                                      table[f"model.layers.{i}.attn.{side}_scale"])
    step, stored = quantized.run([7], present, len(PROMPT) + 1)
    float_step, float_present = floats.run([7], past, len(PROMPT) + 1)
    for i in range(quantized.layers):
        for kind, side in (("key", "k"), ("value", "v")):
            name = f"present.{i}.{kind}"
            assert (stored[name][:, :, :-1] == present[name]).all()  # the past kept as it was
            scale = table[f"model.layers.{i}.attn.{side}_scale"]
            _, heads, _, size = stored[name].shape
            s = scale.reshape(1, heads, 1, size) if scale.size > 1 else scale.reshape(())
            expected = np.clip(np.rint(float_present[name][:, :, -1:] / s), -128, 127)
            assert np.abs(stored[name][:, :, -1:].astype(np.int32) - expected).max() <= 1  # the new row, rounded
    # what remains between the two is the new token's own rounded key and value
    assert relative_error(step, float_step) < 5e-3


def test_genai_generates_with_an_int8_cache(tiny_llama, scales, tmp_path):
    from test_genai import genai_greedy

    out = build(tiny_llama, tmp_path / "out", "-p", "fp32", "--kv-cache", "int8-per-channel",
                "--kv-cache-scales", str(scales["int8-per-channel"]))
    decoder = OnnxDecoder(out)
    ids = list(PROMPT)
    logits, present = decoder.run(ids, None, len(ids))
    expected = list(ids)
    while len(expected) < 20:
        expected.append(int(logits[-1].argmax()))
        logits, present = decoder.run([expected[-1]], present, len(expected))
    got = genai_greedy(out, PROMPT)
    assert got[:20] == expected


BAD_FILES = {
    "not JSON": ("{", "not JSON"),
    "nested too deeply": ("[" * 100_000 + "]" * 100_000, "not JSON (nested too deeply)"),  # a traceback before
    "not UTF-8": (b"{\xff}", "not JSON"),
    "no scales": ({"k_scales": [1]}, 'expected {"scales"'),
    "too few layers": ({"scales": {"k_scales": [0.1], "v_scales": [0.1]}}, "k_scales has 1 entries for 2 KV layers"),
    "negative": ({"scales": {"k_scales": [0.1, -0.1], "v_scales": [0.1, 0.1]}}, "scales must be finite, positive"),
    "NaN": ('{"scales": {"k_scales": [0.1, NaN], "v_scales": [0.1, 0.1]}}', "scales must be finite, positive"),
    "a string": ({"scales": {"k_scales": [0.1, "x"], "v_scales": [0.1, 0.1]}}, "expected a number"),
    "channels": ({"scales": {"k_scales": [[0.1, 0.2], [0.1]], "v_scales": [0.1, 0.1]}}, "expected a number"),
    "layer ids": ({"scales": {"k_scales": [0.1, 0.1], "v_scales": [0.1, 0.1]}, "layer_ids": [0, 5]},
                  "are not the model's KV layers"),
    "qmax": ({"scales": {"k_scales": [0.1, 0.1], "v_scales": [0.1, 0.1]}, "qmax": 0}, "qmax must be a positive number"),
    "a list": ([1, 2], 'expected {"scales"'),
}


@pytest.mark.parametrize("case", BAD_FILES)
def test_malformed_scales_files_are_one_line(tiny_llama, tmp_path, capsys, case):
    content, message = BAD_FILES[case]
    path = tmp_path / "scales.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content if isinstance(content, str) else json.dumps(content))
    assert_refused(capsys, tmp_path, ["-m", tiny_llama, "-p", "fp32", "--kv-cache", "int8-per-tensor",
                                      "--kv-cache-scales", path], message)


@pytest.mark.parametrize("flags, message", [
    (["--kv-cache", "int8-per-tensor"], "int8-per-tensor needs --kv-cache-scales FILE"),
    (["--kv-cache-scales", "x.json"], "applies to an int8 KV cache"),
    (["--kv-cache", "int8-per-tensor", "--kv-cache-scales", "x.json", "-e", "dml"], "GroupQueryAttention's on cpu and cuda"),
    (["--kv-cache", "int8-per-tensor", "--kv-cache-scales", "missing.json"], "--kv-cache-scales missing.json: cannot read it"),
])
def test_option_refusals(tiny_llama, tmp_path, capsys, flags, message):
    assert_refused(capsys, tmp_path, ["-m", tiny_llama, "-p", "fp32", *flags], message)


def test_reference_extra_options_map_to_the_kv_cache():
    from builder.cli import genai_extra_options

    assert genai_extra_options(["kv_cache_quant_scheme=int8_per_channel", "kv_cache_scale_file=s.json"], {}) == {
        "kv_cache": "int8-per-channel", "kv_cache_scales": "s.json"}
