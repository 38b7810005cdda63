"""The build path needs neither torch nor transformers: a build where importing them fails."""

import subprocess
import sys

from helpers import assert_parity

SCRIPT = """
import sys
sys.modules["torch"] = None          # `import torch` now raises ImportError
sys.modules["transformers"] = None
from builder.cli import main
rc = main(sys.argv[1:])
heavy = [m for m in ("torch", "transformers", "onnxruntime") if sys.modules.get(m) is not None]
assert not heavy, heavy
sys.exit(rc)
"""


def test_build_without_torch(tiny_llama, tmp_path):
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-c", SCRIPT, "-m", str(tiny_llama), "-o", str(out), "-q", "-p", "fp32"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert_parity(out, tiny_llama, tolerance=1e-4)
