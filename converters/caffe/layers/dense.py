"""InnerProduct -> Flatten + Gemm, or MatMul + Add when ``axis`` keeps several leading dims.

Caffe flattens the input from ``axis`` on into K features: the output is
``shape[:axis] + (num_output,)``. The weight is ``(num_output, K)``, or ``(K, num_output)``
with ``transpose: true``; legacy caffemodels store it as ``(1, 1, num_output, K)``.
"""

from __future__ import annotations

import numpy as np

from edgeinfer.converters.caffe.builder import Blob, LayerContext, layer


def normalize_axis(ctx: LayerContext, axis: int, rank: int, what: str = "axis") -> int:
    if not -rank <= axis < rank:
        raise ctx.invalid(f"{what} {axis} out of range for an input of rank {rank}")
    return axis % rank


@layer("InnerProduct")
def inner_product(ctx: LayerContext) -> None:
    ctx.expect_bottoms(1)
    ctx.expect_tops(1)
    param = ctx.param("inner_product_param")
    shape = ctx.shape()
    axis = normalize_axis(ctx, param.axis, len(shape))
    features, outputs = int(np.prod(shape[axis:], dtype=np.int64)), int(param.num_output)
    expected = [Blob((features, outputs) if param.transpose else (outputs, features))]
    if param.bias_term:
        expected.append(Blob((outputs,), 0.0))
    blobs = ctx.blobs(expected)
    bias = [ctx.const(blobs[1], "bias")] if param.bias_term else []
    if axis == 1:
        flat = ctx.node("Flatten", ctx.inputs, {"axis": 1}, suffix="flatten") if len(shape) != 2 else ctx.inputs[0]
        ctx.node("Gemm", [flat, ctx.const(blobs[0], "weight"), *bias], {"transB": 0 if param.transpose else 1}, top=0)
        return
    ctx.batch_axis_untouched(axis, "InnerProduct")
    # Keep the leading axes: (..., K) @ (K, num_output) broadcasts over them.
    value = ctx.inputs[0] if axis == len(shape) - 1 else ctx.reshape(ctx.inputs[0], [*shape[:axis], features])
    weight = blobs[0] if param.transpose else np.ascontiguousarray(blobs[0].T)
    product = ctx.node("MatMul", [value, ctx.const(weight, "weight")], top=None if bias else 0)
    if bias:
        ctx.node("Add", [product, *bias], top=0)
