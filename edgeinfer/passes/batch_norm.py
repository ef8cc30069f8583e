"""Fold an inference-mode ``BatchNormalization`` into the ``Conv`` that feeds it.

With per-output-channel ``s = gamma / sqrt(var + eps)``::

    W'[m] = W[m] * s[m]
    b'[m] = (b[m] - mean[m]) * s[m] + beta[m]        (b = 0 when the Conv has no bias)

computed in float64 and stored in the weights' dtype. Needs constant weights and BN
statistics, a BN in inference mode whose running-statistics outputs nobody reads, and a
Conv output read by the BN alone (else the unnormalized result would be lost).
"""

from __future__ import annotations

import numpy as np

from edgeinfer.ir import Node
from edgeinfer.passes.rules import GraphView, Match, Rewrite, Rule, input_at, rule_pass


def _match(view: GraphView, node: Node) -> Match | None:
    conv = view.producer(node.inputs[0], "Conv")
    return None if conv is None else Match((conv, node), {"conv": conv})


def _check(view: GraphView, match: Match) -> str | None:
    bn, conv = match.root, match["conv"]
    if bn.attrs.get("training_mode", 0):
        return "the BatchNormalization is in training mode"
    if any(o and (view.consumers(o) or view.is_output(o)) for o in bn.outputs[1:]):
        return "the BatchNormalization's running statistics are read"
    if view.const(conv.inputs[1]) is None:
        return "the Conv weights are computed at run time"
    if input_at(conv, 2) and view.const(conv.inputs[2]) is None:
        return "the Conv bias is computed at run time"
    if any(view.const(name) is None for name in bn.inputs[1:5]):
        return "the BatchNormalization parameters are not constant"
    channels = view.const(conv.inputs[1]).shape[0]
    if any(view.const(name).size != channels for name in bn.inputs[1:5]):
        return f"the BatchNormalization parameters do not have {channels} channels"
    return None


def _rewrite(view: GraphView, match: Match) -> Rewrite:
    bn, conv = match.root, match["conv"]
    weight = view.const(conv.inputs[1])
    gamma, beta, mean, var = (view.const(n).astype(np.float64).reshape(-1) for n in bn.inputs[1:5])
    bias = view.const(input_at(conv, 2))
    bias = np.zeros_like(mean) if bias is None else bias.astype(np.float64).reshape(-1)
    scale = gamma / np.sqrt(var + float(bn.attrs.get("epsilon", 1e-5)))
    new_weight = (weight.astype(np.float64) * scale.reshape((-1,) + (1,) * (weight.ndim - 1))).astype(weight.dtype)
    new_bias = ((bias - mean) * scale + beta).astype(weight.dtype)
    w_name, b_name = view.fresh(f"{conv.inputs[1]}__bn"), view.fresh(f"{bn.outputs[0]}__bias")
    node = Node("Conv", [conv.inputs[0], w_name, b_name], bn.outputs[:1], conv.attrs, name=conv.name)
    return Rewrite([node], {w_name: new_weight, b_name: new_bias})


RULES = (Rule("bn_into_conv", ("BatchNormalization",), _match, _rewrite, _check),)
fold_batch_norm = rule_pass("fold_batch_norm", 1, RULES)
