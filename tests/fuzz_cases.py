"""Malformed inputs made from valid ones: the fuzz test (tests/test_fuzz.py, a few hundred cases in
CI) and scripts/fuzz_inputs.py (as many as asked, each failure saved to reproduce) share them.

A Case is one mutation of one valid tiny input, as data: the parser it aims at, the file, the kind
of mutation (truncation, a byte flip, a huge count or length, a value of the wrong JSON or GGUF
type, deep nesting, overlapping tensors) with its parameters drawn from a seeded generator, and
what the build must do. Every case must end within a time and memory bound in exit code 2 with
exactly one `error: ...` line, or in a success the format's own reader agrees with (the
safetensors library, gguf's GGUFReader; a real build's model then gives finite logits and loads
its tokenizer). A case whose input is certainly wrong (`expect="refuse"`) must be refused.

Cases are data so the test can name them before any file exists; `make_bases` writes the valid
inputs once (no torch: scripts/make_tiny_checkpoint.py's weights, tests/gguf_files.py's GGUF
writer), `run_case` copies the one a case mutates, applies the mutation and runs builder's CLI
in-process (a dry run reads every header and config and plans; some cases also build).

This module lives in tests/ beside the helpers it uses; the script puts tests/ on sys.path.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import random
import resource
import shutil
import signal
import struct
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))  # make_tiny_checkpoint

SECONDS = 10.0  # per case; most take milliseconds
MEMORY = 2 << 30  # address space a case may add to the process
DEEP = 100_000  # nesting levels of the deepest JSON / YAML cases


# --------------------------------------------------------------------------------------------
# The valid inputs


def make_bases(root: Path) -> dict[str, Path]:
    """Writes every valid input a case mutates under `root`; returns them by name."""
    import make_tiny_checkpoint as tiny
    from gguf_files import SPM, VOCAB, write_gguf
    from safetensors.numpy import save_file

    root.mkdir(parents=True, exist_ok=True)
    llama = root / "llama"
    tiny.write(llama)
    weights = tiny.weights()

    sharded = root / "sharded"
    shutil.copytree(llama, sharded)
    (sharded / "model.safetensors").unlink()
    names = sorted(weights)
    shards = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    for file, part in shards.items():
        save_file({n: weights[n] for n in part}, sharded / file)
    (sharded / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": sum(w.nbytes for w in weights.values())},
         "weight_map": {n: f for f, part in shards.items() for n in part}}, indent=2))

    bases = {"llama": llama, "sharded": sharded}
    # GGUF files of the same Llama: float32 with a byte-level BPE vocabulary, Q8_0 with SentencePiece's
    for name, types, vocab, size in (("gguf", "F32", "gpt2", VOCAB),
                                     ("gguf_spm", {"*": "Q8_0"}, "llama", len(SPM["llama"]["tokens"]))):
        source = root / f"{name}-source"
        source.mkdir()
        config = {**tiny.CONFIG, "vocab_size": size, "bos_token_id": 1, "eos_token_id": 2}
        save_file({n: w.astype(np.float32) for n, w in tiny.weights(0, config).items()}, source / "model.safetensors")
        (source / "config.json").write_text(json.dumps(config))
        bases[name] = write_gguf(source, root / f"{name}.gguf", types, vocab=vocab)

    adapter = root / "adapter"
    adapter.mkdir()
    rng = np.random.default_rng(1)
    c = tiny.CONFIG
    outs = {"q_proj": c["num_attention_heads"] * c["head_dim"], "v_proj": c["num_key_value_heads"] * c["head_dim"]}
    lora = {}
    for i in range(c["num_hidden_layers"]):
        for module, rows in outs.items():
            prefix = f"base_model.model.model.layers.{i}.self_attn.{module}"
            lora[f"{prefix}.lora_A.weight"] = rng.standard_normal((4, c["hidden_size"]), dtype=np.float32) * 0.1
            lora[f"{prefix}.lora_B.weight"] = rng.standard_normal((rows, 4), dtype=np.float32) * 0.1
    save_file(lora, adapter / "adapter_model.safetensors")
    (adapter / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": "llama", "r": 4, "lora_alpha": 8,
        "target_modules": ["q_proj", "v_proj"], "lora_dropout": 0.0, "bias": "none", "fan_in_fan_out": False,
        "use_rslora": False, "modules_to_save": None, "inference_mode": True}, indent=2))
    bases["adapter"] = adapter

    (root / "build.yaml").write_text(
        f"model: {llama}\nprecision: int4\nexecution_provider: cpu\nblock_size: 32\naccuracy_level: 4\n"
        "context_length: 128\nsearch: {top_k: 40, top_p: 0.9, temperature: 0.7, max_length: 64}\n")
    bases["yaml"] = root / "build.yaml"
    return bases


# --------------------------------------------------------------------------------------------
# Cases


@dataclass(frozen=True)
class Case:
    """One mutation of one base input (see the module's docstring)."""

    parser: str  # safetensors, index, config, generation, gguf, lora, yaml
    base: str  # a key of make_bases
    target: str  # the file of the base that is mutated ("" for a base that is one file)
    mutation: str  # a key of MUTATIONS
    params: tuple = ()
    expect: str = "either"  # "refuse": the input is certainly wrong; "either": refused or read correctly
    build: bool = False  # also build for real when the dry run succeeds
    index: int = 0

    @property
    def id(self) -> str:
        """Unique among a run's cases: the parser, the index, the mutation and its parameters."""
        return f"{self.parser}-{self.index:03d}-{self.what}"

    @property
    def what(self) -> str:
        """The mutation and its parameters (the same for the same input, at any index)."""
        shown = "-".join(_short(p) for p in self.params)
        return self.mutation + (f"-{shown}" if shown else "")


def _short(value: Any) -> str:
    text = value if isinstance(value, str) else repr(value)
    text = "".join(ch if ch.isalnum() or ch in "._" else "_" for ch in text)
    return text[:24]


# Values of the wrong JSON type or range, by name (`RAW` ones are written as raw JSON text).
WRONG = {
    "string": "x", "numeric-string": "64", "list": [1], "empty-list": [], "dict": {"a": 1}, "null": None,
    "zero": 0, "negative": -1, "fraction": 0.5, "true": True, "nan": float("nan"), "big": 10**9, "huge": 2**64,
    "1e309": "RAW:1e309", "deep": f"RAW:{'[' * DEEP}{']' * DEEP}", "digits": f"RAW:{'1' * 5000}",
}
# config.json keys the tiny Llama build reads, by what they hold.
COUNT_KEYS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
              "vocab_size", "max_position_embeddings", "head_dim")
