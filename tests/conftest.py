import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from helpers import make_checkpoint  # noqa: E402

# Small enough to build in well under a second, big enough for GQA (4 query heads, 2 KV heads).
TINY = dict(
    vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
)


@pytest.fixture(scope="session", autouse=True)
def private_cache(tmp_path_factory):
    """builder's cache of input digests (builder/digests.py) in a folder of the test session's own,
    for builds in this process and in the CLI subprocesses the tests start."""
    import os

    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("xdg-cache"))


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("tiny-llama"), "LlamaConfig", **TINY)
