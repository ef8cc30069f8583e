"""Reductions (ReduceSum ... ReduceLogSumExp), axes as an attribute (opset 1) or as an input
(ReduceSum 13, the others 18, with ``noop_with_empty_axes``), and CumSum / CumProd."""

from __future__ import annotations

import torch

from edgeinfer.backends.torch.registry import axis_of, ints, lowering, scalar


def _sum(x, axes, keep):
    return torch.sum(x, dim=axes, keepdim=keep)


def _prod(x, axes, keep):
    for axis in sorted(axes, reverse=True):
        x = torch.prod(x, dim=axis, keepdim=keep)
    return x


def _max(x, axes, keep):
    return torch.amax(x, dim=axes, keepdim=keep)


def _min(x, axes, keep):
    return torch.amin(x, dim=axes, keepdim=keep)


REDUCERS = {
    "ReduceSum": _sum,
    "ReduceMean": lambda x, a, k: torch.mean(x if x.is_floating_point() else x.double(), dim=a, keepdim=k),
    "ReduceMax": _max,
    "ReduceMin": _min,
    "ReduceProd": _prod,
    "ReduceL1": lambda x, a, k: _sum(torch.abs(x), a, k),
    "ReduceL2": lambda x, a, k: torch.sqrt(_sum(x * x, a, k)),
    "ReduceLogSum": lambda x, a, k: torch.log(_sum(x, a, k)),
    "ReduceLogSumExp": lambda x, a, k: torch.logsumexp(x, dim=a, keepdim=k),
    "ReduceSumSquare": lambda x, a, k: _sum(x * x, a, k),
}


def _reduce(op: str, data, axes: list[int], keepdims: int, noop: int):
    if not axes:
        if noop:
            return data
        axes = list(range(data.dim()))
    axes = sorted({axis_of(a, data.dim()) for a in axes})
    if data.dim() == 0:
        return REDUCERS[op](data.reshape(1), [0], False)
    if op in ("ReduceMax", "ReduceMin") and any(data.shape[a] == 0 for a in axes):
        fill = _identity(op, data.dtype)
        shape = [1 if i in axes else d for i, d in enumerate(data.shape)] if keepdims else \
            [d for i, d in enumerate(data.shape) if i not in axes]
        return torch.full(shape, fill, dtype=data.dtype, device=data.device)
    result = REDUCERS[op](data, axes, bool(keepdims))
    return result.to(data.dtype)


def _identity(op: str, dtype: torch.dtype):
    """The identity of max / min: what a reduction over an empty set gives."""
    if dtype == torch.bool:
        return op == "ReduceMin"
    if dtype.is_floating_point:
        return float("-inf") if op == "ReduceMax" else float("inf")
    info = torch.iinfo(dtype)
    return info.min if op == "ReduceMax" else info.max


def _register(op: str, input_since: int) -> None:
    def with_attribute(data, *, axes=None, keepdims=1):
        return _reduce(op, data, list(axes or []), keepdims, 0)

    def with_input(data, axes=None, *, keepdims=1, noop_with_empty_axes=0):
        return _reduce(op, data, ints(axes), keepdims, noop_with_empty_axes)

    with_attribute.__name__ = f"{op.lower()}_attribute"
    with_input.__name__ = op.lower()
    lowering(op, since=1)(with_attribute)
    lowering(op, since=input_since, static=(1,))(with_input)


for _op in REDUCERS:
    _register(_op, 13 if _op == "ReduceSum" else 18)


def _cumulative(fn, x, axis, exclusive, reverse, identity):
    axis = axis_of(int(scalar(axis)), x.dim())
    if reverse:
        x = x.flip(axis)
    y = fn(x, dim=axis)
    if exclusive:
        pad = torch.full_like(x.narrow(axis, 0, 1), identity)
        y = torch.cat([pad, y.narrow(axis, 0, x.shape[axis] - 1)], axis)
    return y.flip(axis) if reverse else y


@lowering("CumSum", since=11, static=(1,))
def cum_sum(x, axis, *, exclusive=0, reverse=0):
    return _cumulative(torch.cumsum, x, axis, exclusive, reverse, 0).to(x.dtype)


@lowering("CumProd", since=26, static=(1,))
def cum_prod(x, axis, *, exclusive=0, reverse=0):
    return _cumulative(torch.cumprod, x, axis, exclusive, reverse, 1).to(x.dtype)