TOKEN_KEYS = ("bos_token_id", "eos_token_id")
SCALE_KEYS = ("rms_norm_eps", "rope_theta")


def config_expectation(key: str, wrong: str) -> str:
    """Whether config.json's `key` set to WRONG[`wrong`] is certainly refused, or may be valid
    (transformers' default for a null, a token id of 0, a long context)."""
    never = {"string", "numeric-string", "dict", "true", "nan", "huge", "1e309", "deep", "digits"}
    if key in COUNT_KEYS:
        valid = {"null", "big"} if key == "max_position_embeddings" else {"null"} if key == "head_dim" else set()
        return "either" if wrong in valid else "refuse"
    if key in TOKEN_KEYS:
        return "refuse" if wrong in never | {"fraction"} else "either"
    if key in SCALE_KEYS:  # a positive finite number, however large
        wrong_values = never - {"huge"} | {"list", "empty-list", "negative"}
        return "refuse" if wrong in wrong_values or (key, wrong) == ("rope_theta", "zero") else "either"
    if key == "hidden_act":
        return "either" if wrong == "null" else "refuse"
    if key == "architectures":
        return "refuse"
    if key == "rope_scaling":  # null, [], 0 mean none; a dict without rope_type the default rotary
        return "either" if wrong in ("null", "empty-list", "zero", "dict") else "refuse"
    return "refuse" if wrong in ("deep", "digits") else "either"


def generate(seed: int, counts: dict[str, int]) -> list[Case]:
    """`counts[group]` cases for each group of FIXED / RANDOM, the same for the same seed: the fixed
    cases each defect called for first, then random mutations."""
    rng = random.Random(seed)
    cases: list[Case] = []
    for group, count in counts.items():
        fixed = FIXED[group]()
        made = [*fixed, *(RANDOM[group](rng) for _ in range(max(0, count - len(fixed))))][:count]
        cases += [Case(**{**c.__dict__, "index": len(cases) + i}) for i, c in enumerate(made)]
    return cases


def _fixed_safetensors(parser="safetensors", base="llama", target="model.safetensors") -> list[Case]:
    c = lambda mutation, *params, expect="refuse": Case(parser, base, target, mutation, params, expect)  # noqa: E731
    return [c("header_length", v) for v in (0, 1, 2**63, 2**64 - 1, "size", "size-7", "minus1", "plus1")] + [
        c("header_not_object", "list"), c("header_not_object", "deep"), c("entry_deep"),
        c("overlap"), c("gap"), c("trailing_byte"), c("truncate", 0.5), c("truncate", 0.01),
        c("metadata_value", "int"), c("extra_entry"),
        Case(parser, base, target, "swap_offsets", (), "either", build=True),
        Case(parser, base, target, "retype", ("model.layers.0.self_attn.k_proj.weight", "F16"), "either", build=True),
    ]


def _random_safetensors(rng: random.Random, parser="safetensors", base="llama", target="model.safetensors") -> Case:
    kind = rng.choice(["truncate", "flip_header", "flip_header", "entry_value", "entry_value", "header_length_random"])
    if kind == "truncate":
        return Case(parser, base, target, kind, (round(rng.random(), 4),), "refuse")
    if kind == "flip_header":
        return Case(parser, base, target, kind, (round(rng.random(), 4), rng.randrange(1, 256)))
    if kind == "header_length_random":
        return Case(parser, base, target, "header_length", (rng.choice([2**k for k in range(3, 64)]),), "refuse")
    field_, wrong = rng.choice(["dtype", "shape", "data_offsets"]), rng.choice(sorted(WRONG))
    return Case(parser, base, target, kind, (round(rng.random(), 4), field_, wrong), "refuse")


def _fixed_json(parser: str, base: str, target: str, keys: tuple[str, ...]) -> list[Case]:
    c = lambda mutation, *params, expect="refuse": Case(parser, base, target, mutation, params, expect)  # noqa: E731
    return [c("json_deep"), c("json_value", keys[0], "deep"), c("json_value", keys[0], "digits"),
            c("json_not_object", "list"), c("json_truncate", 0.5), c("json_empty")]


def _random_json(rng: random.Random, parser: str, base: str, target: str, keys: tuple[str, ...],
                 expectation=lambda key, wrong: "refuse" if wrong in ("deep", "digits") else "either") -> Case:
    kind = rng.choice(["json_truncate", "json_flip", "json_value", "json_value", "json_value"])
    if kind == "json_truncate":
        return Case(parser, base, target, kind, (round(rng.random(), 4),))
    if kind == "json_flip":
        return Case(parser, base, target, kind, (round(rng.random(), 4), rng.randrange(1, 256)))
    key, wrong = rng.choice(keys), rng.choice(sorted(WRONG))
    expect = expectation(key, wrong)
    return Case(parser, base, target, kind, (key, wrong), expect, build=expect == "either" and key in BUILT_KEYS)


# Keys whose accepted values also get a real build: a model that runs, with finite logits.
BUILT_KEYS = (*SCALE_KEYS, *TOKEN_KEYS, "max_position_embeddings", "rope_scaling", "fan_in_fan_out", "use_rslora",
              "temperature")
