"""Gemm, MatMul and Einsum.

All three end in BLAS through ``np.matmul`` / ``np.einsum(optimize=True)``. Transposed
operands are passed as views (BLAS reads them transposed, no copy). Half-precision operands
are multiplied in float32 (numpy has no fp16 BLAS) and the result is cast back.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from edgeinfer.backends.numpy import parallel
from edgeinfer.backends.numpy.kernels.nn_common import as_compute, compute_dtype
from edgeinfer.backends.numpy.registry import kernel

# Elements per block of a GEMM's epilogue: an activation (GELU is ~30 passes) wants its
# scratch in cache, a bias alone is one pass.
_ACTIVATION_CHUNK = 1 << 15
_BIAS_CHUNK = 1 << 18


def matmul_rows(a: np.ndarray, b: np.ndarray, bias: np.ndarray | None = None,
                activation: Callable[[np.ndarray], None] | None = None) -> np.ndarray:
    """``activation(a @ b + bias)`` for ``a`` [..., M, K] and a 2-D ``b`` [K, N] of the same
    float dtype: one GEMM over all of ``a``'s rows (no copy of ``a`` when its rows are
    contiguous), then the bias and activation in place on row blocks shared between the
    run's workers."""
    rows = a.reshape(-1, a.shape[-1])
    with parallel.blas_for(rows.shape[0] * b.shape[0] * b.shape[1]):
        out = np.matmul(rows, b)
    chunk = _ACTIVATION_CHUNK if activation is not None else _BIAS_CHUNK
    if out.size <= chunk:  # one block: nothing to split
        if bias is not None:
            np.add(out, bias, out=out, casting="same_kind")
        if activation is not None:
            activation(out)
    else:
        def finish(index: int) -> None:
            target = out[slice(*blocks[index])]
            if bias is not None:
                np.add(target, bias, out=target, casting="same_kind")
            if activation is not None:
                activation(target)

        blocks = parallel.split(out.shape[0], parallel.chunks_for(out.size, chunk))
        parallel.parallel_for(len(blocks), finish, work=out.size * (8 if activation is not None else 1))
    return out.reshape(*a.shape[:-1], b.shape[1])


def _matmul_dtype(dtype: np.dtype) -> np.dtype:
    return compute_dtype(dtype) if np.dtype(dtype).kind == "f" or dtype.name == "bfloat16" else np.dtype(dtype)


@kernel("Gemm", since=1)
def gemm(a, b, c=None, *, alpha=1.0, beta=1.0, transA=0, transB=0, broadcast=0):
    """``alpha * A' @ B' + beta * C``; ``broadcast`` (opsets 1-6) is accepted: C always
    broadcasts unidirectionally, which is what ``broadcast=1`` asked for."""
    if a.ndim != 2 or b.ndim != 2:
        raise ValueError(f"Gemm: expected 2-D A and B, found shapes {list(a.shape)} and {list(b.shape)}")
    lhs = a.T if transA else a
    rhs = b.T if transB else b
    if lhs.shape[1] != rhs.shape[0]:
        raise ValueError(f"Gemm: inner dimensions differ: A' is {list(lhs.shape)}, B' is {list(rhs.shape)} "
                         f"(transA={transA}, transB={transB})")
    if c is not None and beta != 0.0:
        try:
            np.broadcast_shapes(c.shape, (lhs.shape[0], rhs.shape[1]))
        except ValueError:
            raise ValueError(f"Gemm: C of shape {list(c.shape)} does not broadcast to the output shape "
                             f"{[lhs.shape[0], rhs.shape[1]]}") from None
    dtype = _matmul_dtype(a.dtype)
    with parallel.blas_for(lhs.shape[0] * lhs.shape[1] * rhs.shape[1]):
        y = np.matmul(as_compute(lhs, dtype), as_compute(rhs, dtype))
    if dtype.kind != "f":  # integer Gemm: float alpha/beta, cast back once
        y = alpha * y + (beta * c if c is not None else 0)
        return np.asarray(y).astype(a.dtype)
    if alpha != 1.0:
        y *= dtype.type(alpha)
    if c is not None and beta != 0.0:
        cc = as_compute(c, dtype)
        y += cc if beta == 1.0 else cc * dtype.type(beta)
    return y.astype(a.dtype, copy=False)


@kernel("MatMul", since=1)
def matmul(a, b):
    """numpy.matmul semantics (batched, broadcasting, 1-D operands promoted and squeezed)."""
    if a.ndim == 0 or b.ndim == 0:
        raise ValueError(f"MatMul: expected operands of rank >= 1, found shapes {list(a.shape)} and {list(b.shape)}")
    if a.shape[-1] != b.shape[-2 if b.ndim > 1 else 0]:
        raise ValueError(f"MatMul: inner dimensions differ: {list(a.shape)} @ {list(b.shape)}")
    dtype = _matmul_dtype(a.dtype)
    if a.ndim >= 2 and b.ndim == 2 and a.dtype == b.dtype == dtype and dtype.kind == "f":
        return matmul_rows(a, b)
    macs = max(a.size * b.shape[-1], b.size * a.shape[-2]) if a.ndim > 1 and b.ndim > 1 else a.size
    with parallel.blas_for(macs):
        return np.matmul(as_compute(a, dtype), as_compute(b, dtype)).astype(a.dtype, copy=False)


@kernel("Einsum", since=12)
def einsum(*inputs, equation=""):
    if not equation:
        raise ValueError("Einsum: the equation attribute is required")
    dtype = _matmul_dtype(inputs[0].dtype)
    operands = [as_compute(x, dtype) for x in inputs]
    result = np.einsum(equation.replace(" ", ""), *operands, optimize=len(operands) > 1)
    return np.asarray(result).astype(inputs[0].dtype, copy=False)
