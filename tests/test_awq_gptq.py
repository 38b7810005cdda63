"""AWQ and GPTQ input: tiny checkpoints written here from a tiny transformers Llama, each linear
weight quantized by our own encoder into the format's exact tensors (AutoAWQ's GEMM packing,
AutoGPTQ's v1 and gptqmodel's v2 packing), decoded again by a reference written from the formats'
definitions (shifts and masks, not builder's byte views), and the float model with those
dequantized weights substituted in as transformers' reference."""

import json
import re

import numpy as np
import onnx
import pytest
import torch
from conftest import TINY
from helpers import GENAI_PROMPT, assert_parity, build, make_checkpoint, mapped_rss
from test_genai import assert_same_greedy

from builder.cli import main
from builder.quantize import QuantizedMatrix, dequantize

AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]
LINEAR = re.compile(r"model\.layers\.\d+\.(self_attn|mlp)\.\w+_proj\.weight")
# lm_head is float in AWQ/GPTQ checkpoints: kept float, so nothing but the repacking is tested.
INT4 = ("-p", "int4", "--accuracy-level", "0", "--float-layers", "lm_head")
SIZES = dict(TINY, hidden_size=128, intermediate_size=256, eos_token_id=255)  # K of 128 and 256


def encode(w: np.ndarray, bits: int, group: int):
    """Asymmetric min/max round-to-nearest per group of `group` input features:
    codes q [K, N], zero points z [K/g, N], fp16 scales s [K/g, N], with w ≈ (q − z)·s."""
    wt = w.T.astype(np.float32)  # (N, K) -> (K, N)
    k, n = wt.shape
    g = wt.reshape(k // group, group, n)
    lo, hi = g.min(1), g.max(1)
    top = 2**bits - 1
    s = np.maximum((hi - lo) / top, 1e-8).astype(np.float16)
    z = np.clip(np.round(-lo / s.astype(np.float32)), 0, top).astype(np.int64)
    q = np.clip(np.round(g / s.astype(np.float32)[:, None]) + z[:, None], 0, top).astype(np.int64)
    return q.reshape(k, n), z, s


def pack_along(values: np.ndarray, bits: int, axis: int, order=None) -> np.ndarray:
    """int32 words of 32/bits fields along `axis`, field i (bits·i up) holding element
    per·c + order[i] of word c."""
    per = 32 // bits
    order = list(range(per)) if order is None else order
    v = np.moveaxis(values.astype(np.int64) & (2**bits - 1), axis, -1)
    v = v.reshape(*v.shape[:-1], -1, per)
    words = sum(v[..., order[i]] << (bits * i) for i in range(per))
    return np.moveaxis(words.astype(np.uint32).view(np.int32), -1, axis)


def unpack_along(words: np.ndarray, bits: int, axis: int, order=None) -> np.ndarray:
    per = 32 // bits
    order = list(range(per)) if order is None else order
    w = np.moveaxis(words.view(np.uint32).astype(np.int64), axis, -1)
    fields = np.stack([(w >> (bits * i)) & (2**bits - 1) for i in range(per)], axis=-1)
    out = np.empty_like(fields)
    out[..., order] = fields  # field i is element order[i]
    return np.moveaxis(out.reshape(*w.shape[:-1], -1), -1, axis)


def write_quantized(src, dst, method: str, bits: int = 4, group: int = 32, v1: bool = True, act_order=False,
                    zero_at=None):
    """Writes `src` (a float checkpoint) as an AWQ or GPTQ checkpoint in `dst`, and its
    reference: `dst`-deq, the float32 checkpoint of the dequantized weights. `zero_at`: a linear
    layer whose first group gets zero point 0 (a v1 GPTQ stores it as an all-ones field)."""
    from safetensors.numpy import load_file, save_file

    tensors = load_file(src / "model.safetensors")
    config = json.loads((src / "config.json").read_text())
    out, deq = {}, {}
    for name, value in tensors.items():
        deq[name] = value.astype(np.float32)
        if not LINEAR.fullmatch(name):
            out[name] = value
            continue
        module = name.removesuffix(".weight")
        k = value.shape[1]
        g = k if group == -1 else group
        q, z, s = encode(value, bits, g)
        if module == zero_at:
            z[0] = 0
        if method == "gptq" and v1:  # v1 stores z − 1 in `bits` bits: a zero point of 0 reads back as 2^bits
            z = ((z - 1) & (2**bits - 1)) + 1
        groups = np.arange(k) // g
        if act_order:
            groups = np.random.default_rng(0).permutation(groups)
        deq[name] = ((q - z[groups]) * s[groups].astype(np.float32)).T
        out[module + ".scales"] = s
        if method == "awq":
            out[module + ".qweight"] = pack_along(q, 4, 1, AWQ_ORDER)
            out[module + ".qzeros"] = pack_along(z, 4, 1, AWQ_ORDER)
        else:
            out[module + ".qweight"] = pack_along(q, bits, 0)
            out[module + ".qzeros"] = pack_along(z - (1 if v1 else 0), bits, 1)  # masked to `bits` bits
            out[module + ".g_idx"] = groups.astype(np.int32)
    dst.mkdir()
    # safetensors.numpy writes an array's memory as is: every tensor C-contiguous first.
    out, deq = ({k: np.ascontiguousarray(v) for k, v in d.items()} for d in (out, deq))
    save_file(out, dst / "model.safetensors", metadata={"format": "pt"})
    if method == "awq":
        qc = {"quant_method": "awq", "bits": bits, "group_size": group, "zero_point": True, "version": "gemm"}
    else:
        qc = {"quant_method": "gptq", "bits": bits, "group_size": group, "sym": False, "desc_act": act_order,
              "checkpoint_format": "gptq" if v1 else "gptq_v2"}
    (dst / "config.json").write_text(json.dumps({**config, "quantization_config": qc}))
    ref = dst.parent / f"{dst.name}-deq"
    ref.mkdir()
    save_file(deq, ref / "model.safetensors", metadata={"format": "pt"})
    (ref / "config.json").write_text(json.dumps({**config, "dtype": "float32"}))
    return dst, ref


def reference_weights(folder, method: str, bits: int, group: int, v1: bool) -> dict[str, np.ndarray]:
    """The formats' dequantization, [N, K] float32 per linear module, from the stored tensors."""
    from safetensors.numpy import load_file

    t = load_file(folder / "model.safetensors")
    weights = {}
    for name in t:
        if not name.endswith(".qweight"):
            continue
        m = name.removesuffix(".qweight")
        if method == "awq":
            q = unpack_along(t[name], 4, 1, AWQ_ORDER)
            z = unpack_along(t[m + ".qzeros"], 4, 1, AWQ_ORDER)
        else:
            q = unpack_along(t[name], bits, 0)
            z = unpack_along(t[m + ".qzeros"], bits, 1) + (1 if v1 else 0)  # masked field, then + 1
        k = q.shape[0]
        groups = t[m + ".g_idx"] if m + ".g_idx" in t else np.arange(k) // (k if group == -1 else group)
        weights[m] = ((q - z[groups]) * t[m + ".scales"].astype(np.float32)[groups]).T
    return weights


def make(tmp_path, method, bits=4, group=32, v1=True, **kw):
    src = make_checkpoint(tmp_path / "src", "LlamaConfig", dtype=torch.float16, **SIZES)
    return write_quantized(src, tmp_path / method, method, bits, group, v1, **kw)


def onnx_weights(out) -> dict[str, tuple[np.ndarray, int]]:
    """Each MatMulNBits' weight dequantized from its B, scales and zero points: name -> ([N, K], bits)."""
    model = onnx.load(out / "model.onnx")
    init = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    found = {}
    for node in model.graph.node:
        if node.op_type != "MatMulNBits":
            continue
        attrs = {a.name: a.i for a in node.attribute}
        data, scales = init[node.input[1]], init[node.input[2]]  # input 0 is x
        zp = init[node.input[3]] if len(node.input) > 3 and node.input[3] else None
        w = dequantize(QuantizedMatrix(data, scales, zp), attrs["K"], attrs["bits"])
        found[node.input[1].removesuffix(".data")] = (w, attrs["bits"], attrs["block_size"], zp is not None)
    return found


CASES = {
    "awq-g32": dict(method="awq", group=32),
    "awq-g64": dict(method="awq", group=64),
    "awq-g128": dict(method="awq", group=128),
    "gptq-v1-g32": dict(method="gptq", group=32, zero_at="model.layers.0.mlp.up_proj"),
    "gptq-v2-g128": dict(method="gptq", group=128, v1=False),
    "gptq-8bit-g64": dict(method="gptq", bits=8, group=64),
    "gptq-per-row": dict(method="gptq", group=-1),
}


@pytest.mark.parametrize("case", CASES)
def test_int4_build_is_the_checkpoint_repacked(tmp_path, case):
    """Every MatMulNBits dequantizes to the formats' own dequantization, bit for bit; the logits
    equal transformers' on the dequantized float model."""
    kw = CASES[case]
    path, ref = make(tmp_path, **kw)
    out = build(path, tmp_path / "out", *INT4)
    want = reference_weights(path, kw["method"], kw.get("bits", 4), kw["group"], kw.get("v1", True))
    got = onnx_weights(out)
    fused = {"model.layers.{}.self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")}
    for layer in range(SIZES["num_hidden_layers"]):
        for onnx_name, (w, bits, block, has_zp) in got.items():
            if f"layers.{layer}." not in onnx_name:
                continue
            parts = fused.get(onnx_name.replace(f".{layer}.", ".{}."))
            modules = [f"model.layers.{layer}.{p}" for p in parts] if parts else [onnx_name]
            expected = np.concatenate([want[m] for m in modules])
            np.testing.assert_array_equal(w, expected, err_msg=onnx_name)
            assert has_zp and block == min(128, kw["group"] if kw["group"] > 0 else 128), onnx_name
            widened = kw.get("zero_at") and "up_proj" in onnx_name and "layers.0." in onnx_name
            assert bits == (8 if widened or kw.get("bits") == 8 else 4), onnx_name
    assert len(got) == 5 * SIZES["num_hidden_layers"]  # qkv (fused), o, gate, up, down; lm_head float
    assert_parity(out, ref, 1e-4)


