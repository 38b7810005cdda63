"""What Gemma's float32 residual stream costs in decode speed (fp16 build, ONNX Runtime CPU).

Builds one random Gemma 3 of gemma-3-1b's layer shape (hidden 1152, MLP 6912, 4/1 heads of 256;
8 layers and a 32k vocabulary to keep it quick) twice — with the float32 stream builder uses for
Gemma in fp16, and with the stream left in fp16 — and times decode steps of each.

    python scripts/residual_cost.py [--steps 64] [--layers 8]

Needs the test extras (transformers, torch, onnxruntime).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def decode_ms(folder: Path, steps: int) -> float:
    from helpers import OnnxDecoder

    decoder = OnnxDecoder(folder)
    ids = list(range(3, 19))
    logits, present = decoder.run(ids, None, len(ids))
    times = []
    for _ in range(steps):
        ids.append(int(logits[-1].argmax()))
        start = time.perf_counter()
        logits, present = decoder.run(ids[-1:], present, len(ids))
        times.append(time.perf_counter() - start)
        assert np.isfinite(logits).all()
    return 1000 * statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=64)
    p.add_argument("--layers", type=int, default=8)
    args = p.parse_args()
    from helpers import build, make_checkpoint

    import builder.blocks.residual as decoder

    root = Path(tempfile.mkdtemp())
    source = make_checkpoint(root / "src", "Gemma3TextConfig", vocab_size=32000, hidden_size=1152,
                             intermediate_size=6912, num_hidden_layers=args.layers, num_attention_heads=4,
                             num_key_value_heads=1, head_dim=256, max_position_embeddings=512, sliding_window=512)
    float32_stream = build(source, root / "fp32-stream", "-p", "fp16")
    original = decoder.ResidualStream.__init__
    decoder.ResidualStream.__init__ = lambda self, g, x, eps, target, dtype=None: original(self, g, x, eps, target)
    fp16_stream = build(source, root / "fp16-stream", "-p", "fp16")
    decoder.ResidualStream.__init__ = original
    for _ in range(2):  # alternate, so neither gets a warmer machine
        for name, folder in (("float32 stream", float32_stream), ("fp16 stream", fp16_stream)):
            print(f"{name:15s} {decode_ms(folder, args.steps):7.2f} ms per decode step (median of {args.steps})")


if __name__ == "__main__":
    main()
