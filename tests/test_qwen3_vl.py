"""Qwen3-VL's image-and-text package (learned position grid interpolated to the image, DeepStack
features carried beside the embeddings, interleaved M-RoPE, q/k-norm decoder) against
transformers, through plain ONNX Runtime and onnxruntime-genai's multimodal API on real PNGs.
The Qwen2.5-VL tests' helpers (tests/test_qwen2_5_vl.py) run it."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from helpers import build, relative_error
from test_qwen2_5_vl import (
    EOS,
    IDS,
    IMAGE,
    NEW_TOKENS,
    PAD,
    arrays,
    assert_int4_decoder_matches,
    genai_generate,
    genai_inputs,
    pipeline_logits,
    png,
    transformers_generate,
    transformers_logits,
    vision_features,
    write_tokenizer,
)

from builder.cli import main

TEXT = dict(vocab_size=263, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, max_position_embeddings=1024, rms_norm_eps=1e-6,
            rope_parameters={"rope_type": "default", "mrope_section": [2, 3, 3], "mrope_interleaved": True,
                             "rope_theta": 5_000_000.0})
# Three blocks, DeepStack from the first two (added after decoder layers 0 and 1); a 6x6 learned
# position grid, interpolated to every image's grid.
VISION = dict(depth=3, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64, patch_size=16,
              num_position_embeddings=36, deepstack_visual_indexes=[0, 1], spatial_merge_size=2, temporal_patch_size=2)
PREPROCESSOR = {  # Qwen3-VL-8B-Instruct's preprocessor_config.json, with fewer pixels
    "size": {"shortest_edge": 4096, "longest_edge": 32 * 32 * 100}, "patch_size": 16, "temporal_patch_size": 2,
    "merge_size": 2, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
    "image_processor_type": "Qwen2VLImageProcessorFast", "processor_class": "Qwen3VLProcessor",
}
WIDTH = 3 * 64  # image features and inputs_embeds: [merged | ds 0 | ds 1]


def make_checkpoint(folder: Path) -> Path:
    """A random Qwen3VLForConditionalGeneration as transformers saves it (model.language_model.*,
    model.visual.*, lm_head), with its tokenizer and processor files."""
    torch.manual_seed(0)
    config = transformers.Qwen3VLConfig(
        text_config=TEXT, vision_config=VISION, image_token_id=IMAGE, video_token_id=IDS["<|video_pad|>"],
        vision_start_token_id=IDS["<|vision_start|>"], vision_end_token_id=IDS["<|vision_end|>"])
    config.text_config.bos_token_id, config.text_config.eos_token_id, config.text_config.pad_token_id = None, EOS, PAD
    model = transformers.Qwen3VLForConditionalGeneration(config)
    with torch.no_grad():  # norms away from 1 and biases away from 0, so that a wrong one shows
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5) if name.endswith("weight") else p.uniform_(-0.5, 0.5)
    model.save_pretrained(folder)
    (folder / "generation_config.json").write_text(json.dumps(
        {"eos_token_id": [EOS], "pad_token_id": PAD, "do_sample": False, "repetition_penalty": 1.0}))
    write_tokenizer(folder)
    (folder / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR))
    return folder


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("qwen3_vl"))


@pytest.fixture(scope="module")
def package(source, tmp_path_factory):
    return build(source, tmp_path_factory.mktemp("out") / "fp32", "-p", "fp32")


@pytest.fixture(scope="module")
def image(tmp_path_factory):
    # smart_resize by 32: 320 x 256 pixels, 20 x 16 patches, 80 tokens.
    return png(tmp_path_factory.mktemp("image") / "image.png", 333, 251)


@pytest.fixture(scope="module")
def reference(source):
    return transformers.Qwen3VLForConditionalGeneration.from_pretrained(source, dtype=torch.float32).eval()


def test_package_files_and_genai_config(package):
    model = json.loads((package / "genai_config.json").read_text())["model"]
    assert model["type"] == "qwen3_vl" and model["image_token_id"] == IMAGE
    assert (model["vision"]["patch_size"], model["vision"]["spatial_merge_size"]) == (16, 2)
    assert model["decoder"]["hidden_size"] == WIDTH  # genai sizes image_features and inputs_embeds by it
    assert model["decoder"]["inputs"]["position_ids"] == "position_ids"
    transforms = json.loads((package / "vision_processor.json").read_text())["processor"]["transforms"]
    assert transforms[2]["operation"]["attrs"]["min_pixels"] == 4096
    assert transforms[4]["operation"]["attrs"] == {"mean": [0.5] * 3, "std": [0.5] * 3, "qwen3_vl": 1}


def test_pixels_match_transformers_image_processor(package, source, image):
    from PIL import Image

    _, inputs = genai_inputs(package, image)
    ids, pixels, grid = arrays(inputs)
    expected = transformers.AutoImageProcessor.from_pretrained(source)(Image.open(image), return_tensors="np")
    assert grid.tolist() == expected["image_grid_thw"].tolist() == [[1, 16, 20]]
    assert np.abs(pixels - expected["pixel_values"]).max() < 1e-5
    assert ids.count(IMAGE) == 80


@pytest.mark.parametrize("grid", [(1, 16, 20), (1, 4, 4), (1, 6, 10), (2, 8, 6)])
def test_image_and_deepstack_features_match_transformers(package, reference, grid):
    t, h, w = grid
    pixels = np.random.default_rng(0).standard_normal((t * h * w, 3 * 2 * 16 * 16)).astype(np.float32)
    grid = np.array([grid], np.int64)
    got = vision_features(package, pixels, grid)
    with torch.no_grad():
        out = reference.model.visual(torch.from_numpy(pixels), grid_thw=torch.from_numpy(grid))
    expected = torch.cat([out.pooler_output, *out.deepstack_features], dim=-1).numpy()
    assert got.shape == (t * h * w // 4, WIDTH)
    assert relative_error(got, expected) < 1e-4


def test_pipeline_logits_match_transformers(package, reference, image):
    _, inputs = genai_inputs(package, image)
    ids, pixels, grid = arrays(inputs)
    prefill, step, next_id, positions = transformers_logits(reference, ids, pixels, grid)
    got_prefill, got_step = pipeline_logits(package, ids, pixels, grid, positions, next_id)
    assert relative_error(got_prefill, prefill) < 1e-4
    assert relative_error(got_step, step) < 1e-4


def test_deepstack_matters(package, reference, image):
    # Without the DeepStack slices (zeroed) the package's prefill moves: they are not dropped.
    _, inputs = genai_inputs(package, image)
    ids, pixels, grid = arrays(inputs)
    prefill, _, next_id, positions = transformers_logits(reference, ids, pixels, grid)
    import onnxruntime as ort

    features = vision_features(package, pixels, grid)
    features[:, 64:] = 0
    embedding = ort.InferenceSession(str(package / "embedding.onnx"), providers=["CPUExecutionProvider"])
    (embeds,) = embedding.run(None, {"input_ids": np.array([ids]), "image_features": features})
    decoder = ort.InferenceSession(str(package / "model.onnx"), providers=["CPUExecutionProvider"])
    past = {i.name: np.zeros((1, i.shape[1], 0, i.shape[3]), np.float32)
            for i in decoder.get_inputs() if i.name.startswith("past_key_values")}
    logits = decoder.run(["logits"], {"inputs_embeds": embeds, "attention_mask": np.ones((1, len(ids)), np.int64),
                                      "position_ids": positions, **past})[0][0]
    assert relative_error(logits, prefill) > 1e-2


def test_genai_multimodal_greedy_matches_transformers(package, reference, image):
    # A prompt whose 16 greedy steps have no near-tie in this random model (PROMPT's second has one).
    inputs, got = genai_generate(package, image, "abc <|vision_start|><|vision_end|> xyz")
    ids, pixels, grid = arrays(inputs)
    expected = transformers_generate(reference, ids, pixels, grid)
    assert len(expected) == len(ids) + NEW_TOKENS, "the reference stopped or tied early"
    assert got[: len(expected)] == expected


def test_genai_second_image_of_another_size(package, reference, tmp_path):
    other = png(tmp_path / "other.png", 90, 120)
    inputs, got = genai_generate(package, other, "<|vision_start|><|vision_end|> and text")
    ids, pixels, grid = arrays(inputs)
    assert grid.tolist() == [[1, 8, 6]] and ids.count(IMAGE) == 12
    expected = transformers_generate(reference, ids, pixels, grid)
    assert len(expected) > len(ids) + 5 and got[: len(expected)] == expected


def test_fp16_package_matches_transformers(source, reference, image, tmp_path):
    out = build(source, tmp_path / "fp16", "-p", "fp16")
    _, inputs = genai_inputs(out, image)
    ids, pixels, grid = arrays(inputs)
    prefill, step, next_id, positions = transformers_logits(reference, ids, pixels, grid)
    got_prefill, got_step = pipeline_logits(out, ids, pixels, grid, positions, next_id, np.float16)
    assert relative_error(got_prefill, prefill) < 1e-2
    assert relative_error(got_step, step) < 1e-2


def test_int4_decoder_matches_fake_quantized_transformers(source, image, tmp_path):
    out = build(source, tmp_path / "int4", "-p", "int4", "--accuracy-level", "0", "--quant-method", "rtn", "--symmetric")
    assert_int4_decoder_matches(out, source, image, transformers.Qwen3VLForConditionalGeneration)


def test_text_only_builds_a_plain_qwen3_decoder(source, tmp_path):
    from helpers import OnnxDecoder

    out = build(source, tmp_path / "text", "-p", "fp32", "--text-only")
    config = json.loads((out / "genai_config.json").read_text())["model"]
    assert config["type"] == "qwen3" and "input_ids" in config["decoder"]["inputs"]
    ids = [72, 101, 108, 108, 111, 44, 32, 119]
    prefill, _ = OnnxDecoder(out).prefill_and_step(ids, 33)
    model = transformers.Qwen3VLForConditionalGeneration.from_pretrained(source, dtype=torch.float32).eval()
    with torch.no_grad():
        expected = model(torch.tensor([ids])).logits[0].numpy()
    assert relative_error(prefill, expected) < 1e-4


def test_verify_runs_a_text_prompt_and_an_image_prompt(source, tmp_path, capsys):
    assert main(["-m", str(source), "-o", str(tmp_path / "out"), "-p", "fp32", "--verify"]) == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("verify")]
    assert [line.split(":")[0] for line in lines] == ["verify", "verify (with an image)"]
    assert all(line.endswith("PASS") and "cosine 1.000000" in line for line in lines), lines


@pytest.mark.parametrize("key, value, message", [
    ("num_position_embeddings", 35, "num_position_embeddings 35"),
    ("deepstack_visual_indexes", [7], "deepstack_visual_indexes [7]"),
])
def test_malformed_values_are_refused_in_one_line(source, tmp_path, capsys, key, value, message):
    folder = tmp_path / "src"
    folder.mkdir()
    for f in source.iterdir():
        (folder / f.name).write_bytes(f.read_bytes())
    raw = json.loads((source / "config.json").read_text())
    raw["vision_config"][key] = value
    (folder / "config.json").write_text(json.dumps(raw))
    assert main(["-m", str(folder), "-o", str(tmp_path / "out"), "-q"]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err


# Qwen3-VL-MoE: the same package, its decoder's MLP a sparse block of stacked experts (layer 1 dense).
MOE_TEXT = dict(TEXT, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24, mlp_only_layers=[1])


@pytest.fixture(scope="module")
def moe_source(tmp_path_factory):
    folder = tmp_path_factory.mktemp("qwen3_vl_moe")
    torch.manual_seed(0)
    config = transformers.Qwen3VLMoeConfig(
        text_config=MOE_TEXT, vision_config=VISION, image_token_id=IMAGE, video_token_id=IDS["<|video_pad|>"],
        vision_start_token_id=IDS["<|vision_start|>"], vision_end_token_id=IDS["<|vision_end|>"])
    config.text_config.bos_token_id, config.text_config.eos_token_id, config.text_config.pad_token_id = None, EOS, PAD
    transformers.Qwen3VLMoeForConditionalGeneration(config).save_pretrained(folder)
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [EOS], "pad_token_id": PAD}))
    write_tokenizer(folder)
    (folder / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR))
    return folder


def hub_expert_layout(source: Path, folder: Path) -> Path:
    """`source` with its stacked experts as the hub stores them (x · W: [E, H, 2I], [E, I, H])."""
    from safetensors.numpy import load_file, save_file

    folder.mkdir()
    for f in source.iterdir():
        if f.suffix != ".safetensors":
            (folder / f.name).write_bytes(f.read_bytes())
    tensors = {k: v.transpose(0, 2, 1).copy() if ".experts." in k else v
               for k, v in load_file(source / "model.safetensors").items()}
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


@pytest.mark.parametrize("layout", ["transformers", "hub"])
def test_moe_package_matches_transformers(moe_source, image, tmp_path, layout):
    source = moe_source if layout == "transformers" else hub_expert_layout(moe_source, tmp_path / "hub")
    package = build(source, tmp_path / "out", "-p", "fp32")
    reference = transformers.Qwen3VLMoeForConditionalGeneration.from_pretrained(source, dtype=torch.float32).eval()
    _, inputs = genai_inputs(package, image)
    ids, pixels, grid = arrays(inputs)
    prefill, step, next_id, positions = transformers_logits(reference, ids, pixels, grid)
    got_prefill, got_step = pipeline_logits(package, ids, pixels, grid, positions, next_id)
    assert relative_error(got_prefill, prefill) < 1e-4 and relative_error(got_step, step) < 1e-4
    if layout == "transformers":  # a prompt whose 16 greedy steps have no near-tie in this random model
        inputs, got = genai_generate(package, image, "Look: <|vision_start|><|vision_end|>!")
        ids, pixels, grid = arrays(inputs)
        expected = transformers_generate(reference, ids, pixels, grid)
        assert len(expected) == len(ids) + NEW_TOKENS and got[: len(expected)] == expected
