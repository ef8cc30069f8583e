"""Reshape-like ops, concatenation, gather, slice, cast and Shape.

Reshapes run on the IR's own axis order (a reshape of an NHWC tensor reads it back in NCHW
first: the one place a layout change costs a TRANSPOSE). Concatenation and slicing work in
any order, with their axes mapped through it; Shape reads whichever order its input is held
in and gathers the dims back into the IR's order.
"""

from __future__ import annotations

import numpy as np

from edgeinfer.format.tflite.context import OpContext
from edgeinfer.format.tflite.export import ExportError, export_rule, identity, inverse
from edgeinfer.format.tflite.schema import TENSOR_TYPE_CODES
from edgeinfer.ir import Graph, Node

INT32_MAX = 2**31 - 1


def new_shape(shape: tuple) -> list[int]:
    """A RESHAPE target from the IR's inferred output shape (one unknown dim becomes -1)."""
    unknown = [i for i, d in enumerate(shape) if not isinstance(d, int)]
    if len(unknown) > 1:
        raise ExportError(f"the output shape {shape} has more than one dim unknown at export")
    return [d if isinstance(d, int) else -1 for d in shape]


def check_reshape(node: Node, graph: Graph) -> str | None:
    y = graph.values.get(node.outputs[0])
    if y is None or y.shape is None:
        return "the output shape must be known"
    if len([d for d in y.shape if not isinstance(d, int)]) > 1:
        return f"the output shape {y.shape} has more than one dim unknown at export"
    return None


@export_rule(("Reshape", "Flatten", "Squeeze", "Unsqueeze"), check=check_reshape, int8="same", int8_inputs=(0,))
def reshape(ctx: OpContext) -> None:
    shape = ctx.int32(new_shape(ctx.out_shape()), "shape")
    ctx.op("RESHAPE", [ctx.input(0), shape], [ctx.output(0)], version=1)


def check_concat(node: Node, graph: Graph) -> str | None:
    ranks = {graph.values[name].rank for name in node.inputs if name}
    if None in ranks or len(ranks) != 1:
        return "all inputs must have the same known rank"
    return None


@export_rule("Concat", check=check_concat, int8="any")
def concat(ctx: OpContext) -> None:
    ks = [k for k in range(len(ctx.node.inputs)) if ctx.has(k)]
    perm = ctx.layout(*ks)
    axis = perm.index(int(ctx.attrs["axis"]) % len(perm))
    inputs = [ctx.input(k, perm) for k in ks]
    if ctx.int8:  # TFLite's int8 kernel needs every input on the output's scale
        wanted = ctx.out_quant()
        for index, k in enumerate(ks):
            if not ctx.quant(k).same(wanted):
                requantized = ctx.temp(tuple(ctx.shape(k)[a] for a in perm), f"requant{k}", quant=wanted)
                ctx.op("QUANTIZE", [inputs[index]], [requantized], version=2)
                inputs[index] = requantized
    ctx.op("CONCATENATION", inputs, [ctx.output(0, perm)], options="ConcatenationOptions", axis=axis,
           fused_activation_function=0)


def check_gather(node: Node, graph: Graph) -> str | None:
    data, indices = graph.values.get(node.inputs[0]), graph.values.get(node.inputs[1])
    if data is None or data.rank is None or indices is None or indices.rank is None:
        return "data and indices ranks must be known"
    if indices.const is not None:
        axis = int(node.attrs.get("axis", 0)) % data.rank
        size = data.shape[axis]
        if (indices.const < 0).any() and not isinstance(size, int):
            return "negative indices into a dynamic dim cannot be resolved at export"
    return None


@export_rule("Gather", check=check_gather, int8="same", int8_inputs=(0,))
def gather(ctx: OpContext) -> None:
    axis = int(ctx.attrs.get("axis", 0)) % ctx.rank(0)
    indices = ctx.const(1)
    if indices is not None:
        size = ctx.shape(0)[axis]
        indices = np.where(indices < 0, indices + (size if isinstance(size, int) else 0), indices)
        index_tensor = ctx.constant(indices.astype(np.int32), "indices")
    else:
        index_tensor = ctx.float_input(1)
    ctx.op("GATHER", [ctx.input(0), index_tensor], [ctx.output(0)], options="GatherOptions", axis=axis,
           batch_dims=0)


