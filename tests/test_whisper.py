"""Whisper's package (encoder.onnx, model.onnx with self and cross caches, genai_config.json's
whisper sections, audio_processor_config.json) against transformers, through plain ONNX Runtime and
through onnxruntime-genai's multimodal API on a real WAV (tests/data/speech.wav, espeak-ng speaking
one sentence: scripts/make_speech_wav.py)."""

import json
import sys
import wave
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch
import transformers
from fake_quant import fake_quantize
from helpers import build, relative_error

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
from byte_tokenizer import byte_chars  # noqa: E402

WAV = Path(__file__).resolve().parent / "data" / "speech.wav"
# A byte-level vocabulary (ids 0-255), then Whisper's special tokens in Whisper's order.
SPECIAL = ("<|endoftext|>", "<|startoftranscript|>", "<|en|>", "<|translate|>", "<|transcribe|>",
           "<|notimestamps|>")
EOS, START, EN, TRANSLATE, TRANSCRIBE, NO_TIMESTAMPS = range(256, 256 + len(SPECIAL))
PROMPT_TEXT = "<|startoftranscript|><|en|><|transcribe|><|notimestamps|>"
PROMPT = [START, EN, TRANSCRIBE, NO_TIMESTAMPS]
NEW_TOKENS = 16
CONFIG = dict(
    vocab_size=264, num_mel_bins=80, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
    decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, max_source_positions=1500,
    max_target_positions=64, bos_token_id=EOS, eos_token_id=EOS, pad_token_id=EOS, decoder_start_token_id=START,
    # transformers' defaults suppress ids of the real vocabulary (past this one): none, for plain greedy
    suppress_tokens=None, begin_suppress_tokens=None,
)


def write_tokenizer(folder):
    """tokenizer.json: one token per byte (no merges) and Whisper's special tokens after them."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    tokenizer = Tokenizer(models.BPE(vocab={c: b for b, c in byte_chars().items()}, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(t, special=True) for t in SPECIAL])
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>"}))


def make_checkpoint(folder: Path) -> Path:
    torch.manual_seed(0)
    config = transformers.WhisperConfig(**CONFIG)
    model = transformers.WhisperForConditionalGeneration(config).eval()
    with torch.no_grad():  # random weights large enough that the layers matter
        for name, p in model.named_parameters():
            if name.endswith("bias") or "layer_norm" in name:
                p.normal_(0.0 if name.endswith("bias") else 1.0, 0.1)
    model.save_pretrained(folder)
    transformers.WhisperFeatureExtractor(feature_size=80).save_pretrained(folder)
    write_tokenizer(folder)
    return folder


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("whisper"))


@pytest.fixture(scope="module")
def package(source, tmp_path_factory):
    return build(source, tmp_path_factory.mktemp("out") / "fp32", "-p", "fp32")


def test_package_files_and_genai_config(package):
    names = {p.name for p in package.iterdir()}
    assert {"encoder.onnx", "encoder.onnx.data", "model.onnx", "audio_processor_config.json", "genai_config.json",
            "tokenizer.json"} <= names
    config = json.loads((package / "genai_config.json").read_text())
    model = config["model"]
    assert model["type"] == "whisper"
    assert model["encoder"]["filename"] == "encoder.onnx"
    assert model["decoder"]["inputs"]["cross_past_key_names"] == "past_key_cross_%d"
    assert "attention_mask" not in model["decoder"]["inputs"]
    assert model["speech"]["config_filename"] == "audio_processor_config.json"
    assert config["search"]["past_present_share_buffer"] is False
    assert model["context_length"] == CONFIG["max_target_positions"]


def audio() -> np.ndarray:
    with wave.open(str(WAV)) as w:
        assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (16_000, 1, 2)
        return np.frombuffer(w.readframes(w.getnframes()), np.int16).astype(np.float32) / 32768.0


def reference_features(source) -> np.ndarray:
    extractor = transformers.WhisperFeatureExtractor.from_pretrained(source)
    return extractor(audio(), sampling_rate=16_000, return_tensors="np")["input_features"]


def genai_inputs(folder, prompt=PROMPT_TEXT):
    """input_ids and audio_features as onnxruntime-genai's Whisper processor makes them."""
    import onnxruntime_genai as og

    model = og.Model(str(folder))
    processor = model.create_multimodal_processor()
    return model, processor(prompt, audios=og.Audios.open(str(WAV)))


