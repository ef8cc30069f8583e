"""Reductions over constant axes, arg-max/min and top-k."""

from __future__ import annotations

import numpy as np

from edgeinfer.converters.tflite.importer import OpContext, rule
from edgeinfer.ir import dtypes

# opset 17: ReduceSum takes axes as an input, the others as an attribute
_REDUCERS = {"MEAN": "ReduceMean", "SUM": "ReduceSum", "REDUCE_PROD": "ReduceProd",
             "REDUCE_MAX": "ReduceMax", "REDUCE_MIN": "ReduceMin"}


def _reducer(onnx_op: str):
    def convert(ctx: OpContext) -> None:
        axes = tuple(int(a) for a in np.asarray(ctx.const_required(1, "axes")).reshape(-1))
        keepdims = int(bool(ctx.opt("keep_dims")))
        if onnx_op == "ReduceMean" and axes and _int8_mean(ctx, axes, keepdims):
            return
        x = ctx.x(0)
        if not axes:
            ctx.emit1("Identity", [x], ctx.out())
        elif onnx_op == "ReduceSum":
            ctx.emit1(onnx_op, [x, ctx.constant(np.array(axes, np.int64), "axes")], ctx.out(), keepdims=keepdims)
        else:
            ctx.emit1(onnx_op, [x], ctx.out(), axes=axes, keepdims=keepdims)

    return convert


def _int8_mean(ctx: OpContext, axes: tuple[int, ...], keepdims: int) -> bool:
    """Full-integer MEAN as ``edgeinfer::TFLiteMean``: TFLite's general quantized mean (integer
    sum, 1/count folded into the requantization multiplier). Its two special cases keep the
    QDQ import: equal input and output quantization, and 4-D means over H and W with
    keep_dims (those run other kernels)."""
    if not ctx.int8_tensors((0,)):
        return False
    rank = len(ctx.tensor(0).shape)
    spatial = keepdims and rank == 4 and sorted(a % rank for a in axes) == [1, 2]
    same = ctx.tensor(0).quant.scale.reshape(-1)[0] == ctx.out_tensor().quant.scale.reshape(-1)[0] and \
        ctx.tensor(0).quant.zero_point.reshape(-1)[0] == ctx.out_tensor().quant.zero_point.reshape(-1)[0]
    if spatial or same:
        return False
    ctx.emit_int8("TFLiteMean", [*ctx.qlinear(0), *ctx.out_qlinear()], axes=axes, keepdims=keepdims)
    return True


for _name, _op in _REDUCERS.items():
    rule(_name, options="ReducerOptions")(_reducer(_op))


def _arg(onnx_op: str):
    def convert(ctx: OpContext) -> None:
        axis = int(np.asarray(ctx.const_required(1, "axis")).reshape(-1)[0])
        y = ctx.emit1(onnx_op, [ctx.x(0)], axis=axis, keepdims=0)
        out_dtype = ctx.out_tensor().dtype
        if out_dtype == "int64":
            ctx.emit1("Identity", [y], ctx.out())
        else:
            ctx.emit1("Cast", [y], ctx.out(), to=dtypes.to_onnx(out_dtype))

    return convert


rule("ARG_MAX", options="ArgMaxOptions")(_arg("ArgMax"))
rule("ARG_MIN", options="ArgMinOptions")(_arg("ArgMin"))


@rule("TOPK_V2")
def topk(ctx: OpContext) -> None:
    k = ctx.emit1("Reshape", [ctx.int64(1), ctx.constant(np.array([1], np.int64), "k_shape")])
    values, indices = ctx.emit("TopK", [ctx.x(0), k], [ctx.out(0), ctx.imp.builder.fresh("topk_indices")],
                               axis=-1, largest=1, sorted=1)
    ctx.emit1("Cast", [indices], ctx.out(1), to=dtypes.to_onnx(ctx.out_tensor(1).dtype))
