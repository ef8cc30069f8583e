"""Shape manipulation: reshape, slicing, packing, gathering, padding and friends.

Shape-like inputs are int32 in TFLite and int64 in ONNX; constants are converted here and
run-time values get a ``Cast``. ``SHAPE`` keeps TFLite's int32 (or int64) result so the
surrounding integer arithmetic sees the types the model was built with.
"""

from __future__ import annotations

import numpy as np

from edgeinfer.converters.tflite.importer import OpContext, rule
from edgeinfer.errors import UnsupportedOpError
from edgeinfer.ir import dtypes

INT64_MAX = np.iinfo(np.int64).max
INT64_MIN = np.iinfo(np.int64).min


def _i64(ctx: OpContext, values, hint: str) -> str:
    return ctx.constant(np.asarray(values, np.int64).reshape(-1), hint)


@rule("RESHAPE", options="ReshapeOptions")
def reshape(ctx: OpContext) -> None:
    out_dims = ctx.out_shape()
    if ctx.has(1) and ctx.const(1) is None:
        shape = ctx.int64(1)
    elif ctx.has(1) and ctx.const(1).ndim <= 1:
        shape = _i64(ctx, ctx.const(1), "reshape_shape")
    elif ctx.opt("new_shape") is not None:
        shape = _i64(ctx, ctx.opt("new_shape"), "reshape_shape")
    elif all(d is not None for d in out_dims):
        shape = _i64(ctx, out_dims, "reshape_shape")
    else:
        raise UnsupportedOpError(f"{ctx.where}: no target shape (neither a shape input nor new_shape)")
    ctx.emit1("Reshape", [ctx.x(0), shape], ctx.out())


@rule("SHAPE", options="ShapeOptions")
def shape(ctx: OpContext) -> None:
    out_dtype = ctx.out_tensor().dtype
    if out_dtype == "int64":
        ctx.emit1("Shape", [ctx.x(0)], ctx.out())
    else:
        ctx.emit1("Cast", [ctx.emit1("Shape", [ctx.x(0)])], ctx.out(), to=dtypes.to_onnx(out_dtype))


@rule("TRANSPOSE")
def transpose(ctx: OpContext) -> None:
    perm = tuple(int(p) for p in ctx.const_required(1, "perm"))
    ctx.emit1("Transpose", [ctx.x(0)], ctx.out(), perm=perm)


@rule("EXPAND_DIMS")
def expand_dims(ctx: OpContext) -> None:
    axis = int(np.asarray(ctx.const_required(1, "axis")).reshape(-1)[0])
    rank = len(ctx.tensor(0).shape)
    axis = axis + rank + 1 if axis < 0 else axis
    ctx.emit1("Unsqueeze", [ctx.x(0), _i64(ctx, [axis], "unsqueeze_axes")], ctx.out())


@rule("SQUEEZE", options="SqueezeOptions")
def squeeze(ctx: OpContext) -> None:
    dims = ctx.opt("squeeze_dims")
    if dims:
        ctx.emit1("Squeeze", [ctx.x(0), _i64(ctx, dims, "squeeze_axes")], ctx.out())
    else:
        static = ctx.shape(0)
        axes = [i for i, d in enumerate(static) if d == 1]
        if any(d is None for d in static):
            raise UnsupportedOpError(f"{ctx.where}: SQUEEZE without squeeze_dims needs a static input shape")
        ctx.emit1("Squeeze", [ctx.x(0), _i64(ctx, axes, "squeeze_axes")], ctx.out())


@rule("CONCATENATION", options="ConcatenationOptions")
def concatenation(ctx: OpContext) -> None:
    ctx.emit_fused("Concat", [ctx.x(k) for k in range(ctx.num_inputs)], axis=int(ctx.opt("axis")))


@rule("PACK", options="PackOptions")
def pack(ctx: OpContext) -> None:
    rank = len(ctx.tensor(0).shape)
    axis = int(ctx.opt("axis"))
    axis = axis + rank + 1 if axis < 0 else axis
    axes = _i64(ctx, [axis], "pack_axis")
    parts = [ctx.emit1("Unsqueeze", [ctx.x(k), axes]) for k in range(ctx.num_inputs)]
    ctx.emit1("Concat", parts, ctx.out(), axis=axis)


