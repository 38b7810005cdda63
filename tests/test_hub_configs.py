"""Every real hub config.json under tests/data/hub_configs/ (copied from public sources, listed in
its SOURCES.md) plans: a dry run over a checkpoint whose safetensors header lists, at full size,
the tensors scripts/make_synthetic_checkpoint.py's TENSORS derives from that config.

The checkpoint costs nothing: the header is written and the file is then truncated out to the size
the header promises, so the data region is a hole (a sparse file); a dry run reads config.json and
the headers only, never a tensor's bytes. A config whose model_type TENSORS has no generator for is
skipped with the reason; a config builder refuses is an expected failure (strict) carrying the
refusal's one line, so that a fix shows up as an unexpected pass.
"""

from __future__ import annotations

import json
import math
import shutil
import struct
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from builder.cli import main

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
from make_synthetic_checkpoint import TENSORS  # noqa: E402

HUB_CONFIGS = Path(__file__).resolve().parent / "data" / "hub_configs"
FILES = ("config.json", "generation_config.json")

# model_types TENSORS lacks whose checkpoints carry another family's tensor names (config keys alike).
SAME_TENSORS = {"kimi_k2": "deepseek_v3", "deepseek_v2": "deepseek_v3"}

# The hub's multimodal classes whose text decoder builder builds from text_config, and where their
# checkpoints keep it: (TENSORS' text model_type, renames of the generator's names). The vision
# tower's tensors are left out: builder ignores them (the families' `ignored` patterns).
COMPOSITE = {
    "qwen3_5": ("qwen3_5_text", (("model.", "model.language_model."),)),
    "qwen3_5_moe": ("qwen3_5_moe_text", (("model.", "model.language_model."),)),
    "gemma4": ("gemma4_text", (("model.", "model.language_model."),)),
    "llama4": ("llama4_text", (("model.", "language_model.model."), ("lm_head.", "language_model.lm_head."))),
}

# Refusals seen when this corpus was gathered: folder -> the refusal's line (see the module doc).
REFUSED: dict[str, str] = {}


# Configs whose layout TENSORS' generator for their model_type does not cover (a test-side gap, not
# a refusal by builder): folder -> why.
NOT_GENERATED = {
    "RedHatAI__Llama-4-Scout-17B-16E-Instruct-FP8-dynamic":
        "compressed-tensors FP8 (llm-compressor, for_llm_compressor: per-channel float8 weights with weight_scale); "
        "_header writes bf16 tensors and block-wise FP8 only, and the per-expert layout llm-compressor saves is "
        "not modelled",
}


def _tensors(config: dict) -> Iterator[tuple[str, tuple[int, ...]]] | str:
    """The checkpoint's (name, shape)s, or why there are none."""
    model_type = config.get("model_type")
    if model_type in TENSORS:
        return TENSORS[model_type](config)
    if model_type in SAME_TENSORS:
        # DeepSeek-V3's router bias exists only with its noaux_tc routing (DeepSeek-V2: greedy).
        return ((name, shape) for name, shape in TENSORS[SAME_TENSORS[model_type]](config)
                if config.get("topk_method") == "noaux_tc" or not name.endswith("e_score_correction_bias"))
    if model_type in COMPOSITE:
        text_type, renames = COMPOSITE[model_type]
        text = config["text_config"]

        def renamed():
            head = False
            for name, shape in TENSORS[text_type](text):
                for old, new in renames:
                    if name.startswith(old):
                        name = new + name[len(old):]
                        break
                head |= name.endswith("lm_head.weight")
                yield name, shape
            if not head and not config.get("tie_word_embeddings", text.get("tie_word_embeddings", True)):
                yield "lm_head.weight", (text["vocab_size"], text["hidden_size"])  # untied: the generators' presets are tied

        return renamed()
    return f"scripts/make_synthetic_checkpoint.py's TENSORS has no generator for model_type {model_type!r}"


def _fp8_block(config: dict) -> tuple[int, int] | None:
    """[bn, bk] of a block-wise FP8 checkpoint (quant_method "fp8", as DeepSeek-V3 and Kimi K2 ship)."""
    q = config.get("quantization_config") or {}
    if q.get("quant_method") == "fp8" and q.get("weight_block_size"):
        bn, bk = q["weight_block_size"]
        return bn, bk
    return None


