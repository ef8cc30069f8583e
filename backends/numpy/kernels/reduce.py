"""Reductions (ReduceSum ... ReduceLogSumExp), ArgMax/ArgMin, CumSum and CumProd.

Reductions take ``axes`` as an attribute before opset 13 (ReduceSum) or 18 (the others) and
as an optional input after; no axes means all axes, unless ``noop_with_empty_axes`` asks for
the identity. Results keep the input dtype (integer sums wrap like C; half-precision sums
accumulate in float32). A reduction over an empty set gives the operation's identity
(0 for sums, 1 for products, -inf / the lowest integer for max, -inf for LogSumExp).
"""

from __future__ import annotations

import numpy as np

from edgeinfer.backends.numpy.kernels._general import (
    as_array,
    int_list,
    normalize_axes,
    normalize_axis,
    scalar_of,
)
from edgeinfer.backends.numpy.registry import kernel


def _accumulator(x: np.ndarray) -> np.dtype:
    return np.dtype(np.float32) if x.dtype.kind not in "iub" and x.dtype.itemsize < 4 else x.dtype


def _lowest(dtype: np.dtype):
    if dtype.kind == "b":
        return False
    return np.iinfo(dtype).min if dtype.kind in "iu" else -np.inf


def _highest(dtype: np.dtype):
    if dtype.kind == "b":
        return True
    return np.iinfo(dtype).max if dtype.kind in "iu" else np.inf


def _sum(x, axes, keepdims):
    return np.sum(x, axis=axes, keepdims=keepdims, dtype=_accumulator(x))


def _log_sum_exp(x, axes, keepdims):
    wide = x.astype(_accumulator(x), copy=False)
    finite = np.isfinite(wide)
    peak = np.max(wide, axis=axes, keepdims=True, where=finite, initial=-np.inf)
    peak = np.where(np.isfinite(peak), peak, 0)
    with np.errstate(divide="ignore"):  # log(0) = -inf for an empty or all -inf slice
        result = np.log(np.sum(np.exp(wide - peak), axis=axes, keepdims=True)) + peak
    return result if keepdims else np.squeeze(result, axis=axes)


def _with_float_math(fn):
    """Integer inputs: compute in float64, truncate back to the input dtype."""
    def run(x, axes, keepdims):
        wide = x.astype(np.float64) if x.dtype.kind in "iu" else x.astype(_accumulator(x), copy=False)
        with np.errstate(divide="ignore", invalid="ignore"):
            return fn(wide, axes, keepdims)
    return run


_REDUCTIONS = {
    "ReduceSum": _sum,
    "ReduceMean": _with_float_math(lambda x, a, k: np.mean(x, axis=a, keepdims=k)),
    "ReduceMax": lambda x, a, k: np.max(x, axis=a, keepdims=k, initial=_lowest(x.dtype)),
    "ReduceMin": lambda x, a, k: np.min(x, axis=a, keepdims=k, initial=_highest(x.dtype)),
    "ReduceProd": lambda x, a, k: np.prod(x, axis=a, keepdims=k, dtype=_accumulator(x)),
    "ReduceL1": lambda x, a, k: _sum(np.abs(x), a, k),
    "ReduceL2": _with_float_math(lambda x, a, k: np.sqrt(np.sum(x * x, axis=a, keepdims=k))),
    "ReduceSumSquare": lambda x, a, k: _sum(x * x, a, k),
    "ReduceLogSum": _with_float_math(lambda x, a, k: np.log(np.sum(x, axis=a, keepdims=k))),
    "ReduceLogSumExp": _with_float_math(_log_sum_exp),
}
_AXES_BECAME_INPUT = {"ReduceSum": 13}  # the others at 18


def _reduce(op_type, data, axes, keepdims, noop_with_empty_axes):
    if not axes:
        if noop_with_empty_axes:
            return data
        axes = range(data.ndim)
    result = _REDUCTIONS[op_type](data, normalize_axes(axes, data.ndim), bool(keepdims))
    return as_array(result).astype(data.dtype, copy=False)


def _register(op_type: str) -> None:
    def with_attribute(data, *, axes=None, keepdims=1):
        return _reduce(op_type, data, axes, keepdims, 0)

    def with_input(data, axes=None, *, keepdims=1, noop_with_empty_axes=0):
        return _reduce(op_type, data, None if axes is None else int_list(axes, "axes"), keepdims,
                       noop_with_empty_axes)

    for fn, form in ((with_attribute, "axes attribute"), (with_input, "axes input")):
        fn.__name__ = fn.__qualname__ = f"{op_type.lower()}_{form.split()[-1]}"
        fn.__doc__ = f"ONNX {op_type} ({form})."
    kernel(op_type, since=1)(with_attribute)
    kernel(op_type, since=_AXES_BECAME_INPUT.get(op_type, 18))(with_input)


for _op in _REDUCTIONS:
    _register(_op)


def _arg_reduce(data, axis, keepdims, select_last_index, pick):
    axis = normalize_axis(axis, data.ndim)
    if data.shape[axis] == 0:
        raise ValueError(f"cannot take an arg-reduction over empty axis {axis}")
    if select_last_index:
        index = data.shape[axis] - 1 - pick(np.flip(data, axis), axis=axis)
    else:
        index = pick(data, axis=axis)
    index = as_array(index).astype(np.int64, copy=False)
    return np.expand_dims(index, axis) if keepdims else index


@kernel("ArgMax", since=1)
def arg_max(data, *, axis=0, keepdims=1, select_last_index=0):
    return _arg_reduce(data, axis, keepdims, select_last_index, np.argmax)


@kernel("ArgMin", since=1)
def arg_min(data, *, axis=0, keepdims=1, select_last_index=0):
    return _arg_reduce(data, axis, keepdims, select_last_index, np.argmin)


@kernel("CumSum", since=11)
def cum_sum(x, axis, *, exclusive=0, reverse=0):
    return _scan(np.cumsum, 0, x, axis, exclusive, reverse)


@kernel("CumProd", since=26)
def cum_prod(x, axis, *, exclusive=0, reverse=0):
    return _scan(np.cumprod, 1, x, axis, exclusive, reverse)


def _scan(accumulate, identity, x, axis, exclusive, reverse):
    """Inclusive or exclusive (shifted by one, starting at ``identity``), forward or reverse."""
    axis = normalize_axis(scalar_of(axis, "axis"), x.ndim)
    data = np.flip(x, axis) if reverse else x
    total = accumulate(data, axis=axis, dtype=_accumulator(x))
    if exclusive:
        shifted = np.full_like(total, identity)
        body = [slice(None)] * x.ndim
        head = list(body)
        body[axis], head[axis] = slice(1, None), slice(None, -1)
        shifted[tuple(body)] = total[tuple(head)]
        total = shifted
    total = np.flip(total, axis) if reverse else total
    return np.ascontiguousarray(total).astype(x.dtype, copy=False)