def transformers_model(source):
    return transformers.WhisperForConditionalGeneration.from_pretrained(source, dtype=torch.float32).eval()


def test_features_match_transformers_feature_extractor(package, source):
    _, inputs = genai_inputs(package)
    got = inputs["audio_features"].as_numpy()
    expected = reference_features(source)
    assert got.shape == expected.shape == (1, 80, 3000)
    assert np.abs(got - expected).max() < 1e-4
    assert inputs["input_ids"].as_numpy().tolist() == [PROMPT]


def session(folder, name):
    return ort.InferenceSession(str(folder / f"{name}.onnx"), providers=["CPUExecutionProvider"])


def run_encoder(folder, features, dtype=np.float32):
    encoder = session(folder, "encoder")
    names = [o.name for o in encoder.get_outputs()]
    return dict(zip(names, encoder.run(None, {"audio_features": features.astype(dtype)})))


def reference_encoder(model, features):
    """transformers' encoder output and each decoder layer's cross-attention keys and values."""
    with torch.no_grad():
        hidden = model.model.encoder(torch.from_numpy(features)).last_hidden_state
        cross = {}
        for i, layer in enumerate(model.model.decoder.layers):
            a = layer.encoder_attn
            for kind, proj in (("key", a.k_proj), ("value", a.v_proj)):
                cross[f"present_{kind}_cross_{i}"] = proj(hidden).view(1, -1, a.num_heads, a.head_dim).transpose(1, 2)
    return hidden.numpy(), {k: v.numpy() for k, v in cross.items()}


def test_encoder_matches_transformers(package, source):
    features = reference_features(source)
    got = run_encoder(package, features)
    hidden, cross = reference_encoder(transformers_model(source), features)
    assert got["encoder_hidden_states"].shape == (1, 1500, 64)
    assert relative_error(got["encoder_hidden_states"], hidden) < 1e-4
    for name, expected in cross.items():
        assert got[name].shape == (1, 4, 1500, 16)
        assert relative_error(got[name], expected) < 1e-4, name


def decoder_logits(folder, encoded, ids, next_id, dtype=np.float32):
    """Prefill of `ids`, then one step of `next_id`, as onnxruntime-genai runs the decoder: int32
    ids, the cross cache from the encoder, the self cache fed back."""
    decoder = session(folder, "model")
    cross = {n.replace("present", "past"): v for n, v in encoded.items() if "cross" in n}
    past = {i.name: np.zeros((1, i.shape[1], 0, i.shape[3]), dtype)
            for i in decoder.get_inputs() if i.name.startswith("past") and "self" in i.name}
    outputs = []
    for step in (ids, [next_id]):
        result = decoder.run(None, {"input_ids": np.array([step], np.int32), **past, **cross})
        names = [o.name for o in decoder.get_outputs()]
        past = {n.replace("present", "past"): v for n, v in zip(names[1:], result[1:])}
        outputs.append(result[0][0].astype(np.float32))
    return outputs


def reference_logits(model, features, ids):
    with torch.no_grad():
        encoder_outputs = model.model.encoder(torch.from_numpy(features))
        prefill = model(encoder_outputs=encoder_outputs, decoder_input_ids=torch.tensor([ids]), use_cache=True)
        next_id = int(prefill.logits[0, -1].argmax())
        step = model(encoder_outputs=encoder_outputs, decoder_input_ids=torch.tensor([[next_id]]),
                     past_key_values=prefill.past_key_values, use_cache=True)
    return prefill.logits[0].numpy(), step.logits[0].numpy(), next_id


def test_decoder_logits_match_transformers(package, source):
    features = reference_features(source)
    prefill, step, next_id = reference_logits(transformers_model(source), features, PROMPT)
    got_prefill, got_step = decoder_logits(package, run_encoder(package, features), PROMPT, next_id)
    assert relative_error(got_prefill, prefill) < 1e-4
    assert relative_error(got_step, step) < 1e-4
    assert got_prefill[-1].argmax() == next_id
