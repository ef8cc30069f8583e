"""Ops that assemble, cut or rearrange tensor data: Concat, Split, Slice, Tile, Pad, Trilu,
Compress, NonZero, ReverseSequence and (inference-mode) Dropout."""

from __future__ import annotations

import numpy as np

from edgeinfer.backends.numpy.kernels._general import int_list, normalize_axes, normalize_axis, scalar_of
from edgeinfer.backends.numpy.registry import KernelContext, kernel


@kernel("Concat", since=4)
def concat(*inputs, axis):
    if not inputs:
        raise ValueError("expected at least one input, got none")
    axis = normalize_axis(axis, inputs[0].ndim)
    return np.concatenate(inputs, axis=axis)


@kernel("Split", since=2)
def split_attribute(data, *, axis=0, split=None, _ctx: KernelContext):
    """Opsets 2-12: ``split`` is an attribute."""
    return _split(data, axis, split, None, _ctx.num_outputs)


@kernel("Split", since=13)
def split(data, split=None, *, axis=0, num_outputs=None, _ctx: KernelContext):
    """Opset 13+: ``split`` is an input; opset 18 adds ``num_outputs`` (last chunk smaller)."""
    sizes = None if split is None else int_list(split, "split")
    return _split(data, axis, sizes, num_outputs, _ctx.num_outputs)