def test_float_builds_equal_the_dequantized_model(tmp_path):
    """fp32 logits equal transformers' on the dequantized model; fp16 and bf16 builds hold the
    same initializers, byte for byte, as builds of the dequantized float checkpoint."""
    path, ref = make(tmp_path, "gptq", group=64, zero_at="model.layers.1.self_attn.o_proj")
    assert_parity(build(path, tmp_path / "fp32", "-p", "fp32"), ref, 1e-4)
    for precision, ep in (("fp16", "cpu"), ("bf16", "cuda")):
        ours = onnx.load(build(path, tmp_path / precision, "-p", precision, "-e", ep) / "model.onnx")
        theirs = onnx.load(build(ref, tmp_path / f"{precision}-ref", "-p", precision, "-e", ep) / "model.onnx")
        a = {t.name: onnx.numpy_helper.to_array(t) for t in ours.graph.initializer}
        b = {t.name: onnx.numpy_helper.to_array(t) for t in theirs.graph.initializer}
        assert a.keys() == b.keys()
        for name in a:
            assert a[name].tobytes() == b[name].tobytes(), (precision, name)


@pytest.mark.parametrize("method", ["awq", "gptq"])
def test_genai_greedy_matches_transformers(tmp_path, method):
    path, ref = make(tmp_path, method, group=64)
    out = build(path, tmp_path / "out", *INT4)
    assert_same_greedy(out, ref, GENAI_PROMPT)


