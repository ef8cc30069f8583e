"""Helpers shared by the general kernels (axes, integer inputs, 0-d results).

Kernels raise plain ``ValueError``/``IndexError`` with what was expected and found; the
executor wraps them in a ``BackendError`` that names the node and its input shapes.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np


def as_array(result) -> np.ndarray:
    """numpy ufuncs and reductions return scalars for 0-d results; kernels return arrays."""
    return result if isinstance(result, np.ndarray) else np.asarray(result)


def normalize_axis(axis: int, rank: int, what: str = "axis") -> int:
    """``axis`` in ``[-rank, rank)`` -> ``[0, rank)``."""
    axis = int(axis)
    if not -rank <= axis < rank:
        raise ValueError(f"{what} {axis} is out of range for a rank-{rank} tensor "
                         f"(expected {-rank}..{rank - 1})")
    return axis + rank if axis < 0 else axis


def normalize_axes(axes: Iterable[int], rank: int, what: str = "axes") -> tuple[int, ...]:
    """Each axis normalized; duplicates are an error."""
    out = tuple(normalize_axis(a, rank, what) for a in axes)
    if len(set(out)) != len(out):
        raise ValueError(f"{what} {list(axes)} repeat an axis (rank {rank})")
    return out


def int_list(tensor, what: str) -> list[int]:
    """A 0-d or 1-d integer tensor (shape, axes, pads...) as a list of python ints."""
    array = np.asarray(tensor)
    if array.dtype.kind not in "iu":
        raise ValueError(f"{what}: expected an integer tensor, got dtype {array.dtype}")
    if array.ndim > 1:
        raise ValueError(f"{what}: expected a 1-D tensor, got shape {list(array.shape)}")
    return [int(v) for v in array.reshape(-1)]


def scalar_of(tensor, what: str):
    """The single value of a 0-d or one-element tensor."""
    array = np.asarray(tensor)
    if array.size != 1:
        raise ValueError(f"{what}: expected a scalar (one element), got shape {list(array.shape)}")
    return array.reshape(-1)[0]
