"""Differential config checks: builder against transformers on configs transformers itself accepts.

For each family, a base tiny config (the one its parity tests use) is varied at random within what
transformers' config class allows and at the edge values real checkpoints use: head sizes that are
not multiples of 8 or 16, odd head counts, rotary fractions, every rope_type with the edge factors
(llama3's equal low and high factors, as Llama 4 Scout ships), windows shorter than the prompt,
tied and untied vocabularies, and the hub's spellings written into config.json after transformers
saved it (`rope_theta` + `rope_scaling` with `type` or `rope_type`, JSON's `Infinity` limits, `null`
optional keys). Each case is a tiny random checkpoint; the rule it checks:

- transformers loads it and runs it to finite logits => builder builds it (exit 0), ONNX Runtime's
  CPU runs it, and its fp32 logits match (prefill and two decode steps, relative error < 1e-4);
- transformers refuses it (its config class, its loading or its forward raise) => builder refuses
  it too, with exit 2 and one line.

`run_case` returns an `Outcome`; tests/test_differential.py runs a fixed sample in CI,
scripts/differential_configs.py thousands.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import io
import json
import logging
import math
import random
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

TOLERANCE = 1e-4
PROMPT_LENGTH = 12  # longer than the windows drawn below
STEPS = 2
ROUTER_SCALE = 30.0  # random routers are near-uniform; scaled up, their top-k choices are decisive
ROUTERS = ("mlp.gate.weight", "block_sparse_moe.gate.weight", "router.weight", "mlp.router.weight")


@dataclasses.dataclass(frozen=True)
class Base:
    """A family's tiny config: `config_class` (transformers') built from `config`; `make(folder,
    config)` writes the checkpoint (default: transformers' random init, biases and routers spread)."""

    name: str
    config_class: str
    config: dict[str, Any]
    make: Callable[[Path, dict[str, Any]], Any] | None = None
    layer_lists: bool = False  # per-layer lists in the config: the layer count stays
    tolerance: float = TOLERANCE


@dataclasses.dataclass
class Case:
    base: Base
    overrides: dict[str, Any]
    edits: list[str]  # hub spellings written into config.json after saving (EDITS)
    seed: int

    @property
    def label(self) -> str:
        parts = [f"{k}={v}" for k, v in sorted(self.overrides.items(), key=lambda kv: kv[0])]
        return f"{self.base.name}[{', '.join(parts + self.edits)}]"


@dataclasses.dataclass
class Outcome:
    case: Case
    transformers_ok: bool
    builder_rc: int | None = None
    error: float | None = None
    problem: str | None = None  # why the case fails the rule (None: it holds)
    detail: str = ""

    @property
    def verdict(self) -> str:
        if self.problem is not None:
            return self.problem
        return "built and matched" if self.transformers_ok else "refused by both"


# --- the checkpoint -------------------------------------------------------------------------------------------------

def default_make(folder: Path, config_class: str, config: dict[str, Any], seed: int = 0) -> None:
    """transformers' random init (norms away from 1), then random biases and routers scaled up."""
    from safetensors.numpy import load_file, save_file

    from helpers import make_checkpoint

    make_checkpoint(folder, config_class, seed=seed, **config)
    tensors = load_file(folder / "model.safetensors")
    rng = np.random.default_rng(seed + 1)
    for key, value in tensors.items():
        if key.endswith(".bias"):
            tensors[key] = (0.1 * rng.standard_normal(value.shape)).astype(value.dtype)
        if key.endswith(ROUTERS):
            tensors[key] = value * ROUTER_SCALE
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})


# --- the variations ---------------------------------------------------------------------------------------------------

ROPES = {
    "default": dict(rope_type="default"),
    "linear": dict(rope_type="linear", factor=2.0),
    "dynamic": dict(rope_type="dynamic", factor=2.0),
    "llama3": dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                   original_max_position_embeddings=32),
    "llama3-equal": dict(rope_type="llama3", factor=16.0, low_freq_factor=1.0, high_freq_factor=1.0,
                         original_max_position_embeddings=32),  # Llama 4 Scout's
    "yarn": dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=32),
}
HEAD_DIMS = (8, 12, 16, 20, 24, 32, 40, 48, 64, 80)
FRACTIONS = (0.25, 0.4, 0.5, 0.75, 1.0)


