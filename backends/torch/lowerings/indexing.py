"""Indexing ops: Gather, GatherElements, GatherND, Scatter, ScatterElements, ScatterND, TopK,
ArgMax, ArgMin. Negative indices count from the end, as the spec allows."""

from __future__ import annotations

import math

import torch

from edgeinfer.backends.torch.registry import axis_of, ints, lowering


def _positive(indices: torch.Tensor, size: int) -> torch.Tensor:
    indices = indices.to(torch.int64)
    return torch.where(indices < 0, indices + size, indices)


@lowering("Gather", since=1)
def gather(data, indices, *, axis=0):
    axis = axis_of(axis, data.dim())
    flat = _positive(indices, data.shape[axis]).reshape(-1)
    picked = data.index_select(axis, flat)
    return picked.reshape((*data.shape[:axis], *indices.shape, *data.shape[axis + 1:]))  # () for a scalar pick


@lowering("GatherElements", since=11)
def gather_elements(data, indices, *, axis=0):
    axis = axis_of(axis, data.dim())
    return torch.gather(data, axis, _positive(indices, data.shape[axis]))


def _nd_index(data, indices, batch_dims):
    """(data reshaped [B, *rest], indices [B, n, m] made positive, batch index [B, n])."""
    batch = math.prod(data.shape[:batch_dims])
    depth = indices.shape[-1]
    flat_data = data.reshape(batch, *data.shape[batch_dims:])
    index = _positive_columns(indices.to(torch.int64).reshape(batch, -1, depth), flat_data.shape[1:1 + depth])
    rows = torch.arange(batch, device=data.device)[:, None].expand(batch, index.shape[1])
    return flat_data, index, rows


@lowering("GatherND", since=11)
def gather_nd(data, indices, *, batch_dims=0):
    flat_data, index, rows = _nd_index(data, indices, batch_dims)
    picked = flat_data[(rows, *index.unbind(-1))]
    depth = indices.shape[-1]
    return picked.reshape((*indices.shape[:-1], *data.shape[batch_dims + depth:]))


def _positive_columns(index: torch.Tensor, sizes) -> torch.Tensor:
    """Negative entries of each last-axis column made positive, with Python sizes (no host
    tensor to copy, so a CUDA graph can capture it)."""
    columns = [torch.where(column < 0, column + size, column) for column, size in zip(index.unbind(-1), sizes)]
    return torch.stack(columns, -1)


_REDUCTIONS = {"add": "sum", "mul": "prod", "max": "amax", "min": "amin"}


@lowering("ScatterElements", since=11)
def scatter_elements(data, indices, updates, *, axis=0, reduction="none"):
    axis = axis_of(axis, data.dim())
    index = _positive(indices, data.shape[axis])
    if reduction == "none":
        return data.scatter(axis, index, updates)
    return data.scatter_reduce(axis, index, updates, _REDUCTIONS[reduction], include_self=True)


@lowering("Scatter", since=9)
def scatter(data, indices, updates, *, axis=0):
    return scatter_elements(data, indices, updates, axis=axis)


@lowering("ScatterND", since=11)
def scatter_nd(data, indices, updates, *, reduction="none"):
    depth = indices.shape[-1]
    index = _positive_columns(indices.to(torch.int64).reshape(-1, depth), data.shape[:depth])
    linear = sum(column * math.prod(data.shape[i + 1:depth]) for i, column in enumerate(index.unbind(-1)))
    rows = data.reshape(math.prod(data.shape[:depth]), -1).clone()
    source = updates.reshape(linear.shape[0], -1)
    if reduction == "none":
        rows.index_copy_(0, linear, source)
    elif reduction == "add":
        rows.index_add_(0, linear, source)
    else:
        rows.index_reduce_(0, linear, source, _REDUCTIONS[reduction], include_self=True)
    return rows.reshape(data.shape)


@lowering("TopK", since=10, static=(1,))
def top_k(x, k, *, axis=-1, largest=1, sorted=1):  # noqa: A002 (the spec's name)
    axis = axis_of(axis, x.dim())
    count = ints(k)[0]
    # a stable sort keeps equal values in index order, as the spec asks
    values, indices = torch.sort(x, dim=axis, descending=bool(largest), stable=True)
    return values.narrow(axis, 0, count), indices.narrow(axis, 0, count)


def _arg(fn, data, axis, keepdims, select_last_index):
    axis = axis_of(axis, data.dim())
    if select_last_index:
        flipped = fn(data.flip(axis), dim=axis, keepdim=bool(keepdims))
        return data.shape[axis] - 1 - flipped
    return fn(data, dim=axis, keepdim=bool(keepdims))


@lowering("ArgMax", since=1)
def arg_max(data, *, axis=0, keepdims=1, select_last_index=0):
    return _arg(torch.argmax, data, axis, keepdims, select_last_index)


@lowering("ArgMin", since=1)
def arg_min(data, *, axis=0, keepdims=1, select_last_index=0):
    return _arg(torch.argmin, data, axis, keepdims, select_last_index)
