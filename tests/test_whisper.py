"""Whisper's package (encoder.onnx, model.onnx with self and cross caches, genai_config.json's
whisper sections, audio_processor_config.json) against transformers, through plain ONNX Runtime and
through onnxruntime-genai's multimodal API on a real WAV (tests/data/speech.wav, espeak-ng speaking
one sentence: scripts/make_speech_wav.py)."""

import json
import sys
import wave
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import transformers
from fake_quant import fake_quantize
from helpers import build, relative_error

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
from byte_tokenizer import byte_vocab, save as save_tokenizer  # noqa: E402

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
    save_tokenizer(folder, byte_vocab(), SPECIAL, eos_token="<|endoftext|>")


def make_checkpoint(folder: Path) -> Path:
    torch.manual_seed(0)
    config = transformers.WhisperConfig(**CONFIG)
    model = transformers.WhisperForConditionalGeneration(config).eval()
    # Random weights large enough that greedy decoding varies (at std 0.02 it repeats one token),
    # and attention queries and keys larger still, so that attention picks frames: with std 0.2
    # there it averages over all 1500 and any non-silent audio gave the same tokens.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "layer_norm" in name:
                p.normal_(0.0 if name.endswith("bias") else 1.0, 0.1)
            elif p.dim() == 2 and name != "model.encoder.embed_positions.weight":  # that one: sinusoids
                # the encoder's self-attention and the decoder's cross-attention
                sharp = name.endswith(("q_proj.weight", "k_proj.weight")) and (
                    name.startswith("model.encoder.") or ".encoder_attn." in name)
                p.normal_(0.0, 0.5 if sharp else 0.2)
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


def audio(path=WAV) -> np.ndarray:
    with wave.open(str(path)) as w:
        assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (16_000, 1, 2)
        return np.frombuffer(w.readframes(w.getnframes()), np.int16).astype(np.float32) / 32768.0


def reference_features(source, path=WAV) -> np.ndarray:
    extractor = transformers.WhisperFeatureExtractor.from_pretrained(source)
    return extractor(audio(path), sampling_rate=16_000, return_tensors="np")["input_features"]


def genai_inputs(folder, prompt=PROMPT_TEXT, wavs=(WAV,)):
    """input_ids and audio_features as onnxruntime-genai's Whisper processor makes them (one
    prompt per audio)."""
    import onnxruntime_genai as og

    model = og.Model(str(folder))
    processor = model.create_multimodal_processor()
    prompts = prompt if len(wavs) == 1 else [prompt] * len(wavs)
    return model, processor(prompts, audios=og.Audios.open(*map(str, wavs)))


def transformers_model(source):
    return transformers.WhisperForConditionalGeneration.from_pretrained(source, dtype=torch.float32).eval()


def test_features_match_transformers_feature_extractor(package, source):
    _, inputs = genai_inputs(package)
    got = inputs["audio_features"].as_numpy()
    expected = reference_features(source)
    assert got.shape == expected.shape == (1, 80, 3000)
    # onnxruntime-extensions' STFT and mel filters in float32 against transformers' numpy: measured
    # 4.6e-5 on this file, features in [-0.8, 1.2].
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


def genai_greedy(folder, new_tokens=NEW_TOKENS, wavs=(WAV,)):
    """Each audio's greedy tokens through onnxruntime-genai, the audios in one batch."""
    import onnxruntime_genai as og

    model, inputs = genai_inputs(folder, wavs=wavs)
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=len(PROMPT) + new_tokens, batch_size=len(wavs))
    generator = og.Generator(model, params)
    generator.set_inputs(inputs)
    while not generator.is_done():
        generator.generate_next_token()
    sequences = [[int(t) for t in generator.get_sequence(i)] for i in range(len(wavs))]
    return sequences[0] if len(wavs) == 1 else sequences


