"""Layers that combine, split or rearrange blobs: Eltwise, Concat, Slice, Split, Flatten,
Reshape, Permute, Softmax, Crop, Tile and Silence.

Shapes in Caffe nets are static, so Flatten/Reshape emit a Reshape to a constant shape
computed here with Caffe's rules (Reshape: ``0`` copies the input dim at that position,
``-1`` is inferred, ``axis``/``num_axes`` select the replaced range; a negative ``axis``
counts from the end *after* the last axis, so ``-1`` appends).
"""

from __future__ import annotations

import numpy as np

from edgeinfer.converters.caffe.builder import LayerContext, layer
from edgeinfer.converters.caffe.layers.dense import normalize_axis


@layer("Eltwise")
def eltwise(ctx: LayerContext) -> None:
    ctx.expect_tops(1)
    if len(ctx.inputs) < 2:
        raise ctx.invalid(f"expected at least 2 bottoms, found {len(ctx.inputs)}")
    param = ctx.param("eltwise_param")
    operation = param.EltwiseOp.Name(param.operation)
    coeffs = [float(c) for c in param.coeff]
    if coeffs and (operation != "SUM" or len(coeffs) != len(ctx.inputs)):
        raise ctx.invalid(f"expected one coeff per bottom ({len(ctx.inputs)}) and operation SUM, found "
                          f"{len(coeffs)} coeff(s) with {operation}")
    shapes = {ctx.shape(i) for i in range(len(ctx.inputs))}
    if len(shapes) != 1:
        raise ctx.invalid(f"expected bottoms of one shape, found {sorted(shapes)}")
    if operation == "PROD":
        value = ctx.inputs[0]
        for index, other in enumerate(ctx.inputs[1:], start=2):
            value = ctx.node("Mul", [value, other], top=0 if index == len(ctx.inputs) else None)
        return
    if operation == "MAX":
        ctx.node("Max", ctx.inputs, top=0)
        return
    terms = [value if c == 1.0 else ctx.node("Mul", [value, ctx.const(c, f"coeff{i}")], suffix=f"coeff{i}")
             for i, (value, c) in enumerate(zip(ctx.inputs, coeffs or [1.0] * len(ctx.inputs), strict=True))]
    ctx.node("Add" if len(terms) == 2 else "Sum", terms, top=0)


@layer("Concat")
def concat(ctx: LayerContext) -> None:
    ctx.expect_tops(1)
    param = ctx.param("concat_param")
    axis = param.concat_dim if param.HasField("concat_dim") else param.axis
    rank = len(ctx.shape())
    if len(ctx.inputs) == 1:
        ctx.identity(ctx.inputs[0])
        return
    ctx.node("Concat", ctx.inputs, {"axis": normalize_axis(ctx, axis, rank)}, top=0)


