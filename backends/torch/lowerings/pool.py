"""Pooling: MaxPool (with its Indices output), AveragePool, LpPool and the global poolings.

Pads follow ONNX (begin values of every axis, then end values; ``auto_pad``). MaxPool uses
torch's padding where it is symmetric and at most half the kernel, else pads with -inf first.
AveragePool and LpPool are sum poolings of the padded input divided by the number of counted
elements (``count_include_pad``), which covers asymmetric pads and ``ceil_mode`` alike.
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F

from edgeinfer.backends.torch.lowerings.conv import same_pads
from edgeinfer.backends.torch.registry import LoweringContext, lowering

_MAX = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}


def _geometry(x, kernel_shape, strides, dilations, pads, auto_pad):
    rank = x.dim() - 2
    kernel = list(kernel_shape)
    strides = list(strides) if strides else [1] * rank
    dilations = list(dilations) if dilations else [1] * rank
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        pads = same_pads(x.shape[2:], kernel, strides, dilations, auto_pad)
    elif auto_pad == "VALID" or not pads:
        pads = [0] * (2 * rank)
    return rank, kernel, strides, dilations, list(pads)


def _torch_pads(pads, rank):
    flat = []
    for axis in reversed(range(rank)):
        flat += [pads[axis], pads[rank + axis]]
    return flat


def _rank_check(node, graph) -> str | None:
    value = graph.values.get(node.inputs[0])
    if value is not None and value.shape is not None and len(value.shape) - 2 not in _MAX:
        return f"{len(value.shape) - 2}-D pooling: torch pools 1-D, 2-D and 3-D only"
    return None


@lowering("MaxPool", since=1, check=_rank_check)
def max_pool(x, *, auto_pad="NOTSET", ceil_mode=0, dilations=None, kernel_shape, pads=None, storage_order=0,
             strides=None, _ctx: LoweringContext):
    rank, kernel, strides, dilations, pads = _geometry(x, kernel_shape, strides, dilations, pads, auto_pad)
    dtype = x.dtype
    data = x if x.is_floating_point() else x.double()  # exact for the integer types MaxPool takes
    begin, end = pads[:rank], pads[rank:]
    pre_padded = begin != end or any(2 * p > k for p, k in zip(begin, kernel, strict=True))
    if pre_padded:
        data = F.pad(data, _torch_pads(pads, rank), value=float("-inf"))
        padding = [0] * rank
    else:
        padding = begin
    want_indices = _ctx.num_outputs > 1
    result = _MAX[rank](data, kernel, strides, padding, dilations, ceil_mode=bool(ceil_mode),
                        return_indices=want_indices)
    if pre_padded:
        effective = [(k - 1) * d + 1 for k, d in zip(kernel, dilations, strict=True)]
        crop = functools.partial(_onnx_output, x=x, kernel=effective, strides=strides, pads=pads, ceil_mode=ceil_mode)
        result = tuple(map(crop, result)) if want_indices else crop(result)
    if not want_indices:
        return result.to(dtype)
    values, indices = result
    return values.to(dtype), _onnx_indices(indices, x.shape, data.shape, begin if pre_padded else [0] * rank,
                                           storage_order)


def _onnx_indices(indices, shape, searched_shape, begin, storage_order):
    """torch's per-plane indices (into the searched, possibly padded, plane) -> ONNX's indices into
    the whole input, row-major (``storage_order=0``) or column-major over the spatial axes."""
    spatial, searched = list(shape[2:]), list(searched_shape[2:])
    coords = []
    rest = indices
    for size in reversed(searched):
        coords.append(rest % size)
        rest = rest // size
    coords = [c - b for c, b in zip(reversed(coords), begin, strict=True)]
    order = range(len(spatial)) if not storage_order else reversed(range(len(spatial)))
    flat = torch.zeros_like(indices)
    for axis in order:
        flat = flat * spatial[axis] + coords[axis]
    plane = math.prod(spatial)
    n, c = shape[0], shape[1]
    base = (torch.arange(n * c, device=indices.device) * plane).reshape(n, c, *([1] * len(spatial)))
    return flat + base


def _onnx_output(y, x, kernel, strides, pads, ceil_mode):
    """``y`` cropped to ONNX's output size: with ``ceil_mode`` the last window must start inside
    the input or its begin padding (a sum pool of a padded input also keeps windows that start
    in the end padding)."""
    rank = x.dim() - 2
    for axis in range(rank):
        size, begin, end = x.shape[2 + axis], pads[axis], pads[rank + axis]
        span = size + begin + end - kernel[axis]
        out = (-(-span // strides[axis]) if ceil_mode else span // strides[axis]) + 1
        if ceil_mode and (out - 1) * strides[axis] >= size + begin:
            out -= 1
        if y.shape[2 + axis] > out:
            y = y.narrow(2 + axis, 0, out)
    return y


def _sum_pool(x, kernel, strides, ceil_mode):
    rank = x.dim() - 2
    if rank == 1:
        return _sum_pool(x.unsqueeze(2), [1, *kernel], [1, *strides], ceil_mode).squeeze(2)
    pool = F.avg_pool2d if rank == 2 else F.avg_pool3d
    return pool(x, kernel, strides, 0, ceil_mode=bool(ceil_mode), count_include_pad=False, divisor_override=1)


def _no_dilation(node, graph) -> str | None:
    if any(d != 1 for d in node.attrs.get("dilations", None) or []):
        return "dilated average / Lp pooling is not lowered (torch's avg_pool has no dilation)"
    return _rank_check(node, graph)


@lowering("AveragePool", since=1, check=_no_dilation)
def average_pool(x, *, auto_pad="NOTSET", ceil_mode=0, count_include_pad=0, dilations=None, kernel_shape,
                 pads=None, strides=None):
    rank, kernel, strides, _, pads = _geometry(x, kernel_shape, strides, dilations, pads, auto_pad)
    if not any(pads) and not ceil_mode:
        return {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}[rank](x, kernel, strides)
    flat = _torch_pads(pads, rank)
    ones = torch.ones((1, 1, *x.shape[2:]), dtype=x.dtype, device=x.device)
    counted = F.pad(ones, flat, value=1.0 if count_include_pad else 0.0)
    sums = _sum_pool(F.pad(x, flat), kernel, strides, ceil_mode)
    average = sums / _sum_pool(counted, kernel, strides, ceil_mode)
    return _onnx_output(average, x, kernel, strides, pads, ceil_mode)


@lowering("LpPool", since=1, check=_no_dilation)
def lp_pool(x, *, auto_pad="NOTSET", ceil_mode=0, dilations=None, kernel_shape, p=2, pads=None, strides=None):
    rank, kernel, strides, _, pads = _geometry(x, kernel_shape, strides, dilations, pads, auto_pad)
    powered = F.pad(torch.abs(x) ** p, _torch_pads(pads, rank))
    pooled = _sum_pool(powered, kernel, strides, ceil_mode) ** (1.0 / p)
    return _onnx_output(pooled, x, kernel, strides, pads, ceil_mode)


@lowering("GlobalAveragePool", since=1)
def global_average_pool(x):
    return torch.mean(x, dim=list(range(2, x.dim())), keepdim=True)


@lowering("GlobalMaxPool", since=1)
def global_max_pool(x):
    return torch.amax(x, dim=list(range(2, x.dim())), keepdim=True)


@lowering("GlobalLpPool", since=1)
def global_lp_pool(x, *, p=2):
    return torch.sum(torch.abs(x) ** p, dim=list(range(2, x.dim())), keepdim=True) ** (1.0 / p)
