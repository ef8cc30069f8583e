"""QuantizeLinear, DequantizeLinear and the integer ops (MatMulInteger, ConvInteger, QLinearMatMul,
QLinearConv).

``QuantizeLinear``: ``y = saturate(round_half_even(x / scale) + zero_point)``; ``DequantizeLinear``:
``(x - zero_point) * scale``; scales per tensor or per ``axis``. Integer products accumulate in
float64, which is exact for int8/uint8 operands (each product is below 2**16, so a sum stays
exact past 2**37 terms) and runs on every torch device with float64; the qlinear ops requantize
``round_half_even(acc * (scale_a * scale_b / scale_y)) + zero_point_y``.
"""

from __future__ import annotations

import torch

from edgeinfer.backends.torch.lowerings.conv import conv_geometry
from edgeinfer.backends.torch.registry import LoweringContext, axis_of, lowering

_RANGES = {torch.int8: (-128, 127), torch.uint8: (0, 255), torch.int16: (-32768, 32767),
           torch.int32: (-2 ** 31, 2 ** 31 - 1)}


def _along(param: torch.Tensor, rank: int, axis: int) -> torch.Tensor:
    """A per-tensor (0-d / 1-element) or per-axis (1-D) parameter shaped to broadcast."""
    if param.dim() == 0 or param.numel() == 1 and rank != 1:
        return param.reshape(())
    shape = [1] * rank
    shape[axis] = -1
    return param.reshape(shape)


def _no_blocks(node, graph) -> str | None:
    if node.attrs.get("block_size", 0):
        return "blocked quantization (block_size > 0) is not lowered"
    return None


@lowering("QuantizeLinear", since=10, check=_no_blocks)
def quantize_linear(x, y_scale, y_zero_point=None, *, axis=1, block_size=0, output_dtype=0, precision=0,
                    saturate=1, _ctx: LoweringContext):
    target = _ctx.output_dtypes[0]
    axis = axis_of(axis, x.dim())
    # divided in x's precision (float32 for half types), as the spec's reference does
    wide = x if x.dtype == torch.float64 else x.float()
    scaled = torch.round(wide / _along(y_scale, x.dim(), axis).to(wide.dtype)).double()
    if y_zero_point is not None:
        scaled = scaled + _along(y_zero_point, x.dim(), axis).double()
    low, high = _RANGES[target]
    return scaled.clamp(low, high).to(target)


@lowering("DequantizeLinear", since=10, check=_no_blocks)
def dequantize_linear(x, x_scale, x_zero_point=None, *, axis=1, block_size=0, output_dtype=0,
                      _ctx: LoweringContext):
    axis = axis_of(axis, x.dim())
    shifted = x.to(torch.float64)
    if x_zero_point is not None:
        shifted = shifted - _along(x_zero_point, x.dim(), axis).double()
    target = _ctx.output_dtypes[0] or x_scale.dtype
    return (shifted * _along(x_scale, x.dim(), axis).double()).to(target)


def _shifted(value, zero_point, axis: int):
    value = value.to(torch.float64)
    if zero_point is None:
        return value
    return value - _along(zero_point, value.dim(), axis).double()


def _integer_matmul(a, a_zero_point, b, b_zero_point):
    # a's zero point is per row (axis -2) when 1-D, b's per column (axis -1)
    a64 = _shifted(a, a_zero_point, a.dim() - 2 if a.dim() > 1 else 0)
    b64 = _shifted(b, b_zero_point, b.dim() - 1)
    return torch.matmul(a64, b64)


def _requantize(acc, multiplier, y_zero_point, target):
    y = torch.round(acc * multiplier)
    if y_zero_point is not None:
        y = y + y_zero_point.double().reshape(())
    low, high = _RANGES[target]
    return y.clamp(low, high).to(target)


@lowering("MatMulInteger", since=10)
def matmul_integer(a, b, a_zero_point=None, b_zero_point=None):
    return _integer_matmul(a, a_zero_point, b, b_zero_point).to(torch.int32)


@lowering("QLinearMatMul", since=10)
def qlinear_matmul(a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point=None):
    acc = _integer_matmul(a, a_zero_point, b, b_zero_point)
    multiplier = a_scale.double().reshape(-1)[0] * _along(b_scale.double(), acc.dim(), acc.dim() - 1) \
        / y_scale.double().reshape(())
    target = y_zero_point.dtype if y_zero_point is not None else torch.uint8
    return _requantize(acc, multiplier, y_zero_point, target)


def _integer_conv(x, w, x_zero_point, w_zero_point, attrs):
    x64 = _shifted(x, x_zero_point, 1)
    w64 = _shifted(w, w_zero_point, 0)
    return conv_geometry(x64, w64, None, **attrs)


_CONV_KEYS = ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")


@lowering("ConvInteger", since=10)
def conv_integer(x, w, x_zero_point=None, w_zero_point=None, *, auto_pad="NOTSET", dilations=None, group=1,
                 kernel_shape=None, pads=None, strides=None):
    attrs = dict(zip(_CONV_KEYS, (auto_pad, dilations, group, kernel_shape, pads, strides), strict=True))
    return _integer_conv(x, w, x_zero_point, w_zero_point, attrs).to(torch.int32)


@lowering("QLinearConv", since=10)
def qlinear_conv(x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point, b=None, *,
                 auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None, strides=None):
    attrs = dict(zip(_CONV_KEYS, (auto_pad, dilations, group, kernel_shape, pads, strides), strict=True))
    acc = _integer_conv(x, w, x_zero_point, w_zero_point, attrs)
    if b is not None:
        acc = acc + _along(b.double(), acc.dim(), 1)
    multiplier = x_scale.double().reshape(()) * _along(w_scale.double(), acc.dim(), 1) / y_scale.double().reshape(())
    target = y_zero_point.dtype if y_zero_point is not None else torch.uint8
    return _requantize(acc, multiplier, y_zero_point, target)

