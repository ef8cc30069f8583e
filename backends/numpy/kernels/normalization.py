"""Normalization kernels (inference): BatchNormalization, Instance/Layer/Group normalization,
LpNormalization, LRN and MeanVarianceNormalization.

Statistics are reduced in float32 (or float64 for float64 inputs), as ``stash_type=1``
asks, and variances are computed as ``E[(x - mean)^2]`` rather than ``E[x^2] - mean^2``,
which loses digits when the mean is large.
"""

from __future__ import annotations

import numpy as np

from edgeinfer.backends.numpy.kernels.nn_common import as_compute, compute_dtype, normalize_axis
from edgeinfer.backends.numpy.registry import kernel
from edgeinfer.errors import UnsupportedOpError


def _channel_shape(x: np.ndarray) -> tuple[int, ...]:
    return (-1,) + (1,) * (x.ndim - 2)


def _check_channels(op: str, x: np.ndarray, **params: np.ndarray) -> None:
    if x.ndim < 2:
        raise ValueError(f"{op}: expected an input of rank >= 2 (N, C, ...), found shape {list(x.shape)}")
    for name, value in params.items():
        if value.size != x.shape[1]:
            raise ValueError(f"{op}: expected {name} with {x.shape[1]} elements (one per channel), "
                             f"found shape {list(value.shape)}")


@kernel("BatchNormalization", since=6)
def batch_normalization(x, scale, bias, mean, var, *, epsilon=1e-5, momentum=0.9, spatial=1,
                        is_test=0, training_mode=0, _ctx=None):
    outputs = _ctx.num_outputs if _ctx is not None else 1
    if training_mode or (outputs > 1 and not is_test):
        where = f" (node {_ctx.name!r})" if _ctx is not None and _ctx.name else ""
        raise UnsupportedOpError(f"BatchNormalization{where}: training mode (training_mode=1 or running "
                                 f"statistics outputs) is not supported for inference; expected "
                                 f"training_mode=0 and one output, found {outputs} outputs")
    dtype = compute_dtype(x.dtype)
    if spatial or scale.ndim == 1:
        _check_channels("BatchNormalization", x, scale=scale, B=bias, mean=mean, var=var)
        shape = _channel_shape(x)
    else:  # spatial=0 (opsets 7-8): statistics per activation, shaped like x[0]
        shape = (1, *scale.shape)
    factor = (as_compute(scale, dtype) / np.sqrt(as_compute(var, dtype) + dtype.type(epsilon))).reshape(shape)
    y = np.subtract(as_compute(x, dtype), as_compute(mean, dtype).reshape(shape))
    y *= factor
    y += as_compute(bias, dtype).reshape(shape)
    return y.astype(x.dtype, copy=False)


def _standardize(x: np.ndarray, axes: tuple[int, ...], epsilon: float, dtype: np.dtype):
    """(x - mean) / sqrt(var + eps) over ``axes``, with the mean and 1/std (keepdims)."""
    xc = as_compute(x, dtype)
    mean = xc.mean(axis=axes, keepdims=True)
    centered = xc - mean
    var = np.mean(np.square(centered), axis=axes, keepdims=True)
    inv_std = 1.0 / np.sqrt(var + dtype.type(epsilon))
    centered *= inv_std
    return centered, mean, inv_std


@kernel("InstanceNormalization", since=6)
def instance_normalization(x, scale, b, *, epsilon=1e-5):
    _check_channels("InstanceNormalization", x, scale=scale, B=b)
    dtype = compute_dtype(x.dtype)
    y, _, _ = _standardize(x, tuple(range(2, x.ndim)), epsilon, dtype)
    y *= as_compute(scale, dtype).reshape(_channel_shape(x))
    y += as_compute(b, dtype).reshape(_channel_shape(x))
    return y.astype(x.dtype, copy=False)


@kernel("LayerNormalization", since=17)
def layer_normalization(x, scale, b=None, *, axis=-1, epsilon=1e-5, stash_type=1):
    axis = normalize_axis("LayerNormalization", axis, x.ndim)
    dtype = compute_dtype(x.dtype) if stash_type == 1 else np.dtype(x.dtype)
    y, mean, inv_std = _standardize(x, tuple(range(axis, x.ndim)), epsilon, dtype)
    y *= as_compute(scale, dtype)
    if b is not None:
        y += as_compute(b, dtype)
    return y.astype(x.dtype, copy=False), mean, inv_std


