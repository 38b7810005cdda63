"""The public Python API: pinned names, and the crafting example run end to end."""

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from helpers import PROMPT, OnnxDecoder, relative_error

import builder
import builder.blocks

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

from craft_gelu_llama import craft  # noqa: E402


def test_public_names_are_pinned():
    assert sorted(builder.__all__) == [
        "BuildError", "BuildOptions", "Checkpoint", "DecoderIO", "Graph", "Quantization", "Target", "Weight",
        "__version__", "blocks", "build", "save",
    ]
    assert sorted(builder.blocks.__all__) == [
        "AttentionSpec", "AttentionWeights", "QuantizedValues", "ResidualStream", "Rope", "SequenceLengths", "Vocabulary",
        "activation", "embedding", "gated_mlp", "layer_norm", "linear", "lm_head", "longrope_tables", "plain_mlp", "quantized_weight", "rms_norm",
        "rotary_tables", "rotary_tables_by_layer_type", "self_attention", "sequence_lengths", "shared_vocabulary", "skip_layer_norm", "skip_rms_norm", "sparse_moe",
    ]
    for name in builder.__all__ + [f"blocks.{n}" for n in builder.blocks.__all__]:
        obj = builder
        for part in name.split("."):
            obj = getattr(obj, part)
        if callable(obj) and not isinstance(obj, type(builder)):
            assert obj.__doc__, f"{name} has no docstring"


def test_crafted_gelu_llama_matches_transformers_with_gelu(tiny_llama, tmp_path):
    out = craft(tiny_llama, tmp_path / "gelu")
    # What onnxruntime-genai needs, as a build writes it (this checkpoint has no tokenizer).
    assert sorted(p.name for p in out.iterdir()) == ["build.yaml", "genai_config.json", "model.onnx", "model.onnx.data"]
    # The reference: the same checkpoint in transformers, its MLP activation switched likewise.
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_llama, hidden_act="gelu_pytorch_tanh",
                                                              dtype=torch.float32).eval()
    silu = transformers.AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32).eval()
    with torch.no_grad():
        expected = model(torch.tensor([PROMPT])).logits[0].numpy()
        unchanged = silu(torch.tensor([PROMPT])).logits[0].numpy()
    got, _ = OnnxDecoder(out).run(PROMPT, None, len(PROMPT))
    assert relative_error(got, expected) < 1e-4
    assert relative_error(got, unchanged) > 1e-2  # the activation really changed
    assert np.isfinite(got).all()


def test_build_can_be_called_twice_in_one_process(tmp_path):
    # Importing a submodule named like the function would rebind builder.build to the module.
    example = ROOT / "examples" / "tiny-llama"
    for name in ("a", "b"):
        out = builder.build(builder.BuildOptions(model=str(example), output=str(tmp_path / name), precision="fp32"),
                            progress=False)
        assert (out / "model.onnx").is_file()
    assert callable(builder.build)


def test_registry_is_read_from_the_families_declarations():
    import dataclasses

    import architectures
    from builder.errors import BuildError
    from builder.family import Family, register

    # Each module that declares a family names it after its file (--list-architectures prints
    # architectures/<name>.py), and every registered family is some module's declaration.
    import importlib
    import pkgutil

    registered = {f.name: f for f in architectures.families()}
    declared = {}
    for info in pkgutil.iter_modules(architectures.__path__):
        family = getattr(importlib.import_module(f"architectures.{info.name}"), "FAMILY", None)
        if isinstance(family, Family):  # the module's own declaration, registered under its file's name
            assert registered.get(info.name) is family, f"architectures/{info.name}.py declares {family.name!r}"
            declared[family.name] = info.name
    assert sorted(declared) == sorted(registered)
    for name, module in architectures.ARCHITECTURES.items():
        assert (Path(architectures.__file__).parent / f"{module}.py").is_file(), name
    llama = architectures.load("LlamaForCausalLM")
    with pytest.raises(BuildError, match="declared by both architectures/llama.py and architectures/copy.py"):
        register(dataclasses.replace(llama, name="copy"))
