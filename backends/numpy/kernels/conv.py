"""Conv (1-D, 2-D, 3-D; grouped, depthwise, dilated, strided, padded).

Three paths, none of which loops over pixels:

- pointwise (1x1 kernel, stride 1, no pads): the input is already the column matrix, so
  ``W[M, C] @ X[N, C, L]`` is one BLAS call per image and group, without any copy;
- depthwise (one input channel per group): ``k**d`` multiply-adds of strided views of the
  padded input over the whole tensor, instead of a per-channel loop;
- everything else: im2col through a strided view of the padded input (one copy into the
  ``[N, G, C/G * K, L]`` column matrix) and one batched matmul into a preallocated output.

float32 stays float32 and float64 stays float64; half types are computed in float32.
``conv_nd`` is shared with ConvInteger and QLinearConv, which pass float64 operands: products
of 8-bit (and 16-bit) values summed in float64 are exact, so BLAS gives exact integer results.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.lib.stride_tricks import as_strided

from edgeinfer.backends.numpy.kernels.nn_common import (
    as_compute,
    compute_dtype,
    kernel_taps,
    pad_spatial,
    prod,
    spatial_attrs,
    tap_slices,
    window_geometry,
)
from edgeinfer.backends.numpy.registry import kernel


def conv_nd(x: np.ndarray, w: np.ndarray, *, group: int, strides: Sequence[int], dilations: Sequence[int],
            begin: Sequence[int], end: Sequence[int], out_sizes: Sequence[int]) -> np.ndarray:
    """Convolution of ``x`` [N, C, *S] with ``w`` [M, C/group, *K] (same dtype), no bias."""
    n, channels = x.shape[:2]
    m, group_channels = w.shape[:2]
    kernel = w.shape[2:]
    length = prod(out_sizes)
    out = np.empty((n, m, *out_sizes), dtype=x.dtype)
    if group_channels == 1 and group == channels and kernel and prod(kernel) > 1:
        return _depthwise(x, w, strides, dilations, begin, end, out)
    if all(k == 1 for k in kernel) and all(s == 1 for s in strides) and not any(begin) and not any(end):
        cols = x.reshape(n, group, group_channels, length)
    else:
        cols = _im2col(pad_spatial(x, begin, end), group, kernel, strides, dilations, out_sizes)
    weights = w.reshape(group, m // group, group_channels * prod(kernel))
    if n == 1 and group == 1:  # the common inference case: one plain 2-D GEMM
        np.matmul(weights[0], cols[0, 0], out=out.reshape(m, length))
    else:
        np.matmul(weights, cols, out=out.reshape(n, group, m // group, length))
    return out


def _im2col(xp: np.ndarray, group: int, kernel: Sequence[int], strides: Sequence[int],
            dilations: Sequence[int], out_sizes: Sequence[int]) -> np.ndarray:
    """[N, G, C/G * prod(K), prod(out)] columns of a padded input (one copy)."""
    n, channels = xp.shape[:2]
    spatial_strides = xp.strides[2:]
    view = as_strided(
        xp,
        shape=(n, channels, *kernel, *out_sizes),
        strides=(*xp.strides[:2], *(st * d for st, d in zip(spatial_strides, dilations, strict=False)),
                 *(st * s for st, s in zip(spatial_strides, strides, strict=False))),
        writeable=False)
    return view.reshape(n, group, channels // group * prod(kernel), prod(out_sizes))


_BLOCK_BYTES = 128 * 1024


def _depthwise(x: np.ndarray, w: np.ndarray, strides, dilations, begin, end, out: np.ndarray) -> np.ndarray:
    """Grouped conv with one input channel per group: accumulate shifted views, one per tap.

    With unit strides every tap reads a *contiguous* run of the flattened padded input (the
    output is computed over the padded width and cropped once), which numpy streams much
    faster than a 2-D strided view; other strides use strided views.
    """
    channels, m = x.shape[1], w.shape[0]
    flat = all(s == 1 for s in strides)
    if flat:  # one spare leading-axis row keeps the last tap's run inside the buffer
        end = [end[0] + 1, *end[1:]]
    xp = pad_spatial(x, begin, end)
    if m != channels:  # channel multiplier: output channel j reads input channel j // (m / C)
        xp = np.repeat(xp, m // channels, axis=1)
    weights = w.reshape(m, -1)
    out_sizes = out.shape[2:]
    if flat:
        padded = xp.shape[2:]
        row = prod(padded[1:])
        length = out_sizes[0] * row
        source = xp.reshape(xp.shape[0], m, -1)
        flat_strides = [prod(padded[axis + 1:]) for axis in range(len(padded))]
        acc = np.empty((x.shape[0], m, length), dtype=out.dtype)
        starts = [sum(o * st for o, st in zip(offsets, flat_strides, strict=True))
                  for _, offsets in kernel_taps(w.shape[2:], dilations)]
        taps = [source[:, :, start:start + length] for start in starts]
        trailing = (1,)
    else:
        acc = out
        taps = [xp[tap_slices(offsets, strides, out_sizes)] for _, offsets in kernel_taps(w.shape[2:], dilations)]
        trailing = (1,) * (x.ndim - 2)
    # Work through channel blocks of about _BLOCK_BYTES so that a block's input, accumulator and
    # scratch stay in cache across all taps instead of streaming the whole tensor per tap.
    per_channel = acc[:, :1].nbytes
    block = max(1, _BLOCK_BYTES // max(per_channel, 1))
    scratch = np.empty_like(acc[:, :block])
    for start in range(0, m, block):
        stop = min(start + block, m)
        target, spare = acc[:, start:stop], scratch[:, :stop - start]
        for tap, view in enumerate(taps):
            column = weights[start:stop, tap].reshape((stop - start, *trailing))
            if tap == 0:
                np.multiply(view[:, start:stop], column, out=target)
            else:
                np.multiply(view[:, start:stop], column, out=spare)
                target += spare
    if flat:
        full = acc.reshape(x.shape[0], m, out_sizes[0], *padded[1:])
        out[...] = full[(Ellipsis, *(slice(0, size) for size in out_sizes[1:]))]
    return out


def conv_geometry(x: np.ndarray, w: np.ndarray, op: str, auto_pad: str, dilations, group: int, kernel_shape,
                  pads, strides):
    """Checked (strides, dilations, out sizes, leading pads, trailing pads) of a Conv."""
    if x.ndim < 3 or w.ndim != x.ndim:
        raise ValueError(f"{op}: expected X of rank >= 3 and W of the same rank, found shapes "
                         f"{list(x.shape)} and {list(w.shape)}")
    if group < 1 or x.shape[1] != w.shape[1] * group or w.shape[0] % group:
        raise ValueError(f"{op}: expected X channels ({x.shape[1]}) = W.shape[1] ({w.shape[1]}) * group "
                         f"({group}) and W.shape[0] ({w.shape[0]}) divisible by group")
    spatial = x.shape[2:]
    kernel = tuple(kernel_shape) if kernel_shape else w.shape[2:]
    if tuple(kernel) != tuple(w.shape[2:]):
        raise ValueError(f"{op}: kernel_shape {list(kernel)} does not match W's spatial shape {list(w.shape[2:])}")
    kernel, strides, dilations, pads = spatial_attrs(op, spatial, kernel, strides, dilations, pads)
    out, begin, end = window_geometry(op, spatial, kernel, strides, dilations, pads, auto_pad)
    return strides, dilations, out, begin, end


@kernel("Conv", since=1)
def conv(x, w, b=None, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None,
         strides=None):
    strides, dilations, out_sizes, begin, end = conv_geometry(x, w, "Conv", auto_pad, dilations, group,
                                                              kernel_shape, pads, strides)
    dtype = compute_dtype(x.dtype)
    y = conv_nd(as_compute(x, dtype), as_compute(w, dtype), group=group, strides=strides,
                dilations=dilations, begin=begin, end=end, out_sizes=out_sizes)
    if b is not None:
        if b.shape != (w.shape[0],):
            raise ValueError(f"Conv: expected B of shape [{w.shape[0]}], found {list(b.shape)}")
        y += as_compute(b, dtype).reshape((-1,) + (1,) * (x.ndim - 2))
    return y.astype(x.dtype, copy=False)
