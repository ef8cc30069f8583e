"""Conv (1-D, 2-D, 3-D; grouped, depthwise, dilated, strided, padded).

Three paths, none of which loops over pixels:

- pointwise (1x1 kernel, stride 1, no pads): the input is already the column matrix, so
  ``W[M, C] @ X[N, C, L]`` is one BLAS call per image and group, without any copy;
- depthwise (one input channel per group): per block of channels, one copy of the taps out
  of a strided view of the padded input and one batched matmul (a GEMV per channel);
- everything else: im2col through a strided view of the padded input (one copy into the
  ``[N, G, C/G * K, L]`` column matrix) and one batched matmul into a preallocated output.

float32 stays float32 and float64 stays float64; half types are computed in float32.
``conv_nd`` is shared with ConvInteger and QLinearConv, which pass float64 operands: products
of 8-bit (and 16-bit) values summed in float64 are exact, so BLAS gives exact integer results.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from numpy.lib.stride_tricks import as_strided

from edgeinfer.backends.numpy import parallel
from edgeinfer.backends.numpy.kernels.nn_common import (
    as_compute,
    compute_dtype,
    pad_spatial,
    prod,
    spatial_attrs,
    window_geometry,
)
from edgeinfer.backends.numpy.registry import kernel

Epilogue = Callable[[np.ndarray, slice], None]
"""Finishes a block of output channels in place (bias, activation) while it is in cache:
``epilogue(out[:, channels], channels)``."""

def conv_nd(x: np.ndarray, w: np.ndarray, *, group: int, strides: Sequence[int], dilations: Sequence[int],
            begin: Sequence[int], end: Sequence[int], out_sizes: Sequence[int],
            epilogue: Epilogue | None = None) -> np.ndarray:
    """Convolution of ``x`` [N, C, *S] with ``w`` [M, C/group, *K] (same dtype), no bias;
    ``epilogue`` is applied to every block of output channels once it is computed."""
    n, channels = x.shape[:2]
    m, group_channels = w.shape[:2]
    kernel = w.shape[2:]
    length = prod(out_sizes)
    out = np.empty((n, m, *out_sizes), dtype=x.dtype)
    if group_channels == 1 and group == channels and kernel and prod(kernel) > 1:
        return _depthwise(x, w, strides, dilations, begin, end, out, epilogue)
    if all(k == 1 for k in kernel) and all(s == 1 for s in strides) and not any(begin) and not any(end):
        cols = x.reshape(n, group, group_channels, length)
    else:
        cols = _im2col(pad_spatial(x, begin, end), group, kernel, strides, dilations, out_sizes)
    weights = w.reshape(group, m // group, group_channels * prod(kernel))
    if n == 1 and group == 1:  # the common inference case: one plain 2-D GEMM
        _gemm_rows(weights[0], cols[0, 0], out, epilogue)
        return out
    with parallel.blas_for(n * m * weights.shape[2] * length):
        np.matmul(weights, cols, out=out.reshape(n, group, m // group, length))
    if epilogue is not None:
        epilogue(out, slice(None))
    return out


def _gemm_rows(weights: np.ndarray, cols: np.ndarray, out: np.ndarray, epilogue: Epilogue | None) -> None:
    """``out[0] = weights @ cols`` (``out`` is [1, M, *S]) as one GEMM, then ``epilogue`` on
    blocks of output channels shared between the run's workers."""
    m = weights.shape[0]
    with parallel.blas_for(m * weights.shape[1] * cols.shape[1]):
        np.matmul(weights, cols, out=out.reshape(m, -1))
    if epilogue is None:
        return
    blocks = parallel.split(m, parallel.chunks_for(out.size, _EPILOGUE_CHUNK), align=8)
    parallel.parallel_for(len(blocks), lambda index: epilogue(out[:, slice(*blocks[index])], slice(*blocks[index])),
                          work=out.size)


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


_EPILOGUE_CHUNK = 1 << 18  # elements: bias and activation are a few cheap passes
_COLUMN_BLOCK_BYTES = 384 * 1024


