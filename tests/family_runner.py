"""The proofs every decoder family takes, run from one place.

A family's test module declares its tiny checkpoint and what it has, and takes the shared proofs:

    globals().update(family_tests(FamilyTest("ArceeForCausalLM", "ArceeConfig", VARIANTS, ...)))

which defines, for each variant (a module-scoped checkpoint):
- test_fp32_matches_transformers: ONNX Runtime's prefill and decode steps, every state fed back
  (KV, conv, recurrent), against transformers' logits with its own cache;
- test_int4_matches_same_rounding: an int4 build (accuracy level 0: float32 arithmetic) against
  transformers with every Linear rounded as the build rounds it, over the same steps;
- test_fp16_bounded (where `fp16_tolerance` is given): an fp16 build within that of transformers' fp32;
- test_genai_greedy_matches_transformers: onnxruntime-genai's greedy tokens, the model type it reads,
  and (`ragged`) a right-padded batch of prompts of different lengths, row by row;
- test_config_matches_transformers: `parse_config` of each of `config_raws` against transformers'
  config class, field by field, rope parameters included.

Special features keep their own failing-before tests beside these, in the family's module.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
import torch
import transformers
from conftest import TINY
from fake_quant import cosine, fake_quantize_model
from helpers import GENAI_PROMPT, PROMPT, build, make_checkpoint, relative_error
from test_genai import MAX_LENGTH, assert_same_greedy

import architectures
from builder.options import PRECISION_DEFAULTS

STEPS = 4
RAGGED = [[7, 3, 11, 19, 23, 29, 31, 37, 41, 43, 47], [5, 17, 33, 12, 99]]
CONFIG_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "hidden_act", "max_position_embeddings", "tie_word_embeddings",
                 "bos_token_id", "eos_token_id", "pad_token_id")


def onnx_steps(folder, ids, next_ids):
    """ONNX Runtime's logits for a prefill of `ids`, then one decode step per id of `next_ids`, each
    fed every present state (KV and conv) of the step before; the first past states are what
    onnxruntime-genai allocates: empty KV, zero conv states of the declared shape."""
    session = ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
    inputs = {i.name: i for i in session.get_inputs()}
    names = [o.name for o in session.get_outputs()]
    state = {}
    for name, i in inputs.items():
        if name.startswith("past"):
            shape = [1 if d == "batch_size" else 0 if isinstance(d, str) else d for d in i.shape]
            state[name] = np.zeros(shape, np.float16 if i.type == "tensor(float16)" else np.float32)
    results, total = [], 0
    for chunk in [ids, *([t] for t in next_ids)]:
        total += len(chunk)
        feed = {"input_ids": np.array([chunk], np.int64), "attention_mask": np.ones((1, total), np.int64), **state}
        outs = dict(zip(names, session.run(None, feed)))
        results.append(outs["logits"][0].astype(np.float32))
        state = {n.replace("present", "past_key_values", 1) if n.endswith(("key", "value")) else
                 n.replace("present", "past", 1): v for n, v in outs.items() if n.startswith("present")}
    return results


def reference_steps(model, ids, steps):
    """transformers' logits for a prefill, then `steps` greedy decode steps with its cache; the ids fed.
    Each step gets its position, as generate() gives it: Bamba's model counts positions from 0
    without them (its decode step then differs from its own full forward by 3.0 on a tiny model)."""
    # transformers 5.25 names the cache `cache` (`past_key_values` is its deprecated alias, which
    # Ergo's forward ignores: its decode steps then ran uncached, 0.45 off its own full forward)
    cache = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    with torch.no_grad():
        out = model(torch.tensor([ids]), use_cache=True)
        results, fed = [out.logits[0].numpy()], []
        for _ in range(steps):
            fed.append(int(out.logits[0, -1].argmax()))
            position = torch.tensor([[len(ids) + len(fed) - 1]])
            out = model(torch.tensor([[fed[-1]]]), **{cache: out.past_key_values}, position_ids=position,
                        use_cache=True)
            results.append(out.logits[0].numpy())
    return results, fed


def assert_steps_match(out, model, ids=PROMPT, tolerance=1e-4, min_cosine=None):
    """Prefill of `ids` and STEPS decode steps (every state fed back) against `model`'s."""
    want, fed = reference_steps(model, ids, STEPS)
    for step, (g, w) in enumerate(zip(onnx_steps(out, ids, fed), want)):
        assert relative_error(g, w) < tolerance, f"step {step}: relative error {relative_error(g, w):.2e}"
        assert (g.argmax(-1) == w.argmax(-1)).all(), f"step {step}: argmax differs"
        assert min_cosine is None or cosine(g, w) > min_cosine, f"step {step}: cosine {cosine(g, w)}"


