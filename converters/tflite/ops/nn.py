"""Pooling, softmax, matmul, resize and space/depth rearrangements."""

from __future__ import annotations

import numpy as np

from edgeinfer.converters.tflite.importer import NCHW_TO_NHWC, NHWC_TO_NCHW, OpContext, rule
from edgeinfer.converters.tflite.ops.conv import window_attrs
from edgeinfer.errors import UnsupportedOpError


def _pool(ctx: OpContext, op_type: str, **extra) -> None:
    kernel = (ctx.opt("filter_height"), ctx.opt("filter_width"))
    strides = (ctx.opt("stride_h"), ctx.opt("stride_w"))
    if min(kernel) < 1 or min(strides) < 1:
        raise UnsupportedOpError(f"{ctx.where}: expected positive filter size and strides, found "
                                 f"{kernel} and {strides}")
    attrs = window_attrs(ctx, ctx.shape(0)[1:3], kernel, strides)
    y = ctx.emit1(op_type, [ctx.x(0, perm=NHWC_TO_NCHW)], kernel_shape=kernel, strides=strides,
                  **attrs, **extra)
    ctx.emit1("Transpose", [ctx.activation(y)], ctx.out(), perm=NCHW_TO_NHWC)


@rule("MAX_POOL_2D", options="Pool2DOptions")
def max_pool(ctx: OpContext) -> None:
    _pool(ctx, "MaxPool")


@rule("AVERAGE_POOL_2D", options="Pool2DOptions")
def average_pool(ctx: OpContext) -> None:
    # TF's SAME average pooling divides by the number of real (unpadded) pixels.
    _pool(ctx, "AveragePool", count_include_pad=0)


@rule("SOFTMAX", options="SoftmaxOptions")
def softmax(ctx: OpContext) -> None:
    if ctx.int8_tensors((0,)):
        ctx.emit_int8("TFLiteSoftmax", [*ctx.qlinear(0), *ctx.out_qlinear()], beta=float(ctx.opt("beta")))
        return
    x, beta = ctx.x(0), float(ctx.opt("beta"))
    if beta != 1.0:
        x = ctx.emit1("Mul", [x, ctx.constant(np.float32(beta), "softmax_beta")])
    ctx.emit1("Softmax", [x], ctx.out(), axis=-1)


@rule("LOG_SOFTMAX")
def log_softmax(ctx: OpContext) -> None:
    ctx.emit1("LogSoftmax", [ctx.x(0)], ctx.out(), axis=-1)


@rule("BATCH_MATMUL", options="BatchMatMulOptions")
def batch_matmul(ctx: OpContext) -> None:
    if ctx.int8_tensors((0, 1)):
        operands = []
        for k, adjoint in ((0, ctx.opt("adj_x")), (1, ctx.opt("adj_y"))):
            raw, *params = ctx.qlinear(k)
            if adjoint:
                rank = len(ctx.tensor(k).shape)
                raw = ctx.emit1("Transpose", [raw], perm=tuple(range(rank - 2)) + (rank - 1, rank - 2))
            operands += [raw, *params]
        ctx.emit_int8("TFLiteBatchMatMul", operands + ctx.out_qlinear())
        return
    operands = []
    for k, adjoint in ((0, ctx.opt("adj_x")), (1, ctx.opt("adj_y"))):
        if adjoint:
            rank = len(ctx.tensor(k).shape)
            perm = tuple(range(rank - 2)) + (rank - 1, rank - 2)
            operands.append(ctx.x(k, perm=perm))
        else:
            operands.append(ctx.x(k))
    ctx.emit1("MatMul", operands, ctx.out())


