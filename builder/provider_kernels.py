"""Which operators an ONNX Runtime execution provider can run, to refuse a build whose graph uses one
it cannot. The data is generated (builder/_provider_kernels_data.py, scripts/provider_kernels.py);
this module only reads it.

ORT matches a node to a kernel registered as [start, end] when the node's schema since_version lies
in it, and to an open kernel "start+" only when since_version == start (kernel_registry.cc,
VerifyVersion): an ai.onnx op whose schema changed after the provider's newest kernel is missing at
the newer opset. trt-rtx has no kernels: its ranges bound the model's opset (TensorRT's parser).
"""

from __future__ import annotations

from collections.abc import Iterable

from ._provider_kernels_data import KERNELS, PARSER_PROVIDERS, RANGES, SCHEMA_SINCE, TYPES

__all__ = ["KERNELS", "RANGES", "TYPES", "PROVIDERS", "missing", "ops_of", "refusal"]

PROVIDERS = tuple(KERNELS)
_ONNX = ("", "ai.onnx")
# Ops ORT runs with no provider's kernel: Constant nodes become initializers when the graph loads.
NO_KERNEL_NEEDED = frozenset({"ai.onnx::Constant"})


def _key(domain: str, op_type: str) -> str:
    return f"{'ai.onnx' if domain in _ONNX else domain}::{op_type}"


def _since(key: str, opset: int) -> int | None:
    """The since_version of key's schema at the model's opset; None where the schema is unknown."""
    versions = SCHEMA_SINCE.get(key)
    if not versions:
        return None
    older = [v for v in versions if v <= opset]
    return older[-1] if older else None


def supported(domain: str, op_type: str, opset: int, provider: str) -> bool:
    key = _key(domain, op_type)
    if key in NO_KERNEL_NEEDED:
        return True
    ranges = RANGES[provider].get(key)
    if not ranges:
        return False
    since = None if provider in PARSER_PROVIDERS else _since(key, opset)
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
    if provider not in RANGES:
        raise ValueError(f"unknown provider {provider!r}; known: {', '.join(PROVIDERS)}")
    return sorted({_key(d, op) for d, op, v in model_ops if not supported(d, op, int(v), provider)})


def refusal(model_ops: Iterable[tuple[str, str, int]], provider: str) -> str | None:
    """One line refusing the build, or None when the provider has every op."""
    gone = missing(model_ops, provider)
    if not gone:
        return None
    return f"the {provider} execution provider has no kernel for {', '.join(gone)} (ONNX Runtime's registered kernels)"
