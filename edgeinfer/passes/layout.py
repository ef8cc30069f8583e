"""Cancel layout transposes (``cancel_transposes``, level 1).

Importers of NHWC frameworks (TFLite, Keras) wrap every layout-sensitive op in
``Transpose(NHWC->NCHW) ... Transpose(NCHW->NHWC)``. Between two such ops the pair meets and
cancels; when elementwise ops sit between them, the transpose is first pushed down through
them. The rules, with ``T_p`` a Transpose by permutation ``p`` and ``p^-1`` its inverse:

- pair:       ``T_q(T_p(x)) = T_{p∘q}(x)``, where ``(p∘q)[i] = p[q[i]]``; an identity
              composition leaves ``x`` itself (an Identity that ``remove_identity`` drops);
- unary:      ``U(T_p(x)) = T_p(U(x))`` for any elementwise ``U`` (activations, casts,
              per-tensor Quantize/DequantizeLinear);
- n-ary:      ``B(T_p(x), T_p(y), c) = T_p(B(x, y, c'))`` for broadcasting elementwise ``B``
              when every run-time input is ``T_p`` of a same-rank value; a constant ``c`` is
              brought to full rank and transposed by ``p^-1`` (``c' = c[..]^T_{p^-1}``);
- concat:     ``Concat_a(T_p(x), T_p(y)) = T_p(Concat_{p[a]}(x, y))``;
- reduce:     ``R_A(T_p(x)) = T_r(R_{p[A]}(x))``; with ``keepdims=0`` ``r`` is the order of the
              surviving dims, often the identity (global average pooling of NHWC needs none);
- pad:        ``Pad_P(T_p(x)) = T_p(Pad_{P'}(x))`` with constant pads, ``P'[p[i]] = P[i]`` (begin
              and end halves alike): the channel padding of MediaPipe's residual blocks.

Each push moves a transpose towards the outputs without adding one, so rewriting terminates,
and a pair that meets is removed.

A transpose read by several nodes (the input of a squeeze-and-excitation block feeds both its
pooling and its scaling ``Mul``) is pushed only where every reader takes it (each one matches a
rule above with it, or is a Transpose it composes with): it then stays for the readers not yet
rewritten, one per sweep, and is dead once all are. That can leave one transpose below each
reader, so the pass runs the single-reader rules to their end first, then the shared pushes,
and keeps their result only when it holds fewer Transposes (in MediaPipe's landscape selfie
segmenter, 41 became 2: the NHWC input's and output's, which an NCHW graph needs).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from edgeinfer.ir import Graph, Node, Value
from edgeinfer.passes.manager import PassResult, graph_pass
from edgeinfer.passes.rules import GraphView, Match, Rewrite, Rule, apply_rules

UNARY = frozenset({
    "Relu", "Clip", "Sigmoid", "Tanh", "Exp", "Log", "Sqrt", "Abs", "Neg", "Floor", "Ceil", "Round",
    "Sin", "Cos", "Elu", "Selu", "Celu", "HardSwish", "HardSigmoid", "LeakyRelu", "Erf", "Reciprocal",
    "Cast", "Not", "Sign", "Softplus", "Softsign", "Mish", "Identity", "QuantizeLinear", "DequantizeLinear",
})
NARY = frozenset({"PRelu", "Add", "Sub", "Mul", "Div", "Max", "Min", "Pow", "Sum", "Mean", "Equal", "Less",
                  "Greater", "LessOrEqual", "GreaterOrEqual", "And", "Or", "Xor", "Where"})
REDUCE = frozenset({"ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
                    "ReduceLogSumExp", "ReduceSumSquare"})  # axes as an attribute at opset 17
# Inputs of a unary op beyond the first that must be scalar constants for the op to commute.
_SCALAR_OPERANDS = {"Clip": (1, 2), "QuantizeLinear": (1, 2), "DequantizeLinear": (1, 2)}


def _perm(node: Node) -> tuple[int, ...] | None:
    perm = node.attrs.get("perm")
    return None if perm is None else tuple(int(p) for p in perm)


def _inverse(perm: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(int(i) for i in np.argsort(perm))


def _transpose_of(view: GraphView, name: str) -> Node | None:
    node = view.producer(name, "Transpose")
    return node if node is not None and _perm(node) is not None else None


def _pre_transpose_value(view: GraphView, name: str, new_name: str, perm: tuple[int, ...]) -> Value:
    """The type of ``new_name``: ``name``'s type with dims in the order before ``T_perm``."""
    value = view.value(name)
    shape = None
    if value is not None and value.shape is not None and len(value.shape) == len(perm):
        inverse = _inverse(perm)
        shape = tuple(value.shape[inverse[j]] for j in range(len(perm)))
    return Value(new_name, value.dtype if value is not None else None, shape)


