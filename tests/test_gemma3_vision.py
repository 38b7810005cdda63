"""Gemma 3's vision encoder and projector (architectures/gemma3_vision.py) against transformers'
get_image_features, in every tensor layout a Gemma3ForConditionalGeneration checkpoint comes in."""

import json

import numpy as np
import onnxruntime as ort
import pytest
import torch
import transformers
from helpers import relative_error
from safetensors.numpy import load_file, save_file
from test_parity_gemma import make_gemma3_multimodal

from architectures import gemma3_vision
from builder.inputs.safetensors import SafetensorsCheckpoint
from builder.errors import BuildError
from builder.target import Quantization, Target
from builder.writer import save_model

# 56-pixel images of 14-pixel patches: 4x4 patches pooled 2x2 to mm_tokens_per_image = 4.
VISION = {"image_size": 56, "num_hidden_layers": 2}

# Where each layout keeps the three parts (transformers 5.23's save_pretrained writes "saved").
LAYOUTS = {
    "hub": ("language_model.model.", "vision_tower.vision_model.", "multi_modal_projector."),
    "saved": ("language_model.model.", "vision_tower.", "multi_modal_projector."),
    "transformers5": ("model.language_model.", "model.vision_tower.", "model.multi_modal_projector."),
}


def make_vision_checkpoint(folder, mm_tokens_per_image=None, text=None, tokens=None, **vision):
    """The tiny checkpoint as transformers saves it, with random values where it initializes zeros
    (biases, the projection), so that no term of the math can vanish unnoticed."""
    folder = make_gemma3_multimodal(folder, hub_layout=False, text=text, tokens=tokens, **vision)
    if mm_tokens_per_image is not None:
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**config, "mm_tokens_per_image": mm_tokens_per_image}))
    tensors, rng = load_file(folder / "model.safetensors"), np.random.default_rng(0)
    for name, value in tensors.items():
        if not name.startswith("language_model.") and not value.any():
            tensors[name] = (0.2 * rng.standard_normal(value.shape)).astype(value.dtype)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    return make_vision_checkpoint(tmp_path_factory.mktemp("saved"), **VISION)


