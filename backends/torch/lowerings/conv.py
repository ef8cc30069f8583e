"""Conv and ConvTranspose (1-D, 2-D, 3-D) with ONNX padding: explicit ``pads`` (begin values
of every axis, then end values), ``auto_pad`` SAME_UPPER / SAME_LOWER / VALID. Symmetric pads
go to torch's ``padding``; asymmetric ones are applied with ``F.pad`` first (Conv) or cropped
from the full result (ConvTranspose)."""

from __future__ import annotations

import torch.nn.functional as F

from edgeinfer.backends.torch.registry import lowering

_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
_CONV_TRANSPOSE = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}


def _spatial_check(node, graph) -> str | None:
    value = graph.values.get(node.inputs[1])
    rank = len(value.shape) - 2 if value is not None and value.shape is not None else None
    if rank is not None and rank not in _CONV:
        return f"{rank}-D convolution: torch has 1-D, 2-D and 3-D convolutions only"
    return None


def same_pads(spatial, kernel, strides, dilations, auto_pad) -> list[int]:
    begin, end = [], []
    for size, k, s, d in zip(spatial, kernel, strides, dilations, strict=True):
        out = -(-size // s)
        total = max((out - 1) * s + (k - 1) * d + 1 - size, 0)
        small = total // 2
        begin.append(small if auto_pad == "SAME_UPPER" else total - small)
        end.append(total - begin[-1])
    return begin + end


def conv_geometry(x, w, b=None, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None,
                  strides=None):
    rank = x.dim() - 2
    kernel = list(kernel_shape) if kernel_shape else list(w.shape[2:])
    strides = list(strides) if strides else [1] * rank
    dilations = list(dilations) if dilations else [1] * rank
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        pads = same_pads(x.shape[2:], kernel, strides, dilations, auto_pad)
    elif auto_pad == "VALID" or not pads:
        pads = [0] * (2 * rank)
    pads = list(pads)
    begin, end = pads[:rank], pads[rank:]
    if begin != end:
        flat = []
        for axis in reversed(range(rank)):
            flat += [begin[axis], end[axis]]
        x, begin = F.pad(x, flat), [0] * rank
    return _CONV[rank](x, w, b, stride=strides, padding=begin, dilation=dilations, groups=group)


@lowering("Conv", since=1, check=_spatial_check)
def conv(x, w, b=None, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None, strides=None):
    return conv_geometry(x, w, b, auto_pad=auto_pad, dilations=dilations, group=group,
                         kernel_shape=kernel_shape, pads=pads, strides=strides)


@lowering("ConvTranspose", since=1, check=_spatial_check)
def conv_transpose(x, w, b=None, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None,
                   output_padding=None, output_shape=None, pads=None, strides=None):
    """The full result ``s * (n - 1) + output_padding + (k - 1) * d + 1`` per axis, then cropped by
    the pads (from ``output_shape`` or SAME_*: the total split with the larger half at the end
    for SAME_UPPER, at the beginning otherwise); a larger wanted output is zero-filled."""
    rank = x.dim() - 2
    spatial = list(x.shape[2:])
    kernel = list(kernel_shape) if kernel_shape else list(w.shape[2:])
    strides = list(strides) if strides else [1] * rank
    dilations = list(dilations) if dilations else [1] * rank
    extra = list(output_padding) if output_padding else [0] * rank
    full = [s * (n - 1) + p + (k - 1) * d + 1 for n, k, s, d, p in zip(spatial, kernel, strides, dilations, extra,
                                                                        strict=True)]
    if output_shape:
        wanted = list(output_shape)[-rank:]
    elif auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        wanted = [n * s for n, s in zip(spatial, strides, strict=True)]
    else:
        wanted = None
    if wanted is None:
        given = list(pads) if pads and auto_pad == "NOTSET" else [0] * (2 * rank)
        begin = given[:rank]
        wanted = [f - b_ - e for f, b_, e in zip(full, begin, given[rank:], strict=True)]
    else:
        totals = [f - o for f, o in zip(full, wanted, strict=True)]
        begin = [t // 2 if auto_pad == "SAME_UPPER" else t - t // 2 for t in totals]
    # torch's output_padding must stay below stride or dilation: add it as zero rows instead
    y = _CONV_TRANSPOSE[rank](x, w, None, stride=strides, padding=0, dilation=dilations, groups=group)
    flat = []
    for axis in reversed(range(rank)):
        start = begin[axis]
        flat += [-start, wanted[axis] + start - y.shape[2 + axis]]
    y = F.pad(y, flat)
    if b is not None:
        y = y + b.reshape(1, -1, *([1] * rank))
    return y