def _split(data, axis, sizes, num_outputs, outputs):
    axis = normalize_axis(axis, data.ndim)
    length = data.shape[axis]
    if sizes is None:
        count = num_outputs or outputs
        if num_outputs is None and length % count:
            raise ValueError(f"cannot split dim {axis} of size {length} into {count} equal parts")
        chunk = -(-length // count)
        sizes = [min(chunk, max(length - i * chunk, 0)) for i in range(count)]
    if len(sizes) != outputs or sum(sizes) != length or min(sizes, default=0) < 0:
        raise ValueError(f"split sizes {sizes} must be {outputs} non-negative sizes summing to dim "
                         f"{axis} of size {length}")
    bounds = np.cumsum(sizes)[:-1]
    return tuple(np.split(data, bounds, axis=axis))


@kernel("Slice", since=10)
def slice_(data, starts, ends, axes=None, steps=None):
    starts, ends = int_list(starts, "starts"), int_list(ends, "ends")
    axes = list(range(len(starts))) if axes is None else int_list(axes, "axes")
    steps = [1] * len(starts) if steps is None else int_list(steps, "steps")
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise ValueError(f"starts, ends, axes and steps must have one entry per sliced axis, found "
                         f"{len(starts)}, {len(ends)}, {len(axes)}, {len(steps)}")
    if 0 in steps:
        raise ValueError("steps must be non-zero")
    index = [slice(None)] * data.ndim
    for start, end, axis, step in zip(starts, ends, normalize_axes(axes, data.ndim), steps, strict=True):
        index[axis] = slice(start, end, step)  # python clamps exactly as the spec does
    return data[tuple(index)]


@kernel("Tile", since=6)
def tile(data, repeats):
    counts = int_list(repeats, "repeats")
    if len(counts) != data.ndim or min(counts, default=0) < 0:
        raise ValueError(f"repeats {counts} must hold {data.ndim} non-negative counts (one per axis)")
    return np.tile(data, counts)


_PAD_MODES = {"constant": "constant", "reflect": "reflect", "edge": "edge", "wrap": "wrap"}


@kernel("Pad", since=11)
def pad(data, pads, constant_value=None, axes=None, *, mode="constant"):
    """Negative pads crop (before any padding, as onnxruntime does)."""
    if mode not in _PAD_MODES:
        raise ValueError(f"mode must be one of {sorted(_PAD_MODES)}, found {mode!r}")
    amounts = int_list(pads, "pads")
    axes = list(range(data.ndim)) if axes is None else list(normalize_axes(int_list(axes, "axes"), data.ndim))
    if len(amounts) != 2 * len(axes):
        raise ValueError(f"pads must hold 2 x {len(axes)} values (begins, then ends), found {len(amounts)}")
    widths = [(0, 0)] * data.ndim
    crop = [slice(None)] * data.ndim
    for i, axis in enumerate(axes):
        begin, end = amounts[i], amounts[i + len(axes)]
        widths[axis] = (max(begin, 0), max(end, 0))
        crop[axis] = slice(max(-begin, 0), data.shape[axis] - max(-end, 0))
    data = data[tuple(crop)]
    if mode == "constant":
        fill = 0 if constant_value is None else scalar_of(constant_value, "constant_value")
        return np.pad(data, widths, mode="constant", constant_values=fill)
    if data.size == 0 and any(widths):
        raise ValueError(f"mode {mode!r} cannot pad an empty tensor of shape {list(data.shape)}")
    return np.pad(data, widths, mode=mode)


@kernel("Trilu", since=14)
def trilu(data, k=None, *, upper=1):
    if data.ndim < 2:
        raise ValueError(f"expected a tensor of rank >= 2, got rank {data.ndim}")
    diagonal = 0 if k is None else int(scalar_of(k, "k"))
    return np.triu(data, diagonal) if upper else np.tril(data, diagonal)


@kernel("Compress", since=9)
def compress(data, condition, *, axis=None):
    keep = np.asarray(condition).reshape(-1).astype(bool)
    if axis is None:
        return np.compress(keep, data.reshape(-1))
    axis = normalize_axis(axis, data.ndim)
    if keep.size > data.shape[axis]:
        raise ValueError(f"condition has {keep.size} entries, more than dim {axis} of size {data.shape[axis]}")
    return np.compress(keep, data, axis=axis)


@kernel("NonZero", since=9)
def nonzero(data):
    return np.ascontiguousarray(np.argwhere(data).T, dtype=np.int64)


@kernel("ReverseSequence", since=10)
def reverse_sequence(data, sequence_lens, *, batch_axis=1, time_axis=0):
    if {batch_axis, time_axis} not in ({0, 1},):
        raise ValueError(f"batch_axis and time_axis must be 0 and 1 in some order, found {batch_axis}, {time_axis}")
    steps, batch = data.shape[time_axis], data.shape[batch_axis]
    lengths = np.asarray(sequence_lens, dtype=np.int64).reshape(-1)
    if lengths.size != batch or (lengths < 0).any() or (lengths > steps).any():
        raise ValueError(f"sequence_lens must hold {batch} lengths in [0, {steps}], found {lengths.tolist()}")
    t = np.arange(steps)[:, None]
    source = np.where(t < lengths[None, :], lengths[None, :] - 1 - t, t)  # (time, batch)
    if time_axis == 1:
        source = source.T
    index = source.reshape(source.shape + (1,) * (data.ndim - 2))
    return np.take_along_axis(data, index, axis=time_axis)


@kernel("Dropout", since=7)
def dropout_attribute(data, *, ratio=0.5, _ctx: KernelContext):
    """Opsets 7-11: inference only, so the identity (the mask, if asked for, is all ones)."""
    return _dropout(data, ratio, False, None, _ctx)


@kernel("Dropout", since=12)
def dropout(data, ratio=None, training_mode=None, *, seed=None, _ctx: KernelContext):
    """With ``training_mode`` true, keeps each element with probability 1 - ratio and scales by
    1 / (1 - ratio); the draw uses ``numpy.random.RandomState(seed)`` like onnx.reference."""
    training = training_mode is not None and bool(scalar_of(training_mode, "training_mode"))
    rate = 0.5 if ratio is None else float(scalar_of(ratio, "ratio"))
    return _dropout(data, rate, training, seed, _ctx)


def _dropout(data, ratio, training, seed, ctx):
    if not training or ratio == 0:
        keep = np.ones(data.shape, dtype=bool)
        out = data
    else:
        if not 0 <= ratio < 1:
            raise ValueError(f"ratio must be in [0, 1), found {ratio}")
        keep = np.random.RandomState(seed).uniform(0.0, 1.0, data.shape) >= ratio
        out = (keep * data * (1.0 / (1.0 - ratio))).astype(data.dtype, copy=False)
    if ctx.num_outputs < 2:
        return out
    mask_dtype = ctx.output_dtypes[1] if ctx.output_dtypes[1] is not None else np.dtype(bool)
    return out, keep.astype(mask_dtype, copy=False)
