"""docs/DESIGN.md's layering, checked on the source: no import circles among builder's and the
architectures' modules (imports inside functions included), blocks never reach architectures or
the pipeline, and only the optional verify step imports torch, transformers or onnxruntime (the
speculative-decoding runner, which nothing imports, onnxruntime)."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("torch", "transformers", "onnxruntime")
# Lower layers and the only project modules each may import: the weight recipe API (lazy) sits on
# the pre-quantized block format and the write-time machinery, which know nothing of recipes nor of
# the input formats (what both share, giving back a mapped array's pages, lies below them); the
# publishing of an output knows nothing of models nor of options (of build.yaml it knows only how to
# tell builder's record; renames and the lock, nothing of outputs).
LAYERS = {
    "builder.stored_blocks": set(),
    "builder.mapped_pages": set(),
    "builder.pending_values": set(),
    "builder.lazy_results": set(),
    "builder.materialize": {"builder.mapped_pages", "builder.pending_values"},
    "builder.quantize": {"builder._kernel", "builder.mapped_pages", "builder.stored_blocks"},
    "builder.lazy": {"builder.stored_blocks", "builder.materialize", "builder.pending_values", "builder.lazy_results"},
    "builder.record_file": set(),
    "builder.renames": set(),
    "builder.output_lock": set(),
    "builder.output_folder": {"builder.audio_processor", "builder.errors", "builder.hub", "builder.image_processor",
                              "builder.record_file"},
    "builder.leftovers": {"builder.output_folder", "builder.output_lock", "builder.renames", "builder.units"},
    "builder.publish": {"builder.errors", "builder.leftovers", "builder.output_folder", "builder.output_lock",
                        "builder.renames"},
}


def modules() -> dict[str, set[str]]:
    """module -> the project modules it imports (anywhere in its file)."""
    files = {}
    for package in ("builder", "architectures"):
        for f in (ROOT / package).rglob("*.py"):
            name = ".".join(f.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            files[name] = f
    graph = {}
    for name, f in files.items():
        deps = set()
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                deps |= {f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in files else node.module
                         for a in node.names}
            elif isinstance(node, ast.Import):
                deps |= {a.name for a in node.names}
        graph[name] = deps - {name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, found = {}, {}, [], []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v] & graph.keys():
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while (w := stack.pop()) != v:
                component.append(w)
            if component:
                found.append(sorted([v, *component]))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_no_import_circles():
    assert cycles(modules()) == []


def test_blocks_never_reach_architectures_or_the_pipeline():
    for name, deps in modules().items():
        if name.startswith("builder.blocks"):
            assert not {d for d in deps if d.startswith(("architectures", "builder.pipeline", "builder.cli"))}, name


def test_input_formats_never_reach_the_pipeline_architectures_or_blocks():
    # builder/inputs/ reads files into lazy Weights; what is built from them lies above it, and so do
    # the build's options (lora.py reads the few it needs through a protocol of its own).
    for name, deps in modules().items():
        if name.startswith("builder.inputs"):
            upward = {d for d in deps if d.startswith(("architectures", "builder.pipeline", "builder.cli",
                                                        "builder.blocks", "builder.architecture", "builder.family",
                                                        "builder.options", "builder.config_file"))}
            assert not upward, f"{name} imports {upward}"
    assert {n for n in modules() if n.startswith("builder.inputs.")} >= {
        "builder.inputs.source", "builder.inputs.read", "builder.inputs.safetensors", "builder.inputs.gguf.checkpoint"}


def test_heavy_imports_only_in_verify():
    # builder.speculative runs a built package in ONNX Runtime (never torch); nothing imports it.
    allowed = {"builder.verify": set(HEAVY), "builder.verify_head": {"torch"}, "builder.speculative": {"onnxruntime"}}
    for name, deps in modules().items():
        heavy = {d.split(".")[0] for d in deps if d.split(".")[0] in HEAVY}
        assert heavy <= allowed.get(name, set()), f"{name} imports {heavy}"
        assert "builder.speculative" not in deps or name == "builder.verify", f"{name} imports builder.speculative"


def test_lower_layers_import_only_what_lies_below_them():
    graph = modules()
    for name, allowed in LAYERS.items():
        project = {d for d in graph[name] if d.split(".")[0] in ("builder", "architectures")}
        assert project <= allowed, f"{name} imports {project - allowed}"


def test_the_core_never_imports_the_families():
    # builder reaches the families through builder/registry.py's entry points only (pyproject.toml:
    # builder.families), so the families stand above the core and another package can add its own.
    graph = modules()
    reaching = sorted(m for m, deps in graph.items() if m.startswith("builder")
                      and any(d == "architectures" or d.startswith("architectures.") for d in deps))
    assert reaching == []
