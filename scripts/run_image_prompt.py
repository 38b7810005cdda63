"""Runs a built image-and-text package through onnxruntime-genai's multimodal API on one image and
times it: model load, the prompt (vision, embedding and decoder models), decode steps, peak RSS.

    python scripts/run_image_prompt.py gemma-3-12b-it-int4-cpu photo.jpg "What is in this picture?"

Without an image file, a 640x480 test pattern is written and used (needs Pillow).
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import time
from pathlib import Path


def test_pattern(path: Path) -> Path:
    import numpy as np
    from PIL import Image

    y, x = np.mgrid[0:480, 0:640]
    Image.fromarray(np.stack([x % 256, y % 256, (x + y) % 256], -1).astype(np.uint8)).save(path)
    return path


def main() -> None:
    import onnxruntime_genai as og

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder")
    ap.add_argument("image", nargs="?")
    ap.add_argument("question", nargs="?", default="What is in this picture?")
    ap.add_argument("--new-tokens", type=int, default=2)
    args = ap.parse_args()
    image = args.image or str(test_pattern(Path(tempfile.mkdtemp()) / "pattern.jpg"))
    started = time.perf_counter()
    model = og.Model(args.folder)
    print(f"load {time.perf_counter() - started:.1f} s", flush=True)
    processor = model.create_multimodal_processor()
    inputs = processor(f"<start_of_image>{args.question}", images=og.Images.open(image))
    prompt = inputs["input_ids"].as_numpy().shape[1]
    print(f"prompt {prompt} tokens, pixels {inputs['pixel_values'].as_numpy().shape}", flush=True)
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=prompt + args.new_tokens + 1, do_sample=False)
    generator = og.Generator(model, params)
    generator.set_inputs(inputs)
    started = time.perf_counter()
    generator.generate_next_token()
    print(f"prompt (vision + embedding + decoder) {time.perf_counter() - started:.1f} s", flush=True)
    for _ in range(args.new_tokens):
        started = time.perf_counter()
        generator.generate_next_token()
        print(f"decode step {time.perf_counter() - started:.2f} s", flush=True)
    tokenizer = og.Tokenizer(model)
    print("generated:", repr(tokenizer.decode(generator.get_sequence(0)[prompt:])))
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.1f} GiB")


if __name__ == "__main__":
    main()