def genai_greedy_logits(folder, new_tokens=NEW_TOKENS):
    """onnxruntime-genai's greedy tokens, and the logits it returns after each step: those of
    the next position (position -> logits)."""
    import onnxruntime_genai as og

    model, inputs = genai_inputs(folder)
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=len(PROMPT) + new_tokens)
    generator = og.Generator(model, params)
    generator.set_inputs(inputs)
    logits = {}
    while not generator.is_done():
        generator.generate_next_token()
        if not generator.is_done():
            position = len(generator.get_sequence(0)) - 1
            logits[position] = np.asarray(generator.get_logits(), np.float32).reshape(-1)
    return [int(t) for t in generator.get_sequence(0)], logits


def transformers_greedy(model, features, new_tokens=NEW_TOKENS):
    """Plain greedy generate from the four prompt tokens: GenerationMixin.generate, not Whisper's
    own generate (which adds language detection, timestamp rules and suppressed tokens), on the
    checkpoint's generation config (no suppress_tokens, no forced ids)."""
    out = transformers.GenerationMixin.generate(
        model, input_features=torch.from_numpy(features), decoder_input_ids=torch.tensor([PROMPT]),
        max_new_tokens=new_tokens, do_sample=False, num_beams=1, output_logits=True, return_dict_in_generate=True)
    gaps = [float(torch.topk(step[0], 2).values.diff().abs()) for step in out.logits]
    assert min(gaps) > 1e-3, "a near-tie: float32 rounding may pick either token"
    return out.sequences[0].tolist()


def test_genai_transcribes_the_wav_as_transformers_generates(package, source):
    # genai's own features (equal to transformers' within 4.6e-5) into its encoder, then greedy decoding.
    expected = transformers_greedy(transformers_model(source), reference_features(source))
    got = genai_greedy(package)
    assert got == expected
    assert len(set(got[len(PROMPT):])) > 3  # a sequence that varies, not one token repeated


def test_a_batch_of_two_audios_transcribes_each_as_alone(package, source, tmp_path):
    # The second audio is the first reversed: other features, so another transcript.
    reversed_wav = tmp_path / "reversed.wav"
    with wave.open(str(reversed_wav), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16_000)
        w.writeframes((audio()[::-1] * 32768.0).astype(np.int16).tobytes())
    model = transformers_model(source)
    expected = [transformers_greedy(model, reference_features(source, path)) for path in (WAV, reversed_wav)]
    assert expected[0] != expected[1]
    assert genai_greedy(package, wavs=(WAV, reversed_wav)) == expected


def test_fp16_package_matches_transformers(source, tmp_path):
    # Encoder and decoder in fp16 with float32 residual streams: weights and activations rounded
    # to 2^-11 relative; bound 1e-2 of the largest logit, as the other fp16 tests (measured 7e-3 for
    # the encoder, 8.3e-3 for the decoder: this checkpoint's sharp attention amplifies rounding).
    out = build(source, tmp_path / "fp16", "-p", "fp16")
    features = reference_features(source)
    model = transformers_model(source)
    hidden, _ = reference_encoder(model, features)
    encoded = run_encoder(out, features, np.float16)
    assert encoded["encoder_hidden_states"].dtype == np.float16
    assert relative_error(encoded["encoder_hidden_states"].astype(np.float32), hidden) < 1e-2
    prefill, step, next_id = reference_logits(model, features, PROMPT)
    got_prefill, got_step = decoder_logits(out, encoded, PROMPT, next_id, np.float16)
    assert relative_error(got_prefill, prefill) < 1e-2
    assert relative_error(got_step, step) < 1e-2
    # Through onnxruntime-genai (its fp16 features): fp16's error (up to 7e-2 here) exceeds the
    # reference's smallest top-2 gap (5.5e-2), so its greedy tokens may part from float32's; each
    # step's logits are compared with transformers' on genai's own tokens instead. Over 15 steps
    # the fp16 self cache's rounding adds up: measured 1.1e-2, bound 2e-2.
    tokens, logits = genai_greedy_logits(out)
    with torch.no_grad():
        expected = model(input_features=torch.from_numpy(features), decoder_input_ids=torch.tensor([tokens])).logits[0]
    positions = sorted(logits)
    assert len(positions) == NEW_TOKENS - 1
    assert relative_error(np.stack([logits[p] for p in positions]), expected[positions].numpy()) < 2e-2


