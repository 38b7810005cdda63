"""--verify: the built model in ONNX Runtime against the checkpoint in transformers, on one prompt.

Needs the test extras (torch, transformers, onnxruntime); imported only when asked for. For int4 /
int8 builds the reference runs on the same rounding of the original weights (fake quantization
with this package's quantizer, proved bit-exact with ONNX Runtime's), so the comparison measures
the graph, not the expected quantization error.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import re
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from builder.blocks.moe import expert_block_size
from builder.errors import BuildError
from builder.genai_config import config_entries
from builder.options import BuildOptions
from builder.quantize import dequantize, quantize

log = logging.getLogger("builder")

PROMPT_TEXT = "The capital of France is Paris. The capital of Germany is"


@dataclass(frozen=True)
class Verdict:
    max_abs_diff: float
    relative: float
    cosine: float
    top1: float
    passed: bool
    prompt: str = ""  # what was compared beyond the text prompt ("with an image")

    def __str__(self) -> str:
        return (f"verify{f' ({self.prompt})' if self.prompt else ''}: max |diff| {self.max_abs_diff:.3g} "
                f"(relative {self.relative:.3g}), cosine {self.cosine:.6f}, "
                f"top-1 agreement {self.top1:.0%} -> {'PASS' if self.passed else 'FAIL'}")


# cosine floor and top-1 floor per activation/weight format: fp32 is exact up to summation order;
# fp16 rounds every op; int4/int8 at accuracy level 4 also round activations to int8, and the
# reference already has the weights' rounding, so int8 gets int4's cosine floor (it had 0.999,
# which a tiny random Gemma 3 missed at 0.99886 with 97% top-1, passing at accuracy level 0).
TOLERANCE = {"fp32": (0.99999, 1.0), "fp16": (0.999, 0.9), "int8": (0.998, 0.9), "int4": (0.998, 0.8)}


# Modules of an image-and-text checkpoint that its package keeps in float (the vision model).
FLOAT_TOWERS = ("vision_tower", "multi_modal_projector", "visual")

# The Linear modules of transformers' mixtures of experts that the build keeps in float, as every
# router (HunYuan's gate.wg, PhiMoE's router, Qwen2-MoE's shared-expert gate): not rounded here.
FLOAT_ROUTERS = (".mlp.gate", ".mlp.gate.wg", ".mlp.router", ".mlp.shared_expert_gate",
                 # a gated DeltaNet's per-head gate projections (Qwen3.5, Qwen3-Next): float in every
                 # build, as architectures/qwen3_5.py writes them (quantizing them moves the logits)
                 ".linear_attn.in_proj_a", ".linear_attn.in_proj_b", ".linear_attn.in_proj_ba",
                 # MLA's kv_b_proj, absorbed into per-head MatMuls (architectures/deepseek_v3.py): float
                 ".self_attn.kv_b_proj",
                 ".feed_forward.router")  # Llama 4's

# What --verify imports; checked before building (find_spec imports nothing).
REQUIREMENTS = ("torch", "transformers", "onnxruntime")


def _cache_argument(model, output) -> dict:
    """The cache a forward returned, as the next forward's keyword: transformers 5.25 renamed it
    `cache` (past_key_values still works there, with a deprecation warning on the user's terminal
    until 5.40); 5.23 knows only past_key_values."""
    import inspect

    if "cache" in inspect.signature(model.forward).parameters:
        return {"cache": output.cache}
    return {"past_key_values": output.past_key_values}


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


def _graph_linears(name: str, rows: int) -> list[tuple[str, tuple[str, ...], slice]]:
    """The graph's linear layers a transformers Linear feeds: (module path, the checkpoint modules it
    is made of, its rows). q/k/v become one qkv_proj; Phi-3's gate_up_proj becomes gate_proj and
    up_proj; Phi's self_attn.dense is the graph's o_proj; a multimodal prefix is dropped."""
    module = _graph_path(name)
    module = re.sub(r"\.self_attn\.dense$", ".self_attn.o_proj", module)  # Phi's attention output
    fused = re.match(r"(.*)\.(q|k|v)_proj$", name)
    if fused:
        parts = tuple(f"{fused.group(1)}.{p}_proj" for p in "qkv")
        return [(re.sub(r"\.(q|k|v)_proj$", ".qkv_proj", module), parts, slice(None))]
    if name.endswith(".gate_up_proj"):
        half = rows // 2
        return [(module[: -len("gate_up_proj")] + "gate_proj", (name,), slice(0, half)),
                (module[: -len("gate_up_proj")] + "up_proj", (name,), slice(half, rows))]
    return [(module, (name,), slice(None))]


def _graph_path(name: str) -> str:
    """A transformers module's path in the graph: a multimodal checkpoint's text prefix dropped."""
    return name.replace("language_model.model.", "model.").replace("model.language_model.", "model.")


def _reference_model(folder: Path, options: BuildOptions, quiet: bool = False):
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
        model = _from_pretrained(auto, folder, torch.float32, config).eval()
    else:  # the reference is peft's own merge, made in the base's dtype as builder's is (builder/inputs/lora.py)
        import peft

        from builder.inputs.lora import adapter_folder

        base = _from_pretrained(auto, folder, "auto", config)
        model = peft.PeftModel.from_pretrained(base, adapter_folder(options)).merge_and_unload()
        model = model.to(torch.float32).eval()
    target = options.target().with_layers(model.config.get_text_config().num_hidden_layers)
    q = target.quantization
    if q is not None:
        with torch.no_grad():
            was_tied = _tied(model)
            untied = _untie_float_lookup(model, q, target.provider.quantized_gather and not target.standard_ops)
            bits = _lookup_bits(q, target, untied, was_tied)
            if bits is not None:  # a lookup table quantized on its own (blocks/embedding.py, vocabulary.py)
                table = model.get_input_embeddings().weight.numpy()
                m = quantize(table, bits, q.block_size, q.symmetric, np.float32, q.method)
                table[...] = dequantize(m, table.shape[1], bits)
            for name, module in model.named_modules():
                if (not isinstance(module, torch.nn.Linear) or any(part in name for part in FLOAT_TOWERS)
                        or name.endswith(FLOAT_ROUTERS)):
                    continue
                w = module.weight.numpy()  # shares memory with the parameter: edited in place
                for graph_module, sources, rows in _graph_linears(name, w.shape[0]):
                    if target.quantizes(graph_module, sources):
                        bits = q.bits_for(graph_module, sources)
                        m = quantize(w[rows], bits, q.block_size, q.symmetric, np.float32, q.method)
                        w[rows] = dequantize(m, w.shape[1], bits)
            for name, module in model.named_modules():
                _round_stacked_experts(name, module, target, model.config)
                if name.endswith("embed_tokens_per_layer"):  # Gemma 4's, gathered from 8-bit blocks (gemma4.py)
                    table = module.weight.numpy()
                    m = quantize(table, 8, q.block_size, True, np.float32, "rtn")
                    table[...] = dequantize(m, table.shape[1], 8)
    return model


def _tied(model) -> bool:
    head = model.get_output_embeddings()
    return head is not None and model.get_input_embeddings().weight is head.weight


def _lookup_bits(q, target, untied: bool, was_tied: bool) -> int | None:
    """The bits the build quantizes the token lookup table to on its own, or None where it is float
    or rounded with lm_head: a standard-ops build's tied lookup (8-bit: ONNX's Gather has no 4-bit
    type); an untied table with --quantize-embeddings, or among an int4 build's int8 layers (the
    mixed preset's `*embed_tokens`), where the provider has GatherBlockQuantized."""
    if was_tied:
        return target.lookup_bits(q.bits) if untied and target.standard_ops else None
    if not (target.provider.quantized_gather or target.standard_ops):
        return None
    bits = q.bits_for("model.embed_tokens", ("model.embed_tokens",))
    if (q.embeddings and q.bits == 4) or (q.bits == 4 and bits == 8):
        return target.lookup_bits(bits)
    return None


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


