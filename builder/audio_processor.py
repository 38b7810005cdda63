"""The audio processor file onnxruntime-genai's Whisper processor reads (onnxruntime-extensions'
speech feature extraction: decode → STFT magnitudes → log-mel), written from a checkpoint's
preprocessor_config.json (WhisperFeatureExtractor's keys).

The three operations and their attributes are those onnxruntime-genai's own Whisper exporter
writes (onnxruntime_genai/models/builders/whisper.py); on 16 kHz audio their features equal
transformers' WhisperFeatureExtractor's to about 3e-5 (tests/test_whisper.py measures it).
"""

from __future__ import annotations

from typing import Any

from builder.errors import BuildError

AUDIO_PROCESSOR_FILE = "audio_processor_config.json"  # onnxruntime-genai's default speech.config_filename

# WhisperFeatureExtractor's defaults for the keys preprocessor_config.json leaves out (its
# feature_size: the model's num_mel_bins, as a checkpoint without the file can only mean).
DEFAULTS = {"sampling_rate": 16_000, "hop_length": 160, "chunk_length": 30, "n_fft": 400, "padding_value": 0.0}


def whisper_processor(pre: dict[str, Any], num_mel_bins: int) -> dict[str, Any]:
    """The processor JSON for log-mel features of `num_mel_bins` bins; `pre` is
    preprocessor_config.json ({} without one). Refuses, naming the key, what onnxruntime-extensions
    cannot compute the same way."""
    pre = {**DEFAULTS, "feature_size": num_mel_bins, **{k: v for k, v in pre.items() if v is not None}}
    if pre["feature_size"] != num_mel_bins:
        raise BuildError(f"preprocessor_config.json: feature_size {pre['feature_size']} is not the model's "
                         f"num_mel_bins {num_mel_bins}")
    if pre["sampling_rate"] != 16_000:
        raise BuildError(f"preprocessor_config.json: sampling_rate {pre['sampling_rate']}; onnxruntime-extensions' "
                         "log-mel features are Whisper's 16 kHz ones")
    for key in ("hop_length", "chunk_length", "n_fft"):
        if not isinstance(pre[key], int) or isinstance(pre[key], bool) or pre[key] <= 0:
            raise BuildError(f"preprocessor_config.json: {key} must be a positive integer, got {pre[key]!r}")
    if pre["padding_value"] != 0.0:
        raise BuildError(f"preprocessor_config.json: padding_value {pre['padding_value']}; onnxruntime-extensions "
                         "pads the audio with silence (0.0)")
    n_fft, hop = pre["n_fft"], pre["hop_length"]
    return {"feature_extraction": {"sequence": [
        _op("audio_decoder", "AudioDecoder"),
        _op("STFT", "STFTNorm", n_fft=n_fft, frame_length=n_fft, hop_length=hop),
        _op("log_mel_spectrogram", "LogMelSpectrum", chunk_size=pre["chunk_length"], hop_length=hop, n_fft=n_fft,
            n_mel=num_mel_bins),
    ]}}


def _op(name: str, kind: str, **attrs: Any) -> dict[str, Any]:
    operation: dict[str, Any] = {"name": name, "type": kind}
    if attrs:
        operation["attrs"] = attrs
    return {"operation": operation}
