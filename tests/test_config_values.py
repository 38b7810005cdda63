"""config.json (and generation_config.json, tokenizer) values that are wrong end in one line naming
the key and exit 2, before anything is written; the lenient forms transformers accepts still build."""

import json
import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from builder.cli import main

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "tiny-llama"
NAN, INF = float("nan"), float("inf")
GEMMA2 = {"architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2"}
GEMMA3 = {"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text"}


@pytest.fixture
def src(tmp_path) -> Path:
    """A copy of examples/tiny-llama (2 layers, 4 heads over 2 KV heads, 259 tokens): no torch needed."""
    return shutil.copytree(EXAMPLE, tmp_path / "src")


DELETE = object()  # a change's value that removes the key


def edit_json(path: Path, change: dict) -> None:
    """Sets the keys of `change` in the JSON object in `path` (removes those set to DELETE)."""
    data = {**json.loads(path.read_text()), **change}
    path.write_text(json.dumps({k: v for k, v in data.items() if v is not DELETE}))


def run(capsys, *argv) -> tuple[int, str]:
    rc = main([str(a) for a in argv])
    return rc, capsys.readouterr().err.strip()


def assert_one_line(rc: int, err: str, key: str) -> None:
    assert rc == 2, err
    assert len(err.splitlines()) == 1 and err.startswith("error: "), err
    assert key in err, err


# (config.json change, the key the one line must name). Each ended in a traceback or built with
# exit 0 before these checks, except where the comment says it already ended in one line.
BAD_CONFIG = {
    # wrong JSON types
    "rope_scaling-string": ({"rope_scaling": "linear"}, "rope_scaling"),
    "rope_scaling-list": ({"rope_scaling": ["linear", 2.0]}, "rope_scaling"),
    "rope_parameters-string": ({"rope_parameters": "default"}, "rope_parameters"),
    "hidden_size-string": ({"hidden_size": "64"}, "hidden_size"),  # was one line, naming a tensor's shape
    "hidden_size-float": ({"hidden_size": 64.5}, "hidden_size"),  # likewise
    "hidden_size-bool": ({"hidden_size": True}, "hidden_size"),  # likewise
    "tie_word_embeddings-string": ({"tie_word_embeddings": "yes"}, "tie_word_embeddings"),
    "rms_norm_eps-string": ({"rms_norm_eps": "1e-5"}, "rms_norm_eps"),
    "text_config-list": ({"architectures": ["Gemma3ForConditionalGeneration"], "text_config": [1, 2]}, "text_config"),
    "architectures-true": ({"architectures": True}, "architectures"),
    "rope_theta-null": ({"rope_theta": None}, "rope_theta"),
    # sizes and counts
    "head_dim-past-every-tensor": ({"head_dim": 10**9}, "head_dim"),  # was a MemoryError sizing rotary tables
    "max_position_embeddings-2^64": ({"max_position_embeddings": 2**64}, "max_position_embeddings"),
    "num_key_value_heads-0": ({"num_key_value_heads": 0}, "num_key_value_heads"),
    "num_key_value_heads-3": ({"num_key_value_heads": 3}, "num_key_value_heads"),  # was one line
    "heads-do-not-divide-hidden": ({"num_attention_heads": 3, "num_key_value_heads": 1, "head_dim": DELETE},
                                   "num_attention_heads"),  # was one line, naming a tensor's shape
    "vocab_size-negative": ({"vocab_size": -259}, "vocab_size"),  # likewise
    "head_dim-0": ({"head_dim": 0}, "head_dim"),  # likewise
    "max_position_embeddings-0": ({"max_position_embeddings": 0}, "max_position_embeddings"),
    "max_position_embeddings-negative": ({"max_position_embeddings": -1}, "max_position_embeddings"),
    "layer_types-short": ({"layer_types": ["full_attention"]}, "layer_types"),
    "layer_types-unknown": ({"layer_types": ["full_attention", "chunky_attention"]}, "layer_types"),
    "num_hidden_layers-past-the-tensors": ({"num_hidden_layers": 3}, "num_hidden_layers"),  # was one line
    # values that built a model of NaNs, or one ONNX Runtime refuses
    "rms_norm_eps-nan": ({"rms_norm_eps": NAN}, "rms_norm_eps"),
    "rms_norm_eps-inf": ({"rms_norm_eps": INF}, "rms_norm_eps"),
    "rms_norm_eps-negative": ({"rms_norm_eps": -1e-5}, "rms_norm_eps"),
    "rms_norm_eps-0": ({"rms_norm_eps": 0.0}, "rms_norm_eps"),
    "rope_theta-negative": ({"rope_theta": -10000.0}, "rope_theta"),
    "rope_theta-0": ({"rope_theta": 0}, "rope_theta"),
    "rope_theta-inf": ({"rope_theta": INF}, "rope_theta"),
    "rope_parameters.rope_theta-negative": ({"rope_parameters": {"rope_type": "default", "rope_theta": -1.0}},
                                            "rope_parameters.rope_theta"),
    "rope_scaling.factor-nan": ({"rope_scaling": {"rope_type": "linear", "factor": NAN}}, "rope_scaling.factor"),
    "rope_scaling.factor-0": ({"rope_scaling": {"rope_type": "linear", "factor": 0}}, "rope_scaling.factor"),
    "longrope-one-factor-for-8-pairs": ({"rope_scaling": {"rope_type": "longrope", "short_factor": [1.0],
                                                          "long_factor": [2.0]}}, "short_factor"),
    "partial_rotary_factor-1.5": ({"partial_rotary_factor": 1.5}, "partial_rotary_factor"),
    "partial_rotary_factor-0": ({"partial_rotary_factor": 0}, "partial_rotary_factor"),
    "sliding_window-negative": ({"architectures": ["MistralForCausalLM"], "sliding_window": -4}, "sliding_window"),
    # token ids
    "bos_token_id-string": ({"bos_token_id": "1"}, "bos_token_id"),
    "bos_token_id-float": ({"bos_token_id": 1.5}, "bos_token_id"),
    "bos_token_id-bool": ({"bos_token_id": True}, "bos_token_id"),
    "eos_token_id-negative": ({"eos_token_id": -2}, "eos_token_id"),
    "eos_token_id-past-int32": ({"eos_token_id": 2**31}, "eos_token_id"),
    "eos_token_id-list-with-string": ({"eos_token_id": [2, "</s>"]}, "eos_token_id"),
    # Gemma's scalars (config parsing comes before any Gemma tensor is looked for)
    "query_pre_attn_scalar-0": ({**GEMMA2, "query_pre_attn_scalar": 0}, "query_pre_attn_scalar"),
    "final_logit_softcapping-nan": ({**GEMMA2, "final_logit_softcapping": NAN}, "final_logit_softcapping"),
    "attn_logit_softcapping-negative": ({**GEMMA2, "attn_logit_softcapping": -50.0}, "attn_logit_softcapping"),
    "rope_local_base_freq-negative": ({**GEMMA3, "rope_local_base_freq": -1.0}, "rope_local_base_freq"),
    # 0 is what Exaone4Config saves without a window; with one, deriving layer_types divided by it
    "sliding_window_pattern-0": ({**GEMMA3, "sliding_window": 16, "sliding_window_pattern": 0}, "sliding_window_pattern"),
    "per-layer-type-rope_theta-inf": ({**GEMMA3, "rope_parameters": {
        "full_attention": {"rope_type": "default", "rope_theta": INF},
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}}, "full_attention.rope_theta"),
    "text_config.hidden_size-string": ({"architectures": ["Gemma3ForConditionalGeneration"],
                                        "text_config": {"hidden_size": "64", "num_hidden_layers": 2}},
                                       "text_config.hidden_size"),
}


