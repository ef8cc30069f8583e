"""Activation functions. Composite formulas run in float32 for half-precision inputs (and are
rounded back once), so fp16 results are not degraded by half-precision intermediates."""

from __future__ import annotations

import math

import numpy as np

from edgeinfer.backends.numpy.kernels._general import as_array
from edgeinfer.backends.numpy.kernels.elementwise import erf64
from edgeinfer.backends.numpy.registry import kernel

_SELU_ALPHA = 1.67326319217681884765625
_SELU_GAMMA = 1.05070102214813232421875


def _wide(x: np.ndarray) -> np.ndarray:
    """float16/bfloat16 -> float32 for intermediate math; other dtypes unchanged."""
    return x.astype(np.float32) if x.dtype.itemsize < 4 and x.dtype.kind not in "iub" else x


@kernel("Relu", since=6)
def relu(x):
    return as_array(np.maximum(x, np.zeros((), x.dtype)))


@kernel("LeakyRelu", since=6)
def leaky_relu(x, *, alpha=0.01):
    return as_array(np.where(x < 0, x * alpha, x)).astype(x.dtype, copy=False)


@kernel("PRelu", since=7)
def prelu(x, slope):
    return as_array(np.where(x < 0, x * slope, x)).astype(x.dtype, copy=False)


@kernel("ThresholdedRelu", since=10)
def thresholded_relu(x, *, alpha=1.0):
    return as_array(np.where(x > alpha, x, np.zeros((), x.dtype)))


@kernel("Sigmoid", since=6)
def sigmoid(x):
    """``1 / (1 + exp(-x))`` as ``1 / (1 + e)`` for x >= 0 and ``e / (1 + e)`` below, with
    ``e = exp(-|x|)`` in (0, 1]: no exp overflows, and no ``inf / inf`` on large inputs."""
    w = _wide(x)
    e = np.exp(-np.abs(w))
    ratio = 1.0 / (1.0 + e)
    result = np.where(w >= 0, ratio, e * ratio)
    return as_array(result).astype(x.dtype, copy=False)


@kernel("HardSigmoid", since=6)
def hard_sigmoid(x, *, alpha=0.2, beta=0.5):
    return as_array(np.clip(x * alpha + beta, 0, 1)).astype(x.dtype, copy=False)


@kernel("HardSwish", since=14)
def hard_swish(x):
    return as_array(x * np.clip(x * (1.0 / 6.0) + 0.5, 0, 1)).astype(x.dtype, copy=False)


@kernel("Tanh", since=6)
def tanh(x):
    return as_array(np.tanh(x))


@kernel("Elu", since=6)
def elu(x, *, alpha=1.0):
    w = _wide(x)
    return as_array(np.where(w < 0, alpha * np.expm1(np.minimum(w, 0)), w)).astype(x.dtype, copy=False)


@kernel("Selu", since=6)
def selu(x, *, alpha=_SELU_ALPHA, gamma=_SELU_GAMMA):
    w = _wide(x)
    result = np.where(w <= 0, alpha * np.expm1(np.minimum(w, 0)), w) * gamma
    return as_array(result).astype(x.dtype, copy=False)


@kernel("Celu", since=12)
def celu(x, *, alpha=1.0):
    w = _wide(x)
    result = np.maximum(w, 0) + np.minimum(0, alpha * np.expm1(np.minimum(w, 0) / alpha))
    return as_array(result).astype(x.dtype, copy=False)


@kernel("Gelu", since=20)
def gelu(x, *, approximate="none"):
    w = _wide(x)
    if approximate == "tanh":
        inner = math.sqrt(2.0 / math.pi) * (w + 0.044715 * w * w * w)
        result = 0.5 * w * (1.0 + np.tanh(inner))
    elif approximate == "none":
        result = 0.5 * w * (1.0 + erf64(w * (1.0 / math.sqrt(2.0))))
    else:
        raise ValueError(f"approximate must be 'none' or 'tanh', found {approximate!r}")
    return as_array(result).astype(x.dtype, copy=False)


@kernel("Softplus", since=1)
def softplus(x):
    return as_array(np.logaddexp(_wide(x), 0)).astype(x.dtype, copy=False)


@kernel("Softsign", since=1)
def softsign(x):
    return as_array(x / (1 + np.abs(x))).astype(x.dtype, copy=False)


@kernel("Mish", since=18)
def mish(x):
    w = _wide(x)
    return as_array(w * np.tanh(np.logaddexp(w, 0))).astype(x.dtype, copy=False)


@kernel("Clip", since=6)
def clip_attributes(x, *, min=None, max=None):  # noqa: A002  (the spec's attribute names)
    """Opsets 6-10: bounds are attributes (absent: unbounded, the spec's +-FLT_MAX)."""
    return _clip(x, min, max)


@kernel("Clip", since=11)
def clip(x, min=None, max=None):  # noqa: A002
    """Opset 11+: bounds are optional 0-d inputs; min > max gives max everywhere."""
    return _clip(x, None if min is None else min.astype(x.dtype, copy=False),
                 None if max is None else max.astype(x.dtype, copy=False))


def _clip(x, low, high):
    if low is None and high is None:
        return x.copy()
    if low is not None and high is not None:
        return as_array(np.minimum(np.maximum(x, low), high)).astype(x.dtype, copy=False)
    bound = np.maximum if low is not None else np.minimum
    return as_array(bound(x, low if low is not None else high)).astype(x.dtype, copy=False)


@kernel("Shrink", since=9)
def shrink(x, *, bias=0.0, lambd=0.5):
    """x - bias above lambd, x + bias below -lambd, 0 between."""
    zero = np.zeros((), x.dtype)
    result = np.where(x > lambd, x - bias, np.where(x < -lambd, x + bias, zero))
    return as_array(result).astype(x.dtype, copy=False)


@kernel("Swish", since=24)
def swish(x, *, alpha=1.0):
    """x * sigmoid(alpha * x)."""
    w = _wide(x)
    return as_array(w * sigmoid(w * np.asarray(alpha, w.dtype))).astype(x.dtype, copy=False)
