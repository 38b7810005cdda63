"""The element type of every value of a built graph, inferred the simple way our graphs allow
(initializers, inputs, Cast targets; comparison and index ops; otherwise the first float input),
for checks no runtime here can make: which operators a provider would be handed bfloat16."""

from __future__ import annotations

import onnx

FLOATS = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16, onnx.TensorProto.DOUBLE}
BOOL_OUTPUTS = {"Equal", "Greater", "GreaterOrEqual", "Less", "LessOrEqual", "And", "Or", "Not", "Xor", "IsNaN", "IsInf"}
INT64_OUTPUTS = {"Shape", "Size", "ArgMax", "ArgMin", "NonZero"}


def value_types(graph: onnx.GraphProto) -> dict[str, int]:
    types = {t.name: t.data_type for t in graph.initializer}
    types.update({v.name: v.type.tensor_type.elem_type for v in graph.input})
    for node in graph.node:  # in topological order, as builder writes them
        attributes = {a.name: a for a in node.attribute}
        known = [types[i] for i in node.input if i in types]
        if node.op_type == "Cast":
            kind = attributes["to"].i
        elif node.op_type == "CastLike":
            kind = types.get(node.input[1])
        elif node.op_type == "Constant":
            kind = attributes["value"].t.data_type if "value" in attributes else onnx.TensorProto.FLOAT
        elif node.op_type == "ConstantOfShape":
            kind = attributes["value"].t.data_type if "value" in attributes else onnx.TensorProto.FLOAT
        elif node.op_type in BOOL_OUTPUTS:
            kind = onnx.TensorProto.BOOL
        elif node.op_type in INT64_OUTPUTS:
            kind = onnx.TensorProto.INT64
        elif node.op_type == "Where":
            kind = types.get(node.input[1])
        else:
            kind = next((t for t in known if t in FLOATS), known[0] if known else None)
        for position, output in enumerate(node.output):
            types[output] = onnx.TensorProto.INT64 if node.op_type == "TopK" and position == 1 else kind
    return types


def fed_bfloat16(model: onnx.ModelProto) -> set[tuple[str, str]]:
    """(domain::op, node name) of every top-level node with a bfloat16 input."""
    types = value_types(model.graph)
    return {(f"{n.domain or 'ai.onnx'}::{n.op_type}", n.name) for n in model.graph.node
            if any(types.get(i) == onnx.TensorProto.BFLOAT16 for i in n.input if i)}