def _resize(ctx: OpContext, mode: str, coordinates: str, **extra) -> None:
    x = ctx.x(0, perm=NHWC_TO_NCHW)
    size = ctx.const(1)
    n, _, _, c = ctx.shape(0)
    if size is not None and n is not None and c is not None:
        sizes = ctx.constant(np.array([n, c, int(size[0]), int(size[1])], np.int64), "resize_sizes")
    else:
        head = ctx.emit1("Slice", [ctx.emit1("Shape", [x]), ctx.constant(np.array([0], np.int64), "s0"),
                                   ctx.constant(np.array([2], np.int64), "s2")])
        sizes = ctx.emit1("Concat", [head, ctx.int64(1)], axis=0)
    y = ctx.emit1("Resize", [x, "", "", sizes], mode=mode, coordinate_transformation_mode=coordinates, **extra)
    ctx.emit1("Transpose", [y], ctx.out(), perm=NCHW_TO_NHWC)


@rule("RESIZE_BILINEAR", options="ResizeBilinearOptions")
def resize_bilinear(ctx: OpContext) -> None:
    coordinates = ("align_corners" if ctx.opt("align_corners")
                   else "half_pixel" if ctx.opt("half_pixel_centers") else "asymmetric")
    _resize(ctx, "linear", coordinates)


@rule("RESIZE_NEAREST_NEIGHBOR", options="ResizeNearestNeighborOptions")
def resize_nearest(ctx: OpContext) -> None:
    if ctx.opt("align_corners"):
        _resize(ctx, "nearest", "align_corners", nearest_mode="round_prefer_ceil")
    elif ctx.opt("half_pixel_centers"):
        _resize(ctx, "nearest", "tf_half_pixel_for_nn", nearest_mode="floor")
    else:
        _resize(ctx, "nearest", "asymmetric", nearest_mode="floor")



@rule("DEPTH_TO_SPACE")
def depth_to_space(ctx: OpContext) -> None:
    _space_depth(ctx, "DepthToSpace", mode="DCR")


@rule("SPACE_TO_DEPTH")
def space_to_depth(ctx: OpContext) -> None:
    _space_depth(ctx, "SpaceToDepth")


def _space_depth(ctx: OpContext, op_type: str, **extra) -> None:
    # The block size is the only field of Depth/SpaceToDepthOptions; derive it from the shapes
    # instead so no options table is needed.
    in_h, out_h = ctx.shape(0)[1], ctx.out_shape()[1]
    if in_h is None or out_h is None or not in_h or not out_h:
        raise UnsupportedOpError(f"{ctx.where}: the spatial dims must be static")
    block = out_h // in_h if op_type == "DepthToSpace" else in_h // out_h
    y = ctx.emit1(op_type, [ctx.x(0, perm=NHWC_TO_NCHW)], blocksize=block, **extra)
    ctx.emit1("Transpose", [y], ctx.out(), perm=NCHW_TO_NHWC)


@rule("PRELU")
def prelu(ctx: OpContext) -> None:
    ctx.emit1("PRelu", [ctx.x(0), ctx.x(1)], ctx.out())


@rule("LEAKY_RELU", options="LeakyReluOptions")
def leaky_relu(ctx: OpContext) -> None:
    ctx.emit1("LeakyRelu", [ctx.x(0)], ctx.out(), alpha=float(ctx.opt("alpha")))


@rule("GELU", options="GeluOptions")
def gelu(ctx: OpContext) -> None:
    x = ctx.x(0)
    half = ctx.constant(np.float32(0.5), "half")
    one = ctx.constant(np.float32(1.0), "one")
    if ctx.opt("approximate"):
        cube = ctx.emit1("Mul", [ctx.emit1("Mul", [x, x]), x])
        inner = ctx.emit1("Add", [x, ctx.emit1("Mul", [cube, ctx.constant(np.float32(0.044715), "gelu_c")])])
        inner = ctx.emit1("Mul", [inner, ctx.constant(np.float32(np.sqrt(2 / np.pi)), "gelu_k")])
        gate = ctx.emit1("Tanh", [inner])
    else:
        gate = ctx.emit1("Erf", [ctx.emit1("Mul", [x, ctx.constant(np.float32(1 / np.sqrt(2)), "gelu_r")])])
    gate = ctx.emit1("Mul", [ctx.emit1("Add", [gate, one]), half])
    ctx.emit1("Mul", [x, gate], ctx.out())
