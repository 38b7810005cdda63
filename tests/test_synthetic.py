"""Every preset of scripts/make_synthetic_checkpoint.py, shrunk to a few MB with its layout kept
(names, fused tensors, multimodal parts, rope settings), builds: the benchmark checkpoints are
ones the architectures accept, and builds of them account for every tensor."""

import copy
import sys
from pathlib import Path

import onnxruntime as ort
import pytest
from helpers import build

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
from make_synthetic_checkpoint import PRESETS, TENSORS, write_checkpoint  # noqa: E402

SHRINK = {"vocab_size": 512, "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 3,
          "max_position_embeddings": 256, "original_max_position_embeddings": 64,
          "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 128, "max_window_layers": 3,
          "moe_num_experts": 4, "moe_k": 2}


def shrunk(config: dict) -> dict:
    """The preset with small dimensions: 4 query heads of 64, KV heads in the preset's ratio."""
    c = copy.deepcopy(config)
    text = c.get("text_config", c)
    heads, kv = text["num_attention_heads"], text["num_key_value_heads"]
    text.update({k: v for k, v in SHRINK.items() if k in text})
    text.update(hidden_size=256, num_attention_heads=4, num_key_value_heads=max(1, 4 * kv // heads))
    if "head_dim" in text:
        text["head_dim"] = 64
    if text.get("sliding_window"):
        text["sliding_window"] = min(text["sliding_window"], 16)
    if "partial_rotary_factor" in text:  # rotate a multiple of 16 of the 64 dims, as the preset does of its head
        rotated = max(16, round(int(64 * text["partial_rotary_factor"]) / 16) * 16)  # phi-2's 0.4 -> 0.5
        text["partial_rotary_factor"] = rotated / 64
    for key in ("no_rope_layers", "layer_types"):  # per-layer lists follow the layer count
        if isinstance(text.get(key), list):
            text[key] = text[key][: text["num_hidden_layers"]]
    rope = text.get("rope_scaling") or {}
    if "short_factor" in rope:  # one factor per rotated pair of the 64-wide head
        pairs = int(64 * text.get("partial_rotary_factor", 1.0)) // 2
        rope["short_factor"], rope["long_factor"] = [1.0] * pairs, [2.0] * pairs
    if "vision_config" in c:
        # 16x16 patches: the 256 image tokens onnxruntime-genai expects, unpooled.
        patch = c["vision_config"].get("patch_size", 14)
        c["vision_config"].update(hidden_size=32, intermediate_size=64, num_hidden_layers=1, image_size=16 * patch)
    return c


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_preset_layout_builds(name, tmp_path):
    config = shrunk(PRESETS[name])
    write_checkpoint(tmp_path / "src", config)
    out = build(tmp_path / "src", tmp_path / "out", "-p", "int4")
    session = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    assert session.get_outputs()[0].name == "logits"
    assert sum(1 for _ in TENSORS[config["model_type"]](config)) > 10
