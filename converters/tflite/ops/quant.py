"""QUANTIZE and DEQUANTIZE.

In the QDQ import every quantized tensor already has a float view, so both ops relabel that
view: the importer quantizes an op's quantized outputs itself (``QuantizeLinear`` with the
output's scale), which is exactly QUANTIZE (float -> int8) and requantization (int8 -> int8
with new parameters). DEQUANTIZE of a float16 constant (fp16-weight models) is that constant
widened to float32 at conversion and marked as stored in float16 (``edgeinfer.ir.weights``);
DEQUANTIZE of a float16 activation is a ``Cast``.
"""

from __future__ import annotations

import numpy as np

from edgeinfer.converters.tflite.importer import OpContext, rule
from edgeinfer.errors import UnsupportedOpError
from edgeinfer.ir import dtypes


@rule("QUANTIZE")
def quantize(ctx: OpContext) -> None:
    if not ctx.imp.is_quantized(ctx.out_tensor()):
        raise UnsupportedOpError(f"{ctx.where}: output {ctx.out_tensor().name!r} has no quantization "
                                 "parameters")
    ctx.set_output(0, ctx.x(0))


@rule("DEQUANTIZE")
def dequantize(ctx: OpContext) -> None:
    tensor = ctx.tensor(0)
    if ctx.imp.is_quantized(tensor):
        value = ctx.x(0)
        if ctx.imp.is_quantized(ctx.out_tensor()):
            raise UnsupportedOpError(f"{ctx.where}: a quantized output of DEQUANTIZE is not supported")
        ctx.set_output(0, value)
    elif tensor.dtype == "float16" and ctx.const(0) is not None:
        # A float16 weight: a float32 constant that remembers it is stored as float16
        # (edgeinfer.ir.weights), so passes and backends see a constant weight, not a Cast.
        ctx.set_constant_output(0, ctx.const(0).astype(np.float32), stored_fp16=True)
    elif tensor.dtype == "float16":
        ctx.emit1("Cast", [ctx.x(0)], ctx.out(), to=dtypes.to_onnx(ctx.out_tensor().dtype))
    else:
        raise UnsupportedOpError(f"{ctx.where}: input {tensor.name!r} of type {tensor.type_name} has no "
                                 "quantization parameters")


@rule("DENSIFY")
def densify(ctx: OpContext) -> None:
    """DENSIFY of a sparse constant: the reader has densified it already (``sparsity.py``)."""
    data = ctx.const_required(0, "the sparse tensor")
    ctx.set_constant_output(0, data, stored_fp16=data.dtype == np.float16)
