"""--verify: the built model in ONNX Runtime against the checkpoint in transformers, on one prompt.

Needs the test extras (torch, transformers, onnxruntime); imported only when asked for, and the
only module that imports them (docs/DESIGN.md). For int4 / int8 builds the reference runs on the
build's rounding of the original weights (builder/verify_rounding.py), so the comparison measures
the graph, not the expected quantization error; the package is fed as onnxruntime-genai feeds it
(builder/verify_feed.py); the prompts and the verdict are builder/verify_verdict.py's.
"""

from __future__ import annotations

import importlib.util
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from builder.errors import BuildError
from builder.genai_config import config_entries
from builder.options import BuildOptions
from builder.verify_feed import DecoderFeed, check_fed, embedder, image_feed
from builder.verify_rounding import (experts_symmetric, experts_transposed, in_float_tower, is_per_layer_table,
                                     lookup_bits, round_experts, round_linear, round_lookup, round_per_layer_table)
from builder.verify_verdict import PROMPT_TEXT, Verdict, fallback_prompt, grid_image_prompt, image_prompt, verdict

log = logging.getLogger("builder")

# What --verify imports; checked before building (find_spec imports nothing).
REQUIREMENTS = ("torch", "transformers", "onnxruntime")

CPU = ["CPUExecutionProvider"]


def check_verifiable(options: BuildOptions) -> None:
    """Refuses, before anything is built, a --verify that could only fail after the build."""
    gguf = _gguf_input(options)
    if gguf is not None:
        raise BuildError(f"--verify compares the model with transformers' run of a safetensors checkpoint, and "
                         f"{gguf.name} is a GGUF file (transformers would dequantize it, comparing other weights): "
                         "build it without --verify, or verify a build of the checkpoint it was converted from")
    needed = (*REQUIREMENTS, "peft") if options.adapter is not None else REQUIREMENTS  # peft merges the adapter
    missing = [m for m in needed if importlib.util.find_spec(m) is None]
    if missing:
        raise BuildError(f"--verify needs {', '.join(missing)} (the test extras: pip install -e '.[test]')")
    if options.resolved_io_dtype == "bf16":
        raise BuildError("--verify runs ONNX Runtime on the CPU, which has no bfloat16 kernels; verify a fp16 build")


def _gguf_input(options: BuildOptions) -> Path | None:
    """The GGUF file a build reads, when --input or --model names one (or a folder of one); None
    otherwise (a hub id is never GGUF: builder downloads safetensors only)."""
    from builder.inputs.gguf.checkpoint import find

    for given in (options.input, options.model):
        path = Path(given).expanduser() if given else None
        if path is not None and path.suffix == ".gguf":
            return path
        if path is not None and path.exists():
            return find(path)
    return None


def verify(options: BuildOptions, output: Path, folder: Path, quiet: bool = False) -> list[Verdict]:
    """The prompt's logits and the next step's, ONNX Runtime against transformers; for an
    image-and-text package, also with an image in the prompt (vision -> embedding -> decoder)."""
    check_verifiable(options)
    genai = json.loads((output / "genai_config.json").read_text())["model"]
    check_fed(genai, output)
    decoder = genai["decoder"]
    model = _reference_model(folder, options, quiet, experts_symmetric(output / decoder["filename"]))
    dtype = np.float16 if options.resolved_io_dtype == "fp16" else np.float32
    sides = _Sides(model, DecoderFeed(_decoder_session(output / decoder["filename"], decoder), decoder, dtype),
                   _embedder(output, genai), options)
    ids = _prompt(folder, genai["vocab_size"])
    verdicts = [sides.compare(ids, {}, sides.embed(np.array([ids], np.int64)))]
    if "vision" in genai:
        verdicts.append(_image_verdict(sides, output, genai, ids))
    if "mtp" in genai:
        verdicts.append(_head_verdict(model, output, folder, ids, options, experts_symmetric(output / "mtp.onnx")))
    return verdicts


