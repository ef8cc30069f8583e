"""Multi-head attention fusion for the BERT pattern (level 2).

Matched, with ``H`` heads, ``Q``/``K``/``V`` the projected ``[B, S, H*d]`` tensors::

    q = Transpose(Reshape(Q, [B, S, H, dk]), [0, 2, 1, 3])
    k = Transpose(Reshape(K, [B, T, H, dk]), [0, 2, 3, 1])      (or [0,2,1,3] then [0,1,3,2])
    v = Transpose(Reshape(V, [B, T, H, dv]), [0, 2, 1, 3])
    p = Softmax(MatMul(q, k) / c + mask, axis=-1)                (/ c, * c and + mask optional)
    Y = Reshape(Transpose(MatMul(p, v), [0, 2, 1, 3]), [B, S, H*dv])

becomes ``edgeinfer::Attention(Q, K, V, [mask], num_heads=H, scale=1/c)`` (``scale=c`` for
``* c``), whose semantics are defined in ``edgeinfer.ir.lowering``. Head count and sizes
come from the inferred shapes of the head-split reshapes, so shapes computed at run time
(``Shape -> Gather -> Concat``) are fine as long as the head dims are static.
"""

from __future__ import annotations

from edgeinfer.ir import EDGEINFER_DOMAIN, Node
from edgeinfer.passes.rules import GraphView, Match, Rewrite, Rule, broadcast_shape, rule_pass, same_dims

HEADS_FIRST = (0, 2, 1, 3)


def _perm(node: Node) -> tuple[int, ...]:
    return tuple(int(p) for p in node.attrs.get("perm", ()))


def _split_heads(view: GraphView, name: str, perms: tuple[tuple[int, ...], ...]) -> tuple[str, list[Node]] | None:
    """(projected input, nodes) of ``Transpose(Reshape(X))`` (one or two transposes) ending in ``name``."""
    nodes: list[Node] = []
    current = name
    composed = tuple(range(4))
    for _ in range(2):
        transpose = view.producer(current, "Transpose")
        if transpose is None:
            break
        nodes.append(transpose)
        composed = tuple(_perm(transpose)[i] for i in composed) if len(_perm(transpose)) == 4 else ()
        current = transpose.inputs[0]
    reshape = view.producer(current, "Reshape")
    if reshape is None or not nodes or composed not in perms:
        return None
    nodes.append(reshape)
    return reshape.inputs[0], nodes


def _match(view: GraphView, node: Node) -> Match | None:
    merge_t = view.producer(node.inputs[0], "Transpose")
    context = view.producer(merge_t.inputs[0], "MatMul") if merge_t is not None else None
    if context is None or _perm(merge_t) != HEADS_FIRST:
        return None
    softmax = view.producer(context.inputs[0], "Softmax")
    v = _split_heads(view, context.inputs[1], (HEADS_FIRST,))
    if softmax is None or v is None:
        return None
    nodes = [node, merge_t, context, softmax, *v[1]]
    current, mask, scale = softmax.inputs[0], "", 1.0
    add = view.producer(current, "Add")
    if add is not None:
        for i in (0, 1):
            if view.producer(add.inputs[i], ("Div", "Mul", "MatMul")) is not None:
                current, mask = add.inputs[i], add.inputs[1 - i]
                nodes.append(add)
                break
    scaling = view.producer(current, ("Div", "Mul"))
    if scaling is not None and view.scalar(scaling.inputs[1]) is not None:
        c = view.scalar(scaling.inputs[1])
        if c == 0.0:
            return None
        scale = 1.0 / c if scaling.op_type == "Div" else c
        current = scaling.inputs[0]
        nodes.append(scaling)
    scores = view.producer(current, "MatMul")
    if scores is None:
        return None
    q = _split_heads(view, scores.inputs[0], (HEADS_FIRST,))
    k = _split_heads(view, scores.inputs[1], ((0, 2, 3, 1),))
    if q is None or k is None:
        return None
    nodes += [scores, *q[1], *k[1]]
    captures = {"q": q[0], "k": k[0], "v": v[0], "mask": mask, "scale": scale, "softmax": softmax,
                "splits": (q[1][-1], k[1][-1], v[1][-1]), "scores": scores.outputs[0], "merge_t": merge_t}
    return Match(tuple(reversed(nodes)), captures)


def _check(view: GraphView, match: Match) -> str | None:
    splits = [view.shape(r.outputs[0]) for r in match["splits"]]
    projected = [view.shape(match[n]) for n in ("q", "k", "v")]
    if any(s is None or len(s) != 4 for s in splits) or any(p is None or len(p) != 3 for p in projected):
        return "the head-split reshapes are not rank 3 -> rank 4 with known shapes"
    heads, dk = splits[0][2], splits[0][3]
    if not all(isinstance(d, int) for s in splits for d in s[2:]):
        return "the head count or head size is not static"
    if splits[1][2:] != (heads, dk) or splits[2][2] != heads:
        return f"Q, K and V are split differently: {splits}"
    for split, proj in zip(splits, projected, strict=True):
        if not same_dims(split[:2], proj[:2]) or proj[2] != split[2] * split[3]:
            return f"a reshape {proj} -> {split} is not a split of the last axis into heads"
    out = view.shape(match.root.outputs[0])
    merged = view.shape(match["merge_t"].outputs[0])
    if out is None or merged is None or len(out) != 3 or not same_dims(out[:2], merged[:2]) \
            or out[2] != heads * splits[2][3]:
        return f"the output reshape {merged} -> {out} is not a merge of the heads"
    softmax = match["softmax"]
    if int(softmax.attrs.get("axis", -1 if view.opset("") >= 13 else 1)) not in (-1, 3):
        return "the Softmax is not over the last axis"
    if match["mask"]:
        scores = view.shape(match["scores"])
        mask = view.shape(match["mask"])
        if mask is None or len(mask) > 4 or (scores is not None and broadcast_shape(mask, scores) not in (None, scores)):
            return f"the mask of shape {mask} does not broadcast to the scores {scores}"
    if view.dtype(match["q"]) not in ("float32", "float64", "float16"):
        return "attention inputs are not float"
    return None


def _rewrite(view: GraphView, match: Match) -> Rewrite:
    heads = view.shape(match["splits"][0].outputs[0])[2]
    inputs = [match["q"], match["k"], match["v"]] + ([match["mask"]] if match["mask"] else [])
    node = Node("Attention", inputs, match.root.outputs, {"num_heads": int(heads), "scale": float(match["scale"])},
                domain=EDGEINFER_DOMAIN, name=match["softmax"].name)
    return Rewrite([node])


RULES = (Rule("attention", ("Reshape",), _match, _rewrite, _check),)
fuse_attention = rule_pass("fuse_attention", 2, RULES)