def check_slice(node: Node, graph: Graph) -> str | None:
    if graph.values[node.inputs[0]].rank is None:
        return "the input rank must be known"
    if any(graph.values[name].const is None for name in node.inputs[1:] if name):
        return "starts, ends, axes and steps must be constants"
    if "starts" in node.attrs:
        return "Slice before opset 10 (attributes) is not exported"
    return None


def _clamp(value: int) -> int:
    return max(-INT32_MAX, min(INT32_MAX, value))


@export_rule("Slice", since=10, check=check_slice, int8="same", int8_inputs=(0,))
def slice_(ctx: OpContext) -> None:
    rank = ctx.rank(0)
    starts, ends = (ctx.const(k).reshape(-1).astype(np.int64) for k in (1, 2))
    axes = ctx.const(3).reshape(-1).astype(np.int64) % rank if ctx.has(3) else np.arange(len(starts))
    steps = ctx.const(4).reshape(-1).astype(np.int64) if ctx.has(4) else np.ones(len(starts), np.int64)
    perm = ctx.layout(0)
    begin, end, stride = [0] * rank, [0] * rank, [1] * rank
    begin_mask = end_mask = 0
    for position, axis in enumerate(perm):
        if axis not in axes:
            begin_mask |= 1 << position
            end_mask |= 1 << position
            continue
        index = list(axes).index(axis)
        step = int(steps[index])
        start, stop = int(starts[index]), int(ends[index])
        stride[position] = step
        begin[position] = _clamp(start)
        if (step > 0 and stop >= INT32_MAX) or (step < 0 and stop <= -INT32_MAX):
            end_mask |= 1 << position  # "to the end" (ONNX writes INT64_MAX / INT64_MIN)
        else:
            size = ctx.shape(0)[axis]
            if step < 0 and isinstance(size, int) and stop < -size:
                end_mask |= 1 << position
            end[position] = _clamp(stop)
    ctx.op("STRIDED_SLICE", [ctx.input(0, perm), ctx.int32(begin, "begin"), ctx.int32(end, "end"),
                             ctx.int32(stride, "strides")], [ctx.output(0, perm)], options="StridedSliceOptions",
           begin_mask=begin_mask, end_mask=end_mask)


def shape_range(rank: int, attrs) -> tuple[int, int]:
    """ONNX Shape's ``[start, end)`` (opset 15 attributes; negative counts from the end),
    clamped to ``[0, rank]``."""
    start = int(attrs.get("start", 0))
    end = int(attrs.get("end", rank))
    start = max(0, min(rank, start + rank if start < 0 else start))
    end = max(0, min(rank, end + rank if end < 0 else end))
    return start, end


def check_shape(node: Node, graph: Graph) -> str | None:
    x = graph.values.get(node.inputs[0])
    if x is None or x.rank is None:
        return "the input rank must be known"
    start, end = shape_range(x.rank, node.attrs)
    if end <= start:  # folded before export, unless it is a graph output
        return f"Shape of dims [{start}:{end}] of a rank-{x.rank} input is empty; TFLite computes no empty tensor"
    return None


@export_rule("Shape", check=check_shape)
def shape(ctx: OpContext) -> None:
    """SHAPE of the input in the axis order it is held in (a quantized input's int8 tensor, no
    DEQUANTIZE), then a GATHER of the IR's dims ``[start, end)`` where that order or the range
    differs from the whole IR shape. A Shape whose dims are static was folded before export
    (``fold_constants``)."""
    name, rank = ctx.name(0), ctx.rank(0)
    start, end = shape_range(rank, ctx.attrs)
    held = ctx.exp.perms(name)
    perm = identity(rank) if not held or identity(rank) in held else held[0]
    source = ctx.exp.tensor(name, perm, "raw")
    dtype = ctx.exp.dtype(ctx.node.outputs[0])
    positions = [inverse(perm)[axis] for axis in range(start, end)]
    options = {"options": "ShapeOptions", "out_type": TENSOR_TYPE_CODES[dtype]}
    if positions == list(range(rank)):
        ctx.op("SHAPE", [source], [ctx.output(0)], version=1, **options)
        return
    dims = ctx.temp((rank,), "dims", dtype=dtype)
    ctx.op("SHAPE", [source], [dims], version=1, **options)
    ctx.op("GATHER", [dims, ctx.int32(positions, "axes")], [ctx.output(0)], version=1, options="GatherOptions",
           axis=0, batch_dims=0)