CONFIG_KEYS = (*COUNT_KEYS, *TOKEN_KEYS, *SCALE_KEYS, "hidden_act", "architectures", "rope_scaling",
               "tie_word_embeddings", "torch_dtype", "an_unknown_key")
INDEX_KEYS = ("weight_map", "metadata", "weight_map/model.norm.weight", "weight_map/model.embed_tokens.weight")
GENERATION_KEYS = ("bos_token_id", "eos_token_id", "do_sample", "max_length", "temperature")
ADAPTER_KEYS = ("r", "lora_alpha", "target_modules", "peft_type", "use_rslora", "fan_in_fan_out", "bias",
                "modules_to_save", "use_dora", "an_unknown_key")


def adapter_expectation(key: str, wrong: str) -> str:
    """Whether adapter_config.json's `key` set to WRONG[`wrong`] is certainly refused: r and lora_alpha
    must be positive numbers (a huge one is odd, not wrong), peft_type LORA (or absent)."""
    never = {"string", "numeric-string", "dict", "list", "empty-list", "nan", "1e309", "deep", "negative", "zero",
             "true", "digits"}
    if key in ("r", "lora_alpha"):
        return "refuse" if wrong in never | {"null"} else "either"
    if key == "peft_type":
        return "either" if wrong == "null" else "refuse"
    return "refuse" if wrong in ("deep", "digits") else "either"


def _fixed_config() -> list[Case]:
    c = lambda *params, expect="refuse": Case("config", "llama", "config.json", "json_value", params, expect)  # noqa
    return [*_fixed_json("config", "llama", "config.json", CONFIG_KEYS),
            c("rms_norm_eps", "nan"), c("rms_norm_eps", "1e309"), c("num_hidden_layers", "big"),
            c("num_key_value_heads", "zero"), c("rope_scaling", "string"), c("vocab_size", "huge"),
            c("rope_theta", "negative"), c("max_position_embeddings", "zero"), c("architectures", "true"),
            c("head_dim", "big"), c("max_position_embeddings", "huge"),
            c("rope_theta", "null", expect="either"),
            Case("config", "llama", "config.json", "json_value", ("max_position_embeddings", "big"), "either", True)]


def _fixed_gguf(base="gguf") -> list[Case]:
    c = lambda mutation, *params, expect="refuse": Case("gguf", base, "", mutation, params, expect)  # noqa: E731
    return [c("gguf_field", "tensor_count", 2**60), c("gguf_field", "kv_count", 2**60),
            c("gguf_field", "key_length", 2**40), c("gguf_field", "string_length", 2**40),
            c("gguf_field", "string_array_count", 2**40),
            c("gguf_field", "number_array_count", 2**40), c("gguf_field", "n_dims", 1000),
            c("gguf_field", "offset", 2**40), c("gguf_field", "value_type", 99), c("gguf_field", "tensor_type", 99),
            c("gguf_overlap"), c("gguf_duplicate_tensor"), c("gguf_duplicate_key"),
            c("gguf_value", "llama.block_count", "u32", 10**9), c("gguf_value", "llama.block_count", "u32", 3),
            c("gguf_value", "llama.attention.key_length", "u32", 10**9),
            c("gguf_value", "llama.attention.layer_norm_rms_epsilon", "f32", float("nan")),
            c("gguf_value", "llama.attention.layer_norm_rms_epsilon", "f32", float("inf")),
            c("gguf_value", "llama.attention.layer_norm_rms_epsilon", "f32", -1e-5),
            c("gguf_value", "general.architecture", "arr_str", ["llama"]),
            c("gguf_value", "tokenizer.ggml.bos_token_id", "u32", 10**6),
            c("gguf_rename", "blk.7.attn_q.weight"), c("gguf_truncate", 0.5), c("gguf_truncate", 0.001),
            Case("gguf", base, "", "gguf_value", ("llama.context_length", "u32", 10**9), "either", build=True),
            Case("gguf", base, "", "gguf_field", ("tensor_type", 1, 7), "either", build=True)]  # attn_k F32 -> F16


# Metadata keys the build reads, and replacements of each GGUF type.
GGUF_KEYS = ("general.architecture", "llama.block_count", "llama.context_length", "llama.embedding_length",
             "llama.feed_forward_length", "llama.attention.head_count", "llama.attention.head_count_kv",
             "llama.attention.layer_norm_rms_epsilon", "llama.rope.freq_base", "llama.rope.dimension_count",
             "llama.attention.key_length", "tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens",
             "tokenizer.ggml.token_type", "tokenizer.ggml.merges", "tokenizer.ggml.scores",
             "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id", "tokenizer.chat_template",
             "general.alignment")
GGUF_VALUES = (("str", "x"), ("i32", -1), ("u32", 0), ("u32", 1), ("u32", 10**9), ("u64", 2**63), ("f32", float("nan")),
               ("f32", float("inf")), ("f32", -1.0), ("f32", 0.5), ("bool", True), ("arr_i32", [1, 2]),
               ("arr_str", ["a", "b c"]), ("arr_empty", []), ("arr_f32", [float("nan")]))


def gguf_expectation(key: str, kind: str, value: Any) -> str:
    """Whether the metadata `key` set to `value` of GGUF type `kind` is certainly refused."""
    number = kind in ("i32", "u32", "u64", "f32")
    if key == "general.architecture" or key.startswith("tokenizer.ggml.") and key.endswith(("model", "pre")) or \
            key == "tokenizer.chat_template":
        return "either" if kind == "str" and key != "general.architecture" else "refuse"
    if key in ("llama.rope.freq_base", "llama.attention.layer_norm_rms_epsilon"):
        return "either" if number and math.isfinite(value) and value > 0 else "refuse"
    if key.startswith("llama."):  # counts and sizes: a changed one disagrees with the tensors' shapes
        unchecked = key in ("llama.context_length", "llama.rope.dimension_count")  # llama's head_dim: key_length
        return "either" if unchecked and kind in ("u32", "i32", "u64") and value >= 1 else "refuse"
    if key.endswith("_token_id"):
        return "either" if kind in ("u32",) and 0 <= value < 10 else "refuse"
    if key == "general.alignment":
        return "either" if kind == "u32" and value == 1 else "refuse"
    return "refuse" if kind not in ("arr_str", "arr_i32", "arr_empty", "arr_f32") else "either"