def assert_ragged_batch_matches(out, model):
    """onnxruntime-genai's greedy generation of RAGGED as one right-padded batch equals `model`'s,
    row by row (a row's state must be its last real token's, not the padding's)."""
    from test_sliding_windows import assert_rows_match, genai_generate

    generated = genai_generate(out, RAGGED, MAX_LENGTH)
    assert_rows_match(model, RAGGED, generated, MAX_LENGTH - max(map(len, RAGGED)))


def load(source):
    return transformers.AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).eval()


def _strip_type(rope: dict[str, Any] | None) -> dict[str, Any] | None:
    return None if rope is None else {k: v for k, v in rope.items() if k != "type"}


@dataclass(frozen=True)
class FamilyTest:
    """A family's tiny checkpoints and the proofs they take.

    `variants`: name -> config.json overrides of `base`, each a checkpoint every proof runs on;
    `make(folder, config)` writes one (default: transformers' random weights of `config_class`);
    `genai_type`: genai_config.json's model type (None: onnxruntime-genai does not run the family,
    no genai proof); `genai_variant`: the variant genai greedy runs (default: the first);
    `config_raws`: config.json texts (the hub's spellings) compared with transformers' config on
    `config_fields` and the rope parameters; `quantize(model, bits, block_size, symmetric, method=)`
    rounds the reference as the build rounds it (default: every nn.Linear; a family whose experts are
    stacked parameters passes test_family_moe.fake_quantize_experts); `layer_lists`: the config holds per-layer lists or
    indices (tests/differential.py then keeps the layer count). `name` prefixes the variants'
    names as differential bases (default: the config class's, lowercased, without "Config"; "":
    the variants' names alone, already distinct)."""

    architecture: str
    config_class: str
    variants: dict[str, dict[str, Any]]
    base: dict[str, Any] = field(default_factory=lambda: dict(TINY))
    make: Callable[[Path, dict[str, Any]], Any] | None = None
    tolerance: float = 1e-4
    fp16_tolerance: float | None = None
    genai_type: str | None = "llama"
    genai_variant: str | None = None
    genai_seed: int = 0  # the genai checkpoint's random seed (one whose greedy continuation has no near-tie)
    ragged: bool = False
    config_raws: tuple[dict[str, Any], ...] = ({},)
    config_fields: tuple[str, ...] = CONFIG_FIELDS
    quantize: Callable[..., None] = fake_quantize_model
    layer_lists: bool = False
    since: tuple[int, int] = (0, 0)  # the oldest transformers whose modeling builder follows for this family
    name: str | None = None

    @property
    def family(self) -> str:
        return self.config_class.removesuffix("Config").lower() if self.name is None else self.name

    @property
    def available(self) -> bool:
        """Whether the installed transformers has the family as builder builds it (the oldest release
        the tests claim may lack it, or model it otherwise: `since`)."""
        version = tuple(int(p) for p in transformers.__version__.split(".")[:2])
        return hasattr(transformers, self.config_class) and version >= self.since

    def base_name(self, variant: str) -> str:
        """`variant`'s name as a differential base."""
        return f"{self.family}-{variant}" if self.family else variant

    def checkpoint(self, folder: Path, variant: str, seed: int = 0, **more: Any) -> Path:
        config = {**self.base, **self.variants[variant], **more}
        if self.make is not None:
            self.make(folder, config)
        else:
            make_checkpoint(folder, self.config_class, seed, **config)
        return folder


# Every FamilyTest declared, in the order the modules were imported: tests/differential.py draws
# its random configs around each variant too.
SPECS: list[FamilyTest] = []