@pytest.mark.parametrize("case", sorted(BAD_CONFIG))
def test_bad_config_value_is_one_line(case, src, capsys):
    change, key = BAD_CONFIG[case]
    edit_json(src / "config.json", change)
    assert_one_line(*run(capsys, "-m", src, "--dry-run"), key)


BAD_GENERATION = {
    "bos_token_id-string": ({"bos_token_id": "1"}, "bos_token_id"),
    "eos_token_id-float": ({"eos_token_id": 2.5}, "eos_token_id"),
    "pad_token_id-past-int32": ({"pad_token_id": 2**33}, "pad_token_id"),
    "eos_token_id-negative": ({"eos_token_id": [2, -1]}, "eos_token_id"),
    "temperature-nan": ({"temperature": NAN}, "temperature"),
    "top_k-float": ({"top_k": 0.5}, "top_k"),
}


@pytest.mark.parametrize("case", sorted(BAD_GENERATION))
def test_bad_generation_config_value_is_one_line(case, src, capsys):
    change, key = BAD_GENERATION[case]
    edit_json(src / "generation_config.json", change)
    rc, err = run(capsys, "-m", src, "--dry-run")
    assert_one_line(rc, err, key)
    assert "generation_config.json" in err


BAD_TOKENIZER = {
    "tokenizer.json-not-json": ("tokenizer.json", '{"model": {"type": "BPE"'),
    "tokenizer.json-a-list": ("tokenizer.json", "[1, 2]"),
    "tokenizer.json-no-model": ("tokenizer.json", '{"version": "1.0", "added_tokens": []}'),
    "tokenizer_config.json-a-list": ("tokenizer_config.json", '["<s>"]'),
    "tokenizer_config.json-deeply-nested": ("tokenizer_config.json", "[" * 100_000 + "]" * 100_000),
}


