"""Writes tests/data/speech.wav: espeak-ng (Debian's `espeak-ng` package) speaking one sentence,
resampled from its 22 050 Hz to Whisper's 16 kHz mono 16-bit PCM.

    python scripts/make_speech_wav.py            # needs espeak-ng on PATH; CI reads the committed file

espeak-ng writes only its native rate; the resampling is band-limited (the spectrum cut at the new
Nyquist frequency, numpy's FFT), so the file is reproducible without scipy or sox.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import wave
from pathlib import Path

import numpy as np

SENTENCE = "Hello world, this is a test of speech."
RATE = 16_000
OUT = Path(__file__).resolve().parent.parent / "tests" / "data" / "speech.wav"


def resample(x: np.ndarray, rate: int, new_rate: int) -> np.ndarray:
    n = round(len(x) * new_rate / rate)
    spectrum = np.fft.rfft(x)[: n // 2 + 1]
    return np.fft.irfft(spectrum, n) * (n / len(x))


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "raw.wav"
        subprocess.run(["espeak-ng", "-v", "en-us", "-s", "160", "-w", str(raw), SENTENCE], check=True)
        with wave.open(str(raw)) as w:
            rate, samples = w.getframerate(), np.frombuffer(w.readframes(w.getnframes()), np.int16)
    pcm = np.clip(np.round(resample(samples.astype(np.float64), rate, RATE)), -32768, 32767).astype(np.int16)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    with wave.open(str(OUT), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(RATE)
        w.writeframes(pcm.tobytes())
    print(f"wrote {OUT} ({len(pcm) / RATE:.2f} s, {OUT.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