def _fp8_quantized(name: str, shape: tuple[int, ...]) -> bool:
    """The hub's FP8 checkpoints store every decoder Linear in float8, except the router; the
    embeddings, lm_head, norms and biases stay bf16."""
    return (name.startswith("model.layers.") and name.endswith(".weight") and len(shape) == 2
            and "norm" not in name and not name.endswith("mlp.gate.weight"))


def _header(config: dict, tensors: Iterator[tuple[str, tuple[int, ...]]]) -> tuple[bytes, int]:
    """The safetensors header (with its length prefix) and the size of the data it describes."""
    block = _fp8_block(config)
    entries, offset = {}, 0

    def add(name: str, dtype: str, shape: tuple[int, ...], itemsize: int) -> None:
        nonlocal offset
        nbytes = math.prod(shape) * itemsize
        entries[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes

    for name, shape in tensors:
        if block is not None and _fp8_quantized(name, shape):
            add(name, "F8_E4M3", shape, 1)
            add(name + "_scale_inv", "F32", (-(-shape[0] // block[0]), -(-shape[1] // block[1])), 4)
        else:
            add(name, "BF16", shape, 2)
    entries["__metadata__"] = {"format": "pt"}
    raw = json.dumps(entries, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw, offset


def _case(folder: Path):
    marks = []
    if folder.name in REFUSED:
        marks.append(pytest.mark.xfail(strict=True, reason=REFUSED[folder.name]))
    return pytest.param(folder, id=folder.name, marks=marks)


CASES = [_case(f) for f in sorted(HUB_CONFIGS.iterdir()) if (f / "config.json").is_file()]


def test_the_corpus_is_listed_in_its_sources():
    sources = (HUB_CONFIGS / "SOURCES.md").read_text()
    assert len(CASES) >= 20
    for case in CASES:
        org, name = case.values[0].name.split("__", 1)
        assert f"{org}/{name}" in sources, case.values[0].name


@pytest.mark.parametrize("folder", CASES)
def test_hub_config_plans(folder, tmp_path, capsys):
    if folder.name in NOT_GENERATED:
        pytest.skip(NOT_GENERATED[folder.name])
    config = json.loads((folder / "config.json").read_text())
    tensors = _tensors(config)
    if isinstance(tensors, str):
        pytest.skip(tensors)
    src = tmp_path / folder.name
    src.mkdir()
    for name in FILES:
        if (folder / name).is_file():
            shutil.copyfile(folder / name, src / name)
    header, data = _header(config, tensors)
    path = src / "model.safetensors"
    with open(path, "wb") as f:
        f.write(header)
        f.truncate(len(header) + data)  # the data region is a hole: nothing of it is written
    assert path.stat().st_size == len(header) + data
    assert path.stat().st_blocks * 512 < len(header) + (1 << 20)  # sparse: the header's blocks only
    rc = main(["-m", str(src), "-o", str(tmp_path / "out"), "--dry-run", "-q"])
    err = capsys.readouterr().err
    refusal = next((line for line in err.splitlines() if line.startswith("error")), err.strip())
    assert rc == 0, refusal
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("folder", [pytest.param(f, id=f.name) for f in sorted(HUB_CONFIGS.iterdir()) if f.is_dir()])
def test_hub_config_reads_as_transformers_reads_it(folder):
    # Every config of the corpus, those the dry run cannot synthesize tensors for included, parses
    # (the family's own reading, no refusal) into the rotary settings transformers' config class
    # standardizes; RedHat's FP8 Llama 4 Scout carries the Instruct model's text_config: rope_scaling
    # llama3 with low_freq_factor = high_freq_factor = 1.0, which builder refused.
    import architectures

    transformers = pytest.importorskip("transformers")
    raw = json.loads((folder / "config.json").read_text())
    architecture = raw["architectures"][0]
    c = architectures.load(architecture).parse_config(raw, architecture)
    text = raw.get("text_config") or raw
    if text.get("model_type") in transformers.CONFIG_MAPPING and "rope_scaling" in text:
        reference = transformers.AutoConfig.for_model(**{k: v for k, v in text.items() if k != "architectures"})
        ours = c.rope_parameters if "full_attention" not in c.rope_parameters else c.rope_parameters["full_attention"]
        theirs = reference.get_text_config().rope_parameters
        theirs = theirs.get("full_attention", theirs)
        for key in ("rope_type", "factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"):
            assert ours.get(key) == theirs.get(key), key
