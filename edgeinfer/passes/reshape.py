"""Reshape chain cancellation.

``Reshape`` depends only on the element order of its input, which ``Reshape``, ``Flatten``,
``Squeeze`` and ``Unsqueeze`` all preserve, so ``Reshape(R(x), s) == Reshape(x, s)`` for any
such ``R`` as long as ``s`` is constant and copies no dim from ``R(x)`` (a ``0`` entry with
``allowzero=0``; a ``0`` is resolved from ``R(x)``'s static shape where that is known).
The inner op stays if something else reads it, else dead-node elimination drops it.
A ``Reshape`` whose output type equals its input type (same static dims or same symbols) is
an identity and becomes ``Identity`` (which ``remove_identity`` then removes).
"""

from __future__ import annotations

import numpy as np

from edgeinfer.ir import Node
from edgeinfer.passes.rules import GraphView, Match, Rewrite, Rule, rule_pass, same_dims

RESHAPE_LIKE = ("Reshape", "Flatten", "Squeeze", "Unsqueeze")


def _match_chain(view: GraphView, node: Node) -> Match | None:
    inner = view.producer(node.inputs[0], RESHAPE_LIKE)
    if inner is None or len(node.inputs) < 2:
        return None
    return Match((node,), {"inner": inner, "shape": view.const(node.inputs[1])}, anchors=(inner,))


def _check_chain(view: GraphView, match: Match) -> str | None:
    shape = match["shape"]
    if shape is None:
        return "the target shape is computed at run time"
    if not match.root.attrs.get("allowzero", 0) and (shape == 0).any():
        between = view.shape(match.root.inputs[0])
        zeros = np.flatnonzero(shape == 0)
        if between is None or any(i >= len(between) or not isinstance(between[i], int) for i in zeros):
            return "the target shape copies a dim (0) of the intermediate whose size is not static"
    return None


def _rewrite_chain(view: GraphView, match: Match) -> Rewrite:
    shape = match["shape"].astype(np.int64).copy()
    root = match.root
    if not root.attrs.get("allowzero", 0):
        between = view.shape(root.inputs[0])
        for i in np.flatnonzero(shape == 0):
            shape[i] = between[i]
    name = view.fresh(f"{root.outputs[0]}__shape")
    node = Node("Reshape", [match["inner"].inputs[0], name], root.outputs, root.attrs, name=root.name)
    return Rewrite([node], {name: shape})


def _keeps_shape(view: GraphView, node: Node) -> bool:
    """Whether a constant target shape maps the input's shape onto itself: every entry is the
    input's dim, a copied dim (0), or one -1 (which then must be the one remaining dim)."""
    source, target = view.shape(node.inputs[0]), view.const(node.inputs[1])
    if source is None or target is None or target.ndim != 1 or len(target) != len(source):
        return False
    copy_zero = not node.attrs.get("allowzero", 0)
    free = [i for i, t in enumerate(target) if t == -1]
    return len(free) <= 1 and all(
        i in free or (t == 0 and copy_zero) or (isinstance(d, int) and d == t)
        for i, (t, d) in enumerate(zip(target.tolist(), source, strict=True)))


def _match_noop(view: GraphView, node: Node) -> Match | None:
    if same_dims(view.shape(node.inputs[0]), view.shape(node.outputs[0])) or _keeps_shape(view, node):
        return Match((node,))
    return None


def _rewrite_noop(view: GraphView, match: Match) -> Rewrite:
    root = match.root
    return Rewrite([Node("Identity", [root.inputs[0]], root.outputs, name=root.name)])


RULES = (
    Rule("reshape_chain", ("Reshape",), _match_chain, _rewrite_chain, _check_chain),
    Rule("noop_reshape", ("Reshape",), _match_noop, _rewrite_noop),
)
cancel_reshapes = rule_pass("cancel_reshapes", 1, RULES)
