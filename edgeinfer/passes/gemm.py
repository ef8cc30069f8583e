"""``MatMul(A, B) + C -> Gemm(A, B, C)`` for 2-D operands.

``Gemm`` computes ``alpha * A @ B + beta * C`` (defaults 1) with ``C`` unidirectionally
broadcast to ``[M, N]``, so the rewrite holds when ``A`` and ``B`` are matrices and ``C``'s
shape is ``[]``, ``[N]``, ``[1, N]``, ``[M, 1]`` or ``[M, N]`` (C may also be computed at run
time). One op instead of two lets every engine add the bias in the GEMM epilogue.
"""

from __future__ import annotations

from edgeinfer.ir import Node
from edgeinfer.passes.rules import GraphView, Match, Rewrite, Rule, other_input, rule_pass


def unidirectional(shape: tuple | None, target: tuple | None) -> bool:
    """Whether ``shape`` broadcasts to ``target`` without growing it (dims known)."""
    if shape is None or target is None or len(shape) > len(target):
        return False
    aligned = target[len(target) - len(shape):]
    return all(d == 1 or (d is not None and d == t) for d, t in zip(shape, aligned, strict=True))


def _match(view: GraphView, node: Node) -> Match | None:
    for name in node.inputs:
        matmul = view.producer(name, "MatMul")
        if matmul is not None and other_input(node, name) != name:
            return Match((matmul, node), {"matmul": matmul, "c": other_input(node, name)})
    return None


def _check(view: GraphView, match: Match) -> str | None:
    matmul = match["matmul"]
    a, b, y = (view.shape(n) for n in (matmul.inputs[0], matmul.inputs[1], matmul.outputs[0]))
    if a is None or b is None or len(a) != 2 or len(b) != 2:
        return f"Gemm needs 2-D operands, found shapes {a} and {b}"
    if view.dtype(matmul.outputs[0]) not in ("float32", "float64", "float16", "bfloat16"):
        return f"Gemm is a float op, the MatMul is {view.dtype(matmul.outputs[0])}"
    if not unidirectional(view.shape(match["c"]), y):
        return f"the addend of shape {view.shape(match['c'])} does not broadcast to the product {y}"
    return None


def _rewrite(view: GraphView, match: Match) -> Rewrite:
    matmul, node = match["matmul"], match.root
    return Rewrite([Node("Gemm", [matmul.inputs[0], matmul.inputs[1], match["c"]], node.outputs, name=matmul.name)])


RULES = (Rule("matmul_add_to_gemm", ("Add",), _match, _rewrite, _check),)
matmul_add_to_gemm = rule_pass("matmul_add_to_gemm", 1, RULES)