def test_act_order_is_exact(tmp_path):
    """GPTQ act-order (g_idx a random permutation of row // group_size): each MatMulNBits holds the
    codes with K permuted so that every group is one block, and gathers its input in that order;
    un-permuted, its weights equal the format's dequantization bit for bit; logits equal
    transformers' on the dequantized model, and onnxruntime-genai's greedy tokens too."""
    path, ref = make(tmp_path, "gptq", group=32, act_order=True)
    out = build(path, tmp_path / "out", *INT4)
    want = reference_weights(path, "gptq", 4, 32, True)
    model = onnx.load(out / "model.onnx")
    init = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    gathers = {n.input[1]: n for n in model.graph.node if n.op_type == "Gather" and n.input[1].endswith("input_order")}
    got = onnx_weights(out)
    assert len(got) == 5 * SIZES["num_hidden_layers"] and len(gathers) == len(got)
    for name, (w, bits, block, _) in got.items():
        order = init[f"{name}.input_order"]
        assert {a.name: a.i for a in gathers[f"{name}.input_order"].attribute}["axis"] == -1
        unpermuted = np.empty_like(w)
        unpermuted[:, order] = w  # B's column j is input feature order[j]
        parts = [name.replace("qkv_proj", p) for p in ("q_proj", "k_proj", "v_proj")] if "qkv" in name else [name]
        np.testing.assert_array_equal(unpermuted, np.concatenate([want[m] for m in parts]), err_msg=name)
        assert not np.array_equal(order, np.arange(len(order))) and (bits, block) == (4, 32)
    assert_parity(out, ref, 1e-4)
    assert_same_greedy(out, ref, GENAI_PROMPT)
    assert_parity(build(path, tmp_path / "fp32", "-p", "fp32"), ref, 1e-4)  # float: (q − z[g_idx])·s[g_idx]


