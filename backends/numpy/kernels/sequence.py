"""Sequence ops: a sequence is a python list of arrays. Kernels never change a list they are
given (a Loop may still hold it); inserting or erasing builds a new one."""

from __future__ import annotations

import numpy as np

from edgeinfer.backends.numpy.kernels._general import int_list, normalize_axis, scalar_of
from edgeinfer.backends.numpy.registry import kernel


def _position(position, length: int, *, insert: bool = False) -> int:
    """A position in ``[-length, length - 1]`` (``[-length, length]`` to insert) -> a list index."""
    index = int(scalar_of(position, "position"))
    high = length if insert else length - 1
    if not -length <= index <= high:
        raise IndexError(f"position {index} is out of range for a sequence of {length} tensors "
                         f"(expected {-length}..{high})")
    return index + length if index < 0 else index


@kernel("SequenceEmpty", since=11)
def sequence_empty(*, dtype=None):
    return []


@kernel("SequenceConstruct", since=11)
def sequence_construct(*inputs):
    return list(inputs)


@kernel("SequenceLength", since=11)
def sequence_length(sequence):
    return np.array(len(sequence), dtype=np.int64)


@kernel("SequenceAt", since=11)
def sequence_at(sequence, position):
    return sequence[_position(position, len(sequence))]


@kernel("SequenceInsert", since=11)
def sequence_insert(sequence, tensor, position=None):
    index = len(sequence) if position is None else _position(position, len(sequence), insert=True)
    return [*sequence[:index], tensor, *sequence[index:]]


@kernel("SequenceErase", since=11)
def sequence_erase(sequence, position=None):
    index = _position(-1 if position is None else position, len(sequence))
    return [*sequence[:index], *sequence[index + 1:]]


@kernel("ConcatFromSequence", since=11)
def concat_from_sequence(sequence, *, axis, new_axis=0):
    if not sequence:
        raise ValueError("cannot concatenate an empty sequence")
    rank = np.ndim(sequence[0])
    if new_axis:
        return np.stack(sequence, axis=normalize_axis(axis, rank + 1))
    return np.concatenate(sequence, axis=normalize_axis(axis, rank))


@kernel("SplitToSequence", since=11)
def split_to_sequence(data, split=None, *, axis=0, keepdims=1):
    """No ``split``: pieces of length 1 (squeezed unless ``keepdims``); a scalar ``split``: pieces
    of that length, the last one shorter; a 1-D ``split``: the pieces' lengths."""
    axis = normalize_axis(axis, data.ndim)
    length = data.shape[axis]
    if split is None:
        pieces = [np.take(data, [i] if keepdims else i, axis=axis) for i in range(length)]
        return pieces
    if np.ndim(split) == 0:
        size = int(scalar_of(split, "split"))
        if size <= 0:
            raise ValueError(f"split must be positive, found {size}")
        sizes = [min(size, length - start) for start in range(0, length, size)]
    else:
        sizes = int_list(split, "split")
        if sum(sizes) != length or min(sizes, default=0) < 0:
            raise ValueError(f"split sizes {sizes} must be non-negative and sum to dim {axis} of size {length}")
    return list(np.split(data, np.cumsum(sizes)[:-1], axis=axis))
