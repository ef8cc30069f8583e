"""Integer matmul and convolution: MatMulInteger, ConvInteger, QLinearMatMul, QLinearConv.

Exact integer semantics with BLAS speed: operands minus their zero points are at most 16
bits wide, so their products summed in float64 are exact integers for any realistic inner
dimension (below 2**53 / 2**32), and the float64 result converts to int32 without error.
Requantization (the QLinear ops) follows the spec and ``onnx.reference``:
``y = saturate(round_half_even(acc * (scale_a * scale_b / scale_y)) + zero_point_y)``, the
multiplier formed in the scales' precision and applied in float64.
"""

from __future__ import annotations

import numpy as np

from edgeinfer.backends.numpy.kernels.conv import conv_geometry, conv_nd
from edgeinfer.backends.numpy.registry import kernel


def _shifted(op: str, name: str, value: np.ndarray, zero_point, axis_size: int, axis: int) -> np.ndarray:
    """``value - zero_point`` in float64; a 1-D zero point applies along ``axis`` of ``value``."""
    shifted = value.astype(np.float64)
    if zero_point is None:
        return shifted
    zp = np.asarray(zero_point)
    if zp.dtype != value.dtype:
        raise ValueError(f"{op}: expected the {name} zero point of type {value.dtype}, found {zp.dtype}")
    if zp.ndim == 1 and zp.size > 1:
        if zp.size != axis_size:
            raise ValueError(f"{op}: expected the {name} zero point to be a scalar or 1-D of length "
                             f"{axis_size}, found shape {list(zp.shape)}")
        zp = zp.reshape((-1,) + (1,) * (value.ndim - 1 - axis % value.ndim))
    shifted -= zp
    return shifted


def _integer_matmul(op: str, a, a_zero_point, b, b_zero_point) -> np.ndarray:
    if a.ndim < 1 or b.ndim < 1 or a.shape[-1] != b.shape[-2 if b.ndim > 1 else 0]:
        raise ValueError(f"{op}: inner dimensions differ: {list(a.shape)} @ {list(b.shape)}")
    rows = a.shape[-2] if a.ndim > 1 else 1
    lhs = _shifted(op, "A", a, a_zero_point, rows, -2 if a.ndim > 1 else -1)
    rhs = _shifted(op, "B", b, b_zero_point, b.shape[-1], -1)
    return np.matmul(lhs, rhs)


def _requantize(op: str, acc: np.ndarray, multiplier: np.ndarray, y_zero_point, fallback: np.dtype) -> np.ndarray:
    dtype = y_zero_point.dtype if y_zero_point is not None else fallback
    if dtype.kind not in "iu":
        raise ValueError(f"{op}: expected an 8-bit integer output type, found {dtype}")
    y = acc * multiplier.astype(np.float64)
    if y_zero_point is not None:
        y += y_zero_point.astype(np.float64)
    info = np.iinfo(dtype)
    return np.clip(np.rint(y), info.min, info.max).astype(dtype)


@kernel("MatMulInteger", since=10)
def matmul_integer(a, b, a_zero_point=None, b_zero_point=None):
    return _integer_matmul("MatMulInteger", a, a_zero_point, b, b_zero_point).astype(np.int32)


@kernel("QLinearMatMul", since=10)
def qlinear_matmul(a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point=None):
    acc = _integer_matmul("QLinearMatMul", a, a_zero_point, b, b_zero_point)
    a_scale = np.asarray(a_scale)
    if a_scale.ndim == 1 and a_scale.size > 1:  # per row of A
        a_scale = a_scale.reshape(-1, 1)
    multiplier = a_scale * np.asarray(b_scale) / np.asarray(y_scale)
    return _requantize("QLinearMatMul", acc, multiplier, y_zero_point, a.dtype)


def _integer_conv(op, x, w, x_zero_point, w_zero_point, auto_pad, dilations, group, kernel_shape, pads, strides):
    strides, dilations, out_sizes, begin, end = conv_geometry(x, w, op, auto_pad, dilations, group,
                                                              kernel_shape, pads, strides)
    if x_zero_point is not None and np.size(x_zero_point) != 1:
        raise ValueError(f"{op}: expected a scalar x zero point, found shape {list(np.shape(x_zero_point))}")
    xs = _shifted(op, "x", x, x_zero_point, 1, 0)
    ws = _shifted(op, "w", w, w_zero_point, w.shape[0], 0)
    return conv_nd(xs, ws, group=group, strides=strides, dilations=dilations, begin=begin, end=end,
                   out_sizes=out_sizes)


@kernel("ConvInteger", since=10)
def conv_integer(x, w, x_zero_point=None, w_zero_point=None, *, auto_pad="NOTSET", dilations=None, group=1,
                 kernel_shape=None, pads=None, strides=None):
    acc = _integer_conv("ConvInteger", x, w, x_zero_point, w_zero_point, auto_pad, dilations, group,
                        kernel_shape, pads, strides)
    return acc.astype(np.int32)


@kernel("QLinearConv", since=10)
def qlinear_conv(x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point, b=None, *,
                 auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None, strides=None):
    acc = _integer_conv("QLinearConv", x, w, x_zero_point, w_zero_point, auto_pad, dilations, group,
                        kernel_shape, pads, strides)
    channel_shape = (-1,) + (1,) * (x.ndim - 2)
    if b is not None:
        if b.shape != (w.shape[0],):
            raise ValueError(f"QLinearConv: expected B of shape [{w.shape[0]}], found {list(b.shape)}")
        acc += b.astype(np.float64).reshape(channel_shape)
    w_scale = np.asarray(w_scale)
    if w_scale.size > 1:
        if w_scale.ndim != 1 or w_scale.size != w.shape[0]:
            raise ValueError(f"QLinearConv: expected w_scale to be a scalar or 1-D of length {w.shape[0]}, "
                             f"found shape {list(w_scale.shape)}")
        w_scale = w_scale.reshape(channel_shape)
    multiplier = np.asarray(x_scale) * w_scale / np.asarray(y_scale)
    return _requantize("QLinearConv", acc, multiplier, y_zero_point, x.dtype)