def _push_below(view: GraphView, root: Node, inputs: list[str], perm: tuple[int, ...],
                attrs: dict | None = None, initializers: dict | None = None,
                stored_like: dict | None = None) -> Rewrite:
    """``root`` on ``inputs`` (already in pre-transpose layout), then ``T_perm`` into its output."""
    out = root.outputs[0]
    inner = view.fresh(f"{out}_pre_T")
    moved = root.with_(inputs=tuple(inputs), outputs=(inner,), attrs=attrs if attrs is not None else root.attrs)
    transpose = Node("Transpose", [inner], [out], {"perm": perm}, name=view.fresh(f"{out}_T"))
    return Rewrite([moved, transpose], dict(initializers or {}), [_pre_transpose_value(view, out, inner, perm)],
                   dict(stored_like or {}))


# -- pair ---------------------------------------------------------------------------------------
def _match_pair(view: GraphView, node: Node) -> Match | None:
    first = _transpose_of(view, node.inputs[0]) if _perm(node) is not None else None
    if first is None or len(_perm(first)) != len(_perm(node)):
        return None
    return Match((node,), {"first": first}, anchors=(first,))


def _rewrite_pair(view: GraphView, match: Match) -> Rewrite:
    first, root = match["first"], match.root
    p, q = _perm(first), _perm(root)
    composed = tuple(p[i] for i in q)
    source = first.inputs[0]
    if composed == tuple(range(len(composed))):
        return Rewrite([Node("Identity", [source], list(root.outputs), name=root.name)])
    return Rewrite([root.with_(inputs=(source,), attrs={"perm": composed})])


# -- unary --------------------------------------------------------------------------------------
def _scalar_const(view: GraphView, name: str) -> bool:
    data = view.const(name)
    return not name or (data is not None and data.size == 1)


def _match_unary(view: GraphView, node: Node) -> Match | None:
    if not node.inputs or len(node.outputs) != 1:
        return None
    transpose = _transpose_of(view, node.inputs[0])
    if transpose is None:
        return None
    for index in _SCALAR_OPERANDS.get(node.op_type, ()):
        if index < len(node.inputs) and not _scalar_const(view, node.inputs[index]):
            return None
    return Match((transpose, node), {"transpose": transpose})


def _rewrite_unary(view: GraphView, match: Match) -> Rewrite:
    transpose, root = match["transpose"], match.root
    return _push_below(view, root, [transpose.inputs[0]] + list(root.inputs[1:]), _perm(transpose))


# -- n-ary elementwise ----------------------------------------------------------------------------
def _match_nary(view: GraphView, node: Node) -> Match | None:
    if len(node.outputs) != 1 or not node.inputs:
        return None
    transposes: dict[int, Node] = {}
    perm = None
    for index, name in enumerate(node.inputs):
        if view.const(name) is not None:
            continue
        transpose = _transpose_of(view, name)
        if transpose is None or (perm is not None and _perm(transpose) != perm):
            return None
        perm = _perm(transpose)
        transposes[index] = transpose
    if perm is None:
        return None
    rank = len(perm)
    out_shape = view.shape(node.outputs[0])
    if out_shape is None or len(out_shape) != rank:
        return None
    for index, name in enumerate(node.inputs):
        shape = view.shape(name)
        if shape is None or len(shape) > rank or (index in transposes and len(shape) != rank):
            return None
    unique = list({id(t): t for t in transposes.values()}.values())
    return Match((*unique, node), {"transposes": transposes, "perm": perm})


def _rewrite_nary(view: GraphView, match: Match) -> Rewrite:
    root, perm, transposes = match.root, match["perm"], match["transposes"]
    inverse = _inverse(perm)
    inputs, inits, stored_like = [], {}, {}
    for index, name in enumerate(root.inputs):
        if index in transposes:
            inputs.append(transposes[index].inputs[0])
            continue
        data = view.const(name)
        if data.size == 1:
            inputs.append(name)
            continue
        full = data.reshape((1,) * (len(perm) - data.ndim) + data.shape)
        new_name = view.fresh(f"{name}_T")
        inits[new_name] = np.ascontiguousarray(full.transpose(inverse))
        stored_like[new_name] = name  # a float16-stored slope (PRelu's) stays float16-stored
        inputs.append(new_name)
    return _push_below(view, root, inputs, perm, initializers=inits, stored_like=stored_like)


# -- concat -----------------------------------------------------------------------------------------
def _match_concat(view: GraphView, node: Node) -> Match | None:
    transposes = [_transpose_of(view, name) for name in node.inputs]
    if not transposes or any(t is None for t in transposes):
        return None
    perms = {_perm(t) for t in transposes}
    if len(perms) != 1:
        return None
    unique = list({id(t): t for t in transposes}.values())
    return Match((*unique, node), {"transposes": transposes, "perm": perms.pop()})


def _rewrite_concat(view: GraphView, match: Match) -> Rewrite:
    root, perm = match.root, match["perm"]
    axis = int(root.attrs.get("axis", 0))
    axis = axis + len(perm) if axis < 0 else axis
    return _push_below(view, root, [t.inputs[0] for t in match["transposes"]], perm,
                       attrs={**root.attrs, "axis": perm[axis]})


# -- reductions ---------------------------------------------------------------------------------
def _match_reduce(view: GraphView, node: Node) -> Match | None:
    if len(node.inputs) != 1 or "axes" not in node.attrs:
        return None
    transpose = _transpose_of(view, node.inputs[0])
    if transpose is None:
        return None
    return Match((transpose, node), {"transpose": transpose})