def family_tests(spec: FamilyTest, suffix: str = "") -> dict[str, Any]:
    """The shared proofs of `spec`'s family, as module globals pytest collects (see the module's doc).
    `suffix` ends every test's name, so a module that proves several families (one FamilyTest each)
    keeps them apart; without one, the module also gets a `family_checkpoint` fixture (each
    variant's checkpoint) for its own tests."""
    SPECS.append(spec)
    made: dict[str, Path] = {}

    def checkpoint(variant: str, factory) -> Path:
        """`variant`'s checkpoint, written once per module."""
        if variant not in made:
            made[variant] = spec.checkpoint(factory.mktemp(spec.base_name(variant)), variant)
        return made[variant]

    each_variant = pytest.mark.parametrize("variant", sorted(spec.variants))

    @pytest.fixture(scope="module", params=sorted(spec.variants))
    def family_checkpoint(request, tmp_path_factory):
        if not spec.available:
            pytest.skip(f"transformers {transformers.__version__} has no {spec.config_class}")
        return checkpoint(request.param, tmp_path_factory)

    @each_variant
    def test_fp32_matches_transformers(variant, tmp_path_factory, tmp_path):
        source = checkpoint(variant, tmp_path_factory)
        out = build(source, tmp_path / "out", "-p", "fp32")
        assert_steps_match(out, load(source), tolerance=spec.tolerance)

    @each_variant
    def test_int4_matches_same_rounding(variant, tmp_path_factory, tmp_path):
        source = checkpoint(variant, tmp_path_factory)
        out = build(source, tmp_path / "out", "-p", "int4", "--accuracy-level", "0")
        model = load(source)
        int4 = PRECISION_DEFAULTS["int4"]  # what the build does when not told
        spec.quantize(model, 4, 32, int4["symmetric"], method=int4["quant_method"])
        want, fed = reference_steps(model, PROMPT, STEPS)
        for step, (g, w) in enumerate(zip(onnx_steps(out, PROMPT, fed), want)):
            assert cosine(g, w) > 0.999 and relative_error(g, w) < max(spec.tolerance, 1e-4), f"step {step}"

    def test_fp16_bounded(tmp_path):
        source = spec.checkpoint(tmp_path / "src", sorted(spec.variants)[0])
        want, fed = reference_steps(load(source), PROMPT, STEPS)
        got = onnx_steps(build(source, tmp_path / "out", "-p", "fp16"), PROMPT, fed)
        for step, (g, w) in enumerate(zip(got, want)):
            assert np.isfinite(g).all() and relative_error(g, w) < spec.fp16_tolerance, f"step {step}"

    def test_genai_greedy_matches_transformers(tmp_path):
        source = spec.checkpoint(tmp_path / "src", spec.genai_variant or sorted(spec.variants)[0], spec.genai_seed,
                                 eos_token_id=255)
        out = build(source, tmp_path / "out", "-p", "fp32")
        assert json.loads((out / "genai_config.json").read_text())["model"]["type"] == spec.genai_type
        assert_same_greedy(out, source, GENAI_PROMPT)
        if spec.ragged:
            assert_ragged_batch_matches(out, load(source))

    @pytest.mark.parametrize("raw", spec.config_raws)
    def test_config_matches_transformers(raw):
        ours = architectures.load(spec.architecture).parse_config(dict(raw, architectures=[spec.architecture]),
                                                                  spec.architecture)
        theirs = getattr(transformers, spec.config_class)(**raw)
        for name in spec.config_fields:
            assert getattr(ours, name) == getattr(theirs, name), name
        assert _strip_type(ours.rope_parameters) == _strip_type(getattr(theirs, "rope_parameters", None))

    tests = [test_fp32_matches_transformers, test_int4_matches_same_rounding]
    missing = pytest.mark.skipif(not spec.available, reason=f"transformers {transformers.__version__} has no "
                                 f"{spec.config_class} as builder builds it (newer than this release)")
    if spec.config_raws:
        tests.append(test_config_matches_transformers)
    if spec.fp16_tolerance is not None:
        tests.append(test_fp16_bounded)
    if spec.genai_type is not None:
        tests.append(test_genai_greedy_matches_transformers)
    found = {f"{test.__name__}{suffix}": missing(test) for test in tests}
    if suffix:
        return found
    # A module of one family newer than the installed transformers: its own tests skip too.
    return {"family_checkpoint": family_checkpoint, **found, **({} if spec.available else {"pytestmark": missing})}