def _round_stacked_experts(name: str, module, target, config) -> None:
    """Rounds, in place, a transformers experts module's stacked gate_up_proj and down_proj as the
    build's QMoE holds them (builder/blocks/moe.py, gpt_oss_experts.py): each expert's matrix alone,
    [out, in] rows blocked along the input, at the block size expert_block_size picks for the
    layer, with the precision's bits (no int8_layers: a QMoE node has one width), method and
    symmetry (gpt-oss's experts: symmetric always). transformers 5 keeps these as 3-D parameters,
    [E, 2I, H] and [E, H, I], or [E, H, 2I] and [E, I, H] where the module says `is_transposed`
    (gpt-oss: x @ W). Row order within a matrix (gate/up concatenated or interleaved) does not
    matter to a row-wise rounding. Nemotron-H's relu² experts have `up_proj` [E, I, H] in
    gate_up_proj's place."""
    up, down = getattr(module, "gate_up_proj", None), getattr(module, "down_proj", None)
    if not _is_3d(up):
        up = getattr(module, "up_proj", None)
    if not (_is_3d(up) and _is_3d(down)) or any(part in name for part in FLOAT_TOWERS):
        return
    if not target.quantizes(_graph_path(name), (name,)):
        return
    # gpt-oss says so; Llama 4's experts are x @ W too ([E, H, 2I], [E, I, H]) without saying it.
    transposed = bool(getattr(module, "is_transposed", False)) or config.model_type in ("llama4", "llama4_text")
    h, i = (down.shape[2], down.shape[1]) if transposed else (down.shape[1], down.shape[2])
    q = target.quantization
    if config.model_type == "gpt_oss":  # builder/blocks/gpt_oss_experts.py: no zero points
        q = replace(q, symmetric=True)
    q = replace(q, block_size=expert_block_size(h, i, q))
    for stacked in (up, down):
        for expert in stacked.data.numpy():  # views of the parameter: edited in place
            rows = expert.T if transposed else expert  # [out, in]
            m = quantize(np.ascontiguousarray(rows), q.bits, q.block_size, q.symmetric, np.float32, q.method)
            rows[...] = dequantize(m, rows.shape[1], q.bits)


