"""com.microsoft MatMulNBits: weight-only quantized MatMul (see edgeinfer.ir.contrib_ops).

The weight is dequantized a slab of output rows at a time and multiplied at once, so peak
extra memory is one float32 slab (``SLAB_ELEMENTS``), never the whole float weight: a 3 GiB
int4 model stays within its packed size plus one slab."""

from __future__ import annotations

import numpy as np

from edgeinfer.backends.numpy.registry import kernel
from edgeinfer.errors import ModelValidationError
from edgeinfer.ir.contrib_ops import MS_DOMAIN, NBITS, dequantize_rows

SLAB_ELEMENTS = 1 << 23  # 32 MiB of float32 per dequantized slab


@kernel("MatMulNBits", domain=MS_DOMAIN)
def matmul_nbits(a, b, scales, zero_points=None, g_idx=None, bias=None, *, K, N, bits=4, block_size,
                 accuracy_level=0):
    if bits not in NBITS:
        raise ModelValidationError(f"MatMulNBits: bits={bits}, expected one of {NBITS}")
    if g_idx is not None:
        raise ModelValidationError("MatMulNBits: g_idx (act-order) is not supported by the numpy backend")
    if a.shape[-1] != K:
        raise ModelValidationError(f"MatMulNBits: input's last dim {a.shape[-1]} != K={K}")
    flat = a.reshape(-1, K).astype(np.float32, copy=False)
    out = np.empty((flat.shape[0], N), np.float32)
    step = max(1, SLAB_ELEMENTS // max(K, 1))
    for start in range(0, N, step):
        rows = slice(start, min(N, start + step))
        w = dequantize_rows(b, scales, zero_points, k=K, bits=bits, block_size=block_size, rows=rows)
        np.matmul(flat, w.T, out=out[:, rows])
    if bias is not None:
        out += bias.astype(np.float32, copy=False)
    return out.reshape(*a.shape[:-1], N).astype(a.dtype, copy=False)
