"""Comparisons, boolean logic, bitwise ops and ``Where`` (all with multidirectional broadcasting)."""

from __future__ import annotations

import numpy as np

from edgeinfer.backends.numpy.kernels._general import as_array
from edgeinfer.backends.numpy.registry import kernel


def _binary(op_type: str, since: int, ufunc) -> None:
    def run(a, b):
        return as_array(ufunc(a, b))

    run.__name__ = run.__qualname__ = op_type.lower()
    run.__doc__ = f"ONNX {op_type}: ``numpy.{ufunc.__name__}`` with broadcasting."
    kernel(op_type, since=since)(run)


for _op, _since, _ufunc in [
    ("Equal", 7, np.equal), ("Less", 7, np.less), ("LessOrEqual", 12, np.less_equal), ("Greater", 7, np.greater),
    ("GreaterOrEqual", 12, np.greater_equal), ("And", 7, np.logical_and), ("Or", 7, np.logical_or),
    ("Xor", 7, np.logical_xor), ("BitwiseAnd", 18, np.bitwise_and), ("BitwiseOr", 18, np.bitwise_or),
    ("BitwiseXor", 18, np.bitwise_xor),
]:
    _binary(_op, _since, _ufunc)


@kernel("Not", since=1)
def logical_not(x):
    return as_array(np.logical_not(x))


@kernel("BitwiseNot", since=18)
def bitwise_not(x):
    return as_array(np.invert(x))


@kernel("BitShift", since=11)
def bit_shift(x, y, *, direction):
    """Shift counts outside ``[0, bits)`` give 0 (or -1 for a right shift of a negative
    signed value), as the spec requires; numpy alone leaves them platform-defined."""
    if direction not in ("LEFT", "RIGHT"):
        raise ValueError(f"direction must be 'LEFT' or 'RIGHT', found {direction!r}")
    x, y = np.broadcast_arrays(x, y)
    bits = np.iinfo(x.dtype).bits
    in_range = (y >= 0) & (y < bits)
    count = np.where(in_range, y, 0).astype(x.dtype)
    if direction == "LEFT":
        unsigned = np.dtype(f"u{x.dtype.itemsize}")  # left shift of a signed value: bit pattern
        shifted = np.left_shift(x.view(unsigned) if x.dtype.kind == "i" else x,
                                count.view(unsigned) if x.dtype.kind == "i" else count).view(x.dtype)
        return np.where(in_range, shifted, np.zeros((), x.dtype))
    overflow = np.where(x < 0, -1, 0).astype(x.dtype) if x.dtype.kind == "i" else np.zeros((), x.dtype)
    return np.where(in_range, np.right_shift(x, count), overflow)


@kernel("Where", since=9)
def where(condition, x, y):
    return as_array(np.where(condition, x, y))
