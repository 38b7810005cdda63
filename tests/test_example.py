"""The checkpoint the repository ships: reproducible from its script, and it runs end to end."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import transformers
from helpers import assert_parity, build

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "tiny-llama"


def test_script_regenerates_the_shipped_files(tmp_path):
    subprocess.run([sys.executable, str(ROOT / "scripts" / "make_tiny_checkpoint.py"), "--output", str(tmp_path)], check=True)
    shipped = sorted(p.name for p in EXAMPLE.iterdir())
    assert shipped == sorted(p.name for p in tmp_path.iterdir())
    for name in shipped:
        assert (tmp_path / name).read_bytes() == (EXAMPLE / name).read_bytes(), name
    assert sum(p.stat().st_size for p in EXAMPLE.iterdir()) < 512 * 1024


def test_example_builds_and_chats_through_genai(tmp_path):
    import onnxruntime_genai as og

    out = build(EXAMPLE, tmp_path / "out", "-p", "fp32")  # bf16 weights widened to fp32
    assert_parity(out, EXAMPLE, tolerance=1e-4)
    model = og.Model(str(out))
    tokenizer = og.Tokenizer(model)
    text = "Hello, world! héllo"
    ids = list(tokenizer.encode(text))
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(EXAMPLE)
    assert ids == hf_tokenizer.encode(text)
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=len(ids) + 12)
    generator = og.Generator(model, params)
    generator.append_tokens(np.array([ids], dtype=np.int32))
    while not generator.is_done():
        generator.generate_next_token()
    generated = [int(t) for t in generator.get_sequence(0)]

    import torch

    hf = transformers.AutoModelForCausalLM.from_pretrained(EXAMPLE, dtype=torch.float32).eval()
    expected = hf.generate(torch.tensor([ids]), max_length=len(ids) + 12, do_sample=False, pad_token_id=2)[0].tolist()
    assert generated == expected
    assert isinstance(tokenizer.decode(generated), str)
