"""Gemma 1, 2, 3 and Gemma3ForConditionalGeneration's text decoder against transformers."""

import json

import numpy as np
import pytest
import torch
import transformers
from conftest import TINY
from fake_quant import assert_quantized_parity
from helpers import (
    GENAI_PROMPT,
    PROMPT,
    OnnxDecoder,
    assert_parity,
    build,
    make_checkpoint,
    relative_error,
)
from helpers import reference as reference_logits
from safetensors.numpy import load_file, save_file
from test_genai import assert_same_greedy

GEMMA = {**TINY, "head_dim": 16, "eos_token_id": 255}
# Windows shorter than the 10-token prompt, soft-capping on, global and local layers both present.
VARIANTS = {
    "gemma": ("GemmaConfig", {}),
    "gemma2": ("Gemma2Config", dict(sliding_window=4, attn_logit_softcapping=5.0, final_logit_softcapping=3.0,
                                    query_pre_attn_scalar=24)),
    "gemma3": ("Gemma3TextConfig", dict(num_hidden_layers=3, sliding_window=4, sliding_window_pattern=2,
                                        query_pre_attn_scalar=24, rope_parameters={
                                            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
                                            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}})),
}


def make_gemma(folder, name):
    config_class, overrides = VARIANTS[name]
    return make_checkpoint(folder, config_class, **{**GEMMA, **overrides})


