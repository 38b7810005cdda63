"""Benchmark builds of a checkpoint: wall and CPU time, peak RSS of the process tree, bytes in and
out, input GB/s, against the machine's floor (read every input byte once, write as many bytes as
the output has), measured in the same run. With --compare, onnxruntime-genai's model builder runs
on the same checkpoint, runs alternating, and the ratios are printed. RSS is sampled over time and
both tools' curves are drawn on one plot.

    python scripts/make_synthetic_checkpoint.py Llama-3.2-1B /data/llama-3.2-1b
    python scripts/benchmark.py /data/llama-3.2-1b --precision int4 fp16 --runs 3 --compare --plot docs/llama-1b.png

Page caches are dropped before every run when the script may (root); otherwise it says so.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

PAGE = os.sysconf("SC_PAGE_SIZE")


@dataclass
class Run:
    tool: str
    precision: str
    wall_s: float
    cpu_s: float
    peak_rss: int
    bytes_in: int
    bytes_out: int
    samples: list[tuple[float, int]] = field(default_factory=list)

    @property
    def gb_per_s(self) -> float:
        return self.bytes_in / self.wall_s / 1e9


def drop_caches() -> bool:
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def tree_rss(pid: int) -> int:
    """Resident bytes of a process and all its descendants, from /proc."""
    total, stack = 0, [pid]
    while stack:
        p = stack.pop()
        try:
            total += int(Path(f"/proc/{p}/statm").read_text().split()[1]) * PAGE
            for task in Path(f"/proc/{p}/task").iterdir():
                stack.extend(int(c) for c in (task / "children").read_text().split())
        except (OSError, ValueError):
            continue
    return total


def measure(cmd: list[str], tool: str, precision: str, bytes_in: int, out: Path, interval: float = 0.05) -> Run:
    before = os.times()
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    samples: list[tuple[float, int]] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            samples.append((time.perf_counter() - start, tree_rss(proc.pid)))
            time.sleep(interval)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _, err = proc.communicate()
    wall = time.perf_counter() - start
    stop.set()
    sampler.join()
    after = os.times()
    if proc.returncode != 0:
        raise SystemExit(f"{tool} failed ({proc.returncode}): {err.decode()[-2000:]}")
    cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    bytes_out = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    peak = max((r for _, r in samples), default=0)
    return Run(tool, precision, wall, cpu, peak, bytes_in, bytes_out, samples)


def floor(checkpoint: Path, bytes_out: int, scratch: Path) -> float:
    """Seconds to read every input byte once and write `bytes_out` bytes, as plainly as Python can."""
    start = time.perf_counter()
    buf = bytearray(64 * 2**20)
    view = memoryview(buf)
    for f in sorted(checkpoint.glob("*.safetensors")):
        with open(f, "rb", buffering=0) as fh:
            while fh.readinto(view):
                pass
    target = scratch / "floor.bin"
    with open(target, "wb", buffering=0) as fh:
        left = bytes_out
        while left > 0:
            left -= fh.write(view[: min(left, len(buf))])
    elapsed = time.perf_counter() - start
    target.unlink()
    return elapsed


def builder_cmd(checkpoint: Path, out: Path, precision: str, flags: tuple[str, ...] = ()) -> list[str]:
    return [sys.executable, "-m", "builder", "-m", str(checkpoint), "-o", str(out), "-p", precision,
            "-e", "cpu", "-q", "--overwrite", *flags]


def genai_cmd(checkpoint: Path, out: Path, precision: str) -> list[str]:
    return [sys.executable, "-m", "onnxruntime_genai.models.builder", "-m", checkpoint.name, "-i", str(checkpoint),
            "-o", str(out), "-p", precision, "-e", "cpu", "-c", str(out.parent / "genai-cache")]


def plot(runs: list[Run], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.5))
    colors = {"builder": "tab:blue", "onnxruntime-genai": "tab:orange"}
    seen = set()
    for r in runs:
        label = f"{r.tool} {r.precision}"
        style = "-" if r.precision == "int4" else "--"
        ax.plot([t for t, _ in r.samples], [m / 2**30 for _, m in r.samples], style, color=colors.get(r.tool),
                label=None if label in seen else label, linewidth=1.2)
        seen.add(label)
    ax.set_xlabel("seconds")
    ax.set_ylabel("RSS of the process tree (GiB)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkpoint", type=Path)
    ap.add_argument("--precision", nargs="+", default=["int4", "fp16"])
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--compare", action="store_true", help="also run onnxruntime-genai's builder")
    ap.add_argument("--plot", type=Path, help="PNG of RSS over time")
    ap.add_argument("--json", type=Path, help="write every run's numbers here")
    ap.add_argument("--scratch", type=Path, help="where outputs go (default: a temporary folder)")
    ap.add_argument("--builder-flags", default="", help="more flags for builder, one string: "
                    "--builder-flags='--quant-method search'")
    args = ap.parse_args()

    bytes_in = sum(f.stat().st_size for f in args.checkpoint.glob("*.safetensors"))
    scratch = args.scratch or Path(tempfile.mkdtemp(prefix="builder-bench-"))
    scratch.mkdir(parents=True, exist_ok=True)
    cold = drop_caches()
    print(f"checkpoint {args.checkpoint} ({bytes_in / 1e9:.2f} GB), {os.cpu_count()} cores, "
          f"page cache {'dropped before each run' if cold else 'NOT dropped (not root): warm runs'}")
    flags = tuple(shlex.split(args.builder_flags))
    tools = [("builder", lambda c, o, p: builder_cmd(c, o, p, flags))] + ([("onnxruntime-genai", genai_cmd)] if args.compare else [])
    runs: list[Run] = []
    floors: dict[str, list[float]] = {}
    for precision in args.precision:
        for i in range(args.runs):
            for tool, cmd in tools:  # alternate the tools within each round
                out = scratch / f"{tool}-{precision}"
                shutil.rmtree(out, ignore_errors=True)
                drop_caches()
                r = measure(cmd(args.checkpoint, out, precision), tool, precision, bytes_in, out)
                runs.append(r)
                print(f"  {tool:18s} {precision} run {i + 1}: {r.wall_s:6.1f} s wall, {r.cpu_s:6.1f} s cpu, "
                      f"peak {r.peak_rss / 2**30:5.2f} GiB, out {r.bytes_out / 1e9:.2f} GB, {r.gb_per_s:.2f} GB/s in")
                if tool == "builder":
                    drop_caches()
                    floors.setdefault(precision, []).append(floor(args.checkpoint, r.bytes_out, scratch))
                shutil.rmtree(out, ignore_errors=True)

    print("\nmedians")
    summary = {}
    for precision in args.precision:
        row = {}
        for tool, _ in tools:
            rs = [r for r in runs if r.tool == tool and r.precision == precision]
            row[tool] = {"wall_s": statistics.median(r.wall_s for r in rs),
                         "cpu_s": statistics.median(r.cpu_s for r in rs),
                         "peak_gib": statistics.median(r.peak_rss for r in rs) / 2**30,
                         "min_wall_s": min(r.wall_s for r in rs), "max_wall_s": max(r.wall_s for r in rs)}
        fl = statistics.median(floors[precision])
        b = row["builder"]
        print(f"  {precision}: builder {b['wall_s']:.1f} s ({b['min_wall_s']:.1f}-{b['max_wall_s']:.1f}), "
              f"peak {b['peak_gib']:.2f} GiB; floor {fl:.1f} s; builder/floor {b['wall_s'] / fl:.2f}x")
        if args.compare:
            g = row["onnxruntime-genai"]
            print(f"  {precision}: onnxruntime-genai {g['wall_s']:.1f} s ({g['min_wall_s']:.1f}-{g['max_wall_s']:.1f}), "
                  f"peak {g['peak_gib']:.2f} GiB; genai/builder: time {g['wall_s'] / b['wall_s']:.1f}x, "
                  f"peak RSS {g['peak_gib'] / b['peak_gib']:.1f}x")
        summary[precision] = {**row, "floor_s": fl}
    if args.plot:
        plot(runs, args.plot, f"{args.checkpoint.name}: RSS over time")
        print(f"plot: {args.plot}")
    if args.json:
        args.json.write_text(json.dumps({"summary": summary, "runs": [
            {k: v for k, v in asdict(r).items() if k != "samples"} for r in runs]}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
