"""MaxPool, AveragePool, LpPool and the global pools.

A window reduction is ``prod(kernel)`` vectorized steps, one per kernel tap, each combining a
strided view of the padded input into the output (``np.maximum`` / ``np.add`` with ``out=``),
so no Python code runs per pixel; MaxPool without indices reduces one axis at a time
(``sum(kernel)`` steps). Averages divide by a per-position count computed the same
way from a spatial mask (no batch or channel axes), so ``count_include_pad`` costs nothing
per channel. Geometry: see ``nn_common``.
"""

from __future__ import annotations

import numpy as np

from edgeinfer.backends.numpy.kernels.nn_common import (
    compute_dtype,
    kernel_taps,
    pad_spatial,
    spatial_attrs,
    tap_slices,
    window_geometry,
)
from edgeinfer.backends.numpy.registry import kernel


def _geometry(op, x, auto_pad, ceil_mode, dilations, kernel_shape, pads, strides):
    if x.ndim < 3:
        raise ValueError(f"{op}: expected an input of rank >= 3 (N, C, spatial...), found shape {list(x.shape)}")
    if kernel_shape is None:
        raise ValueError(f"{op}: the kernel_shape attribute is required")
    spatial = x.shape[2:]
    kernel_, strides, dilations, pads = spatial_attrs(op, spatial, kernel_shape, strides, dilations, pads)
    out, begin, end = window_geometry(op, spatial, kernel_, strides, dilations, pads, auto_pad, bool(ceil_mode))
    return kernel_, strides, dilations, pads, out, begin, end


def _lowest(dtype: np.dtype):
    return -np.inf if dtype.kind == "f" else np.iinfo(dtype).min


def _window_sum(xp: np.ndarray, kernel_, strides, dilations, out_sizes, dtype) -> np.ndarray:
    out = np.zeros(xp.shape[:-len(out_sizes)] + tuple(out_sizes), dtype=dtype)
    for _, offsets in kernel_taps(kernel_, dilations):
        out += xp[tap_slices(offsets, strides, out_sizes)]
    return out


@kernel("MaxPool", since=1)
def max_pool(x, *, auto_pad="NOTSET", ceil_mode=0, dilations=None, kernel_shape=None, pads=None,
             storage_order=0, strides=None, _ctx=None):
    kernel_, strides, dilations, _, out_sizes, begin, end = _geometry(
        "MaxPool", x, auto_pad, ceil_mode, dilations, kernel_shape, pads, strides)
    xp = pad_spatial(x, begin, end, _lowest(x.dtype))
    want_indices = _ctx is not None and _ctx.num_outputs > 1
    if not want_indices:
        return _separable_max(xp, kernel_, strides, dilations, out_sizes)
    out = None
    best = None
    for _, offsets in kernel_taps(kernel_, dilations):
        view = xp[tap_slices(offsets, strides, out_sizes)]
        if out is None:
            out = view.copy()
            if want_indices:
                best = np.broadcast_to(np.asarray(offsets), (*out.shape, len(offsets))).copy()
            continue
        if want_indices:
            better = view > out
            best[better] = offsets
        np.maximum(out, view, out=out)
    if not want_indices:
        return out
    return out, _indices(best, x.shape, out_sizes, strides, begin, storage_order)


def _separable_max(xp: np.ndarray, kernel_, strides, dilations, out_sizes) -> np.ndarray:
    """The window max one spatial axis at a time (max is separable): ``sum(kernel)`` passes
    instead of ``prod(kernel)``, each over an input already reduced along the earlier axes
    (leading axes first: their views read whole contiguous rows)."""
    y = xp
    lead = xp.ndim - len(kernel_)
    for axis, (k, s, d, size) in enumerate(zip(kernel_, strides, dilations, out_sizes, strict=True)):
        taps = [y[(slice(None),) * (lead + axis) + (slice(t * d, t * d + s * (size - 1) + 1, s),)]
                for t in range(k)]
        if k == 1:
            y = taps[0]
            continue
        y = np.maximum(taps[0], taps[1])
        for view in taps[2:]:
            np.maximum(y, view, out=y)
    return np.array(y) if y.base is not None or y is xp else y  # never a view of the input


