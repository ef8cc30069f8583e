"""Convolutions and fully connected layers.

TFLite keeps activations NHWC and filters OHWI (``CONV_2D``, ``TRANSPOSE_CONV``) or
1HW(C*M) (``DEPTHWISE_CONV_2D``); ONNX wants NCHW and OIHW / (C*M)1HW / I O HW. Constant
filters are transposed once here (per-channel quantization axes follow the permutation); the
activation is wrapped in ``Transpose`` nodes that the layout pass cancels between layers.
TFLite's ``SAME`` padding puts the odd pixel at the end, which is ONNX ``SAME_UPPER``; with
static spatial dims the pads are written out explicitly.
"""

from __future__ import annotations

import struct

import numpy as np

from edgeinfer.converters.tflite.importer import NCHW_TO_NHWC, NHWC_TO_NCHW, OpContext, rule
from edgeinfer.errors import UnsupportedOpError
from edgeinfer.format.tflite import schema


def same_pads(size: int, kernel: int, stride: int, dilation: int) -> tuple[int, int]:
    """TF ``SAME`` padding of one spatial dim: (before, after)."""
    out = -(-size // stride)
    total = max((out - 1) * stride + (kernel - 1) * dilation + 1 - size, 0)
    return total // 2, total - total // 2


def window_attrs(ctx: OpContext, in_hw: tuple, kernel: tuple[int, int], strides: tuple[int, int],
                 dilations: tuple[int, int] = (1, 1)) -> dict:
    """Padding attributes (explicit pads when the spatial dims are known)."""
    padding = schema.PADDINGS[ctx.opt("padding")] if 0 <= ctx.opt("padding") < 2 else "?"
    if padding == "VALID":
        return {"pads": (0, 0, 0, 0)}
    if padding != "SAME":
        raise UnsupportedOpError(f"{ctx.where}: padding code {ctx.opt('padding')} is not SAME or VALID")
    if any(d is None for d in in_hw):
        return {"auto_pad": "SAME_UPPER"}
    (top, bottom), (left, right) = (same_pads(s, k, st, d) for s, k, st, d in zip(in_hw, kernel, strides, dilations, strict=True))
    return {"pads": (top, left, bottom, right)}


def _strides(ctx: OpContext) -> tuple[int, int]:
    strides = (ctx.opt("stride_h"), ctx.opt("stride_w"))
    if min(strides) < 1:
        raise UnsupportedOpError(f"{ctx.where}: expected positive strides, found {strides}")
    return strides


def _conv(ctx: OpContext, weight: str, kernel: tuple[int, int], group: int) -> None:
    strides = _strides(ctx)
    dilations = (ctx.opt("dilation_h_factor"), ctx.opt("dilation_w_factor"))
    x = ctx.x(0, perm=NHWC_TO_NCHW)
    inputs = [x, weight] + ([ctx.x(2)] if ctx.has(2) else [])
    attrs = window_attrs(ctx, ctx.shape(0)[1:3], kernel, strides, dilations)
    y = ctx.emit1("Conv", inputs, kernel_shape=kernel, strides=strides, dilations=dilations,
                  group=group, **attrs)
    y = ctx.activation(y)
    ctx.emit1("Transpose", [y], ctx.out(), perm=NCHW_TO_NHWC)


@rule("CONV_2D", options="Conv2DOptions")
def conv_2d(ctx: OpContext) -> None:
    out_c, kh, kw, in_c = ctx.tensor(1).shape
    channels = ctx.shape(0)[3]
    if channels is None or channels % in_c:
        raise UnsupportedOpError(f"{ctx.where}: input channels {channels} is not a multiple of the "
                                 f"filter's {in_c}")
    _conv(ctx, ctx.x(1, perm=NHWC_TO_NCHW), (kh, kw), channels // in_c)


@rule("DEPTHWISE_CONV_2D", options="DepthwiseConv2DOptions")
def depthwise_conv_2d(ctx: OpContext) -> None:
    _, kh, kw, _ = ctx.tensor(1).shape
    channels = ctx.shape(0)[3]
    if channels is None:
        raise UnsupportedOpError(f"{ctx.where}: the input channel count must be static")
    _conv(ctx, ctx.x(1, perm=(3, 0, 1, 2)), (kh, kw), channels)


@rule("TRANSPOSE_CONV", options="TransposeConvOptions")
def transpose_conv(ctx: OpContext) -> None:
    out_shape = ctx.const(0)
    out_hw = tuple(int(d) for d in out_shape[1:3]) if out_shape is not None else ctx.out_shape()[1:3]
    _transposed_conv(ctx, 2, 1, 3, out_hw, schema.PADDINGS[ctx.opt("padding")], _strides(ctx))


# MediaPipe's custom op (its segmentation models); LiteRT runs it in the XNNPACK delegate.
# Inputs: x (NHWC), weights OHWI, bias; options: TfLiteTransposeConvParams {padding (1 SAME,
# 2 VALID), stride_width, stride_height} as raw little-endian int32s.
@rule("Convolution2DTransposeBias")
def convolution_2d_transpose_bias(ctx: OpContext) -> None:
    data = ctx.op.custom_options or b""
    if len(data) < 12:
        raise UnsupportedOpError(f"{ctx.where}: expected 12 bytes of TfLiteTransposeConvParams, found {len(data)}")
    padding, stride_w, stride_h = struct.unpack_from("<iii", data)
    if padding not in (1, 2) or min(stride_w, stride_h) < 1:
        raise UnsupportedOpError(f"{ctx.where}: padding code {padding} (expected 1 SAME or 2 VALID) or strides "
                                 f"{(stride_h, stride_w)} out of range")
    _transposed_conv(ctx, 0, 1, 2, ctx.out_shape()[1:3], "SAME" if padding == 1 else "VALID", (stride_h, stride_w))


def _transposed_conv(ctx: OpContext, x_k: int, w_k: int, bias_k: int, out_hw: tuple, padding: str,
                     strides: tuple[int, int]) -> None:
    # The padding is an attribute, fixed at conversion: where the file marks spatial dims
    # dynamic, they are found by shape inference over the graph built so far.
    x = ctx.x(x_k, perm=NHWC_TO_NCHW)
    in_hw = ctx.shape(x_k)[1:3]
    if None in in_hw + out_hw:
        inferred = ctx.imp.inferred_shape(x)
        in_hw = tuple(inferred[2:4]) if inferred is not None and len(inferred) == 4 else in_hw
        out_hw = tuple(d * s for d, s in zip(in_hw, strides, strict=True)) \
            if padding == "SAME" and None in out_hw else out_hw
    _, kh, kw, _ = ctx.tensor(w_k).shape
    if not all(isinstance(d, int) and d > 0 for d in in_hw + out_hw):
        raise UnsupportedOpError(f"{ctx.where}: input and output spatial sizes must be known at "
                                 f"conversion, found {in_hw} -> {out_hw}")
    pads, extra = [], []
    for size, want, k, s in zip(in_hw, out_hw, (kh, kw), strides, strict=True):
        full = (size - 1) * s + k
        total = max(full - want, 0) if padding == "SAME" else 0
        before = total // 2
        pads.append((before, total - before))
        extra.append(want - (full - total))
    if min(extra) < 0:
        raise UnsupportedOpError(f"{ctx.where}: output size {out_hw} is smaller than the "
                                 f"{padding} transposed convolution produces")
    inputs = [x, ctx.x(w_k, perm=(3, 0, 1, 2))] + ([ctx.x(bias_k)] if ctx.has(bias_k) else [])
    y = ctx.emit1("ConvTranspose", inputs, kernel_shape=(kh, kw), strides=strides,
                  pads=(pads[0][0], pads[1][0], pads[0][1], pads[1][1]), output_padding=tuple(extra))
    y = ctx.activation(y)
    ctx.emit1("Transpose", [y], ctx.out(), perm=NCHW_TO_NHWC)


@rule("FULLY_CONNECTED", options="FullyConnectedOptions")
def fully_connected(ctx: OpContext) -> None:
    if ctx.opt("weights_format") != 0:
        raise UnsupportedOpError(f"{ctx.where}: shuffled weight formats are not supported")
    out_units, in_units = ctx.tensor(1).shape
    if _int8_fully_connected(ctx, in_units):
        return
    x = ctx.x(0)
    in_shape = ctx.shape(0)
    bias = [ctx.x(2)] if ctx.has(2) else []
    if len(in_shape) == 2 or not ctx.opt("keep_num_dims"):
        if len(in_shape) != 2:
            x = ctx.emit1("Reshape", [x, ctx.constant([-1, in_units], "fc_shape")])
        ctx.emit_fused("Gemm", [x, ctx.x(1)] + bias, transB=1)
    elif bias:
        ctx.emit_fused("Add", [ctx.emit1("MatMul", [x, ctx.x(1, perm=(1, 0))])] + bias)
    else:
        ctx.emit_fused("MatMul", [x, ctx.x(1, perm=(1, 0))])


def _int8_fully_connected(ctx: OpContext, in_units: int) -> bool:
    """Full-integer FULLY_CONNECTED as ``edgeinfer::TFLiteFullyConnected`` (int8 weights per
    tensor or per unit, int32 bias); False where the QDQ import applies instead."""
    bias_ok = not ctx.has(2) or (ctx.tensor(2).dtype == "int32" and ctx.const(2) is not None)
    clip = ctx.int8_clip_range()
    if not (ctx.int8_tensors((0, 1), per_channel=(1,)) and ctx.const(1) is not None and bias_ok and clip):
        return False
    x, *x_params = ctx.qlinear(0)
    if len(ctx.shape(0)) != 2 and not ctx.opt("keep_num_dims"):
        x = ctx.emit1("Reshape", [x, ctx.constant(np.array([-1, in_units], np.int64), "fc_shape")])
    inputs = [x, *x_params, *ctx.qlinear(1), *ctx.out_qlinear()] + ([ctx.raw(2)] if ctx.has(2) else [])
    ctx.emit_int8("TFLiteFullyConnected", inputs, clip_min=clip[0], clip_max=clip[1])
    return True