def _rope_of(config: dict[str, Any]) -> dict[str, Any] | None:
    rope = config.get("rope_parameters")
    return rope if isinstance(rope, dict) and "full_attention" not in rope else None


def vary(base: Base, rng: random.Random) -> tuple[dict[str, Any], list[str]]:
    """Overrides of `base.config` and config.json edits: one to three kinds of change at random."""
    c = base.config
    overrides: dict[str, Any] = {}
    kinds = ["heads", "rope", "rotary_fraction", "vocabulary", "tie", "window", "hub_rope", "nulls"]
    if not base.layer_lists:
        kinds.append("layers")
    for kind in rng.sample(kinds, rng.randint(1, 3)):
        if kind == "heads":
            heads = rng.choice((1, 2, 3, 4, 5, 6))
            overrides["num_attention_heads"] = heads
            overrides["num_key_value_heads"] = rng.choice([k for k in range(1, heads + 1) if heads % k == 0])
            head_dim = rng.choice(HEAD_DIMS)
            if rng.random() < 0.7:
                overrides["head_dim"] = head_dim
                overrides["hidden_size"] = rng.choice((32, 48, 64, 96))
            else:  # head_dim from hidden_size / heads
                overrides["hidden_size"] = heads * head_dim
                if "head_dim" in c:
                    overrides["head_dim"] = head_dim
        elif kind == "rope" and ("rope_parameters" in c or "rope_theta" in c or _rope_of(c) is None):
            name = rng.choice(sorted(ROPES))
            rope = dict(ROPES[name], rope_theta=rng.choice((1e4, 5e5, 1e6)))
            old = _rope_of(c)
            if old and "partial_rotary_factor" in old:
                rope["partial_rotary_factor"] = old["partial_rotary_factor"]
            overrides["rope_parameters"] = rope
        elif kind == "rotary_fraction":
            overrides["partial_rotary_factor"] = rng.choice(FRACTIONS)
        elif kind == "vocabulary":
            overrides["vocab_size"] = rng.choice((97, 200, 256, 300))
        elif kind == "tie":
            overrides["tie_word_embeddings"] = rng.random() < 0.5
        elif kind == "window" and "sliding_window" in c:
            overrides["sliding_window"] = rng.choice((None, 3, 4, 8, 64))
        elif kind == "layers":
            overrides["num_hidden_layers"] = rng.choice((1, 2, 3))
    edits = []
    if rng.random() < 0.35:
        edits.append(rng.choice(("hub_rope_type", "hub_type")))
    if rng.random() < 0.25:
        edits.append("null_optional")
    if rng.random() < 0.3:
        edits.append("infinite_limit")  # a Mamba-2 hybrid's time_step_limit; nothing elsewhere
    if "partial_rotary_factor" in overrides and isinstance(overrides.get("rope_parameters"), dict):
        overrides["rope_parameters"]["partial_rotary_factor"] = overrides["partial_rotary_factor"]
    return overrides, edits


def edit_config(folder: Path, edits: list[str]) -> None:
    """Rewrites config.json in the hub's spellings `edits` asks for."""
    path = folder / "config.json"
    config = json.loads(path.read_text())
    for edit in edits:
        if edit in ("hub_rope_type", "hub_type") and isinstance(config.get("rope_parameters"), dict) \
                and "full_attention" not in config["rope_parameters"]:
            rope = dict(config.pop("rope_parameters"))
            config["rope_theta"] = rope.pop("rope_theta", 10000.0)
            if "partial_rotary_factor" in rope:
                config["partial_rotary_factor"] = rope.pop("partial_rotary_factor")
            kind = rope.pop("rope_type", "default")
            config["rope_scaling"] = None if kind == "default" else {("type" if edit == "hub_type" else "rope_type"): kind,
                                                                     **rope}
        elif edit == "null_optional":
            for key in ("pad_token_id", "bos_token_id", "sliding_window"):
                if key in config and key != "sliding_window" or config.get("sliding_window") is None:
                    config[key] = None
        elif edit == "infinite_limit" and isinstance(config.get("time_step_limit"), list):
            # The lower end kept: Nemotron-H's is its time_step_min, which transformers 5.23 clamped
            # at (5.25 reads time_step_limit), so the two releases agree on the case.
            low = config["time_step_limit"][0]
            config["time_step_limit"] = [low if isinstance(low, (int, float)) else 0.0, math.inf]
    path.write_text(json.dumps(config, indent=2))  # Python writes JSON's Infinity, as the hub's files