def make_gemma3_multimodal(folder, hub_layout: bool, text=None, tokens=None, **vision_overrides):
    """A tiny Gemma3ForConditionalGeneration, its tensors named as the hub's -it checkpoints store
    them (`hub_layout`: language_model.model.*, vision_tower.vision_model.*) or as transformers 5's
    modules hold them (model.language_model.*, model.vision_tower.*).
    `vision_overrides` change the vision_config (tests/test_gemma3_vision.py pools 4x4 patches),
    `text` the text_config and `tokens` the special token ids."""
    text = {**GEMMA, **VARIANTS["gemma3"][1], **(text or {})}
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                  image_size=28, patch_size=14)
    vision.update(vision_overrides)
    ids = {**dict(image_token_index=250, boi_token_index=251, eoi_token_index=252, eos_token_id=255), **(tokens or {})}
    cfg = transformers.Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4, **ids)
    make_checkpoint(folder, "Gemma3Config", **cfg.to_dict())
    # save_pretrained's own names vary by transformers version: rename every tensor explicitly.
    tensors = load_file(folder / "model.safetensors")
    renamed = {}
    for k, v in tensors.items():
        for prefix in ("model.language_model.", "language_model.model.", "language_model."):
            if k.startswith(prefix):
                k = ("language_model.model." if hub_layout else "model.language_model.") + k[len(prefix):]
                break
        else:
            for prefix in ("model.vision_tower.vision_model.", "vision_tower.vision_model.", "model.vision_tower.",
                           "vision_tower."):
                if k.startswith(prefix):
                    k = ("vision_tower.vision_model." if hub_layout else "model.vision_tower.") + k[len(prefix):]
                    break
            else:
                if k.startswith(("model.multi_modal_projector.", "multi_modal_projector.")):
                    k = ("" if hub_layout else "model.") + k[k.index("multi_modal_projector."):]
        renamed[k] = v
    save_file(renamed, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def variant(request, tmp_path_factory):
    return make_gemma(tmp_path_factory.mktemp(request.param), request.param)


def test_fp32_matches_transformers(variant, tmp_path):
    assert_parity(build(variant, tmp_path / "out", "-p", "fp32"), variant, tolerance=1e-4)


def test_fp16_matches_transformers(variant, tmp_path):
    # See test_parity_llama: fp16 rounding through two or three layers, bound 1e-2 of the largest logit.
    assert_parity(build(variant, tmp_path / "out", "-p", "fp16"), variant, tolerance=1e-2)


def test_int4_matches_fake_quantized_transformers(variant, tmp_path):
    out = build(variant, tmp_path / "out", "-p", "int4", "--accuracy-level", "0")
    assert_quantized_parity(variant, out, exact=True)


def test_genai_greedy_matches_transformers(variant, tmp_path):
    out = build(variant, tmp_path / "out", "-p", "fp32")
    assert_same_greedy(out, variant, GENAI_PROMPT)


@pytest.mark.parametrize("hub_layout", [False, True], ids=["transformers-layout", "hub-layout"])
def test_gemma3_multimodal_text_decoder(tmp_path, hub_layout):
    source = make_gemma3_multimodal(tmp_path / "src", hub_layout)
    out = build(source, tmp_path / "out", "-p", "fp32", "--text-only")
    cfg = json.loads((out / "genai_config.json").read_text())
    assert cfg["model"]["type"] == "gemma3_text" and cfg["model"]["eos_token_id"] == 255
    model = transformers.AutoModelForImageTextToText.from_pretrained(source, dtype=torch.float32).eval()
    with torch.no_grad():
        prefill = model(input_ids=torch.tensor([PROMPT]), use_cache=True)
        next_id = int(prefill.logits[0, -1].argmax())
        step = model(input_ids=torch.tensor([[next_id]]), past_key_values=prefill.past_key_values, use_cache=True)
    got_prefill, got_step = OnnxDecoder(out).prefill_and_step(PROMPT, next_id)
    assert relative_error(got_prefill, prefill.logits[0].numpy()) < 1e-4
    assert relative_error(got_step, step.logits[0].numpy()) < 1e-4
    assert (got_prefill.argmax(-1) == prefill.logits[0].numpy().argmax(-1)).all()


@pytest.mark.parametrize("flags", [[], ["--windowed-kv-cache"]], ids=["full-kv-cache", "window-ring-buffer"])
def test_sliding_window_cache_over_many_steps(tmp_path, flags):
    # Gemma 2 with a 4-token window: decode eight steps past a 10-token prompt, each step's logits
    # against transformers' full forward of the whole sequence.
    source = make_gemma(tmp_path / "src", "gemma2")
    out = build(source, tmp_path / "out", "-p", "fp32", *flags)
    decoder = OnnxDecoder(out)
    model = transformers.AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).eval()
    ids = list(PROMPT)
    logits, present = decoder.run(ids, None, len(ids))
    windowed = bool(flags)
    assert present["present.0.key"].shape[2] == (4 if windowed else len(ids))  # layer 0 slides
    assert present["present.1.key"].shape[2] == len(ids)  # layer 1 is global
    for _ in range(8):
        ids.append(int(logits[-1].argmax()))
        logits, present = decoder.run(ids[-1:], present, len(ids))
        with torch.no_grad():
            expected = model(torch.tensor([ids])).logits[0, -1].numpy()
        assert relative_error(logits[-1], expected) < 1e-4
    cfg = json.loads((out / "genai_config.json").read_text())["model"]["decoder"]
    assert ("sliding_window" in cfg) == windowed
    if windowed:
        assert cfg["sliding_window"]["layers"] == [0] and cfg["sliding_window"]["window_size"] == 4


