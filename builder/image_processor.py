"""The image processor file onnxruntime-genai reads (onnxruntime-extensions' JSON: decode → resize →
rescale → normalize → channel-first), written from a checkpoint's preprocessor_config.json.

It is not Hugging Face's processor_config.json, which some checkpoints also ship with other
content: the output names it PROCESSOR_FILE so that neither shadows the other. onnxruntime-extensions
decodes images to RGB itself (a second RGB conversion would swap the channels back), and its Resize
takes Pillow's filters by name.
"""

from __future__ import annotations

import math
from typing import Any

from builder.errors import BuildError

PROCESSOR_FILE = "vision_processor.json"

# Pillow's resample codes (Image.Resampling) -> onnxruntime-extensions' Resize interpolation names.
INTERPOLATION = {0: "NEAREST", 1: "LANCZOS", 2: "LINEAR", 3: "CUBIC"}
PILLOW_NAMES = {4: "BOX", 5: "HAMMING"}


def extensions_processor(pre: dict[str, Any], image_size: int, name: str, defaults: dict[str, Any]) -> dict[str, Any]:
    """The processor JSON resizing to `image_size` squares; `pre` is preprocessor_config.json, whose
    missing keys take `defaults` (the transformers image processor's). Refuses, naming the key, what
    onnxruntime-extensions cannot do the same way."""
    pre = {**defaults, **{k: v for k, v in pre.items() if v is not None}}
    size = pre.get("size") or {}
    height, width = size.get("height", image_size), size.get("width", image_size)
    if (height, width) != (image_size, image_size):
        raise BuildError(f"preprocessor_config.json resizes to {height}x{width}, but the vision model takes "
                         f"{image_size}x{image_size} images")
    if not pre.get("do_resize", True) or not pre.get("do_rescale", True):
        raise BuildError("preprocessor_config.json turns off do_resize or do_rescale; onnxruntime-genai's image "
                         "processor always resizes and rescales")
    if pre.get("do_pan_and_scan"):
        raise BuildError("preprocessor_config.json sets do_pan_and_scan; onnxruntime-genai's Gemma 3 processor "
                         "sends one 896-pixel view per image (pass --text-only, or turn pan-and-scan off)")
    interpolation = _interpolation(pre, default=2)
    transforms: list[dict[str, Any]] = [
        _op("decode_image", "DecodeImage", color_space="RGB"),
        _op("resize", "Resize", interpolation=interpolation, width=width, height=height,
            keep_aspect_ratio=0),
        _op("rescale", "Rescale", rescale_factor=float(pre.get("rescale_factor", 1 / 255))),
    ]
    if pre.get("do_normalize", True):
        transforms.append(_op("normalize", "Normalize", mean=[float(m) for m in pre["image_mean"]],
                              std=[float(s) for s in pre["image_std"]]))
    transforms.append(_op("to_channel_first", "Permute3D", dims=[2, 0, 1]))
    return {"processor": {"name": name, "transforms": transforms}}


def _op(name: str, kind: str, **attrs: Any) -> dict[str, Any]:
    operation: dict[str, Any] = {"name": name, "type": kind}
    if attrs:
        operation["attrs"] = attrs
    return {"operation": operation}


def patched_processor(pre: dict[str, Any], name: str, model_flag: str, defaults: dict[str, Any],
                      patch_size: int, merge_size: int, temporal_patch_size: int) -> dict[str, Any]:
    """The processor JSON of Qwen-VL's dynamic resolution (onnxruntime-genai's QwenImageProcessor):
    resize to the nearest multiple of patch·merge within min/max pixels (smart_resize), rescale,
    normalize, and cut into flattened patches in merge order (PatchImage), as transformers'
    Qwen2VLImageProcessor. `pre` is preprocessor_config.json (its missing keys take `defaults`);
    `model_flag` (qwen2_5_vl, qwen3_vl) is Normalize's channel-order switch: it reads the pixels
    BGR, so ConvertRGB (which swaps the decoder's RGB) comes before it. The patch, merge and
    temporal sizes are the vision model's; a preprocessor_config.json that disagrees is refused."""
    given = {k: v for k, v in pre.items() if v is not None}
    size = given.get("size") if isinstance(given.get("size"), dict) else {}
    # transformers' Qwen2VLImageProcessor: min_pixels / max_pixels override size's edges.
    min_pixels = given.get("min_pixels", size.get("shortest_edge", defaults.get("min_pixels")))
    max_pixels = given.get("max_pixels", size.get("longest_edge", defaults.get("max_pixels")))
    pre = {**defaults, **given}
    for key, value in (("min_pixels", min_pixels), ("max_pixels", max_pixels)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise BuildError(f"preprocessor_config.json: {key} is {value!r}; expected a positive integer")
    for key, expected in (("patch_size", patch_size), ("merge_size", merge_size),
                          ("temporal_patch_size", temporal_patch_size)):
        if pre.get(key, expected) != expected:
            raise BuildError(f"preprocessor_config.json: {key} is {pre[key]!r}, but the vision model's is {expected}")
    if not pre.get("do_resize", True) or not pre.get("do_rescale", True):
        raise BuildError("preprocessor_config.json turns off do_resize or do_rescale; onnxruntime-genai's image "
                         "processor always resizes and rescales")
    for key in ("image_mean", "image_std"):
        values = pre[key]
        if (not isinstance(values, list) or len(values) != 3
                or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in values)
                or (key == "image_std" and 0 in values)):
            raise BuildError(f"preprocessor_config.json: {key} is {values!r}; expected three finite numbers (RGB)"
                             + (", none 0" if key == "image_std" else ""))
    if not pre.get("do_normalize", True):
        raise BuildError("preprocessor_config.json turns off do_normalize; onnxruntime-genai's Qwen-VL processor "
                         "always normalizes")
    interpolation = _interpolation(pre, default=3)
    transforms = [
        _op("decode_image", "DecodeImage", color_space="RGB"),
        _op("convert_to_rgb", "ConvertRGB"),
        _op("resize", "Resize", interpolation=interpolation, smart_resize=1, min_pixels=min_pixels,
            max_pixels=max_pixels, patch_size=patch_size, merge_size=merge_size),
        _op("rescale", "Rescale", rescale_factor=float(pre.get("rescale_factor", 1 / 255))),
        _op("normalize", "Normalize", mean=[float(m) for m in pre["image_mean"]],
            std=[float(s) for s in pre["image_std"]], **{model_flag: 1}),
        _op("patch_image", "PatchImage", patch_size=patch_size, temporal_patch_size=temporal_patch_size,
            merge_size=merge_size),
    ]
    return {"processor": {"name": name, "transforms": transforms}}


def _interpolation(pre: dict[str, Any], default: int) -> str:
    """onnxruntime-extensions' Resize interpolation for the processor's Pillow `resample` code
    (`default`: the model's processor class's), or one line refusing one it does not have."""
    resample = pre.get("resample", default)
    if resample not in INTERPOLATION:
        raise BuildError(f"preprocessor_config.json resample {resample} ({PILLOW_NAMES.get(resample, 'unknown')}): "
                         f"onnxruntime-extensions resizes only with {', '.join(INTERPOLATION.values())}")
    return INTERPOLATION[resample]
