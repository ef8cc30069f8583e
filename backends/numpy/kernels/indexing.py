"""Gather, scatter and selection by index: Gather, GatherElements, GatherND, Scatter,
ScatterElements, ScatterND and TopK. Negative indices count from the end of their axis;
indices out of range raise (numpy's ``IndexError``, reported with the node by the executor)."""

from __future__ import annotations

import numpy as np

from edgeinfer.backends.numpy.kernels._general import as_array, normalize_axis, scalar_of
from edgeinfer.backends.numpy.registry import kernel

_REDUCTIONS = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


def _wrap(indices: np.ndarray, size: int, what: str) -> np.ndarray:
    """Indices in ``[-size, size)`` -> ``[0, size)`` as int64; anything else is an error."""
    index = np.asarray(indices).astype(np.int64, copy=False)
    if index.size and (index.min() < -size or index.max() >= size):
        bad = index[(index < -size) | (index >= size)].reshape(-1)[0]
        raise IndexError(f"{what} {bad} is out of range for an axis of size {size}")
    return np.where(index < 0, index + size, index)


@kernel("Gather", since=1)
def gather(data, indices, *, axis=0):
    axis = normalize_axis(axis, data.ndim)
    return as_array(np.take(data, _wrap(indices, data.shape[axis], "index"), axis=axis))


@kernel("GatherElements", since=11)
def gather_elements(data, indices, *, axis=0):
    axis = normalize_axis(axis, data.ndim)
    if indices.ndim != data.ndim:
        raise ValueError(f"indices must have the data's rank {data.ndim}, found rank {indices.ndim}")
    return np.take_along_axis(data, _wrap(indices, data.shape[axis], "index"), axis=axis)


@kernel("GatherND", since=11)
def gather_nd(data, indices, *, batch_dims=0):
    depth = indices.shape[-1] if indices.ndim else 0
    if indices.ndim < 1 or batch_dims + depth > data.ndim or batch_dims >= indices.ndim:
        raise ValueError(f"indices of shape {list(indices.shape)} with batch_dims={batch_dims} do not "
                         f"address data of shape {list(data.shape)}")
    batch_shape = data.shape[:batch_dims]
    if indices.shape[:batch_dims] != batch_shape:
        raise ValueError(f"batch dims of indices {list(indices.shape[:batch_dims])} differ from "
                         f"data's {list(batch_shape)}")
    batches = int(np.prod(batch_shape, dtype=np.int64))
    flat_data = data.reshape((batches,) + data.shape[batch_dims:])
    flat_index = indices.reshape(batches, -1, depth)
    columns = tuple(_wrap(flat_index[..., j], data.shape[batch_dims + j], "index") for j in range(depth))
    rows = np.broadcast_to(np.arange(batches)[:, None], flat_index.shape[:2])
    picked = flat_data[(rows,) + columns]
    return picked.reshape(indices.shape[:-1] + data.shape[batch_dims + depth:])


@kernel("ScatterElements", since=11)
def scatter_elements(data, indices, updates, *, axis=0, reduction="none"):
    axis = normalize_axis(axis, data.ndim)
    if indices.shape != updates.shape or indices.ndim != data.ndim:
        raise ValueError(f"indices {list(indices.shape)} and updates {list(updates.shape)} must have the "
                         f"same shape and the data's rank {data.ndim}")
    where = list(np.indices(indices.shape, sparse=True))
    where[axis] = _wrap(indices, data.shape[axis], "index")
    return _scatter(data, tuple(where), updates, reduction)


kernel("Scatter", since=9)(scatter_elements)


@kernel("ScatterND", since=11)
def scatter_nd(data, indices, updates, *, reduction="none"):
    depth = indices.shape[-1] if indices.ndim else 0
    expected = indices.shape[:-1] + data.shape[depth:]
    if indices.ndim < 1 or depth > data.ndim or updates.shape != expected:
        raise ValueError(f"updates must have shape {list(expected)} for indices {list(indices.shape)} "
                         f"and data {list(data.shape)}, found {list(updates.shape)}")
    flat = indices.reshape(-1, depth)
    where = tuple(_wrap(flat[:, j], data.shape[j], "index") for j in range(depth))
    return _scatter(data, where, updates.reshape((-1,) + data.shape[depth:]), reduction)


def _scatter(data, where, updates, reduction):
    out = data.copy()
    if reduction == "none":
        out[where] = updates  # duplicate indices: the spec leaves the winner undefined
    elif reduction in _REDUCTIONS:
        _REDUCTIONS[reduction].at(out, where, updates)
    else:
        raise ValueError(f"reduction must be one of none, {', '.join(_REDUCTIONS)}; found {reduction!r}")
    return out


@kernel("TopK", since=10)
def top_k(x, k, *, axis=-1, largest=1, sorted=1):  # noqa: A002  (the spec's attribute name)
    """The k largest (or smallest) along ``axis``; equal values keep the lower index first,
    as the spec requires, so the order is deterministic whatever ``sorted`` says."""
    axis = normalize_axis(axis, x.ndim)
    count = int(scalar_of(k, "k"))
    if not 0 <= count <= x.shape[axis]:
        raise ValueError(f"k={count} is out of range for an axis of size {x.shape[axis]}")
    if largest:
        # a stable ascending sort of the reversed axis, read backwards: descending, ties by index
        order = np.argsort(np.flip(x, axis), axis=axis, kind="stable")
        order = x.shape[axis] - 1 - np.flip(order, axis)
    else:
        order = np.argsort(x, axis=axis, kind="stable")
    indices = np.take(order, np.arange(count), axis=axis)
    return np.take_along_axis(x, indices, axis=axis), indices.astype(np.int64, copy=False)
