"""The ``edgeinfer`` domain's fused ops (semantics: ``edgeinfer.ir.lowering``): the base op's
torch call, then the activation; ``Attention`` is ``F.scaled_dot_product_attention``, which
picks a fused kernel (flash / memory-efficient attention) on CUDA."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from edgeinfer.backends.torch.lowerings.activations import apply_activation
from edgeinfer.backends.torch.lowerings.conv import conv_geometry
from edgeinfer.backends.torch.lowerings.matmul import gemm
from edgeinfer.backends.torch.lowerings.normalization import layer_norm
from edgeinfer.backends.torch.registry import lowering
from edgeinfer.errors import EdgeInferError
from edgeinfer.ir import lowering as ei_ops

DOMAIN = "edgeinfer"


def _activation_check(node, graph) -> str | None:
    try:
        ei_ops.split_activation(dict(node.attrs))
    except EdgeInferError as exc:
        return str(exc)
    return None


@lowering("FusedConv", domain=DOMAIN, check=_activation_check)
def fused_conv(x, w, b=None, **attrs):
    base, name, params = ei_ops.split_activation(attrs)
    return apply_activation(conv_geometry(x, w, b, **base), name, params)


@lowering("FusedGemm", domain=DOMAIN, check=_activation_check)
def fused_gemm(a, b, c=None, **attrs):
    base, name, params = ei_ops.split_activation(attrs)
    return apply_activation(gemm(a, b, c, **base), name, params)


@lowering("FusedMatMul", domain=DOMAIN, check=_activation_check)
def fused_matmul(a, b, bias=None, *, activation="", activation_params=()):
    _, name, params = ei_ops.split_activation({"activation": activation, "activation_params": activation_params})
    if bias is not None and a.dim() >= 2 and b.dim() == 2 and bias.dim() == 1 and a.is_floating_point():
        y = F.linear(a, b.T, bias)
    else:
        y = torch.matmul(a, b)
        if bias is not None:
            y = y + bias
    return apply_activation(y, name, params)


@lowering("Gelu", domain=DOMAIN)
def gelu(x, *, approximate="none"):
    return F.gelu(x, approximate=approximate)


@lowering("LayerNormalization", domain=DOMAIN)
def layer_normalization(x, scale, bias=None, *, axis=-1, epsilon=1e-5):
    return layer_norm(x, scale, bias, axis, epsilon)


@lowering("Attention", domain=DOMAIN)
def attention(q, k, v, mask=None, *, num_heads, scale=1.0):
    batch, seq, _ = q.shape
    heads_q = q.reshape(batch, seq, num_heads, -1).transpose(1, 2)
    heads_k = k.reshape(k.shape[0], k.shape[1], num_heads, -1).transpose(1, 2)
    heads_v = v.reshape(v.shape[0], v.shape[1], num_heads, -1).transpose(1, 2)
    if mask is not None:
        mask = mask.to(q.dtype) if mask.is_floating_point() else mask  # additive, broadcast to [B, H, S, T]
    context = F.scaled_dot_product_attention(heads_q, heads_k, heads_v, attn_mask=mask, scale=scale)
    return context.transpose(1, 2).reshape(batch, seq, -1)
