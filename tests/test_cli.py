"""The command line: outputs, records, and one-line refusals that leave nothing on disk."""

import json
import shutil

import numpy as np
import onnx
import pytest
from safetensors.numpy import load_file, save_file

from builder import writer as save_module
from builder.cli import main


def run(capsys, *argv):
    rc = main(list(argv))
    err = capsys.readouterr().err.strip()
    return rc, err


def copy_source(src, dst):
    shutil.copytree(src, dst)
    return dst


def test_output_folder_contents_and_genai_config(tiny_llama, tmp_path, capsys):
    src = copy_source(tiny_llama, tmp_path / "src")
    (src / "tokenizer.json").write_text('{"model": {"type": "BPE", "vocab": {}, "merges": []}}')
    (src / "tokenizer_config.json").write_text("{}")
    (src / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 7], "bos_token_id": 1, "top_k": 20}))
    out = tmp_path / "out"
    rc, err = run(capsys, "-m", str(src), "-o", str(out), "-q")
    assert rc == 0, err
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["model.onnx", "model.onnx.data", "genai_config.json", "tokenizer.json", "tokenizer_config.json", "build.yaml"])
    cfg = json.loads((out / "genai_config.json").read_text())
    model = cfg["model"]
    assert model["eos_token_id"] == [2, 7] and model["bos_token_id"] == 1  # generation_config wins
    assert model["type"] == "llama" and model["vocab_size"] == 256 and model["context_length"] == 128
    dec = model["decoder"]
    assert (dec["head_size"], dec["num_attention_heads"], dec["num_key_value_heads"], dec["num_hidden_layers"]) == (16, 4, 2, 2)
    assert dec["session_options"]["provider_options"] == []
    assert cfg["search"]["top_k"] == 20 and cfg["search"]["past_present_share_buffer"] is True
    assert not list(tmp_path.glob(".out.*")), "staging folder left behind"