def _random_gguf(rng: random.Random, base: str = "gguf") -> Case:
    kind = rng.choice(["gguf_truncate", "gguf_flip", "gguf_flip", "gguf_field_random", "gguf_value", "gguf_value",
                       "gguf_value"])
    if kind == "gguf_truncate":
        return Case("gguf", base, "", kind, (round(rng.random(), 4),))
    if kind == "gguf_flip":  # within the header
        return Case("gguf", base, "", kind, (round(rng.random(), 4), rng.randrange(1, 256)))
    if kind == "gguf_field_random":
        values = [0, 1, 2, 3, 7, 2**31, 2**32 - 1, 2**40, 2**63, 2**64 - 1, "plus1", "minus1"]
        return Case("gguf", base, "", kind, (round(rng.random(), 4), rng.choice(values)))
    key = rng.choice(GGUF_KEYS)
    value_kind, value = rng.choice(GGUF_VALUES)
    build = key.startswith("tokenizer.")  # the tokenizer is written by a real build only
    return Case("gguf", base, "", kind, (key, value_kind, value), gguf_expectation(key, value_kind, value), build)


def _fixed_lora() -> list[Case]:
    def c(target: str, mutation: str, *params: Any) -> Case:
        return Case("lora", "adapter", target, mutation, params, "refuse")

    return [*_fixed_json("lora", "adapter", "adapter_config.json", ADAPTER_KEYS),
            c("adapter_config.json", "json_value", "lora_alpha", "nan"),
            c("adapter_config.json", "json_value", "lora_alpha", "1e309"),
            c("adapter_model.safetensors", "lora_rank", 3), c("adapter_model.safetensors", "lora_rank", 0),
            c("adapter_model.safetensors", "overlap"), c("adapter_model.safetensors", "truncate", 0.5)]


def _random_lora(rng: random.Random) -> Case:
    if rng.random() < 0.5:
        return _random_json(rng, "lora", "adapter", "adapter_config.json", ADAPTER_KEYS, adapter_expectation)
    return _random_safetensors(rng, "lora", "adapter", "adapter_model.safetensors")


YAML_KEYS = ("model", "precision", "execution_provider", "block_size", "accuracy_level", "context_length", "search",
             "float_layers", "bits", "overwrite", "io_dtype", "search/temperature", "search/top_k", "an_unknown_key")
YAML_WRONG = {"string": "x", "list": "[1, 2]", "dict": "{a: 1}", "null": "null", "negative": "-1", "nan": ".nan",
              "1e309": "1e309", "huge": "99999999999999999999", "true": "true", "deep": "[" * DEEP + "]" * DEEP,
              "digits": "1" * 5000,
              "alias-loop": "&a [*a]", "tab": "\t"}


def yaml_expectation(key: str, wrong: str) -> str:
    if wrong in ("deep", "alias-loop", "digits") or key == "an_unknown_key" and wrong != "tab":
        return "refuse"
    if key == "search/temperature":  # a number, finite: genai_config.json is JSON, which has no NaN
        return "refuse" if wrong in ("string", "list", "dict", "nan", "1e309", "true") else "either"
    return "either"


def _fixed_yaml() -> list[Case]:
    c = lambda *params, expect="refuse": Case("yaml", "yaml", "", "yaml_value", params, expect)  # noqa: E731
    return [c("search", "deep"), c("model", "deep"), c("search", "alias-loop"), c("search/temperature", "nan"),
            c("block_size", "digits"),
            c("an_unknown_key", "string"), Case("yaml", "yaml", "", "yaml_truncate", (0.5,))]


def _random_yaml(rng: random.Random) -> Case:
    kind = rng.choice(["yaml_truncate", "yaml_flip", "yaml_value", "yaml_value", "yaml_value"])
    if kind == "yaml_truncate":
        return Case("yaml", "yaml", "", kind, (round(rng.random(), 4),))
    if kind == "yaml_flip":
        return Case("yaml", "yaml", "", kind, (round(rng.random(), 4), rng.randrange(1, 256)))
    key, wrong = rng.choice(YAML_KEYS), rng.choice(sorted(YAML_WRONG))
    return Case("yaml", "yaml", "", kind, (key, wrong), yaml_expectation(key, wrong), build=key.startswith("search"))


FIXED = {
    "safetensors": _fixed_safetensors,
    "index": lambda: _fixed_json("index", "sharded", "model.safetensors.index.json", INDEX_KEYS) + [
        Case("index", "sharded", "model.safetensors.index.json", "json_value", ("weight_map/model.norm.weight", v),
             expect="refuse") for v in ("../llama/model.safetensors", "/etc/hostname", "null", "missing.safetensors")],
    "config": _fixed_config,
    "generation": lambda: _fixed_json("generation", "llama", "generation_config.json", GENERATION_KEYS),
    "gguf": _fixed_gguf,
    "gguf_spm": lambda: [
        Case("gguf", "gguf_spm", "", "gguf_value", ("tokenizer.ggml.scores", "arr_f32", [float("nan")]), "refuse"),
        Case("gguf", "gguf_spm", "", "gguf_truncate", (0.9,))],
    "lora": _fixed_lora,
    "yaml": _fixed_yaml,
}
RANDOM = {
    "safetensors": _random_safetensors,
    "index": lambda rng: _random_json(rng, "index", "sharded", "model.safetensors.index.json", INDEX_KEYS),
    "config": lambda rng: _random_json(rng, "config", "llama", "config.json", CONFIG_KEYS, config_expectation),
    "generation": lambda rng: _random_json(rng, "generation", "llama", "generation_config.json", GENERATION_KEYS),
    "gguf": _random_gguf,
    "gguf_spm": lambda rng: _random_gguf(rng, "gguf_spm"),
    "lora": _random_lora,
    "yaml": _random_yaml,
}
# A CI-sized run: a few hundred cases.
CI_COUNTS = {"safetensors": 50, "index": 25, "config": 70, "generation": 15, "gguf": 80, "gguf_spm": 20, "lora": 40,
             "yaml": 35}


