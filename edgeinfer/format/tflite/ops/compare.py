"""Comparisons, logical ops and Where: bool tensors. Like the arithmetic of ``elementwise``,
they broadcast numpy-style in TFLite as in ONNX, so each runs in the axis order its computed
input already has, a constant operand transposed to match. Measured on LiteRT 2.3 (builtin
kernels and XNNPACK): EQUAL, LESS, LOGICAL_AND and SELECT_V2 broadcast operands of rank 8;
the rules keep ``check_binary``'s rank-6 bound of the arithmetic ops.
"""

from __future__ import annotations

from edgeinfer.format.tflite.context import OpContext
from edgeinfer.format.tflite.export import export_rule
from edgeinfer.format.tflite.ops.elementwise import binary_input, binary_rule, check_binary, unary_rule
from edgeinfer.ir import Graph, Node

COMPARISONS = {"Equal": "EQUAL", "Less": "LESS", "Greater": "GREATER", "LessOrEqual": "LESS_EQUAL",
               "GreaterOrEqual": "GREATER_EQUAL"}
LOGICAL = {"And": "LOGICAL_AND", "Or": "LOGICAL_OR"}
# Operand dtypes of the kernels (LiteRT 2.3 refuses uint16/uint32/uint64 when invoked; raw
# int8/uint8/int16 are refused for every arithmetic op, see export._integer_kernel).
COMPARED_DTYPES = ("float32", "int32", "int64")
SELECTED_DTYPES = ("float32", "int32", "int64", "bool")


def _operand_dtype(name: str, graph: Graph, allowed: tuple[str, ...], op: str) -> str | None:
    dtype = graph.values[name].dtype
    if dtype is not None and dtype not in allowed:
        return f"TFLite's {op} takes {', '.join(allowed)}, found {dtype} operands"
    return None


def check_comparison(node: Node, graph: Graph) -> str | None:
    allowed = COMPARED_DTYPES + ("bool",) if node.op_type == "Equal" else COMPARED_DTYPES
    return check_binary(node, graph) or _operand_dtype(node.inputs[0], graph, allowed, COMPARISONS[node.op_type])


for _op, _opcode in COMPARISONS.items():
    export_rule(_op, check=check_comparison)(binary_rule(_opcode))
for _op, _opcode in LOGICAL.items():  # bool operands (the ONNX schema's only type)
    export_rule(_op, check=check_binary)(binary_rule(_opcode))
export_rule("Not")(unary_rule("LOGICAL_NOT"))


def check_where(node: Node, graph: Graph) -> str | None:
    names = [name for name in node.inputs if name]
    if len(names) != 3:
        return f"Where of {len(names)} input(s): SELECT_V2 takes a condition and two values"
    condition, x, y = (graph.values[name] for name in names)
    if condition.dtype not in (None, "bool"):
        return f"the condition is {condition.dtype}, expected bool"
    if x.dtype != y.dtype:
        return f"values of different dtypes ({x.dtype}, {y.dtype}): SELECT_V2 takes one"
    refused = _operand_dtype(names[1], graph, SELECTED_DTYPES, "SELECT_V2")
    if refused is not None:
        return refused
    ranks = [value.rank for value in (condition, x, y)]
    if any(rank is None for rank in ranks):
        return "operand ranks must be known"
    if max(ranks) > 6:
        return f"TFLite broadcasts up to rank 6, found rank {max(ranks)}"
    return None


@export_rule("Where", check=check_where)
def where(ctx: OpContext) -> None:
    """SELECT_V2 (condition, x, y), which broadcasts all three as ONNX's Where does."""
    perm = ctx.layout(0, 1, 2)
    inputs = [binary_input(ctx, k, perm) for k in range(3)]
    ctx.op("SELECT_V2", inputs, [ctx.output(0, perm)])