@layer("Slice")
def slice_(ctx: LayerContext) -> None:
    ctx.expect_bottoms(1)
    param = ctx.param("slice_param")
    shape = ctx.shape()
    axis = normalize_axis(ctx, param.slice_dim if param.HasField("slice_dim") else param.axis, len(shape))
    ctx.batch_axis_untouched(axis, "Slice")
    count, dim = len(ctx.spec.tops), shape[axis]
    points = [int(p) for p in param.slice_point]
    if points:
        if len(points) != count - 1 or points != sorted(points) or points[-1] >= dim or points[0] <= 0:
            raise ctx.invalid(f"expected {count - 1} increasing slice_point(s) inside (0, {dim}), found {points}")
        bounds = [0, *points, dim]
        sizes = [b - a for a, b in zip(bounds, bounds[1:], strict=False)]
    else:
        if dim % count:
            raise ctx.invalid(f"axis {axis} of size {dim} does not split evenly into {count} tops")
        sizes = [dim // count] * count
    if count == 1:
        ctx.identity(ctx.inputs[0])
        return
    ctx.node("Split", [ctx.inputs[0], ctx.ints(sizes, "split")], {"axis": axis}, tops=range(count))


@layer("Split")
def split(ctx: LayerContext) -> None:
    ctx.expect_bottoms(1)
    for index in range(len(ctx.spec.tops)):
        ctx.identity(ctx.inputs[0], index)


def _reshape_to(ctx: LayerContext, shape: list[int]) -> None:
    ctx.reshape(ctx.inputs[0], shape, top=0)


@layer("Flatten")
def flatten(ctx: LayerContext) -> None:
    ctx.expect_bottoms(1)
    ctx.expect_tops(1)
    param = ctx.param("flatten_param")
    shape = list(ctx.shape())
    start = normalize_axis(ctx, param.axis, len(shape))
    end = normalize_axis(ctx, param.end_axis, len(shape), "end_axis")
    if end < start:
        raise ctx.invalid(f"end_axis {param.end_axis} comes before axis {param.axis}")
    _reshape_to(ctx, shape[:start] + [int(np.prod(shape[start:end + 1]))] + shape[end + 1:])


@layer("Reshape")
def reshape(ctx: LayerContext) -> None:
    ctx.expect_bottoms(1)
    ctx.expect_tops(1)
    param = ctx.param("reshape_param")
    shape = list(ctx.shape())
    rank = len(shape)
    start = param.axis if param.axis >= 0 else rank + param.axis + 1
    end = rank if param.num_axes == -1 else start + param.num_axes
    if not 0 <= start <= rank or not start <= end <= rank:
        raise ctx.invalid(f"axis {param.axis} / num_axes {param.num_axes} out of range for rank {rank}")
    dims = [int(d) for d in param.shape.dim]
    if dims.count(-1) > 1:
        raise ctx.invalid(f"expected at most one -1 in shape {dims}")
    middle = []
    for i, dim in enumerate(dims):
        if dim == 0:
            if start + i >= rank:
                raise ctx.invalid(f"shape {dims}: dim {i} copies input axis {start + i}, input has rank {rank}")
            dim = shape[start + i]
        elif dim < -1:
            raise ctx.invalid(f"shape {dims} has invalid dim {dim}")
        middle.append(dim)
    total = int(np.prod(shape))
    if -1 in middle:
        known = int(np.prod([d for d in middle if d != -1])) * int(np.prod(shape[:start] + shape[end:]))
        if known == 0 or total % known:
            raise ctx.invalid(f"cannot infer -1 in shape {dims} for an input of shape {shape}")
        middle[middle.index(-1)] = total // known
    result = shape[:start] + middle + shape[end:]
    if int(np.prod(result)) != total:
        raise ctx.invalid(f"shape {dims} gives {result} with {int(np.prod(result))} values; input {shape} "
                          f"has {total}")
    _reshape_to(ctx, result)


@layer("Permute")
def permute(ctx: LayerContext) -> None:
    ctx.expect_bottoms(1)
    ctx.expect_tops(1)
    rank = len(ctx.shape())
    order = [int(o) for o in ctx.param("permute_param").order]
    if len(set(order)) != len(order) or any(o >= rank for o in order):
        raise ctx.invalid(f"order {order} is not a permutation of axes of a rank-{rank} input")
    order += [axis for axis in range(rank) if axis not in order]
    if order == list(range(rank)):
        ctx.identity(ctx.inputs[0])
        return
    ctx.node("Transpose", ctx.inputs, {"perm": tuple(order)}, top=0)


@layer("Softmax")
def softmax(ctx: LayerContext) -> None:
    ctx.expect_bottoms(1)
    ctx.expect_tops(1)
    axis = normalize_axis(ctx, ctx.param("softmax_param").axis, len(ctx.shape()))
    ctx.node("Softmax", ctx.inputs, {"axis": axis}, top=0)


@layer("Crop")
def crop(ctx: LayerContext) -> None:
    ctx.expect_bottoms(2)
    ctx.expect_tops(1)
    param = ctx.param("crop_param")
    shape, reference = ctx.shape(0), ctx.shape(1)
    if len(shape) != len(reference):
        raise ctx.invalid(f"bottoms of different ranks: {list(shape)} and {list(reference)}")
    axis = normalize_axis(ctx, param.axis, len(shape))
    ctx.batch_axis_untouched(axis, "Crop")
    axes = list(range(axis, len(shape)))
    offsets = [int(o) for o in param.offset]
    if len(offsets) in (0, 1):
        offsets = (offsets or [0]) * len(axes)
    elif len(offsets) != len(axes):
        raise ctx.invalid(f"expected 0, 1 or {len(axes)} offsets, found {len(offsets)}")
    ends = [o + reference[a] for o, a in zip(offsets, axes, strict=True)]
    if any(end > shape[a] for end, a in zip(ends, axes, strict=True)):
        raise ctx.invalid(f"crop of {list(reference[axis:])} at offsets {offsets} exceeds input {list(shape)}")
    ctx.node("Slice", [ctx.inputs[0], ctx.ints(offsets, "starts"), ctx.ints(ends, "ends"), ctx.ints(axes, "axes")],
             top=0)


@layer("Tile")
def tile(ctx: LayerContext) -> None:
    ctx.expect_bottoms(1)
    ctx.expect_tops(1)
    param = ctx.param("tile_param")
    rank = len(ctx.shape())
    repeats = [1] * rank
    repeats[normalize_axis(ctx, param.axis, rank)] = int(param.tiles)
    ctx.node("Tile", [ctx.inputs[0], ctx.ints(repeats, "repeats")], top=0)


@layer("Silence")
def silence(ctx: LayerContext) -> None:
    ctx.expect_tops(0)