# --------------------------------------------------------------------------------------------
# Mutations: (file bytes, params) -> file bytes


def _json_text(value: Any) -> str:
    """JSON text of `value`, where a string "RAW:..." is written as the raw text after the colon."""
    raws: list[str] = []

    def mark(v: Any) -> Any:
        if isinstance(v, str) and v.startswith("RAW:"):
            raws.append(v[4:])
            return f"\u0000{len(raws) - 1}\u0000"
        if isinstance(v, dict):
            return {k: mark(x) for k, x in v.items()}
        if isinstance(v, list):
            return [mark(x) for x in v]
        return v

    text = json.dumps(mark(value))
    for i, raw in enumerate(raws):
        text = text.replace(json.dumps(f"\u0000{i}\u0000"), raw)
    return text


def _set_path(obj: dict, path: str, value: Any) -> dict:
    """`obj` with the value at `path` ("a/b": obj["a"]["b"]) replaced (or added)."""
    obj = json.loads(json.dumps(obj))
    *parents, last = path.split("/")
    node = obj
    for p in parents:
        node = node[p]
    node[last] = value
    return obj


def json_value(data: bytes, key: str, wrong: str) -> bytes:
    value = WRONG.get(wrong, wrong)  # a name of WRONG, or the value itself (an index's file name)
    return _json_text(_set_path(json.loads(data), key, value)).encode()


def _fraction_cut(data: bytes, fraction: float) -> bytes:
    return data[: int(len(data) * fraction)]


def _flip(data: bytes, start: int, stop: int, fraction: float, xor: int) -> bytes:
    out = bytearray(data)
    out[start + int((stop - start) * fraction) % max(1, stop - start)] ^= xor
    return bytes(out)


def _safetensors_parts(data: bytes) -> tuple[dict, bytes]:
    (n,) = struct.unpack_from("<Q", data)
    return json.loads(data[8:8 + n]), data[8 + n:]


def _safetensors_join(header: Any, body: bytes, text: str | None = None) -> bytes:
    raw = (text if text is not None else _json_text(header)).encode()
    return struct.pack("<Q", len(raw)) + raw + body


def _tensor_names(header: dict) -> list[str]:
    return sorted(n for n in header if n != "__metadata__")


def st_header_length(data: bytes, value: Any) -> bytes:
    (n,) = struct.unpack_from("<Q", data)
    value = {"size": len(data), "size-7": len(data) - 7, "minus1": n - 1, "plus1": n + 1}.get(value, value)
    return struct.pack("<Q", value) + data[8:]


def st_entry_value(data: bytes, fraction: float, field_: str, wrong: str) -> bytes:
    header, body = _safetensors_parts(data)
    names = _tensor_names(header)
    name = names[min(int(fraction * len(names)), len(names) - 1)]
    header[name][field_] = WRONG[wrong]
    return _safetensors_join(header, body)


def st_offsets(data: bytes, how: str) -> bytes:
    """Tensor byte ranges that overlap, leave a gap, or are swapped between two equal-sized tensors."""
    header, body = _safetensors_parts(data)
    names = sorted(_tensor_names(header), key=lambda n: header[n]["data_offsets"])
    a, b = names[-2], names[-1]
    if how == "overlap":  # the last tensor's range moved onto the one before's start
        begin, end = header[b]["data_offsets"]
        start = header[a]["data_offsets"][0]
        header[b]["data_offsets"] = [start, start + end - begin]
        body = body[: max(header[n]["data_offsets"][1] for n in names)]
    elif how == "gap":  # 8 unused bytes before the last tensor
        begin = header[b]["data_offsets"][0]
        header[b]["data_offsets"] = [x + 8 for x in header[b]["data_offsets"]]
        body = body[:begin] + b"\0" * 8 + body[begin:]
    elif how == "swap_offsets":
        sizes: dict[tuple, list[str]] = {}
        for n in names:
            sizes.setdefault((header[n]["dtype"], tuple(header[n]["shape"])), []).append(n)
        a, b = next(v for v in sizes.values() if len(v) > 1)[:2]
        header[a]["data_offsets"], header[b]["data_offsets"] = header[b]["data_offsets"], header[a]["data_offsets"]
    return _safetensors_join(header, body)


def st_structure(data: bytes, how: str, *params: Any) -> bytes:
    header, body = _safetensors_parts(data)
    if how == "header_not_object":
        return _safetensors_join(None, body, "[1, 2]" if params[0] == "list" else "[" * DEEP + "]" * DEEP)
    if how == "entry_deep":
        header[_tensor_names(header)[0]] = WRONG["deep"]
    elif how == "metadata_value":
        header["__metadata__"] = {"format": 1}
    elif how == "extra_entry":  # a zero-sized tensor no architecture reads
        end = max(header[n]["data_offsets"][1] for n in _tensor_names(header))
        header["model.extra.weight"] = {"dtype": "F32", "shape": [0], "data_offsets": [end, end]}
    elif how == "trailing_byte":
        body += b"\0"
    return _safetensors_join(header, body)


