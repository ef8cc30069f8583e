"""Ops of onnxruntime's ``com.microsoft`` domain that edgeinfer reads, writes and runs.

``MatMulNBits`` (weight-only quantized MatMul, onnxruntime's contrib op spec)::

    Y = A @ dequantize(B).T          A: float [..., K], Y: [..., N]
    B: uint8 [N, k_blocks, block_size * bits / 8]   (k_blocks = ceil(K / block_size))
    scales: float [N * k_blocks]    zero_points (optional): uint8, packed like B, per block
    dequantize(B)[n, k] = (q[n, k] - zp[n, k // block_size]) * scales[n, k // block_size]

For 4 bits two values share a byte, the even element in the low nibble; an absent zero point
is ``2 ** (bits - 1)``. This module holds the packing math (used by the quantizer and the numpy
kernel) and the op's type rule.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from edgeinfer.ir.graph import Node, Value
from edgeinfer.ir.infer import type_rule

MS_DOMAIN = "com.microsoft"
NBITS = (4, 8)


def pack(q: np.ndarray, bits: int) -> np.ndarray:
    """Unsigned ``bits``-bit integers (uint8 array, last axis even for 4 bits) packed into bytes."""
    q = np.asarray(q, np.uint8)
    if bits == 8:
        return q
    return (q[..., 0::2] & 0x0F) | ((q[..., 1::2] & 0x0F) << 4)


def unpack(packed: np.ndarray, bits: int) -> np.ndarray:
    """The inverse of ``pack``: the last axis doubles for 4 bits."""
    packed = np.asarray(packed, np.uint8)
    if bits == 8:
        return packed
    out = np.empty((*packed.shape[:-1], packed.shape[-1] * 2), np.uint8)
    out[..., 0::2] = packed & 0x0F
    out[..., 1::2] = packed >> 4
    return out


def dequantize_rows(b: np.ndarray, scales: np.ndarray, zero_points: np.ndarray | None, *, k: int,
                    bits: int, block_size: int, rows: slice, dtype=np.float32) -> np.ndarray:
    """Rows ``rows`` of the dequantized [N, K] weight of a MatMulNBits node."""
    n, k_blocks = b.shape[0], b.shape[1]
    q = unpack(b[rows], bits).reshape(-1, k_blocks, block_size)
    scale = np.asarray(scales, np.float32).reshape(n, k_blocks)[rows]
    if zero_points is None:
        zp = np.full(scale.shape, 2 ** (bits - 1), np.float32)
    else:
        zp = unpack(np.asarray(zero_points).reshape(n, -1), bits)[rows, :k_blocks].astype(np.float32)
    w = (q.astype(np.float32) - zp[..., None]) * scale[..., None]
    return w.reshape(w.shape[0], k_blocks * block_size)[:, :k].astype(dtype, copy=False)


@type_rule("MatMulNBits", MS_DOMAIN)
def _matmul_nbits_type(node: Node, inputs: Sequence[Value]) -> list[tuple]:
    a = inputs[0]
    n = int(node.attrs["N"])
    shape = None if a.shape is None else (*a.shape[:-1], n)
    return [(a.dtype, shape)]