def _is_3d(parameter) -> bool:
    import torch

    return isinstance(parameter, torch.Tensor) and parameter.dim() == 3


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


def _has_auto_map(path: Path) -> bool:
    try:
        return bool(json.loads(path.read_text(encoding="utf-8")).get("auto_map"))
    except (OSError, ValueError, AttributeError, RecursionError):  # no such file, not JSON, not an object
        return False


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
    return [int(i) % vocab for i in (1, 415, 5565, 302, 4843, 349, 5465, 28723, 415, 5565, 302)]


def verify(options: BuildOptions, output: Path, folder: Path, quiet: bool = False) -> list[Verdict]:
    """The prompt's logits and the next step's, ONNX Runtime against transformers; for an
    image-and-text package, also with an image in the prompt (vision -> embedding -> decoder)."""
    check_verifiable(options)
    genai = json.loads((output / "genai_config.json").read_text())["model"]
    if genai["type"] == "whisper":  # a decoder without attention_mask, fed by an encoder
        raise BuildError(f"--verify runs decoders that read input_ids and an attention mask, not Whisper's; "
                         f"the package in {output} is written (tests/test_whisper.py compares it with transformers)")
    import onnxruntime as ort
    import torch

    model = _reference_model(folder, options, quiet)
    decoder = genai["decoder"]
    session_options = ort.SessionOptions()
    for key, value in config_entries(decoder.get("session_options", {})).items():  # as onnxruntime-genai sets them
        session_options.add_session_config_entry(key, value)
    session = ort.InferenceSession(_cpu_model(output / "model.onnx", session_options), session_options,
                                   providers=["CPUExecutionProvider"])
    window = decoder.get("sliding_window") or {}
    ids = _prompt(folder, genai["vocab_size"])
    dtype = np.float16 if options.resolved_io_dtype == "fp16" else np.float32
    names = [o.name for o in session.get_outputs()]
    embed = _embedder(output, genai, decoder["hidden_size"])

    # A hybrid's convolution layers (LFM2) carry a conv state instead of KV, linear-attention and
    # Mamba layers (Qwen3.5, Granite 4.0) a recurrent state too, Falcon-H1's both beside KV,
    # Nemotron-H's MLP and expert layers nothing: zeros of the declared shape first, as genai; KV where the
    # layer has it.
    inputs = {i.name for i in session.get_inputs()}
    shapes = {i.name: i.shape for i in session.get_inputs()}
    kv_dtype = {"tensor(int8)": np.int8}.get(next((i.type for i in session.get_inputs() if i.name.startswith("past_key_values.")), ""), dtype)
    states = {i.name: [1 if isinstance(d, str) else d for d in i.shape] for i in session.get_inputs()
              if i.name.startswith("past.")}

    def run(feed, past, total):
        feed = {**feed, "attention_mask": np.ones((1, total), np.int64)}
        if "position_ids" in inputs and "position_ids" not in feed:  # a provider's rotary (DirectML's), as genai
            new = next(iter(feed.values())).shape[1]
            feed["position_ids"] = np.arange(total - new, total, dtype=np.int64)[None]
        for i in range(decoder["num_hidden_layers"]):
            for name in (n for n in states if n.startswith(f"past.{i}.")):
                feed[name] = past[name.replace("past", "present", 1)] if past else np.zeros(states[name], dtype)
            if f"past_key_values.{i}.key" not in inputs:
                continue
            cap = window["window_size"] if i in window.get("layers", []) else 0
            for kind in ("key", "value"):
                name = f"past_key_values.{i}.{kind}"
                _, heads, _, size = shapes[name]  # the layer's own (Gemma 4's full layers differ)
                feed[name] = past[f"present.{i}.{kind}"] if past else np.zeros((1, heads, cap, size), kv_dtype)
        return dict(zip(names, session.run(None, feed)))

    def compare(prompt_ids, extra, prefill_feed, prompt="", positions=None):
        with torch.no_grad():
            ref = model(input_ids=torch.tensor([prompt_ids]), use_cache=True, **extra)
            nxt = int(ref.logits[0, -1].argmax())
            ref_step = model(input_ids=torch.tensor([[nxt]]), use_cache=True, **_cache_argument(model, ref))
        step_feed = embed(np.array([[nxt]], np.int64))
        if len(shapes.get("position_ids", ())) == 3:  # Qwen-VL's M-RoPE rows, as genai computes them; text: 0, 1, …
            if positions is None:
                positions = np.broadcast_to(np.arange(len(prompt_ids)), (3, 1, len(prompt_ids)))
            prefill_feed = {**prefill_feed, "position_ids": np.ascontiguousarray(positions, np.int64)}
            step_feed["position_ids"] = np.full((3, 1, 1), positions.max() + 1, np.int64)
        first = run(prefill_feed, None, len(prompt_ids))
        second = run(step_feed, first, len(prompt_ids) + 1)
        got = np.concatenate([first["logits"][0], second["logits"][0]]).astype(np.float64)
        rows = first["logits"].shape[1]  # the prompt's positions, or its last alone (--prune-lm-head)
        want = np.concatenate([ref.logits[0, -rows:].numpy(), ref_step.logits[0].numpy()]).astype(np.float64)
        return _verdict(got, want, options, prompt)

    verdicts = [compare(ids, {}, embed(np.array([ids], np.int64)))]
    if "vision" in genai and "image_grid_thw" in genai["vision"]["inputs"]:
        image_ids, extra, positions = _grid_image_prompt(model, genai, ids)
        features = _image_features(output, genai, extra["pixel_values"].numpy(), extra["image_grid_thw"].numpy())
        feed = embed(np.array([image_ids], np.int64), features)
        verdicts.append(compare(image_ids, extra, feed, "with an image", positions))
    elif "vision" in genai:
        image_ids, pixels = _image_prompt(model.config, ids)
        features = _image_features(output, genai, pixels)
        feed = embed(np.array([image_ids], np.int64), features)
        verdicts.append(compare(image_ids, {"pixel_values": torch.from_numpy(pixels)}, feed, "with an image"))
    return verdicts