def fake_quantize_decoder(model, block_size=32):
    """Rounds the decoder's linear layers and proj_out (tied: the token embedding too) as the int4
    build does (symmetric RTN through ONNX Runtime's quantizer); the encoder, and the cross
    attention's k_proj and v_proj it computes, stay float."""
    with torch.no_grad():
        for name, module in model.named_modules():
            in_encoder = name.startswith("model.encoder.") or name.endswith(("encoder_attn.k_proj",
                                                                             "encoder_attn.v_proj"))
            if isinstance(module, torch.nn.Linear) and not in_encoder:
                module.weight.copy_(fake_quantize(module.weight, 4, block_size, True))


def test_int4_decoder_matches_fake_quantized_transformers(source, tmp_path):
    # accuracy_level 0: MatMulNBits computes in float32, so the logits equal transformers' on the
    # same rounded weights to float32 precision.
    out = build(source, tmp_path / "int4", "-p", "int4", "--quant-method", "rtn", "--symmetric",
                "--block-size", "32", "--accuracy-level", "0")
    ops = {n: Counter(node.op_type for node in onnx.load(out / f"{n}.onnx", load_external_data=False).graph.node)
           for n in ("encoder", "model")}
    # per layer: self_attn q, k, v, out, encoder_attn q, out, fc1, fc2; then proj_out, whose 4-bit
    # matrix the token lookup gathers from (tied)
    assert ops["model"]["MatMulNBits"] == 2 * 8 + 1 and ops["model"]["GatherBlockQuantized"] == 1
    assert ops["encoder"]["MatMulNBits"] == 0
    features = reference_features(source)
    model = transformers_model(source)
    fake_quantize_decoder(model)
    encoded = run_encoder(out, features)
    hidden, cross = reference_encoder(model, features)
    assert relative_error(encoded["encoder_hidden_states"], hidden) < 1e-4  # the encoder is not quantized
    prefill, step, next_id = reference_logits(model, features, PROMPT)
    got_prefill, got_step = decoder_logits(out, encoded, PROMPT, next_id)
    assert relative_error(got_prefill, prefill) < 1e-4
    assert relative_error(got_step, step) < 1e-4
    assert got_prefill[-1].argmax() == next_id


def test_overwrite_replaces_a_whisper_build(source, package, tmp_path):
    # The encoder and audio_processor_config.json are a build's own files: --overwrite replaces them.
    out = build(source, tmp_path / "again", "-p", "fp32")
    assert build(source, out, "-p", "fp32", "--overwrite") == out


def test_text_only_is_refused_in_one_line(source, tmp_path, capsys):
    from builder.cli import main

    rc = main(["-m", str(source), "-o", str(tmp_path / "text"), "--text-only"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "encoder" in err, err
    assert not (tmp_path / "text").exists()


@pytest.mark.parametrize("change, key", [
    ({"feature_size": 128}, "feature_size"),  # not the model's num_mel_bins
    ({"sampling_rate": 8000}, "sampling_rate"),
    ({"n_fft": "400"}, "n_fft"),
    ({"hop_length": 0}, "hop_length"),
    ({"padding_value": 1.0}, "padding_value"),
])
def test_preprocessor_values_onnxruntime_extensions_cannot_follow_are_refused(source, tmp_path, capsys, change, key):
    import shutil

    from builder.cli import main

    copy = shutil.copytree(source, tmp_path / "src")
    pre = json.loads((copy / "preprocessor_config.json").read_text())
    (copy / "preprocessor_config.json").write_text(json.dumps({**pre, **change}))
    capsys.readouterr()
    rc = main(["-m", str(copy), "-o", str(tmp_path / "out"), "-q"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and key in err, err
    assert not (tmp_path / "out").exists()


def test_verify_refuses_whisper_in_one_line_after_writing(source, tmp_path, capsys):
    from builder.cli import main

    capsys.readouterr()
    rc = main(["-m", str(source), "-o", str(tmp_path / "v"), "-q", "-p", "fp32", "--verify"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "Whisper" in err, err
    assert (tmp_path / "v" / "encoder.onnx").is_file()
