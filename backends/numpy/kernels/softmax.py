"""Softmax, LogSoftmax and Hardmax.

Before opset 13 the input is coerced to 2-D at ``axis`` (default 1) and the op runs over the
flattened trailing block, i.e. over every axis from ``axis`` on. From opset 13 it runs over
the single ``axis`` (default -1). Both reduce to "normalize over these axes" here.

float32 and float64 inputs are computed in their own type and rounded once. Half-precision
inputs (float16, bfloat16) follow the op's ONNX function body, whose every intermediate
(``Sub``, ``Exp``, ``ReduceSum``, ``Div``, ``Log``) is a tensor of the input type: each step
computes in float32 (sums accumulate in float32) and is rounded to the input type, which is
what ONNX's reference computes and what its fp16/bf16 test cases expect.
"""

from __future__ import annotations

import numpy as np

from edgeinfer.backends.numpy.kernels.nn_common import compute_dtype, normalize_axis
from edgeinfer.backends.numpy.registry import kernel


def _axes(op: str, x: np.ndarray, axis: int, flatten: bool) -> tuple[int, ...]:
    if x.ndim == 0:
        raise ValueError(f"{op}: expected an input of rank >= 1, found a scalar")
    axis = normalize_axis(op, axis, x.ndim)
    return tuple(range(axis, x.ndim)) if flatten else (axis,)


def _rounder(dtype: np.dtype):
    """Rounds a float32 intermediate to ``dtype`` in place (kept as float32); identity for
    types that compute in their own precision."""
    if compute_dtype(dtype) == dtype:
        return lambda work: work

    def round_to_input_type(work: np.ndarray) -> np.ndarray:
        work[...] = work.astype(dtype)
        return work

    return round_to_input_type


def _shifted(x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    work = x.astype(compute_dtype(x.dtype), copy=True)
    work -= work.max(axis=axes, keepdims=True)
    return _rounder(x.dtype)(work)


def _softmax(x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    rounded = _rounder(x.dtype)
    e = rounded(np.exp(_shifted(x, axes)))
    e /= rounded(e.sum(axis=axes, keepdims=True))
    return e.astype(x.dtype, copy=False)


def _log_softmax(x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    rounded = _rounder(x.dtype)
    shifted = _shifted(x, axes)
    total = rounded(rounded(np.exp(shifted)).sum(axis=axes, keepdims=True))
    shifted -= rounded(np.log(total))
    return shifted.astype(x.dtype, copy=False)


def _hardmax(x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    """One-hot of the first maximum over ``axes``."""
    lead = x.shape[:axes[0]]
    flat = x.reshape(lead + (-1,) + x.shape[axes[-1] + 1:])
    winner = np.expand_dims(np.argmax(flat, axis=len(lead)), len(lead))
    out = np.zeros(flat.shape, dtype=x.dtype)
    np.put_along_axis(out, winner, 1, axis=len(lead))
    return out.reshape(x.shape)


@kernel("Softmax", since=1)
def softmax_1(x, *, axis=1):
    return _softmax(x, _axes("Softmax", x, axis, flatten=True))


@kernel("Softmax", since=13)
def softmax(x, *, axis=-1):
    return _softmax(x, _axes("Softmax", x, axis, flatten=False))


@kernel("LogSoftmax", since=1)
def log_softmax_1(x, *, axis=1):
    return _log_softmax(x, _axes("LogSoftmax", x, axis, flatten=True))


@kernel("LogSoftmax", since=13)
def log_softmax(x, *, axis=-1):
    return _log_softmax(x, _axes("LogSoftmax", x, axis, flatten=False))


@kernel("Hardmax", since=1)
def hardmax_1(x, *, axis=1):
    return _hardmax(x, _axes("Hardmax", x, axis, flatten=True))


@kernel("Hardmax", since=13)
def hardmax(x, *, axis=-1):
    return _hardmax(x, _axes("Hardmax", x, axis, flatten=False))
