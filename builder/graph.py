"""A thin layer over `onnx_ir.tape.Tape`: ops that read like ONNX, named by module path.

    g = Graph()
    with g.scope("model", "layers.3", "self_attn", "q_proj"):
        y = g.op.MatMul(x, g.weight("weight", w))   # node /model/layers.3/self_attn/q_proj/MatMul
    out, k, v = g.ms.GroupQueryAttention(q, ..., _outputs=3, num_heads=32, kv_num_heads=8)

`g.op` records ONNX-domain ops, `g.ms` com.microsoft ones. Keyword arguments are attributes;
`_outputs=n` asks for n outputs (an output the model does not need can be left unnamed with
`_unused={1, 2}`). Initializer names follow the scope, with dots: `model.layers.3.self_attn.q_proj.weight`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import onnx_ir as ir
from onnx_ir.tape import Tape

from builder.finite import finite_check
from builder.lazy import Weight
from builder.lazy_results import write_order

OPSET = 21
# A standard-ops model's: Attention with past/present KV (24), RotaryEmbedding, RMSNormalization (23).
STANDARD_OPSET = 24
MS_DOMAIN = "com.microsoft"


class _Ops:
    """`ops.MatMul(a, b, **attributes)` → the op's output value(s)."""

    def __init__(self, graph: Graph, domain: str):
        self._graph = graph
        self._domain = domain

    def __getattr__(self, op_type: str):
        def record(*inputs: ir.Value | None, _outputs: int = 1, _unused: Sequence[int] = (), **attributes: Any):
            return self._graph.node(op_type, inputs, attributes, self._domain, _outputs, _unused)

        return record


class Graph:
    """Records nodes and lazy initializers, then assembles an `ir.Model`."""

    def __init__(self) -> None:
        self.tape = Tape()
        self.op = _Ops(self, "")
        self.ms = _Ops(self, MS_DOMAIN)
        self._scope: list[str] = []
        self._node_names: set[str] = set()
        self._initializer_names: set[str] = set()
        self._constants: dict[tuple, ir.Value] = {}
        # initializer name -> the checkpoint tensors its recipe reads (for plans and records)
        self.sources: dict[str, tuple[str, ...]] = {}
        # Initializers written one member at a time (a stack of experts): how many members.
        self.members: dict[str, int] = {}
        # linear layer module path -> the checkpoint modules its weight is made of
        self.linears: dict[str, tuple[str, ...]] = {}
        # the decoder's position_ids input, where the provider has onnxruntime-genai feed one
        self.position_ids: ir.Value | None = None
        # an int8 KV cache's scales: a layer's past key input -> (k_scale, v_scale) initializers
        self.kv_scales: dict[ir.Value, tuple[ir.Value, ir.Value]] = {}
        # a weight is quantized from float values as it is written (the compiled quantizer loads),
        # not only repacked from a checkpoint's stored blocks: what report.estimate counts
        self.quantizes = False

    @contextlib.contextmanager
    def scope(self, *parts: str) -> Iterator[None]:
        """Names nodes and weights recorded inside after a module path, e.g. ("model", "layers.0")."""
        self._scope.extend(parts)
        try:
            yield
        finally:
            del self._scope[len(self._scope) - len(parts):]

    @property
    def path(self) -> str:
        return "/" + "/".join(self._scope)

    def _unique_node_name(self, op_type: str) -> str:
        base = f"{self.path.rstrip('/')}/{op_type}"
        name, i = base, 1
        while name in self._node_names:
            name = f"{base}_{i}"
            i += 1
        self._node_names.add(name)
        return name

    def node(
        self,
        op_type: str,
        inputs: Sequence[ir.Value | None],
        attributes: dict[str, Any],
        domain: str = "",
        num_outputs: int = 1,
        unused: Sequence[int] = (),
    ) -> ir.Value | Sequence[ir.Value]:
        name = self._unique_node_name(op_type)
        attrs = {k: v for k, v in attributes.items() if v is not None}
        outputs = self.tape.op_multi_out(
            op_type, list(inputs), attrs, num_outputs=num_outputs, domain=domain, name=name
        )
        for i, value in enumerate(outputs):
            value.name = "" if i in unused else f"{name}/output_{i}"
        return outputs[0] if num_outputs == 1 else outputs

    def scoped_name(self, name: str) -> str:
        """`name` prefixed with the current scope, dotted: `model.layers.0.mlp.down_proj.weight`."""
        return ".".join([*self._scope, name]) if self._scope else name

    def weight(self, name: str, weight: Weight) -> ir.Value:
        """Registers a lazy initializer named after the current scope (`model.layers.0.mlp.weight`)."""
        full = self.scoped_name(name)
        check = finite_check(weight.sources, full, weight.shape) if weight.sources else None
        return self.lazy_initializer(full, weight.to_ir(full, check), weight.sources, len(weight.pieces or ()) or 1)

    def lazy_initializer(self, name: str, tensor: ir.TensorProtocol, sources: tuple[str, ...] = (),
                         members: int = 1) -> ir.Value:
        """Registers an initializer. `sources`: the checkpoint tensors its recipe reads; `members`:
        how many pieces it is written in, one at a time (a stack of experts)."""
        if name in self._initializer_names:
            raise ValueError(f"initializer {name!r} defined twice")
        self._initializer_names.add(name)
        self.sources[name] = sources
        if members > 1:
            self.members[name] = members
        return self.tape.initializer(tensor, name=name)

    def constant(self, value: np.ndarray | Sequence[int] | int | float, dtype: np.dtype | type | None = None) -> ir.Value:
        """A small constant initializer (shapes, axes, scalars), shared between all its uses."""
        array = np.asarray(value, dtype=dtype)
        key = (array.dtype.str, array.shape, array.tobytes())
        if key not in self._constants:
            name = f"constant.{array.dtype.name}.{len(self._constants)}"
            self._constants[key] = self.tape.initializer(ir.Tensor(array, name=name), name=name)
        return self._constants[key]

    def model(self, inputs: Sequence[ir.Value], outputs: Sequence[ir.Value], standard: bool = False) -> ir.Model:
        """The recorded graph as a model; `standard`: ONNX's opset STANDARD_OPSET alone (no com.microsoft)."""
        graph = ir.Graph(
            inputs=inputs,
            outputs=outputs,
            nodes=self.tape.nodes,
            initializers=write_order(self.tape.initializers),
            opset_imports={"": STANDARD_OPSET} if standard else {"": OPSET, MS_DOMAIN: 1},
            name="main_graph",
        )
        return ir.Model(graph, ir_version=10, producer_name="builder")