def families_tests(variants: dict[str, tuple[str, dict[str, Any]]], families: dict[str, dict[str, Any]],
                   **common: Any) -> dict[str, Any]:
    """family_tests for a module that proves several families at once: `variants` name -> (config
    class, overrides), as such modules write them; `families` config class -> that family's
    FamilyTest fields (its architecture, genai type, ...); `common`: fields all share. Each family's
    tests end in its config class's name (`_olmo2`), its variants keep their names as differential
    bases."""
    tests = {}
    for config_class, fields in families.items():
        rows = {name: overrides for name, (cls, overrides) in variants.items() if cls == config_class}
        spec = FamilyTest(config_class=config_class, variants=rows, **{"name": "", **common, **fields})
        tests.update(family_tests(spec, suffix=f"_{config_class.removesuffix('Config').lower()}"))
    return tests


def router_outputs(model, routers: list, prompts) -> list[np.ndarray]:
    """The first output of each of `routers` (modules of `model`: their logits, as float64) for each
    prompt of `prompts` run through `model`, in the order they ran."""
    seen = []
    hooks = [r.register_forward_hook(lambda m, i, o: seen.append(o[0].detach().double().numpy())) for r in routers]
    try:
        with torch.no_grad():
            for ids in prompts:
                model(torch.tensor([ids]))
    finally:
        for h in hooks:
            h.remove()
    return seen


def modules_named(model, class_name: str) -> list:
    """The modules of `model` of the class named `class_name` (a family's router, ...)."""
    return [m for m in model.modules() if type(m).__name__ == class_name]


def spread_checkpoint(folder: Path, router_scale: float, noise: dict[str, float]) -> Path:
    """`folder`'s model.safetensors with its routers (`mlp.gate.weight`) scaled by `router_scale`
    and each tensor whose name ends with a key of `noise` (checked in order) replaced by normal
    noise of that standard deviation (seeded: the same checkpoint every run): what transformers
    initializes to constants (a correction bias, biases) made to matter in the proofs."""
    from safetensors.numpy import load_file, save_file

    tensors, rng = load_file(folder / "model.safetensors"), np.random.default_rng(1)
    for key, value in tensors.items():
        if key.endswith("mlp.gate.weight"):
            tensors[key] = value * router_scale
        suffix = next((s for s in noise if key.endswith(s)), None)
        if suffix is not None:
            tensors[key] = (noise[suffix] * rng.standard_normal(value.shape)).astype(value.dtype)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


def assert_grouped_routing(routers: list[tuple[np.ndarray, np.ndarray]], k: int, groups: int, kept: int) -> None:
    """DeepSeek-V3's grouped sigmoid routing (GLM-4.5's, dots1's, MiniCPM5-MoE's, MiMo-V2-Flash's),
    proved by the parity tests only where its choices are clear-cut: for every router's (logits
    (tokens, experts), correction bias), no near-tie in the `kept` of `groups` groups (each scored by
    its best two) nor in the top `k` within them; and both the group restriction and the bias
    change some token's experts (else the proofs would not see them wrong)."""

    def grouped(choice: np.ndarray, check: bool) -> np.ndarray:
        """The experts the router picks by `choice`: the top k within the kept groups, sorted."""
        group = np.sort(choice.reshape(len(choice), groups, -1), -1)[..., -2:].sum(-1)  # (tokens, groups)
        ranked = np.sort(group, -1)[:, ::-1]
        mask = np.zeros_like(group, bool)
        np.put_along_axis(mask, np.argsort(-group, -1)[:, :kept], True, -1)
        masked = np.where(np.repeat(mask, choice.shape[1] // groups, -1), choice, -np.inf)
        top = np.sort(masked, -1)[:, ::-1]
        if check:
            assert (ranked[:, kept - 1] - ranked[:, kept]).min() > 1e-3, "a near-tie in the group choice"
            assert (top[:, k - 1] - top[:, k]).min() > 1e-3, "a near-tie in the top-k choice"
        return np.sort(np.argsort(-masked, -1)[:, :k], -1)

    by_groups = by_bias = 0
    for logits, bias in routers:
        s = 1 / (1 + np.exp(-logits.astype(np.float64)))
        chosen = grouped(s + bias, check=True)
        by_groups += (chosen != np.sort(np.argsort(-(s + bias), -1)[:, :k], -1)).any(-1).sum()
        by_bias += (chosen != grouped(s, check=False)).any(-1).sum()
    assert by_groups > 0, "the group restriction never changes the experts chosen"
    assert by_bias > 0, "the correction bias never changes the experts chosen"