@rule("UNPACK", options="UnpackOptions")
def unpack(ctx: OpContext) -> None:
    count = len(ctx.op.outputs)
    axis = int(ctx.opt("axis"))
    axis = axis + len(ctx.tensor(0).shape) if axis < 0 else axis
    parts = ctx.emit("Split", [ctx.x(0), _i64(ctx, [1] * count, "unpack_split")], count, axis=axis)
    axes = _i64(ctx, [axis], "unpack_axis")
    for k, part in enumerate(parts):
        ctx.emit1("Squeeze", [part, axes], ctx.out(k))


@rule("SPLIT", options="SplitOptions")
def split(ctx: OpContext) -> None:
    axis = int(np.asarray(ctx.const_required(0, "axis")).reshape(-1)[0])
    count = len(ctx.op.outputs)
    ctx.emit("Split", [ctx.x(1)], [ctx.out(k) for k in range(count)], axis=axis)


@rule("SPLIT_V", options="SplitVOptions")
def split_v(ctx: OpContext) -> None:
    sizes = [int(s) for s in ctx.const_required(1, "size_splits")]
    axis = int(np.asarray(ctx.const_required(2, "axis")).reshape(-1)[0])
    if -1 in sizes:
        dim = ctx.shape(0)[axis]
        if dim is None:
            raise UnsupportedOpError(f"{ctx.where}: a -1 split size needs a static dim {axis}")
        sizes[sizes.index(-1)] = dim - (sum(sizes) + 1)
    ctx.emit("Split", [ctx.x(0), _i64(ctx, sizes, "split_sizes")],
             [ctx.out(k) for k in range(len(sizes))], axis=axis)


@rule("GATHER", options="GatherOptions")
def gather(ctx: OpContext) -> None:
    if ctx.opt("batch_dims"):
        raise UnsupportedOpError(f"{ctx.where}: batch_dims={ctx.opt('batch_dims')} is not supported")
    ctx.emit1("Gather", [ctx.x(0), ctx.x(1)], ctx.out(), axis=int(ctx.opt("axis")))


@rule("GATHER_ND")
def gather_nd(ctx: OpContext) -> None:
    ctx.emit1("GatherND", [ctx.x(0), ctx.int64(1)], ctx.out())


@rule("TILE")
def tile(ctx: OpContext) -> None:
    ctx.emit1("Tile", [ctx.x(0), ctx.int64(1)], ctx.out())


@rule("BROADCAST_TO")
def broadcast_to(ctx: OpContext) -> None:
    ctx.emit1("Expand", [ctx.x(0), ctx.int64(1)], ctx.out())


@rule("FILL")
def fill(ctx: OpContext) -> None:
    value = ctx.const(1)
    if value is not None and ctx.tensor(1).quant is None:
        ctx.emit1("ConstantOfShape", [ctx.int64(0)], ctx.out(), value=np.asarray(value).reshape(1))
    else:
        ctx.emit1("Expand", [ctx.x(1), ctx.int64(0)], ctx.out())


@rule("ZEROS_LIKE")
def zeros_like(ctx: OpContext) -> None:
    x = ctx.x(0)
    zero = np.zeros(1, ctx.tensor(0).dtype if ctx.tensor(0).quant is None else np.float32)
    ctx.emit1("ConstantOfShape", [ctx.emit1("Shape", [x])], ctx.out(), value=zero)


@rule("RANGE")
def range_(ctx: OpContext) -> None:
    ctx.emit1("Range", [ctx.x(0), ctx.x(1), ctx.x(2)], ctx.out())


@rule("CAST", options="CastOptions")
def cast(ctx: OpContext) -> None:
    ctx.emit1("Cast", [ctx.x(0)], ctx.out(), to=dtypes.to_onnx(ctx.out_tensor().dtype))