def _depthwise(x: np.ndarray, w: np.ndarray, strides, dilations, begin, end, out: np.ndarray,
               epilogue: Epilogue | None = None) -> np.ndarray:
    """Grouped conv with one input channel per group, by blocks of channels: copy the block's
    taps out of a strided view of the padded input (its [block, taps, pixels] columns, about
    ``_COLUMN_BLOCK_BYTES``, so they stay in cache), then one batched matmul of each channel's
    taps with its column matrix writes the block's output in place; the epilogue follows.
    Numpy's broadcasting multiply by a per-channel weight runs at a third of the speed of a
    plain copy, so one copy plus BLAS beats accumulating ``k**d`` shifted multiply-adds.
    The blocks are shared between the run's workers (the copies release the GIL).
    """
    n, channels, m = x.shape[0], x.shape[1], w.shape[0]
    xp = pad_spatial(x, begin, end)
    if m != channels:  # channel multiplier: output channel j reads input channel j // (m / C)
        xp = np.repeat(xp, m // channels, axis=1)
    kernel, out_sizes = w.shape[2:], out.shape[2:]
    taps, length = prod(kernel), prod(out_sizes)
    spatial_strides = xp.strides[2:]
    view = as_strided(
        xp, shape=(n, m, *kernel, *out_sizes),
        strides=(*xp.strides[:2], *(st * d for st, d in zip(spatial_strides, dilations, strict=False)),
                 *(st * s for st, s in zip(spatial_strides, strides, strict=False))),
        writeable=False)
    weights = w.reshape(m, 1, taps)
    results = out.reshape(n, m, 1, length)
    block = max(1, _COLUMN_BLOCK_BYTES // max(1, n * taps * length * out.itemsize))  # n may be 0
    ranges = [(start, min(start + block, m)) for start in range(0, m, block)]

    def run_block(index: int) -> None:
        start, stop = ranges[index]
        columns = view[:, start:stop].reshape(n, stop - start, taps, length)  # the one copy
        np.matmul(weights[start:stop], columns, out=results[:, start:stop])
        if epilogue is not None:
            epilogue(out[:, start:stop], slice(start, stop))

    parallel.parallel_for(len(ranges), run_block, work=n * m * taps * length)
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


def convolve(x, w, b=None, *, activation: Callable[[np.ndarray], None] | None = None, auto_pad="NOTSET",
             dilations=None, group=1, kernel_shape=None, pads=None, strides=None) -> np.ndarray:
    """Conv with its bias and an optional in-place ``activation`` applied block by block
    (``activation`` only for float32/float64 inputs, whose result needs no rounding)."""
    strides, dilations, out_sizes, begin, end = conv_geometry(x, w, "Conv", auto_pad, dilations, group,
                                                              kernel_shape, pads, strides)
    dtype = compute_dtype(x.dtype)
    if b is not None and b.shape != (w.shape[0],):
        raise ValueError(f"Conv: expected B of shape [{w.shape[0]}], found {list(b.shape)}")
    if activation is not None and dtype != x.dtype:
        raise ValueError(f"Conv: an in-place activation needs float32/float64 input, found {x.dtype}")
    bias = None if b is None else as_compute(b, dtype).reshape((-1,) + (1,) * (x.ndim - 2))

    def finish(block: np.ndarray, channels: slice) -> None:
        if bias is not None:
            block += bias[channels]
        if activation is not None:
            activation(block)

    y = conv_nd(as_compute(x, dtype), as_compute(w, dtype), group=group, strides=strides,
                dilations=dilations, begin=begin, end=end, out_sizes=out_sizes,
                epilogue=finish if bias is not None or activation is not None else None)
    return y.astype(x.dtype, copy=False)


@kernel("Conv", since=1)
def conv(x, w, b=None, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None,
         strides=None):
    return convolve(x, w, b, auto_pad=auto_pad, dilations=dilations, group=group, kernel_shape=kernel_shape,
                    pads=pads, strides=strides)
