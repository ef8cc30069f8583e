"""Ops that create tensors: Constant, ConstantOfShape, Range, EyeLike, OneHot."""

from __future__ import annotations

import math

import numpy as np
import torch

from edgeinfer.backends.torch.registry import LoweringContext, axis_of, ints, lowering, scalar
from edgeinfer.backends.torch.tensors import to_torch, torch_dtype
from edgeinfer.ir import dtypes


@lowering("Constant", since=1)
def constant(*, value=None, sparse_value=None, value_float=None, value_floats=None, value_int=None,
             value_ints=None, _ctx: LoweringContext):
    """Constants have no inputs: the compiler folds them at build time."""
    given = [v for v in (value, sparse_value) if v is not None]
    if given:
        return to_torch(np.array(given[0], copy=True))
    if value_float is not None or value_floats is not None:
        return torch.tensor(value_float if value_float is not None else value_floats, dtype=torch.float32)
    if value_int is not None or value_ints is not None:
        return torch.tensor(value_int if value_int is not None else value_ints, dtype=torch.int64)
    raise ValueError("Constant: expected one value attribute, found none")


@lowering("ConstantOfShape", since=9, static=(0,))
def constant_of_shape(shape, *, value=None, _ctx: LoweringContext):
    dims = ints(shape)
    if value is None:
        return torch.zeros(dims, dtype=_ctx.float_dtype, device=_ctx.device)
    fill = np.asarray(value).reshape(-1)[0]
    dtype = _ctx.dtype(torch_dtype(np.asarray(value).dtype.name))
    return torch.full(dims, fill.item(), dtype=dtype, device=_ctx.device)


@lowering("Range", since=11, static=(0, 1, 2))
def range_(start, limit, delta, *, _ctx: LoweringContext):
    """``start + i * delta`` for ``i < max(ceil((limit - start) / delta), 0)``, in float64 for floats."""
    first, stop, step = scalar(start), scalar(limit), scalar(delta)
    dtype = _ctx.output_dtypes[0]
    if not dtype.is_floating_point:
        count = max(-((int(first) - int(stop)) // int(step)), 0)
        return (int(first) + torch.arange(count, dtype=torch.int64, device=_ctx.device) * int(step)).to(dtype)
    count = max(math.ceil((stop - first) / step), 0)
    positions = torch.arange(count, dtype=torch.float64, device=_ctx.device)
    return (first + positions * step).to(dtype)


@lowering("EyeLike", since=9)
def eye_like(x, *, dtype=None, k=0, _ctx: LoweringContext):
    out = _ctx.dtype(torch_dtype(dtypes.from_onnx(dtype))) if dtype is not None else x.dtype
    rows = torch.arange(x.shape[0], device=x.device)[:, None]
    cols = torch.arange(x.shape[1], device=x.device)[None, :]
    return (rows + k == cols).to(out)


@lowering("OneHot", since=9, static=(1,))
def one_hot(indices, depth, values, *, axis=-1):
    size = int(scalar(depth))  # depth may be a float tensor
    axis = axis_of(axis, indices.dim() + 1)
    index = indices.to(torch.int64)
    index = torch.where(index < 0, index + size, index)
    shape = [1] * (indices.dim() + 1)
    shape[axis] = size
    classes = torch.arange(size, device=indices.device).reshape(shape)
    hot = index.unsqueeze(axis) == classes
    return torch.where(hot, values[1], values[0])