@rule("SLICE")
def slice_(ctx: OpContext) -> None:
    begin, size = ctx.const(1), ctx.const(2)
    if begin is not None and size is not None:
        begin = begin.astype(np.int64)
        end = np.where(size == -1, INT64_MAX, begin + size.astype(np.int64))
        starts, ends = _i64(ctx, begin, "slice_begin"), _i64(ctx, end, "slice_end")
    else:
        starts, size64 = ctx.int64(1), ctx.int64(2)
        minus_one = ctx.constant(np.int64(-1), "minus_one")
        ends = ctx.emit1("Where", [ctx.emit1("Equal", [size64, minus_one]),
                                   ctx.constant(np.int64(INT64_MAX), "int64_max"),
                                   ctx.emit1("Add", [starts, size64])])
    ctx.emit1("Slice", [ctx.x(0), starts, ends], ctx.out())


@rule("STRIDED_SLICE", options="StridedSliceOptions")
def strided_slice(ctx: OpContext) -> None:
    if ctx.opt("ellipsis_mask") or ctx.opt("new_axis_mask"):
        raise UnsupportedOpError(f"{ctx.where}: ellipsis_mask and new_axis_mask are not supported")
    strides = ctx.const_required(3, "strides").astype(np.int64)
    begin, end = ctx.const(1), ctx.const(2)
    count = strides.size
    begin_mask, end_mask, shrink = ctx.opt("begin_mask"), ctx.opt("end_mask"), ctx.opt("shrink_axis_mask")
    shrunk = [i for i in range(count) if shrink >> i & 1]
    if begin is not None and end is not None:
        starts, ends = [], []
        for i in range(count):
            b, e, s = int(begin[i]), int(end[i]), int(strides[i])
            if ctx.opt("offset"):
                e = b + e
            if begin_mask >> i & 1:
                b = 0 if s > 0 else INT64_MAX
            if end_mask >> i & 1:
                e = INT64_MAX if s > 0 else INT64_MIN
            if shrink >> i & 1:
                e, s = (INT64_MAX if b == -1 else b + 1), 1
                strides[i] = 1
            starts.append(b)
            ends.append(e)
        starts_name, ends_name = _i64(ctx, starts, "ss_begin"), _i64(ctx, ends, "ss_end")
    elif begin_mask == 0 and end_mask == 0 and not ctx.opt("offset"):
        starts_name = ctx.int64(1)
        ends_name = ctx.int64(2)
        if shrunk:
            # Run-time begin with shrink: end = begin + 1 on the shrunk axes.
            one_hot = np.zeros(count, np.int64)
            one_hot[shrunk] = 1
            keep = ctx.emit1("Mul", [ends_name, ctx.constant(1 - one_hot, "ss_keep")])
            bumped = ctx.emit1("Mul", [ctx.emit1("Add", [starts_name, ctx.constant(one_hot, "ss_one")]),
                                       ctx.constant(one_hot, "ss_mask")])
            ends_name = ctx.emit1("Add", [keep, bumped])
            strides[shrunk] = 1
    else:
        raise UnsupportedOpError(f"{ctx.where}: run-time begin/end with begin_mask/end_mask/offset")
    axes = _i64(ctx, range(count), "ss_axes")
    y = ctx.emit1("Slice", [ctx.x(0), starts_name, ends_name, axes, _i64(ctx, strides, "ss_steps")],
                  None if shrunk else ctx.out())
    if shrunk:
        ctx.emit1("Squeeze", [y, _i64(ctx, shrunk, "ss_shrink")], ctx.out())


def _pads(ctx: OpContext) -> str:
    paddings = ctx.const(1)
    if paddings is not None:
        return _i64(ctx, paddings.astype(np.int64).T.reshape(-1), "pads")
    flat = ctx.emit1("Reshape", [ctx.emit1("Transpose", [ctx.int64(1)], perm=(1, 0)),
                                 _i64(ctx, [-1], "flat")])
    return flat


@rule(("PAD", "PADV2"))
def pad(ctx: OpContext) -> None:
    inputs = [ctx.x(0), _pads(ctx)]
    if ctx.has(2):
        inputs.append(ctx.x(2))
    ctx.emit1("Pad", inputs, ctx.out(), mode="constant")


@rule("MIRROR_PAD", options="MirrorPadOptions")
def mirror_pad(ctx: OpContext) -> None:
    if ctx.opt("mode") != 0:
        raise UnsupportedOpError(f"{ctx.where}: SYMMETRIC mirror padding has no ONNX equivalent")
    ctx.emit1("Pad", [ctx.x(0), _pads(ctx)], ctx.out(), mode="reflect")
