"""Gemm, MatMul and their fused forms -> FULLY_CONNECTED (constant weights) or BATCH_MATMUL.

FULLY_CONNECTED computes ``x @ W.T + b`` over x's last axis with W stored ``[units, in]``;
``keep_num_dims`` keeps x's leading dims (MatMul of a rank-3 activation). Gemm's ``alpha``
and ``beta`` are folded into the constant weights and bias.
"""

from __future__ import annotations

import numpy as np

from edgeinfer.format.tflite.context import OpContext
from edgeinfer.format.tflite.export import ExportError, export_rule, identity
from edgeinfer.format.tflite.ops.conv import _const_shape, conv_output, float_bias, int8_bias
from edgeinfer.format.tflite.ops.elementwise import activation_support
from edgeinfer.ir import Graph, Node


def check_gemm(node: Node, graph: Graph) -> str | None:
    if _const_shape(graph, node.inputs[1]) is None:
        return "Gemm's B must be constant (FULLY_CONNECTED weights)"
    if len(node.inputs) > 2 and node.inputs[2]:
        shape = _const_shape(graph, node.inputs[2])
        if shape is None:
            return "Gemm's C must be constant"
    return activation_support(node)


def _plain_gemm(node: Node, graph: Graph) -> bool:
    return float(node.attrs.get("alpha", 1.0)) == 1.0 and float(node.attrs.get("beta", 1.0)) == 1.0


def _units_bias_ok(ctx: OpContext, units: int) -> bool:
    bias_shape = _const_shape(ctx.exp.graph, ctx.name(2)) if ctx.has(2) else ()
    return int(np.prod(bias_shape, dtype=np.int64)) in (1, units) if bias_shape else True


def fully_connected(ctx: OpContext, weight_perm: tuple[int, int], *, alpha: float = 1.0, beta: float = 1.0,
                    x_perm: tuple[int, ...] | None = None) -> None:
    w_shape = _const_shape(ctx.exp.graph, ctx.name(1))
    units = w_shape[weight_perm[0]]
    if not _units_bias_ok(ctx, units):
        raise ExportError(f"the bias of shape {_const_shape(ctx.exp.graph, ctx.name(2))} is not one value per "
                          f"output unit ({units})")
    x = ctx.input(0, x_perm)
    if ctx.int8:
        weight = ctx.input(1, weight_perm)
        bias = int8_bias(ctx, 2, ctx.quant(1).scale, units)
    else:
        if alpha == 1.0 and ctx.const(1).dtype == np.float32:
            weight = ctx.input(1, weight_perm)  # the weight itself (a float16-stored one stays so, as the original)
        else:
            data = ctx.const(1)
            weight = ctx.constant(np.ascontiguousarray(np.transpose(data, weight_perm) * np.float32(alpha)),
                                  "weights")
        bias = float_bias(ctx, 2, units, beta)
    keep = len(ctx.out_shape()) > 2
    ctx_shape = ctx.out_shape()

    def write(out: int, code: int) -> None:
        ctx.op("FULLY_CONNECTED", [x, weight, bias], [out], version=5 if ctx.int8 else 1,
               options="FullyConnectedOptions", fused_activation_function=code, keep_num_dims=keep)

    conv_output(ctx, write, ctx_shape, identity(len(ctx_shape)))


@export_rule("Gemm", check=check_gemm, int8="any", int8_inputs=(0, 1), int8_weights=(1,), int8_when=_plain_gemm)
@export_rule("FusedGemm", domain="edgeinfer", check=check_gemm, int8="any", int8_inputs=(0, 1), int8_weights=(1,),
             int8_when=_plain_gemm)
def gemm(ctx: OpContext) -> None:
    trans_b = int(ctx.attrs.get("transB", 0))
    x_perm = (1, 0) if int(ctx.attrs.get("transA", 0)) else None
    fully_connected(ctx, (0, 1) if trans_b else (1, 0), alpha=float(ctx.attrs.get("alpha", 1.0)),
                    beta=float(ctx.attrs.get("beta", 1.0)), x_perm=x_perm)


def check_matmul(node: Node, graph: Graph) -> str | None:
    a, b = graph.values.get(node.inputs[0]), graph.values.get(node.inputs[1])
    if a is None or b is None or a.rank is None or b.rank is None or a.rank < 2 or b.rank < 2:
        return "MatMul operands must have known ranks of at least 2 (1-D operands have no TFLite form)"
    if len(node.inputs) > 2 and node.inputs[2] and _const_shape(graph, node.inputs[2]) is None:
        return "FusedMatMul's bias must be constant"
    return activation_support(node)


@export_rule("MatMul", check=check_matmul, int8="any", int8_weights=(1,))
@export_rule("FusedMatMul", domain="edgeinfer", check=check_matmul, int8="any", int8_inputs=(0, 1), int8_weights=(1,))
def matmul(ctx: OpContext) -> None:
    w_shape = _const_shape(ctx.exp.graph, ctx.name(1))
    if w_shape is not None and len(w_shape) == 2 and (not ctx.int8 or not ctx.quant(1).zero_point.any()):
        fully_connected(ctx, (1, 0))
        return
    a, b = ctx.input(0), ctx.input(1)
    shape = ctx.out_shape()
    if not ctx.has(2) and not ctx.attrs.get("activation", ""):
        ctx.op("BATCH_MATMUL", [a, b], [ctx.output(0)], options="BatchMatMulOptions", adj_x=False, adj_y=False)
        return
    if ctx.int8:
        raise ExportError("an int8 MatMul with bias or activation needs constant weights")
    product = ctx.temp(shape, "product")
    ctx.op("BATCH_MATMUL", [a, b], [product], options="BatchMatMulOptions", adj_x=False, adj_y=False)
    if not ctx.has(2):
        ctx.activation(product, shape, identity(len(shape)), ctx.output(0))
        return
    bias = ctx.constant(ctx.const(2).astype(np.float32), "bias")
    conv_output(ctx, lambda out, code: ctx.op("ADD", [product, bias], [out], options="AddOptions",
                                              fused_activation_function=code), shape, identity(len(shape)))
