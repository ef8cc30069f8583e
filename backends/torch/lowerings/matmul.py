"""MatMul, Gemm and Einsum."""

from __future__ import annotations

import torch

from edgeinfer.backends.torch.registry import lowering


@lowering("MatMul", since=1)
def matmul(a, b):
    return torch.matmul(a, b)


@lowering("Gemm", since=1)
def gemm(a, b, c=None, *, alpha=1.0, beta=1.0, transA=0, transB=0):  # noqa: N803 (the spec's names)
    a = a.T if transA else a
    b = b.T if transB else b
    if c is None or beta == 0:
        y = torch.matmul(a, b)
        return y * alpha if alpha != 1.0 else y
    if a.is_floating_point():
        return torch.addmm(c.expand(a.shape[0], b.shape[1]) if c.dim() < 2 else c, a, b, beta=beta, alpha=alpha)
    return (alpha * torch.matmul(a, b) + beta * c).to(a.dtype)


@lowering("Einsum", since=12)
def einsum(*inputs, equation):
    return torch.einsum(equation.replace(" ", ""), *inputs)