@pytest.mark.parametrize("case", sorted(BAD_TOKENIZER))
def test_corrupt_tokenizer_file_is_refused_before_writing(case, src, tmp_path, capsys):
    name, text = BAD_TOKENIZER[case]
    (src / name).write_text(text)
    out = tmp_path / "out"
    assert_one_line(*run(capsys, "-m", src, "-o", out, "-q"), name)
    assert not out.exists()


def test_broken_values_are_refused_before_writing(src, tmp_path, capsys):
    """A real build, not a dry run: a NaN eps built a model of NaNs with exit 0; nothing is written now."""
    edit_json(src / "config.json", {"rms_norm_eps": NAN})
    out = tmp_path / "out"
    assert_one_line(*run(capsys, "-m", src, "-o", out, "-q"), "rms_norm_eps")
    assert not out.exists() and not list(tmp_path.glob(".out*"))


def _limit_memory():
    limit = 4 * 1024**3  # the fix allocates nothing per layer; without it: MemoryError at this limit
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def test_a_billion_layers_is_refused_before_anything_per_layer(src):
    """num_hidden_layers 10^9: per-layer lists were made (then MemoryError, or the OOM killer)
    before any tensor was looked at. In a subprocess, to bound its memory."""
    edit_json(src / "config.json", {"num_hidden_layers": 10**9})
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}  # no per-thread reservations
    r = subprocess.run([sys.executable, "-m", "builder", "-m", str(src), "--dry-run"], capture_output=True,
                       text=True, timeout=120, preexec_fn=_limit_memory, env=env)
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith("error: ") and len(r.stderr.splitlines()) == 1, r.stderr
    assert "num_hidden_layers 1000000000" in r.stderr and "layers 0 to 1" in r.stderr


def test_verify_on_a_gguf_is_refused_before_building(tiny_llama, tmp_path, capsys):
    """It built the whole model, then failed in a traceback (no config.json beside the GGUF)."""
    sys.path.insert(0, str(Path(__file__).parent))
    from gguf_files import write_gguf

    gguf = write_gguf(tiny_llama, tmp_path / "tiny.gguf")
    out = tmp_path / "out"
    rc, err = run(capsys, "-m", gguf, "-o", out, "-p", "fp32", "--verify", "-q")
    assert_one_line(rc, err, "--verify")
    assert "GGUF" in err and not out.exists()


def test_lenient_real_world_values_still_build(src, tmp_path, capsys):
    """What hub configs hold and transformers accepts: an integer rope_theta and scaling factor,
    nulls for optional keys, an eos list, a pad id of -1 (no pad token) or past the vocabulary (a
    warning each), a one-element pad list and integer sampling values in generation_config.json."""
    edit_json(src / "config.json", {
        "rope_theta": 10000, "rope_scaling": {"rope_type": "linear", "factor": 1}, "head_dim": None,
        "sliding_window": None, "layer_types": ["full_attention", "full_attention"], "eos_token_id": [2, 1],
        "pad_token_id": -1, "max_window_layers": 28, "attention_bias": False,
    })
    edit_json(src / "generation_config.json",
              {"eos_token_id": [2, 1], "pad_token_id": [300], "temperature": 1, "top_k": 50, "top_p": 1})
    out = tmp_path / "out"
    rc, err = run(capsys, "-m", src, "-o", out, "-q")
    assert rc == 0, err
    assert "pad_token_id -1 is no token" in err and "pad_token_id 300 is past the vocabulary (259 tokens)" in err
    genai = json.loads((out / "genai_config.json").read_text())["model"]
    assert genai["eos_token_id"] == [2, 1]
    assert genai["pad_token_id"] == 300  # generation_config.json's, as before: only warned about


