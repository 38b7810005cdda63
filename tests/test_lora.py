"""--adapter: a PEFT LoRA adapter merged into the lazy weights equals peft's merge_and_unload()."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
import yaml
from conftest import TINY
from fake_quant import assert_quantized_parity
from helpers import (
    GENAI_PROMPT,
    PROMPT,
    assert_parity,
    build,
    make_checkpoint,
    reference,
    relative_error,
)
from test_genai import assert_same_greedy

from builder.cli import main
from builder.digests import file_sha256

peft = pytest.importorskip("peft")

TARGETS = ["q_proj", "v_proj", "down_proj"]


def make_adapter(base, folder, seed=1, **config):
    """Trains nothing: a LoRA adapter with random A and random nonzero B (peft starts B at zero, and
    an embedding's A, which would hide a wrong merge), saved the PEFT way."""
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    lora = peft.get_peft_model(model, peft.LoraConfig(**{"r": 4, "lora_alpha": 8, "target_modules": TARGETS, **config}))
    with torch.no_grad():
        for name, p in lora.named_parameters():
            if "lora_B" in name or "lora_embedding_" in name:
                p.normal_(0.0, 0.2)
            elif "modules_to_save" in name:
                p.add_(0.05 * torch.randn_like(p))
    lora.save_pretrained(folder)
    return folder


def merged(base, adapter, folder):
    """peft's own merge, saved as a plain transformers checkpoint (the reference every test reads)."""
    model = transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    peft_model = peft.PeftModel.from_pretrained(model, adapter).eval()
    with torch.no_grad():
        unmerged = peft_model(torch.tensor([PROMPT])).logits[0].numpy()
    peft_model.merge_and_unload().save_pretrained(folder)
    return folder, unmerged


@pytest.fixture(scope="module", params=["lora", "rslora"])
def case(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(request.param)
    base = make_checkpoint(root / "base", "LlamaConfig", **TINY)
    extra = {} if request.param == "lora" else dict(use_rslora=True, r=8, lora_alpha=4,
                                                      target_modules=[*TARGETS, "embed_tokens"],
                                                      modules_to_save=["lm_head"])
    adapter = make_adapter(base, root / "adapter", **extra)
    reference_folder, unmerged = merged(base, adapter, root / "merged")
    return base, adapter, reference_folder, unmerged


def test_fp32_equals_peft_merge(case, tmp_path):
    base, adapter, reference_folder, unmerged = case
    want, _, _ = reference(reference_folder, PROMPT)
    assert relative_error(want, unmerged) < 1e-5  # peft's merged and unmerged models agree
    plain, _, _ = reference(base, PROMPT)
    assert relative_error(plain, want) > 0.05, "the adapter changes too little to prove a merge"
    out = build(base, tmp_path / "out", "-p", "fp32", "--adapter", str(adapter), "--verify")  # peft's merge too
    assert_parity(out, reference_folder, 1e-4)
    recorded = yaml.safe_load((out / "build.yaml").read_text())
    assert recorded["adapter"] == str(adapter.resolve())
    assert recorded["record"]["adapter"]["sha256"]["adapter_model.safetensors"] == file_sha256(
        adapter / "adapter_model.safetensors")


def test_int4_equals_fake_quantized_merge(case, tmp_path):
    base, adapter, reference_folder, _ = case
    out = build(base, tmp_path / "out", "-p", "int4", "--accuracy-level", "0", "--adapter", str(adapter))
    assert_quantized_parity(reference_folder, out, exact=True)


def test_genai_greedy_equals_merged_transformers(case, tmp_path):
    base, adapter, reference_folder, _ = case
    out = build(base, tmp_path / "out", "-p", "fp32", "--adapter", str(adapter))
    assert_same_greedy(out, reference_folder, GENAI_PROMPT)


def test_dora_is_refused_in_one_line(tiny_llama, tmp_path, capsys):
    adapter = make_adapter(tiny_llama, tmp_path / "dora", use_dora=True)
    capsys.readouterr()  # transformers' progress bars while making the adapter
    rc = main(["-m", str(tiny_llama), "-o", str(tmp_path / "out"), "-q", "--adapter", str(adapter)])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "\n" not in err and "DoRA" in err, err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("change, message", [
    (dict(bias="lora_only"), "bias 'lora_only'"),
    (dict(peft_type="IA3"), "peft_type 'IA3'"),
    (dict(alpha_pattern={"q_proj": 16}), "alpha_pattern"),
    (dict(some_future_switch=True), "some_future_switch"),
])
def test_unsupported_settings_are_refused(tiny_llama, tmp_path, capsys, change, message):
    adapter = make_adapter(tiny_llama, tmp_path / "adapter")
    config = json.loads((adapter / "adapter_config.json").read_text())
    (adapter / "adapter_config.json").write_text(json.dumps({**config, **change}))
    capsys.readouterr()  # transformers' progress bars while making the adapter
    rc = main(["-m", str(tiny_llama), "-o", str(tmp_path / "out"), "-q", "--adapter", str(adapter)])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "\n" not in err and message in err, err
    assert not (tmp_path / "out").exists()


def test_adapter_tensor_matching_no_weight_fails_naming_it(tiny_llama, tmp_path, capsys):
    from safetensors.numpy import load_file, save_file

    adapter = make_adapter(tiny_llama, tmp_path / "adapter")
    tensors = load_file(adapter / "adapter_model.safetensors")
    stray = "base_model.model.model.layers.9.self_attn.q_proj.lora_A.weight"
    tensors[stray] = tensors["base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"]
    tensors[stray.replace("lora_A", "lora_B")] = tensors["base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"]
    save_file(tensors, adapter / "adapter_model.safetensors")
    capsys.readouterr()
    rc = main(["-m", str(tiny_llama), "-o", str(tmp_path / "out"), "-q", "-p", "fp32", "--adapter", str(adapter)])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and stray in err, err
    assert not (tmp_path / "out").exists()


def test_build_path_imports_neither_peft_nor_torch():
    import subprocess
    import sys

    code = "import sys, builder.inputs.lora, builder.pipeline; print(sorted({'peft', 'torch'} & set(sys.modules)))"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "[]"


def test_merge_is_float32_and_lazy(tiny_llama, tmp_path):
    from builder.inputs.safetensors import SafetensorsCheckpoint
    from builder.inputs.lora import Adapter, LoraCheckpoint

    adapter = make_adapter(tiny_llama, tmp_path / "adapter")
    ckpt = LoraCheckpoint(SafetensorsCheckpoint.open(tiny_llama), Adapter.open(adapter))
    w = ckpt.weight("model.layers.0.self_attn.q_proj.weight")
    assert w.dtype == np.float32 and w.shape == (64, 64)
    assert ckpt.adapter.tensors.unconsumed() == sorted(
        n for n in ckpt.adapter.tensors.tensors if "layers.0.self_attn.q_proj" not in n)


# peft's default targets for Llama (q_proj and v_proj only), plus an embedding and a full
# replacement: the three ways a merged weight meets the base's dtype.
PARTIAL = dict(target_modules=["q_proj", "v_proj", "embed_tokens"], modules_to_save=["lm_head"])
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@pytest.fixture(scope="module", params=list(DTYPES))
def partial(request, tmp_path_factory):
    """A base stored in one dtype, an adapter trained (in float32, as make_adapter does) on q and v
    only, and peft's merge made the way its users make it: on the base loaded in its own dtype."""
    root = tmp_path_factory.mktemp(f"partial-{request.param}")
    base = make_checkpoint(root / "base", "LlamaConfig", dtype=DTYPES[request.param], **TINY)
    adapter = make_adapter(base, root / "adapter", **PARTIAL)
    model = transformers.AutoModelForCausalLM.from_pretrained(base, dtype="auto")
    assert model.dtype == DTYPES[request.param]
    peft.PeftModel.from_pretrained(model, adapter).merge_and_unload().save_pretrained(root / "merged")
    return base, adapter, root / "merged"


@pytest.mark.parametrize("rows_a_block", [None, 7])
def test_merged_weights_are_peft_merged_weights_in_the_base_dtype(partial, rows_a_block, monkeypatch):
    """Bit for bit, whole or merged a block of 7 rows at a time (the merge is computed a block of
    rows at a time as it is written: the whole one held the delta and the sum as float32 [N, K];
    a 2-layer, 2048-wide LoRA build's peak went 626 -> 265 MB)."""
    from safetensors.numpy import load_file

    from builder.inputs.lora import Adapter, LoraCheckpoint
    from builder.inputs.safetensors import SafetensorsCheckpoint
    from builder.materialize import ComputedRows

    base, adapter, reference_folder = partial
    if rows_a_block:
        monkeypatch.setattr("builder.materialize.ROW_BLOCK_BYTES", rows_a_block * 4 * TINY["hidden_size"])
    want = load_file(reference_folder / "model.safetensors")
    ckpt = LoraCheckpoint(SafetensorsCheckpoint.open(base), Adapter.open(adapter))
    changed = sorted({*ckpt.deltas, *ckpt.replaced})
    assert len(changed) == 2 * 2 + 2  # q and v of two layers, the embedding, lm_head
    for name in ckpt.deltas:
        assert ckpt.weight(name).apply(lambda value: isinstance(value, ComputedRows)), name
    for name in [*changed, "model.layers.0.self_attn.k_proj.weight"]:
        got = ckpt.weight(name).numpy()
        assert got.dtype == ckpt.base.info(name).dtype, name  # merged or not, the base's dtype
        # The same values as peft's merged model, bit for bit (safetensors.numpy reads bf16 as
        # 2-byte words, so compare the bits).
        assert got.view(np.uint16 if got.itemsize == 2 else np.uint32).tobytes() == want[name].tobytes(), name


def test_partial_qkv_targets_build_and_equal_peft_merge(partial, tmp_path):
    # Crashed for bf16 and fp16 bases: the merged q was float32, the untouched k not.
    base, adapter, reference_folder = partial
    plain, _, _ = reference(base, PROMPT)
    want, _, _ = reference(reference_folder, PROMPT)
    assert relative_error(plain, want) > 0.05, "the adapter changes too little to prove a merge"
    out = build(base, tmp_path / "out", "-p", "fp32", "--adapter", str(adapter), "--verify")
    # The graph holds the very weights of peft's merged model (above), upcast exactly to float32:
    # only float32 summation order is left, whatever the base's dtype (3e-7 measured for all three).
    assert_parity(out, reference_folder, 1e-5)


def test_examples_tiny_llama_takes_peft_default_targets(tmp_path, capsys):
    # The repository's own bf16 example, with peft's LoraConfig defaults (q_proj and v_proj for Llama).
    example = Path(__file__).parent.parent / "examples" / "tiny-llama"
    adapter = make_adapter(example, tmp_path / "adapter", target_modules=None)
    assert json.loads((adapter / "adapter_config.json").read_text())["target_modules"] in (
        ["q_proj", "v_proj"], ["v_proj", "q_proj"])
    capsys.readouterr()
    assert main(["-m", str(example), "-o", str(tmp_path / "out"), "-q", "--adapter", str(adapter)]) == 0
    assert (tmp_path / "out" / "model.onnx").is_file()


@pytest.fixture(scope="module")
def adapter_tensors(tmp_path_factory):
    """A valid adapter for conftest's tiny Llama, made once, as the malformed ones' starting point."""
    root = tmp_path_factory.mktemp("valid-adapter")
    base = make_checkpoint(root / "base", "LlamaConfig", **TINY)
    return base, make_adapter(base, root / "adapter")


Q_A = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
Q_B = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"


@pytest.mark.parametrize("change, message", [
    ({Q_A: lambda a, b: a[0]}, "are not LoRA factors"),  # A 1-D
    ({Q_A: lambda a, b: a[:, :, None]}, "are not LoRA factors"),  # A 3-D
    ({Q_B: lambda a, b: b[:, :3]}, "are not LoRA factors"),  # B's rank differs from A's
    ({Q_A: lambda a, b: a[:0], Q_B: lambda a, b: b[:, :0]}, "are not LoRA factors"),  # rank 0: s = alpha / 0
    ({"lora_alpha": float("nan")}, "lora_alpha must be a positive finite number, got nan"),
    ({"lora_alpha": float("inf")}, "lora_alpha must be a positive finite number, got inf"),
    ({"lora_alpha": True}, "lora_alpha must be a positive finite number, got True"),
    ({"r": 4.5}, "r must be a positive integer, got 4.5"),
    ({"r": True}, "r must be a positive integer, got True"),
])
def test_malformed_adapter_is_refused_in_one_line_before_writing(adapter_tensors, tmp_path, capsys, change, message):
    import shutil

    from safetensors.numpy import load_file, save_file

    base, valid = adapter_tensors
    adapter = Path(shutil.copytree(valid, tmp_path / "adapter"))
    tensors = load_file(adapter / "adapter_model.safetensors")
    config = json.loads((adapter / "adapter_config.json").read_text())
    a, b = tensors[Q_A], tensors[Q_B]
    for key, value in change.items():
        if key in tensors:
            tensors[key] = np.ascontiguousarray(value(a, b))
        else:
            config[key] = value
    save_file(tensors, adapter / "adapter_model.safetensors")
    (adapter / "adapter_config.json").write_text(json.dumps(config))  # NaN and Infinity, as Python writes them
    rc = main(["-m", str(base), "-o", str(tmp_path / "out"), "-q", "-p", "fp32", "--adapter", str(adapter)])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "\n" not in err and message in err, err
    assert not (tmp_path / "out").exists()
