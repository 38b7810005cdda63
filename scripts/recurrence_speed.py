"""Speed of the linear recurrence's two forms (builder/blocks/linear_recurrence.py) on ONNX Runtime's
CPU: com.microsoft::LinearAttention, which CPU builds use, against the standard-op Scan that other
providers get, for a prompt and for one decode step. The default sizes are one Mamba-2 layer of
granite-4.0-h-tiny (48 heads of 64, one group of B and C, state 128), the plain gated rule.

    python scripts/recurrence_speed.py --prompt 512
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def recurrence_session(fused: bool, heads):
    """An ONNX Runtime session of builder.blocks.linear_recurrence's plain gated rule alone (no β),
    float32: inputs q, k (B, S, key_heads, key_dim), v (B, S, value_heads, value_dim), decay
    (B, S, value_heads), keep (B, S, 1), past; outputs out and present."""
    import onnx_ir as ir
    import onnxruntime as ort

    from builder.blocks.linear_recurrence import linear_recurrence
    from builder.graph import Graph

    def value(name, *dims):
        return ir.Value(name=name, type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape(("B", "S", *dims)))

    Hk, Hv, Dk, Dv = heads.key_heads, heads.value_heads, heads.key_dim, heads.value_dim
    g = Graph()
    past = ir.Value(name="past", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape(("B", Hv, Dk, Dv)))
    inputs = [value("q", Hk, Dk), value("k", Hk, Dk), value("v", Hv, Dv), value("decay", Hv), value("keep", 1), past]
    q, k, v, decay, keep, _ = inputs
    out, present = linear_recurrence(g, q, k, v, decay, None, keep, past, heads, fused)
    out.name, present.name = "out", "present"
    model = ir.serde.serialize_model(g.model(inputs, [out, present]))
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--heads", type=int, default=48)
    ap.add_argument("--groups", type=int, default=1)
    ap.add_argument("--state", type=int, default=128, help="key_dim: Mamba-2's state size")
    ap.add_argument("--head-dim", type=int, default=64, help="value_dim: Mamba-2's head_dim")
    args = ap.parse_args(argv)
    from builder.blocks.linear_recurrence import RecurrentHeads

    heads = RecurrentHeads(args.groups, args.heads, args.state, args.head_dim)
    rng = np.random.default_rng(0)

    def feed(s: int) -> dict[str, np.ndarray]:
        shapes = dict(q=(1, s, args.groups, args.state), k=(1, s, args.groups, args.state),
                      v=(1, s, args.heads, args.head_dim), decay=(1, s, args.heads))
        f = {n: rng.standard_normal(shape).astype(np.float32) for n, shape in shapes.items()}
        f["decay"] = -np.abs(f["decay"])
        f.update(keep=np.ones((1, s, 1), np.float32), past=np.zeros((1, args.heads, args.state, args.head_dim), np.float32))
        return f

    for fused in (True, False):
        session = recurrence_session(fused, heads)
        for tokens, reps in ((args.prompt, 10), (1, 200)):
            f = feed(tokens)
            session.run(None, f)
            start = time.perf_counter()
            for _ in range(reps):
                session.run(None, f)
            name = "LinearAttention" if fused else "Scan"
            print(f"{name:15s} {tokens:5d} tokens: {(time.perf_counter() - start) / reps * 1e3:.3f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
