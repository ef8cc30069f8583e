"""com.microsoft MatMulNBits: weight-only quantized MatMul (semantics: ``edgeinfer.ir.contrib_ops``).

The packed weight stays packed on the device; each run unpacks it (4 bits: low nibble first),
dequantizes it per block and multiplies in float32, so the device holds the int4/int8 bytes
plus one float32 weight while the op runs, not a float copy of every weight."""

from __future__ import annotations

import torch

from edgeinfer.backends.torch.registry import lowering
from edgeinfer.ir.contrib_ops import MS_DOMAIN, NBITS


def _unpack(packed: torch.Tensor, bits: int) -> torch.Tensor:
    if bits == 8:
        return packed
    return torch.stack([packed & 0x0F, packed >> 4], -1).reshape(*packed.shape[:-1], -1)


def _check(node, graph) -> str | None:
    if node.attrs.get("bits", 4) not in NBITS:
        return f"MatMulNBits bits={node.attrs.get('bits')}: expected one of {NBITS}"
    if len(node.inputs) > 4 and node.inputs[4]:
        return "MatMulNBits with g_idx (act-order) is not lowered"
    return None


@lowering("MatMulNBits", domain=MS_DOMAIN, check=_check)
def matmul_nbits(a, b, scales, zero_points=None, g_idx=None, bias=None, *, K, N, bits=4, block_size,  # noqa: N803
                 accuracy_level=0):
    rows, blocks = b.shape[0], b.shape[1]
    q = _unpack(b, bits).reshape(rows, blocks, block_size).float()
    scale = scales.reshape(rows, blocks).float()[..., None]
    if zero_points is None:
        zero = 2.0 ** (bits - 1)
    else:
        zero = _unpack(zero_points.reshape(rows, -1), bits)[:, :blocks].float()[..., None]
    weight = ((q - zero) * scale).reshape(rows, -1)[:, :K]
    y = torch.matmul(a.reshape(-1, K).float(), weight.T)
    if bias is not None:
        y = y + bias.float()
    return y.reshape(*a.shape[:-1], N).to(a.dtype)
