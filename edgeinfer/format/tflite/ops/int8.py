"""``edgeinfer::TFLite*`` integer ops (from the TFLite importer) back to TFLite's builtins.

These ops already carry TFLite's int8 semantics on raw int8 values, with their scales and
zero points as constant inputs (``edgeinfer.ir.lowering_tflite``); the exporter has recorded
those parameters on the values, so each op is one builtin on int8 tensors. The fused
activation is the one whose integer range (TFLite's ``CalculateActivationRangeQuantized``)
equals the op's ``clip_min``/``clip_max``.
"""

from __future__ import annotations

import numpy as np

from edgeinfer.format.tflite.context import OpContext
from edgeinfer.format.tflite.export import ExportError, export_rule

ACTIVATION_BOUNDS = {0: (None, None), 1: (0.0, None), 3: (0.0, 6.0), 2: (-1.0, 1.0)}  # code -> float range
BINARY = {"TFLiteAdd": ("ADD", "AddOptions"), "TFLiteSub": ("SUB", "SubOptions"),
          "TFLiteMul": ("MUL", "MulOptions")}


def activation_code(ctx: OpContext) -> int:
    """The fused activation reproducing the node's int8 clip range on its output."""
    lo, hi = int(ctx.attrs.get("clip_min", -128)), int(ctx.attrs.get("clip_max", 127))
    quant = ctx.exp.quant[ctx.node.outputs[0]]
    scale, zero = float(quant.scale[0]), int(quant.zero_point[0])

    def level(value: float) -> int:
        ratio = float(np.float32(value) / np.float32(scale))
        return zero + int(np.copysign(np.floor(abs(ratio) + 0.5), ratio))

    for code, (low, high) in ACTIVATION_BOUNDS.items():
        bounds = (max(-128, level(low)) if low is not None else -128, min(127, level(high)) if high is not None else 127)
        if bounds == (lo, hi):
            return code
    raise ExportError(f"the int8 clip range [{lo}, {hi}] is no TFLite fused activation's")


@export_rule("TFLiteFullyConnected", domain="edgeinfer")
def fully_connected(ctx: OpContext) -> None:
    inputs = [ctx.input(0), ctx.input(3)] + ([ctx.input(8)] if ctx.has(8) else [])
    ctx.op("FULLY_CONNECTED", inputs, [ctx.output(0)], version=5, options="FullyConnectedOptions",
           fused_activation_function=activation_code(ctx), keep_num_dims=ctx.rank(0) > 2)


@export_rule("TFLiteBatchMatMul", domain="edgeinfer")
def batch_matmul(ctx: OpContext) -> None:
    ctx.op("BATCH_MATMUL", [ctx.input(0), ctx.input(3)], [ctx.output(0)], version=2, options="BatchMatMulOptions",
           adj_x=False, adj_y=False)


def _binary(opcode: str, options: str):
    def export(ctx: OpContext) -> None:
        ctx.op(opcode, [ctx.input(0), ctx.input(3)], [ctx.output(0)], version=2, options=options,
               fused_activation_function=activation_code(ctx))

    return export


for _op, (_opcode, _options) in BINARY.items():
    export_rule(_op, domain="edgeinfer")(_binary(_opcode, _options))


@export_rule("TFLiteSquaredDifference", domain="edgeinfer")
def squared_difference(ctx: OpContext) -> None:
    ctx.op("SQUARED_DIFFERENCE", [ctx.input(0), ctx.input(3)], [ctx.output(0)], version=2)


@export_rule("TFLiteMean", domain="edgeinfer")
def mean(ctx: OpContext) -> None:
    axes = [int(a) % ctx.rank(0) for a in ctx.attrs["axes"]]
    ctx.op("MEAN", [ctx.input(0), ctx.int32(axes, "axes")], [ctx.output(0)], version=2, options="ReducerOptions",
           keep_dims=bool(int(ctx.attrs.get("keepdims", 1))))


@export_rule("TFLiteSoftmax", domain="edgeinfer")
def softmax(ctx: OpContext) -> None:
    ctx.op("SOFTMAX", [ctx.input(0)], [ctx.output(0)], version=2, options="SoftmaxOptions",
           beta=float(ctx.attrs.get("beta", 1.0)))


@export_rule("TFLiteRsqrt", domain="edgeinfer")
def rsqrt(ctx: OpContext) -> None:
    ctx.op("RSQRT", [ctx.input(0)], [ctx.output(0)], version=2)