def make_loud_gemma(folder, name):
    """A tiny Gemma whose residual stream exceeds 1e5, as real Gemma 3's does (about 1e5 in
    gemma-3-270m), while every fp16 intermediate stays in range: embedding column 0 at 7000
    (56000 once scaled by √64), v/o and gate/up/down weights that add tens of thousands more to
    it, and, for Gemma 2/3, post-norms that scale the branch outputs' column 0 by 5000."""
    from safetensors.numpy import load_file, save_file

    config_class, overrides = VARIANTS[name]
    make_checkpoint(folder, config_class, **{**GEMMA, **overrides, "tie_word_embeddings": False})
    t = load_file(folder / "model.safetensors")
    t["model.embed_tokens.weight"][:, 0] = 7000.0
    for key in t:
        if key.endswith(("v_proj.weight", "gate_proj.weight", "up_proj.weight")):
            t[key][:, 0] = 1.0
        elif key.endswith("o_proj.weight"):
            t[key][0, :] = 30.0
        elif key.endswith("down_proj.weight"):
            t[key][0, :] = 1.0
        elif key.endswith(("post_attention_layernorm.weight", "post_feedforward_layernorm.weight")) and name != "gemma":
            t[key][:] = 0.0
            t[key][0] = 5000.0 - 1  # Gemma's norm multiplies by (1 + weight)
    save_file(t, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


@pytest.mark.parametrize("name", sorted(VARIANTS))
@pytest.mark.parametrize("flags", [["-p", "fp16"], ["-p", "int4", "--io-dtype", "fp16", "--accuracy-level", "0",
                                    "--quant-method", "rtn", "--symmetric"],
                                   ["-p", "int8", "--io-dtype", "fp16", "--accuracy-level", "0"]],
                         ids=["fp16", "int4-fp16", "int8-fp16"])
def test_fp16_survives_a_residual_past_fp16_range(tmp_path, name, flags):
    # Relative max error 1e-2: fp16 projections round each product to 2^-11 relative (see
    # test_fp16_matches_transformers); the float32 stream and norms add nothing to that.
    from fake_quant import reference as quantized_reference

    source = make_loud_gemma(tmp_path / "src", name)
    model = transformers.AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).eval()
    with torch.no_grad():
        hidden = model(torch.tensor([PROMPT]), output_hidden_states=True).hidden_states
    assert max(float(h.abs().max()) for h in hidden[1:-1]) > 1e5  # the residual stream, after each layer
    out = build(source, tmp_path / "out", *flags)
    if flags[1] == "fp16":
        ref_prefill, ref_step, next_id = reference_logits(source, PROMPT)
    else:
        ref_prefill, ref_step, next_id = quantized_reference(source, int(flags[1][3:]), 32, True, method="rtn")
    prefill, step = OnnxDecoder(out).prefill_and_step(PROMPT, next_id)
    for got, want in ((prefill, ref_prefill), (step, ref_step)):
        assert np.isfinite(got).all()
        assert relative_error(got, want) < 1e-2


@pytest.mark.parametrize("flags", [["-p", "fp16", "-e", "cuda"], ["-p", "int4", "-e", "cuda"], ["-p", "bf16", "-e", "cuda"]],
                         ids=["fp16-cuda", "int4-cuda", "bf16-cuda"])
def test_cuda_graph_keeps_the_residual_stream_in_float32(tmp_path, flags):
    # No GPU here: the CUDA graph is checked for structure. Every norm of an fp16 Gemma runs on a
    # float32 stream with float32 weights, and each projection reads fp16; bf16 (float32's range)
    # keeps its own dtype, as does a Llama in fp16.
    import onnx

    def norms(folder):
        model = onnx.load(folder / "model.onnx", load_external_data=False)
        dtypes = {t.name: t.data_type for t in model.graph.initializer}
        stream = [n for n in model.graph.node if n.op_type.endswith("SimplifiedLayerNormalization")
                  and "self_attn" not in n.name]  # q/k head norms are not on the stream
        assert len(stream) >= 5  # two layers of two norms, and the final norm
        return [dtypes[n.input[2] if n.op_type.startswith("Skip") else n.input[1]] for n in stream]

    gemma = build(make_gemma(tmp_path / "gemma", "gemma3"), tmp_path / "out", *flags)
    llama = build(make_checkpoint(tmp_path / "llama", "LlamaConfig", **TINY), tmp_path / "llama-out", *flags)
    io = onnx.TensorProto.BFLOAT16 if flags[1] == "bf16" else onnx.TensorProto.FLOAT16
    assert set(norms(gemma)) == {onnx.TensorProto.FLOAT if io == onnx.TensorProto.FLOAT16 else io}
    assert set(norms(llama)) == {io}