def _indices(best_offsets: np.ndarray, shape, out_sizes, strides, begin, storage_order) -> np.ndarray:
    """Flat input indices (over the whole tensor) of the chosen window elements."""
    n, c, spatial = shape[0], shape[1], shape[2:]
    rank = len(spatial)
    coords = []
    for axis in range(rank):
        start = np.arange(out_sizes[axis]) * strides[axis] - begin[axis]
        start = start.reshape((-1,) + (1,) * (rank - 1 - axis))
        coords.append(start + best_offsets[..., axis])
    order = range(rank) if not storage_order else reversed(range(rank))
    flat = np.zeros(best_offsets.shape[:-1], dtype=np.int64)
    for axis in order:
        flat = flat * spatial[axis] + coords[axis]
    plane = int(np.prod(spatial))
    base = (np.arange(n * c, dtype=np.int64) * plane).reshape((n, c) + (1,) * rank)
    return flat + base


@kernel("AveragePool", since=1)
def average_pool(x, *, auto_pad="NOTSET", ceil_mode=0, count_include_pad=0, dilations=None,
                 kernel_shape=None, pads=None, strides=None):
    kernel_, strides, dilations, pads, out_sizes, begin, end = _geometry(
        "AveragePool", x, auto_pad, ceil_mode, dilations, kernel_shape, pads, strides)
    dtype = compute_dtype(x.dtype)
    xp = pad_spatial(x.astype(dtype, copy=False), begin, end)
    total = _window_sum(xp, kernel_, strides, dilations, out_sizes, dtype)
    spatial = x.shape[2:]
    mask = np.ones(spatial, dtype=dtype)
    if count_include_pad:
        # Explicit (or auto) pads count; the extra trailing cells that ceil mode reads do not.
        rank = len(spatial)
        counted_end = [min(e, p) for e, p in zip(end, pads[rank:], strict=False)] if auto_pad == "NOTSET" else end
        mask = pad_spatial(mask, begin, counted_end, 1)
        mask = pad_spatial(mask, [0] * rank, [e - c for e, c in zip(end, counted_end, strict=False)], 0)
    else:
        mask = pad_spatial(mask, begin, end, 0)
    counts = _window_sum(mask, kernel_, strides, dilations, out_sizes, dtype)
    total /= counts
    return total.astype(x.dtype, copy=False)


@kernel("LpPool", since=1)
def lp_pool(x, *, auto_pad="NOTSET", ceil_mode=0, dilations=None, kernel_shape=None, p=2, pads=None,
            strides=None):
    kernel_, strides, dilations, _, out_sizes, begin, end = _geometry(
        "LpPool", x, auto_pad, ceil_mode, dilations, kernel_shape, pads, strides)
    dtype = compute_dtype(x.dtype)
    powered = np.abs(x.astype(dtype, copy=False)) ** dtype.type(p)
    total = _window_sum(pad_spatial(powered, begin, end), kernel_, strides, dilations, out_sizes, dtype)
    return (total ** dtype.type(1.0 / p)).astype(x.dtype, copy=False)


def _global_axes(op: str, x: np.ndarray) -> tuple[int, ...]:
    if x.ndim < 3:
        raise ValueError(f"{op}: expected an input of rank >= 3 (N, C, spatial...), found shape {list(x.shape)}")
    return tuple(range(2, x.ndim))


@kernel("GlobalAveragePool", since=1)
def global_average_pool(x):
    axes = _global_axes("GlobalAveragePool", x)
    return np.mean(x, axis=axes, keepdims=True, dtype=compute_dtype(x.dtype)).astype(x.dtype, copy=False)


@kernel("GlobalMaxPool", since=1)
def global_max_pool(x):
    return np.max(x, axis=_global_axes("GlobalMaxPool", x), keepdims=True)


@kernel("GlobalLpPool", since=1)
def global_lp_pool(x, *, p=2):
    axes = _global_axes("GlobalLpPool", x)
    dtype = compute_dtype(x.dtype)
    total = np.sum(np.abs(x.astype(dtype, copy=False)) ** dtype.type(p), axis=axes, keepdims=True)
    return (total ** dtype.type(1.0 / p)).astype(x.dtype, copy=False)
