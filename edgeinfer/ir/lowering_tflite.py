"""``edgeinfer::TFLite*``: TFLite's integer kernels as IR ops, and their lowerings.

A full-integer TFLite model computes each op in fixed point. For most ops that is exactly
dequantize -> float op -> quantize (QDQ), which is how the TFLite importer brings them in;
for the ops below TFLite's integer arithmetic rounds differently (two roundings in
``MultiplyByQuantizedMultiplier``, inputs rescaled to a common scale before ADD, a lookup
table of float32 exps in SOFTMAX, a Newton-Raphson 1/sqrt), and the one-step differences
compound in deep int8 graphs (LayerNorm's RSQRT amplifies them). These ops carry TFLite's
definition so that the numpy backend reproduces the interpreter's builtin CPU kernels
bit-exactly (``backends/numpy/kernels/tflite_int8.py`` documents the arithmetic).

All tensors are int8 with per-tensor scales (float32 scalars) and zero points (int8
scalars), passed as inputs in ONNX QLinear order; attributes ``clip_min``/``clip_max``
(default -128/127) are the fused activation's range in the output's integer domain.

- ``TFLiteFullyConnected(x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp, [bias])``:
  ``w`` is ``[units, in]`` (TFLite's layout), ``w_scale``/``w_zp`` scalars or per unit,
  ``bias`` int32 on scale ``x_scale * w_scale``; ``y = x @ w.T + bias`` over x's last axis.
- ``TFLiteBatchMatMul(a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp)``: ``a @ b``
  (numpy broadcasting over the batch dims).
- ``TFLiteAdd``, ``TFLiteSub``, ``TFLiteMul``, ``TFLiteSquaredDifference``
  ``(a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp)``: element-wise, numpy broadcasting.
- ``TFLiteMean(x, x_scale, x_zp, y_scale, y_zp)``: attributes ``axes`` and ``keepdims``.
- ``TFLiteSoftmax(x, x_scale, x_zp, y_scale, y_zp)``: over the last axis, attribute ``beta``.
- ``TFLiteRsqrt(x, x_scale, x_zp, y_scale, y_zp)``: ``1 / sqrt(x)``.

Lowering (backends without these kernels, e.g. onnxruntime): DequantizeLinear of every
input, the float op, QuantizeLinear of the result (and an int8 ``Clip`` for a fused
activation). That is the float-then-round approximation, within a step or two of TFLite,
not bit-exact.
"""

from __future__ import annotations

import numpy as np

from edgeinfer.ir.graph import Node
from edgeinfer.ir.lowering import Lowered, LoweringContext, lowering

_BINARY = {"TFLiteAdd": "Add", "TFLiteSub": "Sub", "TFLiteMul": "Mul"}


class _Builder:
    """Lowered nodes for one node, with fresh names derived from its output."""

    def __init__(self, node: Node, ctx: LoweringContext):
        self.node, self.ctx, self.out = node, ctx, Lowered([])
        self.y = node.outputs[0]

    def fresh(self, tag: str) -> str:
        return self.ctx.fresh(f"{self.y}__{tag}")

    def add(self, op_type: str, inputs: list[str], tag: str, out: str | None = None, **attrs) -> str:
        name = out or self.fresh(tag)
        self.out.nodes.append(Node(op_type, inputs, [name], attrs))
        return name

    def dequantize(self, k: int, **attrs) -> str:
        x, scale, zero = self.node.inputs[k:k + 3]
        return self.add("DequantizeLinear", [x, scale, zero], f"dq{k}", **attrs)

    def quantize(self, y_float: str, scale_index: int) -> Lowered:
        scale, zero = self.node.inputs[scale_index:scale_index + 2]
        lo, hi = int(self.node.attrs.get("clip_min", -128)), int(self.node.attrs.get("clip_max", 127))
        clipped = lo > -128 or hi < 127
        q = self.add("QuantizeLinear", [y_float, scale, zero], "q", out=None if clipped else self.y)
        if clipped:
            bounds = [self.out.const(self.ctx, f"{self.y}__{t}", v, np.int8) for t, v in (("lo", lo), ("hi", hi))]
            self.add("Clip", [q] + bounds, "clip", out=self.y)
        return self.out


@lowering("TFLiteFullyConnected")
def lower_fully_connected(node: Node, ctx: LoweringContext) -> Lowered:
    b = _Builder(node, ctx)
    x, w = b.dequantize(0), b.dequantize(3, axis=0)
    y = b.add("MatMul", [x, b.add("Transpose", [w], "wT", perm=(1, 0))], "matmul")
    if len(node.inputs) > 8 and node.inputs[8]:
        bias_scale = b.add("Mul", [node.inputs[1], node.inputs[4]], "bias_scale")
        y = b.add("Add", [y, b.add("DequantizeLinear", [node.inputs[8], bias_scale], "bias", axis=0)], "biased")
    return b.quantize(y, 6)


@lowering("TFLiteBatchMatMul")
def lower_batch_matmul(node: Node, ctx: LoweringContext) -> Lowered:
    b = _Builder(node, ctx)
    return b.quantize(b.add("MatMul", [b.dequantize(0), b.dequantize(3)], "matmul"), 6)


def _lower_binary(node: Node, ctx: LoweringContext) -> Lowered:
    b = _Builder(node, ctx)
    x, y = b.dequantize(0), b.dequantize(3)
    if node.op_type == "TFLiteSquaredDifference":
        diff = b.add("Sub", [x, y], "diff")
        return b.quantize(b.add("Mul", [diff, diff], "square"), 6)
    return b.quantize(b.add(_BINARY[node.op_type], [x, y], "float"), 6)


for _op in (*_BINARY, "TFLiteSquaredDifference"):
    lowering(_op)(_lower_binary)


@lowering("TFLiteMean")
def lower_mean(node: Node, ctx: LoweringContext) -> Lowered:
    b = _Builder(node, ctx)
    axes, keepdims = [int(a) for a in node.attrs["axes"]], int(node.attrs.get("keepdims", 1))
    x = b.dequantize(0)
    if ctx.opset >= 18:
        y = b.add("ReduceMean", [x, b.out.const(ctx, f"{b.y}__axes", axes, np.int64)], "mean", keepdims=keepdims)
    else:
        y = b.add("ReduceMean", [x], "mean", axes=tuple(axes), keepdims=keepdims)
    return b.quantize(y, 3)


@lowering("TFLiteSoftmax")
def lower_softmax(node: Node, ctx: LoweringContext) -> Lowered:
    b = _Builder(node, ctx)
    x = b.dequantize(0)
    beta = float(node.attrs.get("beta", 1.0))
    if beta != 1.0:
        x = b.add("Mul", [x, b.out.const(ctx, f"{b.y}__beta", beta)], "scaled")
    return b.quantize(b.add("Softmax", [x], "softmax", axis=-1), 3)


@lowering("TFLiteRsqrt")
def lower_rsqrt(node: Node, ctx: LoweringContext) -> Lowered:
    b = _Builder(node, ctx)
    return b.quantize(b.add("Reciprocal", [b.add("Sqrt", [b.dequantize(0)], "sqrt")], "rsqrt"), 3)