@export_rule("Cast")
def cast(ctx: OpContext) -> None:
    perm = ctx.layout(0)
    source, target = ctx.dtype(0), ctx.exp.dtype(ctx.node.outputs[0])
    if source not in TENSOR_TYPE_CODES or target not in TENSOR_TYPE_CODES:
        raise ExportError(f"a cast from {source} to {target} has no TFLite tensor types")
    ctx.op("CAST", [ctx.float_input(0, perm)], [ctx.output(0, perm)], options="CastOptions",
           in_data_type=TENSOR_TYPE_CODES[source], out_data_type=TENSOR_TYPE_CODES[target])



def check_tile(node: Node, graph: Graph) -> str | None:
    repeats = graph.values.get(node.inputs[1])
    return None if repeats is not None and repeats.const is not None else "the repeats must be constant"


@export_rule("Tile", check=check_tile, int8="same", int8_inputs=(0,))
def tile(ctx: OpContext) -> None:
    perm = ctx.layout(0)
    repeats = ctx.const(1).reshape(-1)
    ctx.op("TILE", [ctx.input(0, perm), ctx.int32([int(repeats[a]) for a in perm], "multiples")],
           [ctx.output(0, perm)])


def check_expand(node: Node, graph: Graph) -> str | None:
    y = graph.values.get(node.outputs[0])
    if y is None or y.shape is None or not all(isinstance(d, int) for d in y.shape):
        return "Expand needs a static output shape"
    return None


@export_rule("Expand", check=check_expand, int8="same", int8_inputs=(0,))
def expand(ctx: OpContext) -> None:
    # LiteRT registers BROADCAST_TO from version 2 (version 1 was the old custom op): a version-1
    # opcode fails to load ("Didn't find op for builtin opcode 'BROADCAST_TO' version '1'")
    ctx.op("BROADCAST_TO", [ctx.input(0), ctx.int32(list(ctx.out_shape()), "shape")], [ctx.output(0)], version=2)


def split_sizes(node: Node, graph: Graph) -> list[int] | None:
    x = graph.values[node.inputs[0]]
    axis = int(node.attrs.get("axis", 0)) % x.rank
    if len(node.inputs) > 1 and node.inputs[1]:
        sizes = graph.values[node.inputs[1]].const
        return None if sizes is None else [int(s) for s in sizes.reshape(-1)]
    if "split" in node.attrs:
        return [int(s) for s in node.attrs["split"]]
    outputs = [graph.values.get(name) for name in node.outputs]
    if any(v is None or v.shape is None or not isinstance(v.shape[axis], int) for v in outputs):
        return None
    return [v.shape[axis] for v in outputs]


def check_split(node: Node, graph: Graph) -> str | None:
    x = graph.values.get(node.inputs[0])
    if x is None or x.rank is None:
        return "the input rank must be known"
    return None if split_sizes(node, graph) is not None else "the split sizes must be known at export"


@export_rule("Split", check=check_split)
def split(ctx: OpContext) -> None:
    perm = ctx.layout(0)
    axis = perm.index(int(ctx.attrs.get("axis", 0)) % ctx.rank(0))
    sizes = split_sizes(ctx.node, ctx.exp.graph)
    outputs = [ctx.output(k, perm) for k in range(len(ctx.node.outputs))]
    ctx.op("SPLIT_V", [ctx.input(0, perm), ctx.int32(sizes, "sizes"), ctx.constant(np.int32(axis), "axis")], outputs,
           options="SplitVOptions", num_splits=len(sizes))
