"""The README's Python snippets run as written: generating with onnxruntime-genai from a build,
and crafting a Llama from blocks into a folder onnxruntime-genai runs like a CLI build."""

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import GENAI_PROMPT, build

from builder.cli import main

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "tiny-llama"


def snippet(heading: str) -> str:
    """The first ```python block under `heading` in README.md."""
    text = (ROOT / "README.md").read_text()
    match = re.search(rf"^{re.escape(heading)}\n.*?```python\n(.*?)```", text, re.S | re.M)
    assert match, f"no python block under {heading!r} in README.md"
    return match.group(1)


def run_snippet(code: str, cwd: Path) -> str:
    """Runs `code` as a user would paste it, in `cwd` (which sees the repository's examples/)."""
    if not (cwd / "examples").exists():
        (cwd / "examples").symlink_to(ROOT / "examples")
    r = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r.stdout


def greedy(folder: Path, ids: list[int], new_tokens: int) -> list[int]:
    import onnxruntime_genai as og

    model = og.Model(str(folder))
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=len(ids) + new_tokens)
    generator = og.Generator(model, params)
    generator.append_tokens(np.array([ids], dtype=np.int32))
    while not generator.is_done():
        generator.generate_next_token()
    return [int(t) for t in generator.get_sequence(0)]


def test_run_snippet_generates_from_the_tiny_build(tmp_path):
    import onnxruntime_genai as og

    # The README's first command: the default (int4) build of the shipped example into out/tiny-llama.
    assert main(["-m", str(EXAMPLE), "-o", str(tmp_path / "out" / "tiny-llama"), "--overwrite", "-q"]) == 0
    printed = run_snippet(snippet("## Run the model"), tmp_path).rstrip("\n")
    prompt = "Hello, world!"
    model = og.Model(str(tmp_path / "out" / "tiny-llama"))
    tokenizer = og.Tokenizer(model)
    ids = [int(t) for t in tokenizer.encode(prompt)]
    tokens = greedy(tmp_path / "out" / "tiny-llama", ids, 32 - len(ids))  # the snippet's max_length=32
    assert len(tokens) > len(ids)  # it generated
    assert printed == tokenizer.decode(tokens) and printed.startswith(prompt) and len(printed) > len(prompt)


def test_crafting_snippet_saves_a_folder_genai_runs_like_a_build(tmp_path):
    run_snippet(snippet("## Crafting a model in Python"), tmp_path)
    crafted = tmp_path / "out" / "my-llama"
    built = build(EXAMPLE, tmp_path / "built", "-p", "fp32")
    assert sorted(p.name for p in crafted.iterdir()) == sorted(p.name for p in built.iterdir())
    assert json.loads((crafted / "genai_config.json").read_text()) == json.loads((built / "genai_config.json").read_text())
    # The graph the CLI builds, byte for byte, and so the same greedy tokens all the way.
    for name in ("model.onnx", "model.onnx.data"):
        assert (crafted / name).read_bytes() == (built / name).read_bytes(), name
    assert greedy(crafted, GENAI_PROMPT, 30) == greedy(built, GENAI_PROMPT, 30)
    # A crafted folder holds build.yaml: saving it again with overwrite=True replaces it.
    (crafted / "stale.onnx").write_text("")  # named as a build's file: --overwrite replaces only those
    run_snippet(snippet("## Crafting a model in Python").replace('"out/my-llama"', '"out/my-llama", overwrite=True'),
                tmp_path)
    assert not (crafted / "stale.onnx").exists() and (crafted / "model.onnx").is_file()


@pytest.mark.parametrize("config_class, extra", [
    ("LlamaConfig", {}),
    ("MistralConfig", {"sliding_window": 16}),
    ("Qwen3Config", {"head_dim": 16}),
])
def test_save_describes_the_graph_as_the_pipeline_does(tmp_path, config_class, extra):
    """save()'s genai_config.json, read from the graph and config.json, equals the build's."""
    from conftest import TINY
    from helpers import make_checkpoint

    from builder.genai_config import genai_config
    from builder.options import BuildOptions
    from builder.pipeline import plan
    from builder.writer import crafted_info

    source = make_checkpoint(tmp_path / "ck", config_class, **{**TINY, **extra})
    options = BuildOptions(model=str(source), output=str(tmp_path / "out"), precision="int4",
                           windowed_kv_cache="sliding_window" in extra)
    p = plan(options, source)
    config = json.loads((source / "config.json").read_text())
    generation = json.loads((source / "generation_config.json").read_text())
    target = options.target()
    expected = genai_config(p.info, target, generation)
    assert genai_config(crafted_info(p.model, config, target), target, generation) == expected
    if extra.get("sliding_window"):
        assert expected["model"]["decoder"]["sliding_window"]["layers"] == [0, 1]


def test_architecture_table_is_the_registry():
    import architectures

    text = (ROOT / "README.md").read_text()
    table = dict(re.findall(r"^\| `(\w+)` \| `architectures/(\w+)\.py`", text, re.M))
    assert table == architectures.ARCHITECTURES
    count = re.search(r"(\d+) architectures, listed below", text)
    assert count and int(count.group(1)) == len(architectures.ARCHITECTURES)