def _verdict(got: np.ndarray, want: np.ndarray, options: BuildOptions, prompt: str) -> Verdict:
    diff = float(np.abs(got - want).max())
    cosine = float((got * want).sum() / (np.linalg.norm(got) * np.linalg.norm(want)))
    top1 = float((got.argmax(-1) == want.argmax(-1)).mean())
    kind = options.precision if options.precision in TOLERANCE else "fp16"
    if options.precision in ("int4", "int8") and options.resolved_io_dtype == "fp16":
        kind = "int4"
    if options.kv_cache != "float" and kind in ("fp32", "fp16"):  # the cache rounded to int8 (transformers' is not)
        kind = "int8"
    min_cos, min_top1 = TOLERANCE[kind]
    return Verdict(diff, diff / float(np.abs(want).max()), cosine, top1, cosine >= min_cos and top1 >= min_top1,
                   prompt)


def _image_prompt(config, ids: list[int]) -> tuple[list[int], np.ndarray]:
    """The text prompt followed by one image's tokens (start, the image tokens, end: what Gemma 3's
    processor writes, less its blank lines), and a smooth synthetic image already normalized to
    [-1, 1]. Both sides attend causally over the image (transformers without token_type_ids, as
    the runtime does), so this checks the package, not that known difference."""
    image = [config.boi_token_index, *[config.image_token_index] * config.mm_tokens_per_image, config.eoi_token_index]
    size = config.vision_config.image_size
    y, x = np.mgrid[0:size, 0:size] / size
    pixels = np.stack([np.sin(6 * x + 2 * c) * np.cos(4 * y - c) for c in range(3)])[None].astype(np.float32)
    return [*ids, *image], pixels