def test_graph_uses_fused_ops_and_module_path_names(tiny_llama, tmp_path):
    out = tmp_path / "out"
    assert main(["-m", str(tiny_llama), "-o", str(out), "-q", "-p", "fp32"]) == 0
    model = onnx.load(out / "model.onnx", load_external_data=False)
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("GroupQueryAttention") == 2
    assert ops.count("SimplifiedLayerNormalization") == 1 and ops.count("SkipSimplifiedLayerNormalization") == 4
    names = {n.name for n in model.graph.node}
    assert "/model/layers.1/self_attn/qkv_proj/FusedMatMul" in names
    assert "/model/layers.0/mlp/down_proj/FusedMatMul" in names
    opsets = {o.domain: o.version for o in model.opset_import}
    assert opsets == {"": 21, "com.microsoft": 1}
    gqa = next(n for n in model.graph.node if n.op_type == "GroupQueryAttention")
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in gqa.attribute}
    assert attrs["do_rotary"] == 1 and attrs["num_heads"] == 4 and attrs["kv_num_heads"] == 2
    external = [t for t in model.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    assert {e.value for t in external for e in t.external_data if e.key == "location"} == {"model.onnx.data"}
    assert any(t.name == "model.layers.0.self_attn.qkv_proj.weight" for t in external)


def test_cuda_fp16_graph(tiny_llama, tmp_path):
    # No GPU here: the CUDA build is checked for structure (dtypes, ops, provider options).
    out = tmp_path / "out"
    assert main(["-m", str(tiny_llama), "-o", str(out), "-q", "-p", "fp16", "-e", "cuda"]) == 0
    model = onnx.load(out / "model.onnx", load_external_data=False)
    fp16 = onnx.TensorProto.FLOAT16
    assert {i.type.tensor_type.elem_type for i in model.graph.input if i.name.startswith("past")} == {fp16}
    assert model.graph.output[0].type.tensor_type.elem_type == fp16
    floats = [t for t in model.graph.initializer if t.data_type in (onnx.TensorProto.FLOAT, fp16)]
    assert floats and all(t.data_type == fp16 for t in floats)
    cfg = json.loads((out / "genai_config.json").read_text())
    assert cfg["model"]["decoder"]["session_options"]["provider_options"] == [{"cuda": {"enable_cuda_graph": "0"}}]


def test_bf16_cuda_graph_returns_fp32_logits(tiny_llama, tmp_path):
    out = tmp_path / "out"
    assert main(["-m", str(tiny_llama), "-o", str(out), "-q", "-p", "bf16", "-e", "cuda"]) == 0
    model = onnx.load(out / "model.onnx", load_external_data=False)
    assert model.graph.output[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    assert model.graph.output[1].type.tensor_type.elem_type == onnx.TensorProto.BFLOAT16


@pytest.mark.parametrize("flags, message", [
    (["-p", "bf16", "-e", "cpu"], "-p bf16 -e cpu is not supported"),
    (["-p", "fp32", "-e", "cuda"], "-p fp32 -e cuda is not supported"),
])
def test_refused_precision_provider_pairs(tiny_llama, tmp_path, capsys, flags, message):
    rc, err = run(capsys, "-m", str(tiny_llama), "-o", str(tmp_path / "out"), *flags)
    assert rc == 2 and message in err and len(err.splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_existing_output_is_refused_then_overwritten(tiny_llama, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    rc, err = run(capsys, "-m", str(tiny_llama), "-o", str(out), "-q")
    assert rc == 2 and "exists and is not empty" in err
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    # --overwrite replaces only a previous build (test_outputs.py, test_output_safety.py)
    rc, err = run(capsys, "-m", str(tiny_llama), "-o", str(out), "-q", "--overwrite")
    assert rc == 2 and "has no build.yaml" in err
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    (out / "keep.txt").unlink()
    rc, err = run(capsys, "-m", str(tiny_llama), "-o", str(out), "-q")  # an empty folder is filled
    assert rc == 0 and (out / "model.onnx").is_file()
    rc, err = run(capsys, "-m", str(tiny_llama), "-o", str(out), "-q", "--overwrite")
    assert rc == 0 and (out / "model.onnx").is_file()


def test_failure_while_saving_leaves_no_output(tiny_llama, tmp_path, monkeypatch):
    def explode(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("builder.writer.save_models", explode)
    assert main(["-m", str(tiny_llama), "-o", str(tmp_path / "out"), "-q"]) == 130
    assert list(tmp_path.iterdir()) == []
    assert save_module.MODEL_STEM == "model"


def test_unknown_architecture(tiny_llama, tmp_path, capsys):
    src = copy_source(tiny_llama, tmp_path / "src")
    cfg = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps(dict(cfg, architectures=["FooForCausalLM"])))
    rc, err = run(capsys, "-m", str(src), "-o", str(tmp_path / "out"))
    assert rc == 2 and "unsupported architecture 'FooForCausalLM'" in err and "LlamaForCausalLM" in err
    assert not (tmp_path / "out").exists()


def test_unused_tensor_fails_the_build(tiny_llama, tmp_path, capsys):
    src = copy_source(tiny_llama, tmp_path / "src")
    tensors = load_file(src / "model.safetensors")
    tensors["model.layers.0.mlp.extra_proj.weight"] = np.ones((4, 4), np.float32)
    save_file(tensors, src / "model.safetensors")
    rc, err = run(capsys, "-m", str(src), "-o", str(tmp_path / "out"))
    assert rc == 2 and "model.layers.0.mlp.extra_proj.weight" in err
    assert not (tmp_path / "out").exists()


def test_bad_inputs(tmp_path, capsys):
    rc, err = run(capsys, "-m", str(tmp_path / "missing"), "-o", str(tmp_path / "out"))
    assert rc == 2 and "no such folder" in err
    (tmp_path / "empty").mkdir()
    rc, err = run(capsys, "-m", str(tmp_path / "empty"), "-o", str(tmp_path / "out"))
    assert rc == 2 and "has no config.json" in err
    (tmp_path / "empty" / "config.json").write_text("{oops")
    rc, err = run(capsys, "-m", str(tmp_path / "empty"), "-o", str(tmp_path / "out"))
    assert rc == 2 and "not valid JSON" in err
    assert not (tmp_path / "out").exists()


def test_input_flag_reads_local_folder_named_by_model(tiny_llama, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rc, err = run(capsys, "-m", "meta-llama/Llama-3.2-1B", "-i", str(tiny_llama), "-q")
    assert rc == 0, err
    assert (tmp_path / "Llama-3.2-1B-int4-cpu" / "model.onnx").is_file()


@pytest.mark.parametrize("precision", ["fp32", "fp16", "int4", "int8"])
def test_tied_vocabulary_is_stored_once(tmp_path, precision):
    from conftest import TINY
    from helpers import make_checkpoint

    src = make_checkpoint(tmp_path / "src", "LlamaConfig", **{**TINY, "tie_word_embeddings": True})
    out = tmp_path / "out"
    assert main(["-m", str(src), "-o", str(out), "-q", "-p", precision]) == 0
    model = onnx.load(out / "model.onnx", load_external_data=False)
    vocab_sized = [t.name for t in model.graph.initializer if TINY["vocab_size"] in t.dims]
    ops = {n.op_type for n in model.graph.node}
    if precision == "int8":  # GatherBlockQuantized reads 4-bit data only: a float lookup table remains
        assert vocab_sized == ["model.embed_tokens.weight", "lm_head.data", "lm_head.scales"] or len(vocab_sized) == 3
    elif precision == "int4":
        assert "GatherBlockQuantized" in ops and "model.embed_tokens.weight" not in vocab_sized
    else:
        assert vocab_sized == ["model.embed_tokens.weight"] and "FusedMatMul" in ops