def test_transformers_default_configs_still_parse():
    """The config.json transformers itself writes for each family (every key, its defaults: Qwen2-MoE's
    sliding_window 0, nulls, integer floats) passes the checks."""
    import transformers

    import architectures
    from builder.architecture import decoder_info

    skipped = {"NemotronForCausalLM"}  # its default has no num_key_value_heads, refused before these checks
    # Glm4MoeConfig's defaults (hidden 4096, 96 heads) give no head_dim: heads of 42.67, refused
    # (every GLM-4.5 config.json says head_dim 128).
    skipped.add("Glm4MoeForCausalLM")
    # Dots1Config has no default expert counts (None), so its default config cannot build experts:
    # refused, as transformers' own model fails to build from it.
    skipped.add("Dots1ForCausalLM")
    # DeepseekV2Config's num_experts_per_tok defaults to None too (its router's top-k fails on it).
    skipped.add("DeepseekV2ForCausalLM")
    # Lfm2MoeConfig's default has no layer_types, without which transformers' model cannot be built.
    skipped.add("Lfm2MoeForCausalLM")
    for arch in sorted(set(architectures.ARCHITECTURES) - skipped):
        cls = getattr(transformers, arch.replace("ForCausalLM", "Config").replace("ForConditionalGeneration", "Config"))
        raw = {**json.loads(cls().to_json_string(use_diff=False)), "architectures": [arch]}
        decoder_info(architectures.load(arch).parse_config(raw, arch))


def test_a_build_past_this_machines_memory_is_refused_before_writing(src, tmp_path, capsys, monkeypatch):
    # max_position_embeddings of 10^9 built rotary tables of 64 GB, computed whole at write time:
    # a MemoryError traceback halfway through. The predicted peak is checked against the RAM first
    # (here a 300 MB machine against 2^22 positions, 270 MB of tables beside the writer's own).
    import builder.preflight

    monkeypatch.setattr(builder.preflight, "physical_memory", lambda: 300 * 10**6)
    edit_json(src / "config.json", {"max_position_embeddings": 2**22})
    rc, err = run(capsys, "-m", src, "-o", tmp_path / "out", "-p", "fp32")
    assert_one_line(rc, err, "--context-length")
    assert not (tmp_path / "out").exists()
    assert run(capsys, "-m", src, "-o", tmp_path / "out", "-p", "fp32", "--context-length", "256")[0] == 0


# The config keys the hybrid and MLA families parse themselves, malformed: one line, exit 2.
FAMILY_KEYS = {
    "nemotron_h": [dict(hybrid_override_pattern=5, layers_block_type=None),
                   dict(hybrid_override_pattern="MXZ", layers_block_type=None),
                   dict(layers_block_type="abc"), dict(layers_block_type=["linear_attention", 3]), dict(n_group=3)],
    "granitemoehybrid": [dict(time_step_limit=["a", 1]), dict(time_step_limit=[1.0, 0.5]),
                         dict(time_step_limit=[{"__float__": "NaN"}, 1]), dict(mamba_d_head="x"),
                         dict(mamba_n_groups=4), dict(layer_types=["mamba", "conv", "mamba", "mamba"])],
    "deepseek_v3": [dict(qk_rope_head_dim=15), dict(q_lora_rank="x"), dict(kv_lora_rank=0)],
    "gemma4": [dict(per_layer_config={"x": {}}), dict(per_layer_config={"1": {"foo": 1}}),
               dict(num_kv_shared_layers=99)],
    "whisper": [dict(max_source_positions=750), dict(d_model=66), dict(decoder_attention_heads=0),
                dict(activation_function="swish"), dict(num_mel_bins="80"), dict(decoder_layers=-1)],
}


@pytest.fixture(scope="module")
def family_sources(tmp_path_factory):
    import test_family_deepseek_v3
    import test_family_gemma4
    import test_family_granitemoehybrid
    import test_family_nemotron_h
    import test_whisper

    makers = {"whisper": test_whisper.make_checkpoint, "nemotron_h": test_family_nemotron_h.make, "granitemoehybrid": test_family_granitemoehybrid.make,
              "deepseek_v3": test_family_deepseek_v3.make, "gemma4": test_family_gemma4.make}
    return {name: make(tmp_path_factory.mktemp(name)) for name, make in makers.items()}


@pytest.mark.parametrize("family, change", [(f, c) for f, cs in FAMILY_KEYS.items() for c in cs],
                         ids=[f"{f}-{next(iter(c))}-{i}" for f, cs in FAMILY_KEYS.items() for i, c in enumerate(cs)])
def test_family_keys_malformed_are_refused_in_one_line(family_sources, tmp_path, capsys, family, change):
    source = tmp_path / "src"
    shutil.copytree(family_sources[family], source)
    config = {k: v for k, v in {**json.loads((source / "config.json").read_text()), **change}.items()
              if v is not None}
    (source / "config.json").write_text(json.dumps(config))
    capsys.readouterr()
    assert main(["-m", str(source), "-o", str(tmp_path / "out"), "-q", "-p", "fp32"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    assert not (tmp_path / "out").exists()
