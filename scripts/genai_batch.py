"""onnxruntime-genai's greedy generation of a batch of prompts of different lengths, as users run
it: one function, needing only numpy and onnxruntime-genai (tests and scripts/cuda_check.py share it)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np


def genai_generate(folder: Path, prompts: list[list[int]], max_length: int) -> list[list[int]]:
    """Greedy generation of `prompts` as one batch, padded on the right with the model's pad id (as
    og.Tokenizer.encode_batch does); returns each row's tokens after the padded prompt."""
    import onnxruntime_genai as og

    pad = json.loads((Path(folder) / "genai_config.json").read_text())["model"]["pad_token_id"]
    width = max(map(len, prompts))
    batch = np.full((len(prompts), width), pad, np.int32)
    for row, ids in enumerate(prompts):
        batch[row, : len(ids)] = ids
    model = og.Model(str(folder))
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=max_length, batch_size=len(prompts))
    generator = og.Generator(model, params)
    generator.append_tokens(batch)
    while not generator.is_done():
        generator.generate_next_token()
    return [[int(t) for t in generator.get_sequence(row)][width:] for row in range(len(prompts))]