def relayout(saved, folder, layout):
    """The same checkpoint with its tensors renamed to `layout`."""
    folder.mkdir()
    (folder / "config.json").write_text((saved / "config.json").read_text())
    renamed = {}
    for name, value in load_file(saved / "model.safetensors").items():
        for old, new in zip(LAYOUTS["saved"], LAYOUTS[layout]):
            if name.startswith(old):
                name = new + name[len(old):]
                break
        renamed[name] = value
    save_file(renamed, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


def build_vision(source, out, dtype, quantization=None, narrow=False):
    ckpt = SafetensorsCheckpoint.open(source)
    c = gemma3_vision.parse_config(json.loads((source / "config.json").read_text()))
    target = Target(io_dtype=np.dtype(dtype), quantization=quantization, narrow_float_matrices=narrow)
    model = gemma3_vision.vision_model(ckpt, c, target)
    # Every vision tensor is used but the attention-pooling head transformers computes and drops.
    assert ckpt.unconsumed([*gemma3_vision.IGNORED, "*language_model.*", "lm_head.weight"]) == []
    out.mkdir()
    save_model(model, out, progress=False)
    return ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("dtype, tolerance", [(np.float32, 1e-4), (np.float16, 1e-2)], ids=["fp32", "fp16"])
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_image_features_match_transformers(saved, tmp_path, layout, dtype, tolerance):
    # fp16: weights and activations rounded to 2^-11 relative through two layers, bound 1e-2 of the
    # largest feature (the residual stream and its norms stay in float32).
    source = relayout(saved, tmp_path / "src", layout)
    session = build_vision(source, tmp_path / "out", dtype)
    model = transformers.AutoModelForImageTextToText.from_pretrained(source, dtype=torch.float32).eval()
    for images in (1, 2):
        pixels = np.random.default_rng(images).uniform(-1, 1, (images, 3, 56, 56)).astype(np.float32)
        with torch.no_grad():
            expected = model.get_image_features(torch.from_numpy(pixels)).pooler_output.numpy()
        (got,) = session.run(None, {"pixel_values": pixels.astype(dtype)})
        assert got.dtype == dtype and got.shape == (images, 4, 64) == expected.shape
        assert relative_error(got.astype(np.float32), expected) < tolerance


def test_config_defaults_are_transformers(saved):
    raw = json.loads((saved / "config.json").read_text())
    reference = transformers.Gemma3Config(**raw)
    c = gemma3_vision.parse_config(raw)
    v = reference.vision_config
    assert (c.hidden_size, c.image_size, c.patch_size, c.num_hidden_layers, c.layer_norm_eps, c.hidden_act) == (
        v.hidden_size, v.image_size, v.patch_size, v.num_hidden_layers, v.layer_norm_eps, v.hidden_act)
    assert (c.mm_tokens_per_image, c.text_hidden_size) == (reference.mm_tokens_per_image, 64)
    # Missing keys: transformers' defaults (its bare default, 224-pixel images of 16-pixel patches
    # for 256 tokens, cannot pool: AvgPool2d(kernel_size=0); see the refusal below).
    sparse = {"vision_config": {"image_size": 896, "patch_size": 14}}
    c, default = gemma3_vision.parse_config(sparse), transformers.Gemma3Config(**sparse)
    assert (c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.layer_norm_eps, c.mm_tokens_per_image,
            c.text_hidden_size) == (default.vision_config.hidden_size, default.vision_config.num_hidden_layers,
                                    default.vision_config.num_attention_heads, default.vision_config.layer_norm_eps,
                                    default.mm_tokens_per_image, default.text_config.hidden_size)

def test_bf16_checkpoint_keeps_its_matrices_bf16_under_float32(saved, tmp_path):
    # A bf16 tower built for float32 activations beside a quantized decoder (package.vision_target:
    # the CPU int4 package's vision model) stores its matrices as bf16, half the bytes, widened by
    # Casts that ONNX Runtime folds when it loads: the optimized graph multiplies float32 constants,
    # and the features are transformers' float32 ones on the same bf16 values.
    import onnx
    from safetensors.torch import load_file as load_torch, save_file as save_torch

    from builder.package import vision_target

    source = tmp_path / "src"
    source.mkdir()
    (source / "config.json").write_text((saved / "config.json").read_text())
    tensors = {k: v.to(torch.bfloat16) for k, v in load_torch(saved / "model.safetensors").items()}
    save_torch(tensors, source / "model.safetensors", metadata={"format": "pt"})
    f32 = np.dtype(np.float32)
    assert vision_target(Target(io_dtype=f32, quantization=Quantization(bits=4))).narrow_float_matrices
    assert not vision_target(Target(io_dtype=f32)).narrow_float_matrices  # an fp32 build's tower: float32
    session = build_vision(source, tmp_path / "out", np.float32, narrow=True)
    stored = {t.name: t.data_type for t in onnx.load(tmp_path / "out" / "model.onnx", load_external_data=False).graph.initializer}
    matrices = [n for n in stored if n.endswith(("q_proj.weight", "fc1.weight", "fc2.weight"))]
    assert len(matrices) == 6 and all(stored[n] == onnx.TensorProto.BFLOAT16 for n in matrices)
    model = transformers.AutoModelForImageTextToText.from_pretrained(source, dtype=torch.float32).eval()
    pixels = np.random.default_rng(0).uniform(-1, 1, (2, 3, 56, 56)).astype(np.float32)
    with torch.no_grad():
        expected = model.get_image_features(torch.from_numpy(pixels)).pooler_output.numpy()
    (got,) = session.run(None, {"pixel_values": pixels})
    assert relative_error(got, expected) < 1e-4
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(str(tmp_path / "out" / "model.onnx"), options, providers=["CPUExecutionProvider"])
    optimized = onnx.load(tmp_path / "optimized.onnx", load_external_data=False).graph
    constants = {t.name for t in optimized.initializer}
    assert not [n for n in optimized.node if n.op_type == "Cast" and n.input[0] in constants]


@pytest.mark.parametrize("raw", [{"vision_config": {"image_size": 56, "patch_size": 14}, "mm_tokens_per_image": 5},
                                 {}], ids=["not-a-square", "more-tokens-than-patches"])
def test_refuses_tokens_that_do_not_pool_evenly(raw):
    with pytest.raises(BuildError, match="mm_tokens_per_image"):
        gemma3_vision.parse_config(raw)



def test_int4_linears_match_fake_quantized_transformers(saved, tmp_path):
    # The encoder's q/k/v/out_proj and fc1/fc2 as MatMulNBits (accuracy level 0: float32 compute);
    # transformers on the same weights rounded by ONNX Runtime's quantizer. The patch Conv and the
    # projector's matrix stay float.
    from fake_quant import fake_quantize

    q = Quantization(bits=4, block_size=32, symmetric=True, accuracy_level=0, method="rtn")
    session = build_vision(saved, tmp_path / "out", np.float32, q)
    model = transformers.AutoModelForImageTextToText.from_pretrained(saved, dtype=torch.float32).eval()
    with torch.no_grad():
        linears = [m for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and ".encoder." in n]
        assert len(linears) == 6 * VISION["num_hidden_layers"]
        for module in linears:
            module.weight.copy_(fake_quantize(module.weight, 4, 32, True))
        pixels = np.random.default_rng(0).uniform(-1, 1, (2, 3, 56, 56)).astype(np.float32)
        expected = model.get_image_features(torch.from_numpy(pixels)).pooler_output.numpy()
    (got,) = session.run(None, {"pixel_values": pixels})
    assert relative_error(got, expected) < 1e-4


def test_real_geometry_896_pixels_to_256_tokens(tmp_path):
    # gemma-3-4b/12b/27b-it's geometry (vision_use_head off, as there): 64x64 patches of 14 pixels
    # pooled 4x4 to the 256 tokens onnxruntime-genai expects; narrow and one layer deep.
    source = make_vision_checkpoint(tmp_path / "src", 256, image_size=896, vision_use_head=False)
    session = build_vision(source, tmp_path / "out", np.float32)
    model = transformers.AutoModelForImageTextToText.from_pretrained(source, dtype=torch.float32).eval()
    pixels = np.random.default_rng(0).uniform(-1, 1, (1, 3, 896, 896)).astype(np.float32)
    with torch.no_grad():
        expected = model.get_image_features(torch.from_numpy(pixels)).pooler_output.numpy()
    (got,) = session.run(None, {"pixel_values": pixels})
    assert expected.shape == got.shape == (1, 256, 64)
    assert relative_error(got, expected) < 1e-4