def test_act_order_with_unequal_groups_is_refused_in_one_line(tmp_path, capsys):
    """A g_idx whose groups do not each hold group_size rows cannot become blocks."""
    from safetensors.numpy import load_file, save_file

    path, _ = make(tmp_path, "gptq", group=32, act_order=True)
    tensors = load_file(path / "model.safetensors")
    g_idx = tensors["model.layers.1.mlp.down_proj.g_idx"]
    g_idx[g_idx == 1] = 0  # group 0 now has 64 rows, group 1 none
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    capsys.readouterr()
    assert main(["-m", str(path), "-o", str(tmp_path / "out"), "-q"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "down_proj.g_idx" in err and "exactly 32 input rows" in err, err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("qc, message", [
    ({"quant_method": "awq", "bits": 4, "group_size": 32, "version": "gemv"}, "AWQ version 'gemv'"),
    ({"quant_method": "gptq", "bits": 3, "group_size": 32}, "GPTQ with 3 bits"),
    ({"quant_method": "gptq", "bits": 4, "group_size": 32, "checkpoint_format": "marlin"}, "'marlin'"),
])
def test_unsupported_variants_are_refused_in_one_line(tmp_path, capsys, qc, message):
    path, _ = make(tmp_path, "gptq")
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "quantization_config": qc}))
    capsys.readouterr()
    assert main(["-m", str(path), "-o", str(tmp_path / "out"), "-q"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and message in err, err


def test_encoder_and_reference_agree():
    """The test's own packers and unpackers are inverses (so the reference reads what was written)."""
    rng = np.random.default_rng(1)
    for bits, order in ((4, AWQ_ORDER), (4, None), (8, None)):
        v = rng.integers(0, 2**bits, (16, 64))
        for axis in (0, 1):
            np.testing.assert_array_equal(unpack_along(pack_along(v, bits, axis, order), bits, axis, order), v)


def test_bf16_activations_warn_that_the_stored_scales_are_rounded(tmp_path, capsys):
    # MatMulNBits' scales take the activation dtype: bf16 keeps 8 of fp16's 11 significant bits.
    path, _ = make(tmp_path, "awq", group=64)
    assert main(["-m", str(path), "-o", str(tmp_path / "bf16"), "-p", "int4", "-e", "cuda", "--io-dtype", "bf16"]) == 0
    assert "round the checkpoint's fp16 quantization scales to bf16" in capsys.readouterr().err
    assert main(["-m", str(path), "-o", str(tmp_path / "fp16"), "-p", "int4", "-e", "cuda"]) == 0
    assert "quantization scales" not in capsys.readouterr().err


@pytest.mark.parametrize("method,bits,v1,act_order", [
    ("awq", 4, True, False), ("gptq", 4, True, True), ("gptq", 8, False, False)],
    ids=["awq", "gptq-act-order", "gptq8-v2"])
def test_float_weights_are_computed_a_block_of_rows_at_a_time(tmp_path, monkeypatch, method, bits, v1, act_order):
    """A float build's (q − z)·s was computed whole, with codes, zero points and scales widened to
    float32 [N, K] besides the result; now a block of rows at a time as they are written or
    quantized, ranges not on a word's boundary included, the same float32 values as the format's
    dequantization."""
    import builder.inputs.awq_gptq as awq_gptq
    from builder.lazy import Weight
    from builder.materialize import ComputedRows

    path, _ = make(tmp_path, method, bits=bits, group=32, v1=v1, act_order=act_order)
    fmt = awq_gptq.quant_format(json.loads((path / "config.json").read_text()), path)
    checkpoint = awq_gptq.QuantizedCheckpoint.open_quantized(path, fmt)
    want = reference_weights(path, method, bits, 32, v1)["model.layers.0.mlp.up_proj"].astype(np.float32)  # [256, 128]
    monkeypatch.setattr("builder.materialize.ROW_BLOCK_BYTES", 37 * 128 * 4)  # blocks of 37 rows: not a word's 8
    monkeypatch.setattr(awq_gptq, "PACKED_ROWS_BYTES", 300)  # each decoded a run of one or two qweight rows at a time
    weight = checkpoint.weight("model.layers.0.mlp.up_proj.weight")
    layer = checkpoint.layers["model.layers.0.mlp.up_proj.weight"]
    computed = []

    def spy(stack):
        rows = layer.float32(stack)
        return ComputedRows(lambda a, b: computed.append((a, b)) or rows.rows(a, b), rows.shape, rows.block)

    spied = Weight(weight.shape, np.float32, spy, weight.sources)
    assert spied.numpy().tobytes() == want.tobytes()
    assert computed == [(a, min(a + 37, 256)) for a in range(0, 256, 37)]
    assert spied.slice(0, 3, 250).transpose().numpy().tobytes() == np.ascontiguousarray(want[3:250].T).tobytes()


@pytest.mark.parametrize("method", ["awq", "gptq"])
def test_a_float_block_of_rows_holds_a_run_of_qweight_rows_not_all_of_them(tmp_path, monkeypatch, method):
    """A block of output rows is a stripe of qweight's columns, which touches a page of each of its
    rows: with nothing handed back, the first block left the whole packed tensor resident (112 MB
    of a 70B MLP matrix, against the 64 MB --dry-run counts for a weight written by rows). It is
    decoded a run of qweight's rows at a time now, each run's pages handed back."""
    import builder.inputs.awq_gptq as awq_gptq
    from builder.inputs.mapping import TensorInfo
    from builder.lazy import Weight

    n, k, group = 2048, 8192, 128  # qweight: 8 MB
    rng = np.random.default_rng(0)
    packed = {"qweight": (k, n // 8) if method == "awq" else (k // 8, n), "qzeros": (k // group, n // 8)}
    arrays = {name: rng.integers(-2**31, 2**31, shape, dtype=np.int64).astype(np.int32) for name, shape in packed.items()}
    arrays["scales"] = (rng.random((k // group, n)) * 0.01).astype(np.float16)
    infos = {}
    for name, a in arrays.items():
        a.tofile(tmp_path / name)
        infos[name] = TensorInfo(name, a.dtype, a.shape, tmp_path / name, 0, a.nbytes)
    layer = awq_gptq.QuantizedLinear(awq_gptq.QuantFormat(method, 4, group, 0), infos["qweight"], infos["qzeros"],
                                     infos["scales"], None, n, k)
    monkeypatch.setattr("builder.materialize.ROW_BLOCK_BYTES", 4 * k * 256)  # blocks of 256 output rows
    monkeypatch.setattr(awq_gptq, "PACKED_ROWS_BYTES", 2**20)
    resident = []  # qweight's resident bytes as each run is handed back, and after each block
    release = awq_gptq.release
    monkeypatch.setattr(awq_gptq, "release", lambda view: resident.append(mapped_rss(tmp_path / "qweight"))
                        or release(view))
    weight = Weight((n, k), np.float32, layer.float32, ("x",), by_rows=True).astype(np.float16)
    for _ in weight._row_blocks():
        resident.append(mapped_rss(tmp_path / "qweight"))
    # A fault may map a whole large folio of the page cache (2 MB on this machine's ext4, the most
    # seen here): a run's MB and a folio at either end.
    assert len(resident) > n // 256 and 2**20 <= max(resident) <= 4 * 2**20, max(resident)