def _head_verdict(model, output: Path, folder: Path, ids: list[int], options: BuildOptions,
                  symmetric_experts: bool | None) -> Verdict:
    """The draft head's logits after the prompt's pairs (h_i, t_{i+1}), mtp.onnx against its math in
    transformers' modules (builder/verify_head.py, rounded as the build rounds it), and the draft
    acceptance of builder.speculative's greedy decoding on three prompts."""
    import onnxruntime as ort
    import torch

    from builder import registry
    from builder.hf_config import read_json
    from builder.speculative import Speculative
    from builder.verify_head import HeadReference, head_layout, read_head_tensors

    raw = read_json(folder / "config.json", "model")
    architecture = registry.resolve(raw)
    family = registry.load(architecture)
    layout = head_layout(family.mtp, family.parse_config(raw, architecture))
    reference = HeadReference(model, read_head_tensors(folder, layout), layout)
    target = options.target().with_layers(1)
    with torch.no_grad():
        if target.quantization is not None:
            _round_modules(reference.modules(), target, symmetric_experts, None)
        hidden = model(input_ids=torch.tensor([ids]), output_hidden_states=True).hidden_states[-1][0].numpy()
    want, _ = reference(hidden[:-1], ids[1:], np.arange(len(ids) - 1))
    session = ort.InferenceSession(str(output / "mtp.onnx"), providers=CPU)
    dtype = np.float16 if options.resolved_io_dtype == "fp16" else np.float32
    feed = {"input_ids": np.array([ids[1:]], np.int64), "attention_mask": np.ones((1, len(ids) - 1), np.int64),
            "hidden_states": hidden[None, :-1].astype(dtype)}
    for i in session.get_inputs():
        if i.name.startswith("past"):
            feed[i.name] = np.zeros([1 if d == "batch_size" else 0 if isinstance(d, str) else d for d in i.shape], dtype)
    got = session.run(["logits"], feed)[0][0].astype(np.float64)
    speculative = Speculative(output)
    drafts = accepted = 0
    for prompt in (ids, ids[: max(2, len(ids) // 2)], ids[::-1]):
        _, stats = speculative.generate(prompt, 16)
        drafts, accepted = drafts + stats.drafts, accepted + stats.accepted
    rate = f"draft acceptance {accepted / max(drafts, 1):.0%} of {drafts} greedy drafts"
    return verdict(got, want[-1:].astype(np.float64), options, f"the MTP head; {rate}")


@dataclass(frozen=True)
class _Sides:
    """What is compared: transformers' model, and the package's decoder with its token input."""

    model: Any
    package: DecoderFeed
    embed: Callable[..., dict[str, np.ndarray]]
    options: BuildOptions

    def compare(self, ids: list[int], extra: dict, prompt_feed: dict, prompt: str = "",
                positions: np.ndarray | None = None) -> Verdict:
        """The prompt `ids` (with transformers' `extra` inputs; `prompt_feed`, the package's) and the
        step of the token transformers picks next, on both sides."""
        import torch

        with torch.no_grad():
            ref = self.model(input_ids=torch.tensor([ids]), use_cache=True, **extra)
            nxt = int(ref.logits[0, -1].argmax())
            ref_step = self.model(input_ids=torch.tensor([[nxt]]), use_cache=True, **_cache_argument(self.model, ref))
        step_feed = self.embed(np.array([[nxt]], np.int64))
        first, second = self.package.logits(prompt_feed, step_feed, len(ids), positions)
        got = np.concatenate([first, second]).astype(np.float64)
        rows = first.shape[0]  # the prompt's positions, or its last alone (--prune-lm-head)
        want = np.concatenate([ref.logits[0, -rows:].numpy(), ref_step.logits[0].numpy()]).astype(np.float64)
        return verdict(got, want, self.options, prompt)


def _image_verdict(sides: _Sides, output: Path, genai: dict, ids: list[int]) -> Verdict:
    """The comparison with one image in the prompt, in the layout the vision model declares: a
    patch grid beside the pixels, or a fixed-size image."""
    import torch

    if "image_grid_thw" in genai["vision"]["inputs"]:
        image_ids, extra, positions = _grid_image_prompt(sides.model, genai, ids)
        features = _image_features(output, genai, extra["pixel_values"].numpy(), extra["image_grid_thw"].numpy())
    else:
        image_ids, pixels = image_prompt(sides.model.config, ids)
        features = _image_features(output, genai, pixels)
        extra, positions = {"pixel_values": torch.from_numpy(pixels)}, None
    feed = sides.embed(np.array([image_ids], np.int64), features)
    return sides.compare(image_ids, extra, feed, "with an image", positions)


def _grid_image_prompt(model, genai: dict, ids: list[int]):
    """The grid image prompt (verify_verdict.grid_image_prompt) as transformers reads it, and the
    M-RoPE positions transformers computes for it (get_rope_index); returns (ids, the reference's
    image inputs, positions (3, 1, S))."""
    import torch

    image_ids, pixels, grid = grid_image_prompt(model.config, genai["vision"], ids)
    tokens = torch.tensor([image_ids])
    extra = {"pixel_values": torch.from_numpy(pixels), "image_grid_thw": torch.from_numpy(grid),
             "mm_token_type_ids": (tokens == model.config.image_token_id).int()}
    with torch.no_grad():
        positions, _ = model.model.get_rope_index(tokens, extra["mm_token_type_ids"], extra["image_grid_thw"])
    return image_ids, extra, positions.numpy()


# ONNX Runtime's side: the package's sessions on the CPU.


def _decoder_session(path: Path, decoder: dict):
    """The decoder's session, with the config entries of its session options, as onnxruntime-genai sets them."""
    import onnxruntime as ort

    session_options = ort.SessionOptions()
    for key, value in config_entries(decoder.get("session_options", {})).items():
        session_options.add_session_config_entry(key, value)
    return ort.InferenceSession(_cpu_model(path, session_options), session_options, providers=CPU)


def _cpu_model(path: Path, session_options) -> str | bytes:
    """The model as the CPU runs it: a lookup given zero points packed over the whole table for
    CUDA's GatherBlockQuantized (Quantization.flat_lookup_zero_points) reads the rows' own copy,
    which the CPU kernel's indexing expects; other models by their path."""
    import onnx

    model = onnx.load(path, load_external_data=False)
    swapped = False
    for node in model.graph.node:
        if node.op_type == "GatherBlockQuantized" and len(node.input) > 3 and node.input[3].endswith("lookup_zero_points"):
            node.input[3] = node.input[3][: -len("lookup_zero_points")] + "zero_points"
            swapped = True
    if not swapped:
        return str(path)
    session_options.add_session_config_entry("session.model_external_initializers_file_folder_path", str(path.parent))
    session_options.log_severity_level = 3  # not "Removing initializer ...lookup_zero_points": unused here, by design
    return model.SerializeToString()


def _embedder(output: Path, genai: dict):
    """The decoder's token input (verify_feed.embedder): through the package's embedding model where it has one."""
    import onnxruntime as ort

    hidden = genai["decoder"]["hidden_size"]
    if "embedding" not in genai:
        return embedder(None, hidden)
    return embedder(ort.InferenceSession(str(output / genai["embedding"]["filename"]), providers=CPU), hidden)


def _image_features(output: Path, genai: dict, pixels: np.ndarray, grid: np.ndarray | None = None) -> np.ndarray:
    import onnxruntime as ort

    session = ort.InferenceSession(str(output / genai["vision"]["filename"]), providers=CPU)
    return session.run(None, image_feed(session, pixels, grid))[0]


# transformers' side: the reference model, rounded as the build rounds.


def _reference_model(folder: Path, options: BuildOptions, quiet: bool = False, symmetric_experts: bool | None = None):
    """transformers' float32 model of the checkpoint (with the adapter merged), its weights rounded
    as the build's target rounds them; `symmetric_experts`: what the built graph's QMoE nodes hold."""
    import torch

    model = _load_reference(folder, options, quiet)
    target = options.target().with_layers(model.config.get_text_config().num_hidden_layers)
    if target.quantization is not None:
        with torch.no_grad():
            _round_as_built(model, target, symmetric_experts)
    return model


def _load_reference(folder: Path, options: BuildOptions, quiet: bool):
    try:
        import torch
        import transformers
    except ImportError:
        raise BuildError("--verify needs the test extras: pip install -e '.[test]'") from None
    if quiet:
        transformers.utils.logging.disable_progress_bar()  # "Loading weights" bars on stderr
    config = json.loads((folder / "config.json").read_text())
    auto = (transformers.AutoModelForImageTextToText if config["architectures"][0].endswith("ConditionalGeneration")
            else transformers.AutoModelForCausalLM)
    if options.adapter is None:
        return _from_pretrained(auto, folder, torch.float32, config).eval()
    # the reference is peft's own merge, made in the base's dtype as builder's is (builder/inputs/lora.py)
    import peft

    from builder.inputs.lora import adapter_folder

    base = _from_pretrained(auto, folder, "auto", config)
    model = peft.PeftModel.from_pretrained(base, adapter_folder(options)).merge_and_unload()
    return model.to(torch.float32).eval()


def _round_as_built(model, target, symmetric_experts: bool | None) -> None:
    """Rounds, in place, every weight the build quantizes: the token lookup where the build
    quantizes it on its own, the decoder's Linears, stacked experts and per-layer token tables."""
    import torch

    q = target.quantization
    was_tied = _tied(model)
    untied = _untie_float_lookup(model, q, target.provider.quantized_gather and not target.standard_ops)
    bits = lookup_bits(q, target, untied, was_tied)
    if bits is not None:
        round_lookup(model.get_input_embeddings().weight.numpy(), bits, q)
    _round_modules(model, target, symmetric_experts, getattr(model.config.get_text_config(), "hidden_size", None))
    for name, module in model.named_modules():
        if is_per_layer_table(name):
            round_per_layer_table(module.weight.numpy(), q)


def _round_modules(model, target, symmetric_experts: bool | None, hidden: int | None) -> None:
    """Rounds, in place, the Linears and stacked experts of `model` (any module tree) as the build does."""
    import torch

    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear):
            round_linear(name, module.weight.numpy(), target)  # shares memory with the parameter
    for name, module in model.named_modules():
        experts = _stacked_experts(name, module)
        if experts is not None:
            up, down = experts
            transposed = experts_transposed(up.shape, down.shape, hidden, getattr(module, "is_transposed", None))
            round_experts(name, up.data.numpy(), down.data.numpy(), transposed, target, symmetric_experts)


def _stacked_experts(name: str, module):
    """A transformers experts module's 3-D parameters (gate_up_proj, or up_proj where the experts
    have no gate, and down_proj) outside the vision model; None for any other module."""
    import torch

    def stacked(attribute: str):
        parameter = getattr(module, attribute, None)
        return parameter if isinstance(parameter, torch.Tensor) and parameter.dim() == 3 else None

    up, down = stacked("gate_up_proj"), stacked("down_proj")
    if up is None:
        up = stacked("up_proj")
    if up is None or down is None or in_float_tower(name):
        return None
    return up, down


def _tied(model) -> bool:
    head = model.get_output_embeddings()
    return head is not None and model.get_input_embeddings().weight is head.weight


def _untie_float_lookup(model, q, quantized_gather: bool = True) -> bool:
    """An int8 build's tied vocabulary keeps a float lookup table beside its 8-bit lm_head
    (builder/blocks/lm_head.py), as every build for a provider without GatherBlockQuantized does:
    rounding lm_head in place must not round the embedding that transformers ties to it. (An int4
    build gathers from lm_head's own codes: rounded alike.)"""
    import torch

    embed, head = model.get_input_embeddings(), model.get_output_embeddings()
    untie = (q.bits == 8 or not quantized_gather) and head is not None and embed.weight is head.weight
    if untie:
        embed.weight = torch.nn.Parameter(embed.weight.detach().clone(), requires_grad=False)
    return untie


def _from_pretrained(auto, folder: Path, dtype, config: dict):
    """transformers' model of the checkpoint, never with the checkpoint's own code: trust_remote_code
    is False (left unset, transformers asks on a terminal and runs the code on a "y") and only
    safetensors are read (never a pickle)."""
    try:
        return auto.from_pretrained(folder, dtype=dtype, trust_remote_code=False, use_safetensors=True)
    except ValueError:
        if not config.get("auto_map"):
            raise
        raise BuildError(f"--verify: transformers can load {folder} only with its own code (auto_map in "
                         "config.json), which builder never runs") from None


def _cache_argument(model, output) -> dict:
    """The cache a forward returned, as the next forward's keyword: transformers 5.25 renamed it
    `cache` (past_key_values still works there, with a deprecation warning on the user's terminal
    until 5.40); 5.23 knows only past_key_values."""
    import inspect

    if "cache" in inspect.signature(model.forward).parameters:
        return {"cache": output.cache}
    return {"past_key_values": output.past_key_values}


def _prompt(folder: Path, vocab: int) -> list[int]:
    """The prompt's token ids from the checkpoint's tokenizer, else fixed ids (the comparison is of
    the models; the prompt only needs to be plausible)."""
    try:
        import transformers

        # trust_remote_code=False: a tokenizer_config.json `auto_map` naming a Python file in the
        # folder is never imported (left unset, transformers asks on a terminal and runs it on a "y").
        tokenizer = transformers.AutoTokenizer.from_pretrained(folder, trust_remote_code=False)
        ids = tokenizer.encode(PROMPT_TEXT)
        if ids and max(ids) < vocab:
            return ids
    except Exception as e:  # noqa: BLE001 - no usable tokenizer: fall back to fixed ids
        if _has_auto_map(folder / "tokenizer_config.json"):
            log.warning("--verify: the tokenizer needs its own code (auto_map in tokenizer_config.json), which "
                        "builder never runs; comparing on fixed token ids")
        else:
            log.debug("--verify: no usable tokenizer (%s); comparing on fixed token ids", type(e).__name__)
    return fallback_prompt(vocab)


def _has_auto_map(path: Path) -> bool:
    try:
        return bool(json.loads(path.read_text(encoding="utf-8")).get("auto_map"))
    except (OSError, ValueError, AttributeError, RecursionError):  # no such file, not JSON, not an object
        return False
