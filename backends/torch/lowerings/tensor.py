"""Tensor ops: Concat, Split, Slice, Tile, Pad, Trilu, Compress, NonZero, ReverseSequence, Dropout."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from edgeinfer.backends.torch.registry import LoweringContext, axis_of, ints, lowering, scalar


@lowering("Concat", since=4)
def concat(*inputs, axis):
    return torch.cat(inputs, axis_of(axis, inputs[0].dim()))


def _split(data, axis, sizes, count):
    axis = axis_of(axis, data.dim())
    if not sizes:
        length = data.shape[axis]
        step = -(-length // count)  # the last part may be smaller (opset 18 num_outputs)
        sizes = [min(step, length - i * step) for i in range(count)]
    return tuple(torch.split(data, sizes, axis))


@lowering("Split", since=2)
def split_attribute(data, *, axis=0, split=None, _ctx: LoweringContext):
    return _split(data, axis, list(split or []), _ctx.num_outputs)


@lowering("Split", since=13, static=(1,))
def split(data, split=None, *, axis=0, num_outputs=None, _ctx: LoweringContext):
    return _split(data, axis, ints(split), num_outputs or _ctx.num_outputs)


def _clamped(start: int, end: int, step: int, size: int) -> tuple[int, int]:
    """ONNX Slice's clamping of one axis' start and end."""
    start = start + size if start < 0 else start
    end = end + size if end < 0 else end
    if step > 0:
        return max(0, min(size, start)), max(0, min(size, end))
    return max(-1, min(size - 1, start)), max(-1, min(size - 1, end))


@lowering("Slice", since=10, static=(1, 2, 3, 4))
def slice_(data, starts, ends, axes=None, steps=None):
    starts, ends = ints(starts), ints(ends)
    axes = ints(axes) if axes is not None else list(range(len(starts)))
    steps = ints(steps) if steps is not None else [1] * len(starts)
    index = [slice(None)] * data.dim()
    flips = []
    for start, end, axis, step in zip(starts, ends, axes, steps, strict=True):
        axis = axis_of(axis, data.dim())
        start, end = _clamped(start, end, step, data.shape[axis])
        if step > 0:
            index[axis] = slice(start, end, step)
        else:  # torch has no negative steps: take the positions in reverse order
            flips.append((axis, torch.arange(start, end, step, device=data.device)))
    result = data[tuple(index)]
    for axis, positions in flips:
        result = result.index_select(axis, positions)
    return result


@lowering("Tile", since=6, static=(1,))
def tile(data, repeats):
    return data.repeat(ints(repeats))


def _size(value) -> int:
    return value.numel() if isinstance(value, torch.Tensor) else len(value) if isinstance(value, list) else 1


def _pad_indices(size: int, before: int, after: int, mode: str, device) -> torch.Tensor:
    position = torch.arange(-before, size + after, device=device)
    if mode == "edge":
        return position.clamp(0, size - 1)
    if mode == "wrap":
        return position.remainder(size)
    period = 2 * (size - 1)  # reflect: mirrored about the first and last element
    if period == 0:
        return torch.zeros_like(position)
    folded = position.remainder(period)
    return torch.where(folded < size, folded, period - folded)


@lowering("Pad", since=11, static=(1, 2, 3))
def pad(data, pads, constant_value=None, axes=None, *, mode="constant"):
    rank = data.dim()
    pads = ints(pads)
    axes = [axis_of(a, rank) for a in ints(axes)] if axes is not None else list(range(rank))
    count = len(axes)
    before = dict(zip(axes, pads[:count], strict=True))
    after = dict(zip(axes, pads[count:], strict=True))
    if mode == "constant":
        flat = []
        for axis in reversed(range(rank)):  # torch: last axis first
            flat += [before.get(axis, 0), after.get(axis, 0)]
        value = scalar(constant_value) if constant_value is not None and _size(constant_value) else 0
        return F.pad(data, flat, value=value)
    result = data
    for axis in axes:
        if before[axis] or after[axis]:
            index = _pad_indices(result.shape[axis], before[axis], after[axis], mode, data.device)
            result = result.index_select(axis, index)
    return result


@lowering("Trilu", since=14, static=(1,))
def trilu(data, k=None, *, upper=1):
    diagonal = ints(k)[0] if k is not None else 0
    return torch.triu(data, diagonal) if upper else torch.tril(data, diagonal)


@lowering("Compress", since=9)
def compress(data, condition, *, axis=None):
    if axis is None:
        data, axis = data.reshape(-1), 0
    axis = axis_of(axis, data.dim())
    keep = torch.nonzero(condition.reshape(-1)[: data.shape[axis]]).reshape(-1)
    return data.index_select(axis, keep)


@lowering("NonZero", since=9)
def nonzero(data):
    if data.dim() == 0:
        return torch.zeros((0, int(bool(data))), dtype=torch.int64, device=data.device)
    return torch.nonzero(data).T.contiguous()


@lowering("ReverseSequence", since=10)
def reverse_sequence(data, sequence_lens, *, batch_axis=1, time_axis=0):
    result = data.clone()
    for batch, length in enumerate(ints(sequence_lens)):
        row = data.select(batch_axis, batch)
        axis = time_axis if time_axis < batch_axis else time_axis - 1
        flipped = row.narrow(axis, 0, length).flip(axis)
        result.select(batch_axis, batch).narrow(axis, 0, length).copy_(flipped)
    return result


def _dropout(data, ctx: LoweringContext):
    if ctx.num_outputs > 1:
        return data, torch.ones(data.shape, dtype=torch.bool, device=data.device)
    return data


@lowering("Dropout", since=7)
def dropout_attribute(data, *, ratio=0.5, is_test=0, _ctx: LoweringContext):
    return _dropout(data, _ctx)


@lowering("Dropout", since=12, static=(1, 2), check=lambda node, graph: _training_reason(node, graph))
def dropout(data, ratio=None, training_mode=None, *, seed=None, _ctx: LoweringContext):
    if training_mode is not None and bool(scalar(training_mode)):
        raise ValueError("Dropout in training mode draws random masks; the torch backend runs inference only")
    return _dropout(data, _ctx)


def _training_reason(node, graph) -> str | None:
    if len(node.inputs) > 2 and node.inputs[2]:
        mode = graph.initializers.get(node.inputs[2])
        if mode is None or bool(mode.reshape(-1)[0]):
            return "Dropout with a training_mode input (random masks) is not lowered: inference only"
    return None