def cases(bases: list[Base], count: int, seed: int = 0) -> list[Case]:
    """`count` cases per base, drawn from `seed`: the same list on every machine."""
    out = []
    for b in bases:
        rng = random.Random(f"{seed}:{b.name}")
        for i in range(count):
            overrides, edits = vary(b, rng)
            out.append(Case(b, overrides, edits, seed=i))
    return out


# --- running a case ---------------------------------------------------------------------------------------------------

def _reference(folder: Path, prompt: list[int]) -> tuple[list[np.ndarray], list[int]]:
    import torch
    import transformers

    from family_runner import reference_steps

    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    logits, fed = reference_steps(model, prompt, STEPS)
    for step in logits:
        if not np.isfinite(step).all():
            raise FloatingPointError("transformers computes logits that are not finite")
    return logits, fed


def run_case(case: Case, folder: Path) -> Outcome:
    """Makes the case's checkpoint under `folder`, runs transformers, builds with builder, compares."""
    from builder.cli import main
    from helpers import relative_error
    from family_runner import onnx_steps

    config = {**copy.deepcopy(case.base.config), **copy.deepcopy(case.overrides)}
    source, out = folder / "src", folder / "out"
    transformers_error = None
    with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()), _quiet():
        warnings.simplefilter("ignore")
        try:
            if case.base.make is not None:
                case.base.make(source, config)
            else:
                default_make(source, case.base.config_class, config, case.seed)
            edit_config(source, case.edits)
            vocab = json.loads((source / "config.json").read_text()).get("vocab_size") or 64
            prompt = [int(t) for t in np.random.default_rng(case.seed).integers(0, min(vocab, 256), PROMPT_LENGTH)]
            want, fed = _reference(source, prompt)
        except Exception as e:  # noqa: BLE001 - any refusal of transformers' is the outcome
            transformers_error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
    if not (source / "config.json").is_file():
        return Outcome(case, False, None, detail=transformers_error or "")  # refused before anything was saved
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()), _quiet():
        try:
            rc = main(["-m", str(source), "-o", str(out), "-q", "-p", "fp32"])
        except Exception as e:  # noqa: BLE001 - a traceback is a failed case, reported
            rc, message = None, f"builder raised {type(e).__name__}: {e}"
        else:
            message = err.getvalue().strip()
    if transformers_error is not None:
        outcome = Outcome(case, False, rc, detail=f"transformers: {transformers_error}; builder: {message}")
        if rc is None:
            outcome.problem = "builder crashed"
        elif rc == 0:
            outcome.problem = "built what transformers refuses"
        elif rc != 2 or len([line for line in message.splitlines() if not line.startswith("warning:")]) != 1:
            outcome.problem = "refused in more than one line"
        return outcome
    outcome = Outcome(case, True, rc, detail=message)
    if rc != 0:
        outcome.problem = "builder crashed" if rc is None else "refused what transformers runs"
        return outcome
    try:
        got = onnx_steps(out, prompt, fed)
    except Exception as e:  # noqa: BLE001 - ONNX Runtime refusing the model is the finding
        outcome.problem, outcome.detail = "ONNX Runtime cannot run it", f"{type(e).__name__}: {e}"[:400]
        return outcome
    outcome.error = max(relative_error(g, w) for g, w in zip(got, want))
    if not outcome.error < case.base.tolerance:
        outcome.problem = "logits differ"
        outcome.detail = f"relative error {outcome.error:.2e}"
    return outcome