def _grid_image_prompt(model, genai: dict, ids: list[int]):
    """Qwen-VL: the text prompt followed by one image of 8 x 8 patches as genai's processor writes
    it (vision start, t·h·w / merge² image-pad tokens, vision end), smooth synthetic patches, and
    the M-RoPE positions transformers computes for them (get_rope_index); returns (ids, the
    reference's image inputs, positions (3, 1, S))."""
    import torch

    config, vision = model.config, genai["vision"]
    merge, patch = vision["spatial_merge_size"], vision["patch_size"]
    grid = np.array([[1, 8, 8]], np.int64)
    image = [config.vision_start_token_id, *[config.image_token_id] * (64 // merge ** 2), config.vision_end_token_id]
    width = 3 * config.vision_config.temporal_patch_size * patch * patch
    x = np.arange(64)[:, None] / 64 + np.arange(width)[None, :] / width
    pixels = np.sin(6 * x).astype(np.float32)  # (patches, C·T·P·P)
    image_ids = torch.tensor([[*ids, *image]])
    extra = {"pixel_values": torch.from_numpy(pixels), "image_grid_thw": torch.from_numpy(grid),
             "mm_token_type_ids": (image_ids == config.image_token_id).int()}
    with torch.no_grad():
        positions, _ = model.model.get_rope_index(image_ids, extra["mm_token_type_ids"], extra["image_grid_thw"])
    return image_ids[0].tolist(), extra, positions.numpy()


def _image_features(output: Path, genai: dict, pixels: np.ndarray, grid: np.ndarray | None = None) -> np.ndarray:
    import onnxruntime as ort

    session = ort.InferenceSession(str(output / genai["vision"]["filename"]), providers=["CPUExecutionProvider"])
    kind = {i.name: i.type for i in session.get_inputs()}["pixel_values"]
    feed = {"pixel_values": pixels.astype(np.float16 if kind == "tensor(float16)" else np.float32)}
    if grid is not None:
        feed["image_grid_thw"] = grid
    return session.run(None, feed)[0]


def _embedder(output: Path, genai: dict, hidden: int):
    """The decoder's token input for ids: input_ids, or a multimodal package's embedding model's
    inputs_embeds (with the image features given, else none: a text-only step)."""
    import onnxruntime as ort

    if "embedding" not in genai:
        return lambda ids, features=None: {"input_ids": ids}
    session = ort.InferenceSession(str(output / genai["embedding"]["filename"]), providers=["CPUExecutionProvider"])
    kind = {i.name: i.type for i in session.get_inputs()}["image_features"]
    rank = len(next(i for i in session.get_inputs() if i.name == "image_features").shape)
    empty = np.zeros((1, 0, hidden)[3 - rank:], np.float16 if kind == "tensor(float16)" else np.float32)

    def embed(ids, features=None):
        rows = empty if features is None else features.astype(empty.dtype)
        return {"inputs_embeds": session.run(None, {"input_ids": ids, "image_features": rows})[0]}

    return embed
