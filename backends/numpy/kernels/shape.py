"""Ops that change a tensor's shape but not its data: Reshape, Transpose, Squeeze, Unsqueeze,
Flatten, Expand, plus Shape, Size and Identity.

Reshape-like kernels return numpy views where numpy can make one (no copy); no kernel writes
into its inputs, so sharing memory with an input is safe.
"""

from __future__ import annotations

import math

import numpy as np

from edgeinfer.backends.numpy.kernels._general import int_list, normalize_axes
from edgeinfer.backends.numpy.registry import kernel


@kernel("Reshape", since=5)
def reshape(data, shape, *, allowzero=0):
    target = int_list(shape, "shape")
    if target.count(-1) > 1:
        raise ValueError(f"shape {target} has more than one -1")
    if any(d < -1 for d in target):
        raise ValueError(f"shape {target} has a dimension below -1")
    if not allowzero:
        if len(target) > data.ndim and any(d == 0 for d in target[data.ndim:]):
            raise ValueError(f"shape {target} copies dim(s) (0) beyond the input's rank {data.ndim}")
        target = [data.shape[i] if d == 0 else d for i, d in enumerate(target)]
    elif 0 in target and -1 in target:
        raise ValueError(f"shape {target}: with allowzero=1 a 0 dim and a -1 dim cannot both appear")
    try:
        return data.reshape(target)
    except ValueError:
        raise ValueError(f"cannot reshape a tensor of shape {list(data.shape)} ({data.size} elements) "
                         f"to {target}") from None


@kernel("Transpose", since=1)
def transpose(data, *, perm=None):
    if perm is None:
        return data.transpose()
    if sorted(perm) != list(range(data.ndim)):
        raise ValueError(f"perm {list(perm)} is not a permutation of the {data.ndim} axes")
    return data.transpose(perm)


@kernel("Squeeze", since=1)
def squeeze_attribute(data, *, axes=None):
    """Opsets 1-12: ``axes`` is an attribute."""
    return _squeeze(data, axes)


@kernel("Squeeze", since=13)
def squeeze(data, axes=None):
    return _squeeze(data, None if axes is None else int_list(axes, "axes"))


def _squeeze(data, axes):
    if axes is None:
        return data.reshape([d for d in data.shape if d != 1])
    axes = normalize_axes(axes, data.ndim)
    wrong = [a for a in axes if data.shape[a] != 1]
    if wrong:
        raise ValueError(f"cannot squeeze axes {wrong} of shape {list(data.shape)}: their size is not 1")
    return data.reshape([d for i, d in enumerate(data.shape) if i not in axes])


@kernel("Unsqueeze", since=1)
def unsqueeze_attribute(data, *, axes):
    """Opsets 1-12: ``axes`` is an attribute."""
    return _unsqueeze(data, axes)


@kernel("Unsqueeze", since=13)
def unsqueeze(data, axes):
    return _unsqueeze(data, int_list(axes, "axes"))


def _unsqueeze(data, axes):
    rank = data.ndim + len(axes)
    inserted = set(normalize_axes(axes, rank))
    dims = iter(data.shape)
    return data.reshape([1 if i in inserted else next(dims) for i in range(rank)])


@kernel("Flatten", since=1)
def flatten(data, *, axis=1):
    if not -data.ndim <= axis <= data.ndim:
        raise ValueError(f"axis {axis} is out of range for a rank-{data.ndim} tensor "
                         f"(expected {-data.ndim}..{data.ndim})")
    axis = axis + data.ndim if axis < 0 else axis
    return data.reshape(math.prod(data.shape[:axis]), math.prod(data.shape[axis:]))


@kernel("Expand", since=8)
def expand(data, shape):
    target = int_list(shape, "shape")
    try:
        out_shape = np.broadcast_shapes(data.shape, tuple(target))
    except ValueError:
        raise ValueError(f"cannot expand shape {list(data.shape)} to {target}: not broadcastable") from None
    return np.broadcast_to(data, out_shape).copy()  # a writable array, as every output is


@kernel("Shape", since=1)
def shape_of(data, *, start=0, end=None):
    return np.array(data.shape[slice(start, end)], dtype=np.int64)


@kernel("Size", since=1)
def size_of(data):
    return np.array(data.size, dtype=np.int64)


@kernel("Identity", since=1)
def identity(data):
    return data

