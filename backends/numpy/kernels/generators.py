"""Ops that create tensors: Constant, ConstantOfShape, Range, EyeLike, OneHot."""

from __future__ import annotations

import numpy as np

from edgeinfer.backends.numpy.kernels._general import int_list, normalize_axis, scalar_of
from edgeinfer.backends.numpy.registry import kernel


@kernel("Constant", since=1)
def constant(*, value=None, sparse_value=None, value_float=None, value_floats=None, value_int=None,
             value_ints=None, value_string=None, value_strings=None):
    """Exactly one attribute holds the value (``sparse_value`` arrives densified)."""
    given = {name: v for name, v in [("value", value), ("sparse_value", sparse_value),
                                     ("value_float", value_float), ("value_floats", value_floats),
                                     ("value_int", value_int), ("value_ints", value_ints),
                                     ("value_string", value_string), ("value_strings", value_strings)]
             if v is not None}
    if len(given) != 1:
        raise ValueError(f"expected exactly one value attribute, found {sorted(given) or 'none'}")
    name, v = given.popitem()
    if name in ("value", "sparse_value"):
        return np.array(v, copy=True)
    if name.startswith("value_float"):
        return np.array(v, dtype=np.float32)
    if name.startswith("value_int"):
        return np.array(v, dtype=np.int64)
    return np.array(v, dtype=object)


@kernel("ConstantOfShape", since=9)
def constant_of_shape(shape, *, value=None):
    dims = int_list(shape, "shape")
    if min(dims, default=0) < 0:
        raise ValueError(f"shape {dims} has a negative dimension")
    if value is None:
        return np.zeros(dims, dtype=np.float32)
    fill = np.asarray(value)
    if fill.size != 1:
        raise ValueError(f"value must hold one element, found shape {list(fill.shape)}")
    return np.full(dims, fill.reshape(-1)[0], dtype=fill.dtype)


_STASH_DTYPES = {1: np.float32, 11: np.float64}


@kernel("Range", since=11)
def range_(start, limit, delta, *, stash_type=1):
    """``start + i * delta`` for ``i < max(ceil((limit - start) / delta), 0)``; floats are
    computed in float64 (half precision in ``stash_type``) and rounded once."""
    dtype = np.asarray(start).dtype
    first, stop, step = (scalar_of(v, n) for v, n in ((start, "start"), (limit, "limit"), (delta, "delta")))
    if step == 0:
        raise ValueError("delta must be non-zero")
    if dtype.kind in "iu":
        first, stop, step = int(first), int(stop), int(step)
        count = max(-((first - stop) // step), 0)
        return (first + np.arange(count, dtype=np.int64) * step).astype(dtype)
    if dtype.itemsize < 4:
        if stash_type not in _STASH_DTYPES:
            raise ValueError(f"stash_type must be 1 (float) or 11 (double), found {stash_type}")
        wide = _STASH_DTYPES[stash_type]
    else:
        wide = np.float64
    first, stop, step = (np.asarray(v).astype(wide) for v in (first, stop, step))
    count = max(int(np.ceil((stop - first) / step)), 0)
    return (first + np.arange(count, dtype=wide) * step).astype(dtype)


@kernel("EyeLike", since=9)
def eye_like(x, *, dtype=None, k=0):
    from edgeinfer.ir import dtypes

    if x.ndim != 2:
        raise ValueError(f"expected a rank-2 input, got rank {x.ndim}")
    out_dtype = x.dtype if dtype is None else dtypes.numpy_dtype(dtypes.from_onnx(dtype))
    return np.eye(x.shape[0], x.shape[1], k=k, dtype=out_dtype)


@kernel("OneHot", since=9)
def one_hot(indices, depth, values, *, axis=-1):
    """Negative indices count from ``depth``; indices outside ``[-depth, depth)`` give an
    all-``off`` vector."""
    size = int(scalar_of(depth, "depth"))
    if size < 1:
        raise ValueError(f"depth must be positive, found {size}")
    if np.asarray(values).size != 2:
        raise ValueError(f"values must be [off_value, on_value], found shape {list(np.shape(values))}")
    off, on = np.asarray(values).reshape(-1)
    axis = normalize_axis(axis, indices.ndim + 1)
    index = indices.astype(np.int64)
    index = np.where(index < 0, index + size, index)
    hot = np.expand_dims(index, axis) == np.arange(size).reshape((size,) + (1,) * (indices.ndim - axis))
    return np.where(hot, on, off)
