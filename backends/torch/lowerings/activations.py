"""Activations, Clip, PRelu and the softmax family; ``apply_activation`` serves the fused ops."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from edgeinfer.backends.torch.registry import axis_of, lowering


@lowering("Relu", since=6)
def relu(x):
    return torch.relu(x)


@lowering("LeakyRelu", since=6)
def leaky_relu(x, *, alpha=0.01):
    return F.leaky_relu(x, alpha)


@lowering("Elu", since=6)
def elu(x, *, alpha=1.0):
    return F.elu(x, alpha)


@lowering("Selu", since=6)
def selu(x, *, alpha=1.67326319217681884765625, gamma=1.05070102214050292968750):
    return gamma * torch.where(x > 0, x, alpha * torch.expm1(x))


@lowering("Celu", since=12)
def celu(x, *, alpha=1.0):
    return F.celu(x, alpha)


@lowering("ThresholdedRelu", since=10)
def thresholded_relu(x, *, alpha=1.0):
    return torch.where(x > alpha, x, torch.zeros_like(x))


@lowering("HardSigmoid", since=6)
def hard_sigmoid(x, *, alpha=0.2, beta=0.5):
    return torch.clamp(x * alpha + beta, 0, 1)


@lowering("HardSwish", since=14)
def hard_swish(x):
    return x * torch.clamp(x / 6 + 0.5, 0, 1)


@lowering("Sigmoid", since=6)
def sigmoid(x):
    return torch.sigmoid(x)


@lowering("Tanh", since=6)
def tanh(x):
    return torch.tanh(x)


@lowering("Softplus", since=1)
def softplus(x):
    return torch.where(x > 20, x, torch.log1p(torch.exp(x)))  # the spec's ln(exp(x) + 1), no beta/threshold


@lowering("Softsign", since=1)
def softsign(x):
    return x / (1 + torch.abs(x))


@lowering("Mish", since=18)
def mish(x):
    return x * torch.tanh(F.softplus(x))


@lowering("Swish", since=24)
def swish(x, *, alpha=1.0):
    return x * torch.sigmoid(alpha * x)


@lowering("Gelu", since=20)
def gelu(x, *, approximate="none"):
    return F.gelu(x, approximate=approximate)


@lowering("Shrink", since=9)
def shrink(x, *, bias=0.0, lambd=0.5):
    zero = torch.zeros_like(x)
    return torch.where(x < -lambd, x + bias, torch.where(x > lambd, x - bias, zero)).to(x.dtype)


@lowering("PRelu", since=7)
def prelu(x, slope):
    return torch.where(x < 0, x * slope, x)


@lowering("Clip", since=6)
def clip_attribute(x, *, max=3.4028234663852886e38, min=-3.4028234663852886e38):  # noqa: A002 (spec names)
    return torch.clamp(x, min, max)


@lowering("Clip", since=11)
def clip(x, low=None, high=None):
    if low is not None:
        x = torch.maximum(x, low.to(x.dtype))
    if high is not None:
        x = torch.minimum(x, high.to(x.dtype))
    return x if low is not None or high is not None else x.clone()


def _coerced(x, axis: int, fn):
    """Opset < 13: the input is seen as 2-D [prod(shape[:axis]), prod(shape[axis:])]."""
    axis = axis_of(axis, x.dim())
    flat = x.reshape(math.prod(x.shape[:axis]), -1)
    return fn(flat, 1).reshape(x.shape)


def _hardmax(x, axis):
    index = torch.argmax(x, dim=axis, keepdim=True)
    return torch.zeros_like(x).scatter(axis, index, 1)


@lowering("Softmax", since=1)
def softmax_coerced(x, *, axis=1):
    return _coerced(x, axis, lambda t, a: torch.softmax(t, a))


@lowering("Softmax", since=13)
def softmax(x, *, axis=-1):
    return torch.softmax(x, axis)


@lowering("LogSoftmax", since=1)
def log_softmax_coerced(x, *, axis=1):
    return _coerced(x, axis, lambda t, a: torch.log_softmax(t, a))


@lowering("LogSoftmax", since=13)
def log_softmax(x, *, axis=-1):
    return torch.log_softmax(x, axis)


@lowering("Hardmax", since=1)
def hardmax_coerced(x, *, axis=1):
    return _coerced(x, axis, _hardmax)


@lowering("Hardmax", since=13)
def hardmax(x, *, axis=-1):
    return _hardmax(x, axis_of(axis, x.dim()))


_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def apply_activation(y: torch.Tensor, name: str, params: tuple[float, ...]) -> torch.Tensor:
    """The ``edgeinfer`` domain's activation ``name`` (``edgeinfer.ir.lowering``) on ``y``."""
    if name == "":
        return y
    if name == "Relu":
        return torch.relu(y)
    if name == "Clip":
        return torch.clamp(y, params[0], params[1])
    if name == "LeakyRelu":
        return torch.where(y >= 0, y, y * params[0])
    if name == "Sigmoid":
        return torch.sigmoid(y)
    if name == "Tanh":
        return torch.tanh(y)
    if name == "HardSigmoid":
        return torch.clamp(y * params[0] + params[1], 0, 1)
    if name == "HardSwish":
        return hard_swish(y)
    if name == "Silu":
        return F.silu(y)
    if name == "Gelu":
        return F.gelu(y)
    if name == "GeluTanh":
        return F.gelu(y, approximate="tanh")
    raise ValueError(f"unknown activation {name!r}")
