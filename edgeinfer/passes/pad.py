"""Fold an explicit ``Pad`` into the padding of the ``Conv``/pooling op that reads it.

With ``Pad`` pads ``[b_0..b_{r-1}, e_0..e_{r-1}]`` (begin then end, per axis) and no padding
of the batch and channel axes, ``Op(Pad(x)) == Op'(x)`` with
``pads' = pads + [b_2..b_{r-1}, e_2..e_{r-1}]`` when the padded value is what the op pads
with: 0 for ``Conv`` and for ``AveragePool`` counting pads (``count_include_pad=1``, which
the folded op then needs), ``-inf`` for ``MaxPool``. Only constant mode, constant pads, no
``auto_pad`` of SAME kind, no ceil mode for pooling (its edge windows count differently).
"""

from __future__ import annotations

import numpy as np

from edgeinfer.ir import Node
from edgeinfer.passes.rules import GraphView, Match, Rewrite, Rule, attr_or_input, input_at, rule_pass

TARGETS = ("Conv", "AveragePool", "MaxPool")


def _pad_params(view: GraphView, pad: Node, rank: int) -> tuple[np.ndarray, float] | str:
    if pad.attrs.get("mode", "constant") != "constant":
        return f"pad mode {pad.attrs.get('mode')!r} is not constant"
    try:
        pads = attr_or_input(view, pad, "pads", 1)
        value = attr_or_input(view, pad, "value", 2)
        axes = attr_or_input(view, pad, "axes", 3)
    except LookupError as exc:
        return f"pad operand {exc.args[0]!r} is computed at run time"
    if pads is None:
        return "the Pad has no pads"
    pads = pads.astype(np.int64).reshape(-1)
    if axes is not None:
        axes = [int(a) + rank if a < 0 else int(a) for a in axes.reshape(-1)]
        full = np.zeros(2 * rank, dtype=np.int64)
        for i, axis in enumerate(axes):
            full[axis], full[axis + rank] = pads[i], pads[i + len(axes)]
        pads = full
    if len(pads) != 2 * rank:
        return f"expected {2 * rank} pads for rank {rank}, found {len(pads)}"
    return pads, 0.0 if value is None else float(np.asarray(value).reshape(-1)[0])


def _match(view: GraphView, node: Node) -> Match | None:
    pad = view.producer(node.inputs[0], "Pad")
    if pad is None:
        return None
    return Match((pad, node), {"pad": pad})


def _check(view: GraphView, match: Match) -> str | None:
    node, pad = match.root, match["pad"]
    shape = view.shape(node.inputs[0])
    if shape is None:
        return "the rank of the padded tensor is unknown"
    params = _pad_params(view, pad, len(shape))
    if isinstance(params, str):
        return params
    pads, value = params
    rank = len(shape)
    if (pads < 0).any():
        return "negative pads crop, they cannot become op padding"
    if pads[[0, 1, rank, rank + 1]].any():
        return "the Pad pads the batch or channel axis"
    if node.attrs.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID"):
        return f"the {node.op_type} uses auto_pad={node.attrs['auto_pad']}"
    if node.op_type == "Conv" and value != 0.0:
        return f"Conv pads with 0, the Pad with {value}"
    if node.op_type == "AveragePool":
        if value != 0.0:
            return f"AveragePool pads with 0, the Pad with {value}"
        if any(node.attrs.get("pads", ())) and not node.attrs.get("count_include_pad", 0):
            return "the AveragePool already pads without counting its pads"
    if node.op_type == "MaxPool":
        if value != -np.inf:
            return f"MaxPool pads with -inf, the Pad with {value}"
        if len([o for o in node.outputs if o]) > 1:
            return "the MaxPool's Indices output would change"
    if node.op_type != "Conv" and node.attrs.get("ceil_mode", 0):
        return "ceil_mode pooling"
    return None


def _rewrite(view: GraphView, match: Match) -> Rewrite:
    node, pad = match.root, match["pad"]
    rank = len(view.shape(node.inputs[0]))
    pads, _ = _pad_params(view, pad, rank)
    spatial = rank - 2
    old = np.zeros(2 * spatial, dtype=np.int64)
    if node.attrs.get("auto_pad", "NOTSET") == "NOTSET" and node.attrs.get("pads"):
        old = np.array(node.attrs["pads"], dtype=np.int64)
    new = old + np.concatenate([pads[2:rank], pads[rank + 2:]])
    attrs = {**node.attrs, "pads": tuple(int(p) for p in new), "auto_pad": "NOTSET"}
    if node.op_type == "AveragePool":
        attrs["count_include_pad"] = 1
    inputs = (input_at(pad, 0),) + node.inputs[1:]
    return Rewrite([Node(node.op_type, inputs, node.outputs, attrs, name=node.name)])


RULES = (Rule("pad_into_window_op", TARGETS, _match, _rewrite, _check),)
fold_pad = rule_pass("fold_pad", 1, RULES)
