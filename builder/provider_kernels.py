"""Which operators an ONNX Runtime execution provider can run, to refuse a build whose graph uses one
it cannot. The data is generated (builder/provider_kernels.json, package data written by
scripts/provider_kernels.py; its "about" cites the sources); this module only reads it, once, on the
first use of the table (RANGES, KERNELS, TYPES, SCHEMA_SINCE, PARSER_PROVIDERS, PROVIDERS, or a
function below).

ORT matches a node to a kernel registered as [start, end] when the node's schema since_version lies
in it, and to an open kernel "start+" only when since_version == start (kernel_registry.cc,
VerifyVersion): an ai.onnx op whose schema changed after the provider's newest kernel is missing at
the newer opset. trt-rtx has no kernels: its ranges bound the model's opset (TensorRT's parser).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

__all__ = ["KERNELS", "RANGES", "TYPES", "PROVIDERS", "bfloat16_fed", "bfloat16_missing", "missing", "ops_of",
           "refusal"]

if TYPE_CHECKING:  # read from the JSON on first use (__getattr__)
    ONNXRUNTIME_COMMIT: str
    SOURCES: dict[str, list[str]]
    PARSER_PROVIDERS: frozenset[str]
    RANGES: dict[str, dict[str, list[tuple[int, int | None]]]]  # provider -> "domain::Op" -> [(start, end)]
    KERNELS: dict[str, dict[str, tuple[int, int | None]]]  # provider -> "domain::Op" -> (lowest start, highest end)
    TYPES: dict[str, dict[str, list[str]]]  # provider -> "domain::Op" -> element types
    SCHEMA_SINCE: dict[str, tuple[int, ...]]  # "domain::Op" -> its schema's since_versions
    PROVIDERS: tuple[str, ...]

DATA = "provider_kernels.json"
_ONNX = ("", "ai.onnx")
# Ops ORT runs with no provider's kernel: Constant nodes become initializers when the graph loads.
NO_KERNEL_NEEDED = frozenset({"ai.onnx::Constant"})


def _span(ranges: list[tuple[int, int | None]]) -> tuple[int, int | None]:
    """(lowest start, highest end; None where a range is open)."""
    return min(lo for lo, _ in ranges), None if any(hi is None for _, hi in ranges) else max(hi for _, hi in ranges)


@functools.cache
def _table() -> dict[str, Any]:
    """The generated table, read from the package data once, as the names this module exports."""
    import json
    from importlib.resources import files

    data = json.loads(files(__package__).joinpath(DATA).read_text(encoding="utf-8"))
    ranges = {p: {k: [(lo, hi) for lo, hi in spans] for k, spans in ops.items()} for p, ops in data["ranges"].items()}
    return {"ONNXRUNTIME_COMMIT": data["onnxruntime_commit"],
            "SOURCES": data["sources"],
            "PARSER_PROVIDERS": frozenset(data["parser_providers"]),
            "KERNELS": {p: {k: _span(spans) for k, spans in ops.items()} for p, ops in ranges.items()},
            "RANGES": ranges,
            "TYPES": data["types"],
            "SCHEMA_SINCE": {k: tuple(v) for k, v in data["schema_since"].items()},
            "PROVIDERS": tuple(ranges)}


def __getattr__(name: str):
    table = _table()
    if name not in table:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals().update(table)  # later lookups find the names directly
    return table[name]


def _key(domain: str, op_type: str) -> str:
    return f"{'ai.onnx' if domain in _ONNX else domain}::{op_type}"


def _since(key: str, opset: int) -> int | None:
    """The since_version of key's schema at the model's opset; None where the schema is unknown."""
    versions = _table()["SCHEMA_SINCE"].get(key)
    if not versions:
        return None
    older = [v for v in versions if v <= opset]
    return older[-1] if older else None


def supported(domain: str, op_type: str, opset: int, provider: str) -> bool:
    key = _key(domain, op_type)
    if key in NO_KERNEL_NEEDED:
        return True
    table = _table()
    ranges = table["RANGES"][provider].get(key)
    if not ranges:
        return False
    since = None if provider in table["PARSER_PROVIDERS"] else _since(key, opset)
    if since is None:  # no schema history (contrib domains, parser providers): bound the opset itself
        return any(lo <= opset and (hi is None or opset <= hi) for lo, hi in ranges)
    return any(lo == since if hi is None else lo <= since <= hi for lo, hi in ranges)


def ops_of(model) -> set[tuple[str, str, int]]:
    """(domain, op_type, the model's opset for that domain) of every node of an onnx_ir Model (its
    subgraphs included)."""
    import onnx_ir.traversal

    opsets = {("" if d == "ai.onnx" else d): v for d, v in model.graph.opset_imports.items()}
    out = set()
    for node in onnx_ir.traversal.RecursiveGraphIterator(model.graph):
        domain = "" if node.domain == "ai.onnx" else node.domain
        out.add((domain, node.op_type, node.version or opsets.get(domain, 1)))
    return out


def missing(model_ops: Iterable[tuple[str, str, int]], provider: str) -> list[str]:
    """The "domain::Op" names among (domain, op_type, the model's opset for that domain) that
    provider has no kernel for at that opset; sorted, each once."""
    if provider not in _table()["RANGES"]:
        raise ValueError(f"unknown provider {provider!r}; known: {', '.join(_table()['PROVIDERS'])}")
    return sorted({_key(d, op) for d, op, v in model_ops if not supported(d, op, int(v), provider)})


def refusal(model_ops: Iterable[tuple[str, str, int]], provider: str) -> str | None:
    """One line refusing the build, or None when the provider has every op."""
    gone = missing(model_ops, provider)
    if not gone:
        return None
    return f"the {provider} execution provider has no kernel for {', '.join(gone)} (ONNX Runtime's registered kernels)"


# Element types of a node's outputs where they are not its first float input's (bfloat16_fed).
_BOOL_OUTPUTS = frozenset({"Equal", "Greater", "GreaterOrEqual", "Less", "LessOrEqual", "And", "Or", "Not", "Xor",
                           "IsNaN", "IsInf"})
_INT64_OUTPUTS = frozenset({"Shape", "Size", "ArgMax", "ArgMin", "NonZero"})
# A function ONNX Runtime expands into a Cast: no kernel of its own anywhere.
_EXPANDED = frozenset({"ai.onnx::CastLike"})


def bfloat16_fed(model) -> set[str]:
    """The "domain::Op" names of an onnx_ir Model's top-level nodes that are handed a bfloat16 input.

    Types are inferred the simple way builder's graphs allow, in node order: initializers and
    inputs carry theirs; Cast and CastLike give their target; comparisons give bool, Shape and the
    index ops int64 (and TopK's second output); Where its branches'; any other node its first
    float input's type, else its first known one."""
    import onnx_ir as ir

    floats = {ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16, ir.DataType.DOUBLE}
    types: dict[ir.Value, ir.DataType | None] = {}

    def kind(v: ir.Value | None) -> ir.DataType | None:
        if v is None:
            return None
        return types[v] if v in types else v.dtype

    fed = set()
    for node in model.graph:
        inputs = [kind(v) for v in node.inputs]
        known = [t for t in inputs if t is not None]
        if ir.DataType.BFLOAT16 in known:
            fed.add(_key(node.domain, node.op_type))
        if node.op_type == "Cast":
            out = ir.DataType(node.attributes["to"].value)
        elif node.op_type == "CastLike":
            out = inputs[1]
        elif node.op_type in _BOOL_OUTPUTS:
            out = ir.DataType.BOOL
        elif node.op_type in _INT64_OUTPUTS:
            out = ir.DataType.INT64
        elif node.op_type == "Where":
            out = inputs[1]
        else:
            out = next((t for t in known if t in floats), known[0] if known else None)
        for position, value in enumerate(node.outputs):
            types[value] = ir.DataType.INT64 if node.op_type == "TopK" and position == 1 else (value.dtype or out)
    return fed


def bfloat16_missing(model, provider: str) -> list[str]:
    """The operators the model hands bfloat16 that `provider` has kernels for, but none of them
    bfloat16 (operators with no kernel at all are `missing`'s); sorted. Empty for a provider whose
    kernels' types the data does not list."""
    kernels = _table()["TYPES"].get(provider, {})
    return sorted(op for op in bfloat16_fed(model) - _EXPANDED
                  if op in kernels and not {"bfloat16", "bf16"} & set(kernels[op]))  # TensorRT's spelling: bf16
