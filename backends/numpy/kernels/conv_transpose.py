"""ConvTranspose: one batched matmul to columns, then col2im by strided accumulation.

``cols[N, G, M/G * K, L] = W[G, C/G, M/G * K]^T @ X[N, G, C/G, L]`` (BLAS reads the
transposed weight view without copying), then every kernel tap adds its ``[N, M, *in]`` slice
of the columns into a strided view of the full-size output: ``prod(K)`` vectorized adds.

Output geometry (ONNX spec): the full output along an axis is
``s * (n - 1) + output_padding + (k - 1) * d + 1``; explicit ``pads`` crop it. With
``output_shape`` (or ``auto_pad`` SAME_*, which asks for ``n * s``), the total padding is
``full - output_shape``, split with the larger half at the end for SAME_UPPER and at the
beginning otherwise. A negative total padding (an output larger than the full result) is
filled with zeros.
"""

from __future__ import annotations

import numpy as np

from edgeinfer.backends.numpy import parallel
from edgeinfer.backends.numpy.kernels.nn_common import (
    AUTO_PADS,
    as_compute,
    compute_dtype,
    kernel_taps,
    prod,
    spatial_attrs,
    tap_slices,
)
from edgeinfer.backends.numpy.registry import kernel


def _geometry(x, w, group, auto_pad, dilations, kernel_shape, output_padding, output_shape, pads, strides):
    op = "ConvTranspose"
    if x.ndim < 3 or w.ndim != x.ndim:
        raise ValueError(f"{op}: expected X of rank >= 3 and W of the same rank, found shapes "
                         f"{list(x.shape)} and {list(w.shape)}")
    if group < 1 or w.shape[0] != x.shape[1] or x.shape[1] % group:
        raise ValueError(f"{op}: expected W.shape[0] ({w.shape[0]}) = X channels ({x.shape[1]}), "
                         f"divisible by group ({group})")
    if auto_pad not in AUTO_PADS:
        raise ValueError(f"{op}: expected auto_pad in {AUTO_PADS}, found {auto_pad!r}")
    spatial = x.shape[2:]
    rank = len(spatial)
    kernel_shape = tuple(kernel_shape) if kernel_shape else w.shape[2:]
    kernel_, strides, dilations, pads = spatial_attrs(op, spatial, kernel_shape, strides, dilations, pads)
    output_padding = tuple(output_padding) if output_padding else (0,) * rank
    full = [s * (n - 1) + op_ + (k - 1) * d + 1
            for n, k, s, d, op_ in zip(spatial, kernel_, strides, dilations, output_padding, strict=False)]
    if output_shape:
        wanted = list(output_shape)[-rank:]
    elif auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        wanted = [n * s for n, s in zip(spatial, strides, strict=False)]
    else:
        wanted = None
    if wanted is None:
        begin = list(pads[:rank]) if auto_pad == "NOTSET" else [0] * rank
        end = list(pads[rank:]) if auto_pad == "NOTSET" else [0] * rank
        wanted = [f - b - e for f, b, e in zip(full, begin, end, strict=False)]
    else:
        totals = [f - o for f, o in zip(full, wanted, strict=False)]
        upper = auto_pad == "SAME_UPPER"
        begin = [t // 2 if upper else t - t // 2 for t in totals]
    if min(wanted) < 1:
        raise ValueError(f"{op}: pads {list(pads)} leave no output from a full result of {full}")
    return kernel_, strides, dilations, full, begin, wanted


@kernel("ConvTranspose", since=1)
def conv_transpose(x, w, b=None, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None,
                   output_padding=None, output_shape=None, pads=None, strides=None):
    kernel_, strides, dilations, full, begin, wanted = _geometry(
        x, w, group, auto_pad, dilations, kernel_shape, output_padding, output_shape, pads, strides)
    dtype = compute_dtype(x.dtype)
    n, channels = x.shape[:2]
    spatial = x.shape[2:]
    group_out = w.shape[1]
    m = group_out * group
    xc = as_compute(x, dtype).reshape(n, group, channels // group, prod(spatial))
    wt = as_compute(w, dtype).reshape(group, channels // group, group_out * prod(kernel_)).transpose(0, 2, 1)
    with parallel.blas_for(n * wt.shape[0] * wt.shape[1] * wt.shape[2] * xc.shape[-1]):
        cols = np.matmul(wt, xc).reshape(n, m, prod(kernel_), *spatial)
    canvas = np.zeros((n, m, *full), dtype=dtype)
    for tap, (_, offsets) in enumerate(kernel_taps(kernel_, dilations)):
        canvas[tap_slices(offsets, strides, spatial)] += cols[:, :, tap]
    y = _crop(canvas, begin, wanted)
    if b is not None:
        if b.shape != (m,):
            raise ValueError(f"ConvTranspose: expected B of shape [{m}], found {list(b.shape)}")
        y += as_compute(b, dtype).reshape((-1,) + (1,) * len(spatial))
    return y.astype(x.dtype, copy=False)


def _crop(canvas: np.ndarray, begin: list[int], sizes: list[int]) -> np.ndarray:
    """``canvas[..., b:b+size]`` per spatial axis; parts outside the canvas are zeros."""
    lead = canvas.ndim - len(begin)
    full = canvas.shape[lead:]
    if all(b >= 0 and b + s <= f for b, s, f in zip(begin, sizes, full, strict=False)):
        return canvas[(Ellipsis, *(slice(b, b + s) for b, s in zip(begin, sizes, strict=False)))].copy()
    out = np.zeros(canvas.shape[:lead] + tuple(sizes), dtype=canvas.dtype)
    src, dst = [], []
    for b, s, f in zip(begin, sizes, full, strict=False):
        lo, hi = max(b, 0), min(b + s, f)
        src.append(slice(lo, max(lo, hi)))
        dst.append(slice(lo - b, lo - b + max(0, hi - lo)))
    out[(Ellipsis, *dst)] = canvas[(Ellipsis, *src)]
    return out
