"""What --verify compares on and how it judges: the prompts (text, and one synthetic image in the
layout the checkpoint's config declares) and the verdict on two sets of logits, against tolerances
per precision. numpy only: transformers and ONNX Runtime stay in builder/verify.py."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from builder.options import BuildOptions

PROMPT_TEXT = "The capital of France is Paris. The capital of Germany is"

# The prompt where no tokenizer serves (taken modulo the vocabulary): the comparison is of the
# models, the prompt only needs to be plausible.
FALLBACK_IDS = (1, 415, 5565, 302, 4843, 349, 5465, 28723, 415, 5565, 302)

# cosine floor and top-1 floor per activation/weight format: fp32 is exact up to summation order;
# fp16 rounds every op; int4/int8 at accuracy level 4 also round activations to int8, and the
# reference already has the weights' rounding, so int8 gets int4's cosine floor (it had 0.999,
# which a tiny random Gemma 3 missed at 0.99886 with 97% top-1, passing at accuracy level 0).
TOLERANCE = {"fp32": (0.99999, 1.0), "fp16": (0.999, 0.9), "int8": (0.998, 0.9), "int4": (0.998, 0.8)}

# The image of a grid-patched vision model's prompt: one frame of 8 x 8 patches.
GRID = (1, 8, 8)


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


def verdict(got: np.ndarray, want: np.ndarray, options: BuildOptions, prompt: str = "") -> Verdict:
    """The package's logits `got` against transformers' `want` (rows: positions), judged by the
    tolerance of the build's formats."""
    diff = float(np.abs(got - want).max())
    cosine = float((got * want).sum() / (np.linalg.norm(got) * np.linalg.norm(want)))
    top1 = float((got.argmax(-1) == want.argmax(-1)).mean())
    min_cos, min_top1 = TOLERANCE[_tolerance_kind(options)]
    return Verdict(diff, diff / float(np.abs(want).max()), cosine, top1, cosine >= min_cos and top1 >= min_top1,
                   prompt)


def _tolerance_kind(options: BuildOptions) -> str:
    kind = options.precision if options.precision in TOLERANCE else "fp16"
    if options.precision in ("int4", "int8") and options.resolved_io_dtype == "fp16":
        kind = "int4"
    if options.kv_cache != "float" and kind in ("fp32", "fp16"):  # the cache rounded to int8 (transformers' is not)
        kind = "int8"
    return kind


def fallback_prompt(vocab: int) -> list[int]:
    return [int(i) % vocab for i in FALLBACK_IDS]


def image_prompt(config, ids: list[int]) -> tuple[list[int], np.ndarray]:
    """The text prompt followed by one image's tokens (start, the image tokens, end: what Gemma 3's
    processor writes, less its blank lines), and a smooth synthetic image already normalized to
    [-1, 1]. Both sides attend causally over the image (transformers without token_type_ids, as
    the runtime does), so this checks the package, not that known difference."""
    image = [config.boi_token_index, *[config.image_token_index] * config.mm_tokens_per_image, config.eoi_token_index]
    size = config.vision_config.image_size
    y, x = np.mgrid[0:size, 0:size] / size
    pixels = np.stack([np.sin(6 * x + 2 * c) * np.cos(4 * y - c) for c in range(3)])[None].astype(np.float32)
    return [*ids, *image], pixels


def grid_image_prompt(config, vision: dict, ids: list[int]) -> tuple[list[int], np.ndarray, np.ndarray]:
    """Qwen-VL: the text prompt followed by one image of GRID's patches as genai's processor writes
    it (vision start, t·h·w / merge² image-pad tokens, vision end), and smooth synthetic patches;
    returns (ids, pixels (patches, C·T·P·P), grid [[t, h, w]])."""
    merge, patch = vision["spatial_merge_size"], vision["patch_size"]
    grid = np.array([GRID], np.int64)
    patches = int(np.prod(GRID))
    image = [config.vision_start_token_id, *[config.image_token_id] * (patches // merge ** 2),
             config.vision_end_token_id]
    width = 3 * config.vision_config.temporal_patch_size * patch * patch
    x = np.arange(patches)[:, None] / patches + np.arange(width)[None, :] / width
    return [*ids, *image], np.sin(6 * x).astype(np.float32), grid


__all__ = ["PROMPT_TEXT", "TOLERANCE", "Verdict", "fallback_prompt", "grid_image_prompt", "image_prompt", "verdict"]