def st_retype(data: bytes, name: str, dtype: str) -> bytes:
    """Tensor `name` (BF16) stored as F16 instead, values converted: a valid file of mixed dtypes."""
    import ml_dtypes

    header, body = _safetensors_parts(data)
    begin, end = header[name]["data_offsets"]
    values = np.frombuffer(body[begin:end], ml_dtypes.bfloat16).astype({"F16": np.float16}[dtype])
    header[name]["dtype"] = dtype
    return _safetensors_join(header, body[:begin] + values.tobytes() + body[end:])


def lora_rank(data: bytes, rank: int) -> bytes:
    """The first lora_B's rank changed to `rank` (its rows cut or padded with zeros); lora_A stays, or
    for rank 0 both become empty."""
    from safetensors.numpy import load, save

    tensors = load(data)
    first_b = sorted(n for n in tensors if "lora_B" in n)[0]
    b = tensors[first_b]
    tensors[first_b] = np.zeros((b.shape[0], rank), np.float32) if rank else np.zeros((b.shape[0], 0), np.float32)
    if rank == 0:
        first_a = first_b.replace("lora_B", "lora_A")
        tensors[first_a] = np.zeros((0, tensors[first_a].shape[1]), np.float32)
    return save(tensors)


# ---- GGUF: its fields' positions, and a writer for changed metadata

GGUF_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
GGUF_KIND = {"u32": 4, "i32": 5, "f32": 6, "bool": 7, "str": 8, "u64": 10}


