"""How often a quantized mixture-of-experts build picks other experts than the fp32 build.

Routing is discontinuous: a router logit moved by the rounding of earlier layers (int4 attention
and experts, int8 activations at accuracy_level 4) can swap an expert in or out of a token's
top-k. This builds each family's tiny test checkpoint (tests/test_family_*moe*.py) in fp32 and in
int4 at each accuracy level, exposes the logits every MoE/QMoE node is fed (the router's, or
for Phi-3.5-MoE and ERNIE 4.5 MoE the chosen experts' log-weights), and counts the tokens of
the test prompts (helpers.PROMPT and GENAI_PROMPT, prefill) whose top-k set differs from
fp32's, per sparse layer.

    python scripts/moe_router_flips.py                 # every family, accuracy levels 0 and 4
    python scripts/moe_router_flips.py gptoss phimoe
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))


def with_router_outputs(folder: Path, out: Path) -> tuple[Path, list[tuple[str, int]]]:
    """A copy of the built model whose outputs also hold each MoE/QMoE node's routing logits
    (B·S, E); returns the folder and each node's (output name, k)."""
    model = onnx.load(folder / "model.onnx", load_external_data=False)
    routers = [(n.input[1], next(a.i for a in n.attribute if a.name == "k"))
               for n in model.graph.node if n.op_type in ("MoE", "QMoE")]
    model.graph.output.extend(onnx.ValueInfoProto(name=name) for name, _ in routers)
    out.mkdir()
    onnx.save(model, out / "model.onnx")
    os.link(folder / "model.onnx.data", out / "model.onnx.data")  # ONNX Runtime refuses a link out of the folder
    shutil.copy(folder / "genai_config.json", out)
    return out, routers


def choices(folder: Path, prompts: list[list[int]]) -> np.ndarray:
    """Each token's top-k expert set at each sparse layer: bool (layers, tokens, experts)."""
    from helpers import OnnxDecoder

    with tempfile.TemporaryDirectory(dir=folder.parent) as tmp:  # beside it: a hard link needs the same disk
        exposed, routers = with_router_outputs(folder, Path(tmp) / "routers")
        decoder = OnnxDecoder(exposed)
        per_prompt = []
        for ids in prompts:
            _, outs = decoder.run(ids, None, len(ids))
            layers = []
            for name, k in routers:
                logits = outs[name].astype(np.float32)  # (tokens, experts)
                chosen = np.zeros(logits.shape, bool)
                np.put_along_axis(chosen, np.argsort(-logits, -1)[:, :k], True, -1)
                layers.append(chosen)
            per_prompt.append(np.stack(layers))
    return np.concatenate(per_prompt, axis=1)


def flips(source: Path, work: Path, levels: tuple[int, ...]) -> tuple[int, dict[int, int]]:
    """(choices counted, {accuracy level: choices that differ from fp32's})."""
    from helpers import GENAI_PROMPT, PROMPT, build

    prompts = [PROMPT, GENAI_PROMPT]
    reference = choices(build(source, work / "fp32", "-p", "fp32"), prompts)
    counts = {}
    for level in levels:
        got = choices(build(source, work / f"int4-{level}", "-p", "int4", "--accuracy-level", str(level)), prompts)
        counts[level] = int((got != reference).any(-1).sum())
    return reference.shape[0] * reference.shape[1], counts


def main(argv: list[str] | None = None) -> int:
    from test_family_moe_precisions import FAMILIES, make

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("families", nargs="*", help=f"some of {', '.join(FAMILIES)} (default: all)")
    ap.add_argument("--levels", type=int, nargs="+", default=[0, 4])
    args = ap.parse_args(argv)
    if unknown := set(args.families) - set(FAMILIES):
        ap.error(f"unknown families {sorted(unknown)}; known: {', '.join(FAMILIES)}")
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.families or FAMILIES:
            work = Path(tmp) / name
            rows[name] = flips(make(work / "checkpoint", name), work, tuple(args.levels))
            print(f"{name}: {rows[name]}", file=sys.stderr, flush=True)
    print("| accuracy_level | " + " | ".join(f"{n} ({rows[n][0]})" for n in rows) + " |")
    print("|---" * (len(rows) + 1) + "|")
    for level in args.levels:
        print(f"| {level} | " + " | ".join(str(rows[n][1][level]) for n in rows) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
