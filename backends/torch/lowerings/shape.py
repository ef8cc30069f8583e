"""Shape ops: Reshape, Transpose, Squeeze, Unsqueeze, Flatten, Expand, Shape, Size, Identity,
DepthToSpace, SpaceToDepth. ``Shape`` and ``Size`` return host (CPU) tensors: their results
feed shape arithmetic, read without a device sync (see ``compiler``)."""

from __future__ import annotations

import math

import torch

from edgeinfer.backends.torch.registry import axis_of, ints, lowering


@lowering("Reshape", since=5, static=(1,))
def reshape(data, shape, *, allowzero=0):
    dims = ints(shape)
    if not allowzero:
        dims = [data.shape[i] if d == 0 else d for i, d in enumerate(dims)]
    return data.reshape(dims)


@lowering("Transpose", since=1)
def transpose(data, *, perm=None):
    return data.permute(list(perm) if perm is not None else list(reversed(range(data.dim()))))


def _squeeze(data, axes):
    if not axes:
        return data.reshape([d for d in data.shape if d != 1])
    axes = {axis_of(a, data.dim()) for a in axes}
    return data.reshape([d for i, d in enumerate(data.shape) if i not in axes])


@lowering("Squeeze", since=1)
def squeeze_attribute(data, *, axes=None):
    return _squeeze(data, list(axes or []))


@lowering("Squeeze", since=13, static=(1,))
def squeeze(data, axes=None):
    return _squeeze(data, ints(axes))


def _unsqueeze(data, axes):
    rank = data.dim() + len(axes)
    axes = sorted(axis_of(a, rank) for a in axes)
    shape = list(data.shape)
    for axis in axes:
        shape.insert(axis, 1)
    return data.reshape(shape)


@lowering("Unsqueeze", since=1)
def unsqueeze_attribute(data, *, axes):
    return _unsqueeze(data, list(axes))


@lowering("Unsqueeze", since=13, static=(1,))
def unsqueeze(data, axes):
    return _unsqueeze(data, ints(axes))


@lowering("Flatten", since=1)
def flatten(data, *, axis=1):
    axis = axis_of(axis, data.dim())
    return data.reshape(math.prod(data.shape[:axis]), math.prod(data.shape[axis:]))


@lowering("Expand", since=8, static=(1,))
def expand(data, shape):
    target = torch.broadcast_shapes(tuple(data.shape), tuple(ints(shape)))
    return data.expand(target)  # a broadcast view: lowerings never write into their inputs


@lowering("Shape", since=1)
def shape_of(data, *, start=0, end=None):
    dims = list(data.shape)
    rank = len(dims)
    first = max(0, min(rank, start + rank if start < 0 else start))
    last = rank if end is None else max(0, min(rank, end + rank if end < 0 else end))
    return torch.tensor(dims[first:last], dtype=torch.int64)


@lowering("Size", since=1)
def size_of(data):
    return torch.tensor(data.numel(), dtype=torch.int64)


@lowering("Identity", since=1)
def identity(data):
    return data


@lowering("DepthToSpace", since=1)
def depth_to_space(x, *, blocksize, mode="DCR"):
    n, c, h, w = x.shape
    b = blocksize
    if mode == "DCR":
        y = x.reshape(n, b, b, c // (b * b), h, w).permute(0, 3, 4, 1, 5, 2)
    else:
        y = x.reshape(n, c // (b * b), b, b, h, w).permute(0, 1, 4, 2, 5, 3)
    return y.reshape(n, c // (b * b), h * b, w * b)


@lowering("SpaceToDepth", since=1)
def space_to_depth(x, *, blocksize, mode="DCR"):
    n, c, h, w = x.shape
    b = blocksize
    y = x.reshape(n, c, h // b, b, w // b, b)
    y = y.permute(0, 3, 5, 1, 2, 4) if mode == "DCR" else y.permute(0, 1, 3, 5, 2, 4)
    return y.reshape(n, c * b * b, h // b, w // b)