@dataclass
class GGUFLayout:
    """A GGUF file taken apart: its key/values and tensor infos as encoded bytes, its data, and
    where each count, length, type and offset is (for field mutations)."""

    version: int
    kvs: list[tuple[str, int, bytes]]  # key, value type, the value's bytes
    infos: list[tuple[str, bytes]]  # name, the info's bytes after the name
    data: bytes
    alignment: int
    fields: dict[str, list[tuple[int, str]]] = field(default_factory=dict)  # kind -> [(byte position, format)]

    @classmethod
    def parse(cls, raw: bytes) -> GGUFLayout:
        pos = 24
        version, n_tensors, n_kv = struct.unpack_from("<IQQ", raw, 4)
        fields: dict[str, list[tuple[int, str]]] = {"tensor_count": [(8, "Q")], "kv_count": [(16, "Q")]}
        add = lambda kind, at, fmt: fields.setdefault(kind, []).append((at, fmt))  # noqa: E731

        def skip(at: int, kind: int) -> int:
            if kind in GGUF_SCALARS:
                return at + struct.calcsize(GGUF_SCALARS[kind])
            if kind == 8:
                add("string_length", at, "Q")
                return at + 8 + struct.unpack_from("<Q", raw, at)[0]
            item, count = struct.unpack_from("<IQ", raw, at)
            add("array_type", at, "I")
            add("string_array_count" if item == 8 else "number_array_count", at + 4, "Q")
            at += 12
            for _ in range(count):
                at = skip(at, item)
            return at

        kvs = []
        alignment = 32
        for _ in range(n_kv):
            add("key_length", pos, "Q")
            (n,) = struct.unpack_from("<Q", raw, pos)
            key = raw[pos + 8: pos + 8 + n].decode()
            pos += 8 + n
            (kind,) = struct.unpack_from("<I", raw, pos)
            add("value_type", pos, "I")
            end = skip(pos + 4, kind)
            kvs.append((key, kind, raw[pos + 4:end]))
            if key == "general.alignment":
                (alignment,) = struct.unpack_from("<I", raw, pos + 4)
            pos = end
        infos = []
        for _ in range(n_tensors):
            add("name_length", pos, "Q")
            (n,) = struct.unpack_from("<Q", raw, pos)
            name = raw[pos + 8: pos + 8 + n].decode()
            start = pos = pos + 8 + n
            add("n_dims", pos, "I")
            (dims,) = struct.unpack_from("<I", raw, pos)
            for i in range(dims):
                add("dim", pos + 4 + 8 * i, "Q")
            pos += 4 + 8 * dims
            add("tensor_type", pos, "I")
            add("offset", pos + 4, "Q")
            pos += 12
            infos.append((name, raw[start:pos]))
        data_start = -(-pos // alignment) * alignment
        return cls(version, kvs, infos, raw[data_start:], alignment, fields)

    def header_end(self) -> int:
        return len(self.encode()) - len(self.data)

    def encode(self) -> bytes:
        out = bytearray(b"GGUF" + struct.pack("<IQQ", self.version, len(self.infos), len(self.kvs)))
        for key, kind, value in self.kvs:
            out += struct.pack("<Q", len(key.encode())) + key.encode() + struct.pack("<I", kind) + value
        for name, info in self.infos:
            out += struct.pack("<Q", len(name.encode())) + name.encode() + info
        out += b"\0" * (-len(out) % self.alignment)
        return bytes(out + self.data)


def gguf_encode(kind: str, value: Any) -> tuple[int, bytes]:
    """(GGUF value type, bytes) of `value` as `kind` (GGUF_KIND's, or arr_<kind>)."""

    def one(k: str, v: Any) -> bytes:
        if k == "str":
            return struct.pack("<Q", len(v.encode())) + v.encode()
        return struct.pack("<" + GGUF_SCALARS[GGUF_KIND[k]], v)

    if kind.startswith("arr_"):
        item = {"arr_str": "str", "arr_i32": "i32", "arr_f32": "f32", "arr_empty": "i32"}[kind]
        return 9, struct.pack("<IQ", GGUF_KIND[item], len(value)) + b"".join(one(item, v) for v in value)
    return GGUF_KIND[kind], one(kind, value)


def gguf_value(data: bytes, key: str, kind: str, value: Any) -> bytes:
    layout = GGUFLayout.parse(data)
    kind_id, encoded = gguf_encode(kind, value)
    layout.kvs = [(k, kind_id, encoded) if k == key else (k, t, v) for k, t, v in layout.kvs]
    if key not in {k for k, _, _ in layout.kvs}:
        layout.kvs.append((key, kind_id, encoded))
    return layout.encode()


def gguf_field(data: bytes, kind: str, value: Any, which: int = 0) -> bytes:
    layout = GGUFLayout.parse(data)
    at, fmt = layout.fields[kind][which]
    return _put(data, at, fmt, value)


def gguf_field_random(data: bytes, fraction: float, value: Any) -> bytes:
    layout = GGUFLayout.parse(data)
    every = sorted(f for fields in layout.fields.values() for f in fields)
    at, fmt = every[min(int(fraction * len(every)), len(every) - 1)]
    return _put(data, at, fmt, value)


def _put(data: bytes, at: int, fmt: str, value: Any) -> bytes:
    (old,) = struct.unpack_from("<" + fmt, data, at)
    limit = 2 ** (8 * struct.calcsize(fmt))
    value = {"plus1": old + 1, "minus1": old - 1}.get(value, value) % limit
    out = bytearray(data)
    struct.pack_into("<" + fmt, out, at, value)
    return bytes(out)


def gguf_tensors(data: bytes, how: str, *params: Any) -> bytes:
    layout = GGUFLayout.parse(data)
    if how == "gguf_overlap":  # the second tensor's offset set to the first's
        (offset,) = struct.unpack_from("<Q", layout.infos[0][1], len(layout.infos[0][1]) - 8)
        name, info = layout.infos[1]
        layout.infos[1] = (name, info[:-8] + struct.pack("<Q", offset))
    elif how == "gguf_duplicate_tensor":
        layout.infos[1] = (layout.infos[0][0], layout.infos[1][1])
    elif how == "gguf_duplicate_key":
        layout.kvs.append(layout.kvs[-1])
    elif how == "gguf_rename":
        layout.infos[-1] = (params[0], layout.infos[-1][1])
    return layout.encode()


def gguf_flip(data: bytes, fraction: float, xor: int) -> bytes:
    return _flip(data, 0, GGUFLayout.parse(data).header_end(), fraction, xor)


# ---- YAML


def yaml_value(text: bytes, key: str, wrong: str) -> bytes:
    value = YAML_WRONG[wrong]
    lines = text.decode().splitlines()
    if key.startswith("search/"):
        sub = key.split("/")[1]
        lines = [line for line in lines if not line.startswith("search:")]
        lines.append(f"search: {{{sub}: {value}}}")
    else:
        lines = [line for line in lines if not line.startswith(f"{key}:")] + [f"{key}: {value}"]
    return ("\n".join(lines) + "\n").encode()


MUTATIONS = {
    "truncate": _fraction_cut, "json_truncate": _fraction_cut, "yaml_truncate": _fraction_cut,
    "gguf_truncate": _fraction_cut,
    "flip_header": lambda d, f, x: _flip(d, 0, 8 + struct.unpack_from("<Q", d)[0], f, x),
    "json_flip": lambda d, f, x: _flip(d, 0, len(d), f, x), "yaml_flip": lambda d, f, x: _flip(d, 0, len(d), f, x),
    "header_length": st_header_length, "entry_value": st_entry_value,
    "overlap": lambda d: st_offsets(d, "overlap"), "gap": lambda d: st_offsets(d, "gap"),
    "swap_offsets": lambda d: st_offsets(d, "swap_offsets"),
    "header_not_object": lambda d, how: st_structure(d, "header_not_object", how),
    **{k: (lambda how: lambda d, *p: st_structure(d, how, *p))(k)
       for k in ("entry_deep", "metadata_value", "extra_entry", "trailing_byte")},
    "json_value": json_value, "json_deep": lambda d: ("[" * DEEP + "]" * DEEP).encode(),
    "json_not_object": lambda d, how: b"[1, 2]", "json_empty": lambda d: b"",
    "lora_rank": lora_rank, "retype": st_retype,
    "gguf_value": gguf_value, "gguf_field": gguf_field, "gguf_field_random": gguf_field_random, "gguf_flip": gguf_flip,
    **{k: (lambda how: lambda d, *p: gguf_tensors(d, how, *p))(k)
       for k in ("gguf_overlap", "gguf_duplicate_tensor", "gguf_duplicate_key", "gguf_rename")},
    "yaml_value": yaml_value,
}


# --------------------------------------------------------------------------------------------
# Running a case


@dataclass
class Outcome:
    case: Case
    rc: int | None
    stderr: str
    seconds: float
    problem: str | None  # None: the build did what the case allows
    input: Path | None = None  # the mutated input


def materialize(case: Case, bases: dict[str, Path], work: Path) -> tuple[Path, list[str]]:
    """Copies the case's base into `work`, mutates it; returns (the input, the CLI's arguments for
    a dry run of it)."""
    base = bases[case.base]
    work.mkdir(parents=True, exist_ok=True)
    copy = work / base.name
    if base.is_dir():
        shutil.copytree(base, copy)
    else:
        shutil.copyfile(base, copy)
    target = copy / case.target if case.target else copy
    target.write_bytes(MUTATIONS[case.mutation](target.read_bytes(), *case.params))
    if case.parser == "lora":
        return copy, ["-m", str(bases["llama"]), "--adapter", str(copy)]
    if case.parser == "yaml":
        return copy, ["--config", str(copy)]
    return copy, ["-m", str(copy)]


@contextlib.contextmanager
def bounded(seconds: float, extra_bytes: int):
    """Raises TimeoutError after `seconds`, and MemoryError for an allocation that would take the
    process's address space `extra_bytes` past what it is now (Linux)."""

    def expired(signum, frame):
        raise TimeoutError(f"still running after {seconds:.0f} s")

    with open("/proc/self/statm") as f:
        now = int(f.read().split()[0]) * resource.getpagesize()
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = now + extra_bytes if hard == resource.RLIM_INFINITY else min(hard, now + extra_bytes)
    previous = signal.signal(signal.SIGALRM, expired)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def cli(argv: list[str], seconds: float = SECONDS, extra_bytes: int = MEMORY) -> tuple[int | None, str, str | None]:
    """(exit code, stderr, a problem) of builder's CLI run in-process within the bounds."""
    from builder.cli import main

    err, out = io.StringIO(), io.StringIO()
    try:
        with bounded(seconds, extra_bytes), contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            rc = main(argv)
    except BaseException as e:  # anything escaping main is the defect being looked for
        if isinstance(e, KeyboardInterrupt):
            raise
        return None, err.getvalue(), f"raised {type(e).__name__}: {str(e)[:300]}"
    return rc, err.getvalue(), None


def one_line_error(rc: int | None, stderr: str) -> str | None:
    lines = stderr.splitlines()
    if rc == 2 and len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in stderr:
        return None
    return f"exit {rc} with stderr {stderr[-600:]!r}"


def run_case(case: Case, bases: dict[str, Path], work: Path) -> Outcome:
    """Runs one case (see the module's docstring); `problem` says what went wrong, if anything."""
    started = time.perf_counter()
    try:
        path, argv = materialize(case, bases, work)
    except Exception as e:  # a mutation that does not apply to this base: a bug in the case, not in builder
        return Outcome(case, None, "", 0.0, f"the mutation failed: {type(e).__name__}: {e}")
    rc, stderr, problem = cli([*argv, "--dry-run", "-q"])
    seconds = time.perf_counter() - started
    outcome = Outcome(case, rc, stderr, seconds, problem, path)
    if problem is None and rc == 0:
        if case.expect == "refuse":
            outcome.problem = "accepted an input that is certainly wrong"
        else:
            outcome.problem = agrees_with_reference_reader(case, path)
        if outcome.problem is None and case.build:
            outcome.problem = builds_a_working_model(argv, work / "out", finite=case.mutation not in RAW_BYTES)
    elif problem is None:
        outcome.problem = one_line_error(rc, stderr)
    return outcome


def agrees_with_reference_reader(case: Case, path: Path) -> str | None:
    """For an accepted mutation of a binary format: the format's own reader accepts the file too
    and sees the same tensors builder does (a file builder reads otherwise than the library would
    is a silently different model)."""
    file = path / case.target if case.target else path
    if file.suffix == ".safetensors":
        from safetensors import safe_open

        from builder.inputs.safetensors import read_header

        ours = {n: (str(t.dtype), t.shape) for n, t in read_header(file).items()}
        try:
            with safe_open(file, "np") as f:
                theirs = {n: (f.get_slice(n).get_dtype(), tuple(f.get_slice(n).get_shape())) for n in f.keys()}
        except Exception as e:
            return f"builder read a safetensors file the library refuses: {e}"
        names = {"F32": "float32", "BF16": "bfloat16", "F16": "float16", "I64": "int64", "I32": "int32",
                 "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool", "F64": "float64",
                 "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2"}
        theirs = {n: (names.get(d, d), s) for n, (d, s) in theirs.items()}
        return None if ours == theirs else f"builder read {ours} where the library reads {theirs}"
    if file.suffix == ".gguf":
        import gguf

        from builder.inputs.gguf.header import read

        ours = read(file)
        try:
            reader = gguf.GGUFReader(file)
        except Exception as e:
            return f"builder read a GGUF file gguf's reader refuses: {type(e).__name__}: {e}"
        theirs = [(t.name, t.tensor_type.name, tuple(int(d) for d in reversed(t.shape)), int(t.data_offset),
                   int(t.n_bytes)) for t in reader.tensors]
        mine = [(t.name, t.kind, t.shape, t.offset, t.nbytes) for t in ours.tensors]
        if mine != theirs:
            return f"builder's tensors {mine[:3]}... differ from gguf's {theirs[:3]}..."
        metadata = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
        if json.dumps(metadata, sort_keys=True) != json.dumps(ours.metadata, sort_keys=True):
            return "builder's metadata differs from gguf's"
    return None


# Mutations that can leave a valid file whose weights are other bytes (a type id, a size or an
# offset changed, tensors swapped): its model must run, but its values are whatever the file holds.
RAW_BYTES = ("flip_header", "swap_offsets", "retype", "gguf_flip", "gguf_field", "gguf_field_random", "gguf_truncate",
             "truncate")


def builds_a_working_model(argv: list[str], out: Path, finite: bool = True) -> str | None:
    """A real (fp32) build of an accepted input is a model ONNX Runtime runs (to finite logits, if
    `finite`), with a genai_config.json that is strict JSON and a tokenizer.json `tokenizers` loads."""
    precision = [] if "--config" in argv else ["-p", "fp32"]
    rc, stderr, problem = cli([*argv, "-q", "-o", str(out), *precision], seconds=60)
    if problem is not None:
        return problem
    if rc != 0:  # refused later than the dry run could: still one line
        return one_line_error(rc, stderr)
    from helpers import OnnxDecoder

    try:
        genai = json.loads((out / "genai_config.json").read_text(), parse_constant=_no_constant)
    except ValueError as e:
        return f"genai_config.json is not strict JSON: {e}"
    context = genai["model"]["context_length"]
    prompt = [1, 5, 9][:context]  # a prefill, then a decode step where the context has room
    try:
        decoder = OnnxDecoder(out)
        logits, present = decoder.run(prompt, None, len(prompt))
        if context > len(prompt):
            logits, _ = decoder.run([7], present, len(prompt) + 1)
    except Exception as e:
        return f"ONNX Runtime cannot run the built model: {type(e).__name__}: {e}"
    if finite and not np.isfinite(logits).all():
        return "the built model's logits are not finite"
    if (out / "tokenizer.json").is_file():
        from tokenizers import Tokenizer

        try:
            Tokenizer.from_file(str(out / "tokenizer.json"))
        except Exception as e:
            return f"the written tokenizer.json does not load: {e}"
    return None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")