def _rewrite_reduce(view: GraphView, match: Match) -> Rewrite:
    transpose, root = match["transpose"], match.root
    perm = _perm(transpose)
    rank = len(perm)
    axes = sorted({int(a) + rank if int(a) < 0 else int(a) for a in root.attrs["axes"]})
    new_axes = tuple(sorted(perm[a] for a in axes))
    attrs = {**root.attrs, "axes": new_axes}
    source = transpose.inputs[0]
    if int(root.attrs.get("keepdims", 1)):
        return _push_below(view, root, [source], perm, attrs=attrs)
    survivors = [perm[i] for i in range(rank) if i not in axes]  # source dims, in output order
    order = tuple(int(i) for i in np.argsort(np.argsort(survivors)))
    if order == tuple(range(len(order))):
        return Rewrite([root.with_(inputs=(source,), attrs=attrs)])
    return _push_below(view, root, [source], order, attrs=attrs)


# -- pad ----------------------------------------------------------------------------------------
def _match_pad(view: GraphView, node: Node) -> Match | None:
    if len(node.inputs) < 2 or len(node.inputs) > 3 or view.const(node.inputs[1]) is None:
        return None  # run-time pads, or explicit axes (opset 18)
    transpose = _transpose_of(view, node.inputs[0])
    if transpose is None or view.const(node.inputs[1]).size != 2 * len(_perm(transpose)):
        return None
    return Match((transpose, node), {"transpose": transpose})


def _rewrite_pad(view: GraphView, match: Match) -> Rewrite:
    transpose, root = match["transpose"], match.root
    perm = _perm(transpose)
    rank = len(perm)
    pads = view.const(root.inputs[1]).reshape(2, rank)
    moved = np.empty_like(pads)
    moved[:, list(perm)] = pads
    name = view.fresh(f"{root.inputs[1]}_T")
    return _push_below(view, root, [transpose.inputs[0], name, *root.inputs[2:]], perm,
                       initializers={name: moved.reshape(-1)})


RULES = [
    Rule("transpose_pair", ("Transpose",), _match_pair, _rewrite_pair),
    Rule("transpose_through_unary", tuple(sorted(UNARY)), _match_unary, _rewrite_unary),
    Rule("transpose_through_elementwise", tuple(sorted(NARY)), _match_nary, _rewrite_nary),
    Rule("transpose_through_concat", ("Concat",), _match_concat, _rewrite_concat),
    Rule("transpose_through_reduce", tuple(sorted(REDUCE)), _match_reduce, _rewrite_reduce),
    Rule("transpose_through_pad", ("Pad",), _match_pad, _rewrite_pad),
]

_MATCH_OF = {op: rule.match for rule in RULES for op in rule.root}


def _takes(view: GraphView, reader: Node, transpose: Node) -> bool:
    """Whether ``reader`` matches a layout rule that consumes ``transpose`` (single-reader match)."""
    match = _MATCH_OF.get(reader.op_type) if not reader.domain else None
    found = match(view, reader) if match is not None else None
    return found is not None and any(n is transpose for n in (*found.nodes, *found.anchors))


def _shared(match: Callable[[GraphView, Node], Match | None]) -> Callable[[GraphView, Node], Match | None]:
    """``match``, where a transpose with other readers that all take it is kept (an anchor)
    rather than removed with the pattern."""

    def shared_match(view: GraphView, node: Node) -> Match | None:
        found = match(view, node)
        if found is None:
            return None
        kept = []
        for member in found.nodes[:-1]:
            out = member.outputs[0]
            if member.op_type == "Transpose" and not view.single_use(out) and not view.is_output(out) \
                    and all(_takes(view, reader, member) for reader in view.consumers(out)):
                kept.append(member)
        if not kept:
            return None  # the single-reader rules have had their chance at this one
        return Match(tuple(n for n in found.nodes if all(n is not k for k in kept)), found.captures,
                     (*found.anchors, *kept))

    return shared_match


SHARED_RULES = [Rule(f"{rule.name}_shared", rule.root, _shared(rule.match), rule.rewrite)
                for rule in RULES if rule.name != "transpose_pair"]  # a pair keeps its first as an anchor already


def _transposes(graph: Graph) -> int:
    from edgeinfer.passes.cleanup import eliminate_dead_nodes

    return sum(node.op_type == "Transpose" for node in eliminate_dead_nodes(graph).graph.nodes)


@graph_pass("cancel_transposes", 1)
def cancel_transposes(graph: Graph, level: int = 1) -> PassResult:
    result = apply_rules(graph, RULES, level)
    shared = apply_rules(result.graph, [*RULES, *SHARED_RULES], level)
    if shared.modified and _transposes(shared.graph) < _transposes(result.graph):
        fired = dict(result.fired)
        for name, count in shared.fired.items():
            fired[name] = fired.get(name, 0) + count
        return PassResult(shared.graph, True, fired)
    return result


cancel_transposes.rules = tuple(RULES)  # type: ignore[attr-defined]  (explain() lists their refusals)