def _group_norm(x, scale, bias, epsilon, num_groups, stash_type, per_channel: bool):
    op = "GroupNormalization"
    channels = x.shape[1] if x.ndim >= 2 else 0
    if num_groups is None or num_groups < 1 or channels % num_groups:
        raise ValueError(f"{op}: expected num_groups to divide the {channels} channels, found {num_groups}")
    expected = channels if per_channel else num_groups
    for name, value in (("scale", scale), ("bias", bias)):
        if value.size != expected:
            raise ValueError(f"{op}: expected {name} with {expected} elements, found shape {list(value.shape)}")
    dtype = compute_dtype(x.dtype) if stash_type == 1 else np.dtype(x.dtype)
    grouped = x.reshape(x.shape[0], num_groups, -1)
    y, _, _ = _standardize(grouped, (2,), epsilon, dtype)
    if per_channel:
        y = y.reshape(x.shape)
        shape = _channel_shape(x)
    else:
        shape = (-1, 1)
    y *= as_compute(scale, dtype).reshape(shape)
    y += as_compute(bias, dtype).reshape(shape)
    return y.reshape(x.shape).astype(x.dtype, copy=False)


@kernel("GroupNormalization", since=18)
def group_normalization_18(x, scale, bias, *, epsilon=1e-5, num_groups=None):
    return _group_norm(x, scale, bias, epsilon, num_groups, 1, per_channel=False)


@kernel("GroupNormalization", since=21)
def group_normalization(x, scale, bias, *, epsilon=1e-5, num_groups=None, stash_type=1):
    return _group_norm(x, scale, bias, epsilon, num_groups, stash_type, per_channel=True)


@kernel("LpNormalization", since=1)
def lp_normalization(x, *, axis=-1, p=2):
    axis = normalize_axis("LpNormalization", axis, x.ndim)
    if p not in (1, 2):
        raise ValueError(f"LpNormalization: expected p in (1, 2), found {p}")
    norm = np.sum(np.abs(x), axis=axis, keepdims=True) if p == 1 else np.sqrt(
        np.sum(np.square(x), axis=axis, keepdims=True))
    # A zero vector stays zero (as in ONNX's reference) instead of becoming 0 / 0 = NaN.
    return (x / np.where(norm == 0, 1, norm)).astype(x.dtype, copy=False)


@kernel("LRN", since=1)
def lrn(x, *, alpha=0.0001, beta=0.75, bias=1.0, size=None):
    """Sums of squares over a channel window: ``size`` shifted adds of zero-padded squares."""
    if size is None or size < 1:
        raise ValueError(f"LRN: expected a size attribute >= 1, found {size}")
    if x.ndim < 3:
        raise ValueError(f"LRN: expected an input of rank >= 3 (N, C, spatial...), found shape {list(x.shape)}")
    dtype = compute_dtype(x.dtype)
    channels = x.shape[1]
    before = (size - 1) // 2
    padded = np.zeros((x.shape[0], channels + size - 1, *x.shape[2:]), dtype=dtype)
    np.square(as_compute(x, dtype), out=padded[:, before:before + channels])
    window = np.zeros((x.shape[0], channels, *x.shape[2:]), dtype=dtype)
    for shift in range(size):
        window += padded[:, shift:shift + channels]
    scale = (dtype.type(bias) + dtype.type(alpha / size) * window) ** dtype.type(beta)
    return (as_compute(x, dtype) / scale).astype(x.dtype, copy=False)


@kernel("MeanVarianceNormalization", since=9)
def mean_variance_normalization(x, *, axes=(0, 2, 3)):
    axes = tuple(normalize_axis("MeanVarianceNormalization", a, x.ndim, "axes") for a in axes)
    dtype = compute_dtype(x.dtype)
    xc = as_compute(x, dtype)
    mean = xc.mean(axis=axes, keepdims=True)
    centered = xc - mean
    std = np.sqrt(np.mean(np.square(centered), axis=axes, keepdims=True))
    centered /= std + dtype.type(1e-9)  # the spec's function body adds 1e-9 to the deviation
    return centered.astype(x.dtype, copy=False)