@contextlib.contextmanager
def _quiet():
    """builder's warnings and transformers' logging off for the case (the outcome says what matters)."""
    loggers = [logging.getLogger(n) for n in ("builder", "transformers")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


# --- the families -----------------------------------------------------------------------------------------------------

def _from_variants(module: str, base: str | dict[str, Any], names: list[str] | None = None) -> list[Base]:
    """Bases from a parity test module's VARIANTS {name: (config class, overrides)} over its base
    dict (`base`: a dict, or the name of the module's own)."""
    import importlib

    m = importlib.import_module(module)
    common = getattr(m, base) if isinstance(base, str) else base
    return [Base(name, cls, {**common, **over}) for name, (cls, over) in m.VARIANTS.items()
            if names is None or name in names]


def _from_maker(name: str, module: str, config_class: str, layer_lists: bool = True) -> Base:
    """A base whose test module's make(folder, **overrides) writes the checkpoint (its own random
    state parameters, biases, routers) from its CONFIG."""
    import importlib

    m = importlib.import_module(module)
    return Base(name, config_class, dict(m.CONFIG), lambda folder, config: m.make(folder, **config), layer_lists)


def _from_runner() -> list[Base]:
    """A base per variant of every family test on tests/family_runner.py (each test_family_*
    module imported) whose family the installed transformers has, named by FamilyTest.base_name."""
    import importlib

    import family_runner

    for path in sorted(Path(__file__).parent.glob("test_family_*.py")):
        importlib.import_module(path.stem)
    return [Base(spec.base_name(name), spec.config_class, {**spec.base, "eos_token_id": 255, **overrides},
                 spec.make, layer_lists=spec.layer_lists)
            for spec in family_runner.SPECS if spec.available for name, overrides in spec.variants.items()]


def bases() -> list[Base]:
    """One or more bases per family: the tiny configs its parity tests prove, features on."""
    from conftest import TINY

    out = [Base("llama", "LlamaConfig", {**TINY, "eos_token_id": 255})]
    out += _from_variants("test_parity_llama", TINY, ["mistral-window", "qwen2", "qwen3-tied"])
    out += _from_variants("test_family_moe", "BASE")
    out += _from_variants("test_family_moe2", "BASE")
    out += _from_variants("test_parity_gemma", "GEMMA")
    out += [Base(f"phi3-{n}", "Phi3Config", {**__import__("test_parity_phi3").PHI, **v})
            for n, v in __import__("test_parity_phi3").VARIANTS.items()]
    out += _from_variants("test_family_hunyuan", "BASE")
    out += [
        _from_maker("deepseek_v3", "test_family_deepseek_v3", "DeepseekV3Config", layer_lists=False),
        _from_maker("falcon_h1", "test_family_falcon_h1", "FalconH1Config", layer_lists=False),
        _from_maker("granitemoehybrid", "test_family_granitemoehybrid", "GraniteMoeHybridConfig"),
        _from_maker("lfm2", "test_family_lfm2", "Lfm2Config"),
        _from_maker("llama4", "test_family_llama4", "Llama4TextConfig"),
        _from_maker("nemotron_h", "test_family_nemotron_h", "NemotronHConfig"),
        _from_maker("gemma4", "test_family_gemma4", "Gemma4TextConfig"),
    ]
    # Families whose test module's make(folder, config=CONFIG) writes the checkpoint (routers scaled,
    # biases spread) from a whole config.
    for name, module, config_class in (("lfm2_moe", "test_family_lfm2_moe", "Lfm2MoeConfig"),
                                       ("glm4_moe", "test_family_glm4_moe", "Glm4MoeConfig"),
                                       ("hunyuan_moe", "test_family_hunyuan_moe", "HunYuanMoEV1Config"),
                                       ("dots1", "test_family_dots1", "Dots1Config")):
        m = __import__(module)
        out.append(Base(name, config_class, dict(m.CONFIG), lambda folder, config, m=m: m.make(folder, config),
                        layer_lists=True))
    out.append(Base("gpt_oss", "GptOssConfig", dict(__import__("test_family_gptoss").CONFIG), layer_lists=True))
    out.append(Base("ernie4_5_moe", "Ernie4_5_MoeConfig", dict(__import__("test_family_erniemoe").CONFIG)))
    out += _from_runner()
    import test_family_qwen3_5 as q35
    import test_family_qwen3_5_moe as q35m

    out.append(Base("qwen3_5", "Qwen3_5TextConfig", dict(q35.CONFIG), layer_lists=True))
    # Over 50 draws of its weights, 2 differ from torch by 6.3e-4 (relative) at one or two prefill
    # positions, argmax equal, decode steps within 3e-5: not routing (the same with all 8 experts
    # on), gone with top-1 or a narrow shared expert; the dense Qwen3.5's worst of 50 is 2.9e-5.
    out.append(Base("qwen3_5_moe", "Qwen3_5MoeTextConfig", dict(q35m.CONFIG), layer_lists=True, tolerance=1e-3))
    return out
