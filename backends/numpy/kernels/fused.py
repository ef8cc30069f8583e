"""Kernels of the ``edgeinfer`` domain's fused ops (semantics: ``edgeinfer.ir.lowering``).

A fused op runs its base op with the kernel the registry holds for it (``Conv``, ``Gemm``;
the ``onnx.reference`` implementation when no numpy kernel is registered), then applies the
activation in place on the result, so no intermediate tensor is kept. For float32/float64
``FusedConv`` and ``FusedMatMul`` the bias and activation run on blocks of the output while
they are in cache (``conv.convolve``, ``matmul.matmul_rows``).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from edgeinfer.backends.numpy.kernels.conv import convolve
from edgeinfer.backends.numpy.kernels.elementwise import ERFC_CHEBYSHEV
from edgeinfer.backends.numpy.kernels.matmul import matmul, matmul_rows
from edgeinfer.backends.numpy.kernels.softmax import softmax
from edgeinfer.backends.numpy.registry import KERNELS, KernelContext, kernel
from edgeinfer.ir import lowering as ei_ops

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def _gelu_in_place(y: np.ndarray) -> np.ndarray:
    """``x * Phi(x)`` = ``0.5 x (1 + erf(x / sqrt 2))`` in place on a float32/float64 array.

    With ``z = |x| / sqrt 2``, ``x Phi(x) = max(x, 0) - |x| erfc(z) / 2``: exact on both sides
    (no ``1 - erfc`` cancellation in the negative tail) and free of per-element branches
    (``np.where`` on random signs is ten times slower than a whole pass). erfc(z) =
    ``t exp(-z^2 + c0 + t (c1 + t (c2 + ...)))``, ``t = 1 / (1 + z/2)``, the Chebyshev fit
    ``Erf`` uses (relative error below 1.2e-7)."""
    z = np.abs(y)
    z *= 1.0 / math.sqrt(2.0)
    t = z * 0.5
    t += 1.0
    np.reciprocal(t, out=t)
    erfc = t * ERFC_CHEBYSHEV[-1]
    for coefficient in ERFC_CHEBYSHEV[-2:0:-1]:
        erfc += coefficient
        erfc *= t
    erfc += ERFC_CHEBYSHEV[0]
    erfc -= np.square(z)
    np.exp(erfc, out=erfc)
    erfc *= t
    erfc *= z
    erfc *= 1.0 / math.sqrt(2.0)  # |x| erfc(z) / 2 = z erfc(z) / sqrt 2
    np.maximum(y, 0, out=y)
    y -= erfc
    return y


def _sigmoid(x: np.ndarray, out: np.ndarray) -> np.ndarray:
    np.negative(x, out=out)
    with np.errstate(over="ignore"):  # exp(-x) -> inf for x below about -88: 1 / inf is 0, as wanted
        np.exp(out, out=out)
    out += 1
    return np.reciprocal(out, out=out)


def apply_activation(y: np.ndarray, name: str, params: tuple[float, ...]) -> np.ndarray:
    """``activation(y)``, computed in place when ``y`` is a writable float array."""
    if name == "":
        return y
    if not (isinstance(y, np.ndarray) and y.flags.writeable and y.dtype.kind == "f"):
        y = np.array(y, dtype=y.dtype if y.dtype.kind == "f" else np.float32)
    dtype = y.dtype.type
    if name == "Relu":
        return np.maximum(y, 0, out=y)
    if name == "Clip":
        return np.clip(y, dtype(params[0]), dtype(params[1]), out=y)
    if name == "LeakyRelu":
        return np.where(y >= 0, y, y * dtype(params[0])).astype(y.dtype, copy=False)
    if name == "Sigmoid":
        return _sigmoid(y, y)
    if name == "Tanh":
        return np.tanh(y, out=y)
    if name == "HardSigmoid":
        y *= dtype(params[0])
        y += dtype(params[1])
        return np.clip(y, 0, 1, out=y)
    if name == "HardSwish":
        gate = np.clip(y / dtype(6) + dtype(0.5), 0, 1)
        return np.multiply(y, gate, out=y)
    if name == "Silu":
        return np.multiply(y, _sigmoid(y, np.empty_like(y)), out=y)
    if name == "Gelu":
        if y.dtype in (np.float32, np.float64):
            return _gelu_in_place(y)
        wide = _gelu_in_place(y.astype(np.float32))  # half types: computed in float32, rounded once
        y[...] = wide
        return y
    if name == "GeluTanh":
        inner = np.tanh(dtype(_SQRT_2_OVER_PI) * (y + dtype(0.044715) * y * y * y))
        return np.multiply(y * dtype(0.5), inner + dtype(1), out=y)
    raise ValueError(f"unknown activation {name!r}: expected one of {sorted(ei_ops.ACTIVATIONS)}")


def _freeze(value: Any) -> Any:
    return tuple(value) if isinstance(value, (list, tuple)) else value


@functools.lru_cache(maxsize=256)
def _reference_op(op_type: str, opset: int, attrs: tuple, arity: int) -> Callable[..., Any]:
    """A one-node ``onnx.reference`` evaluator for a standard op without a numpy kernel."""
    import onnx
    from onnx import helper
    from onnx.reference import ReferenceEvaluator

    names = [f"i{i}" for i in range(arity)]
    node = helper.make_node(op_type, names, ["y"], **{k: (list(v) if isinstance(v, tuple) else v) for k, v in attrs})
    graph = helper.make_graph([node], "base", [helper.make_empty_tensor_value_info(n) for n in names],
                              [helper.make_empty_tensor_value_info("y")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = onnx.IR_VERSION
    evaluator = ReferenceEvaluator(model)
    return lambda *inputs: evaluator.run(None, dict(zip(names, inputs, strict=True)))[0]


def _run_base(op_type: str, ctx: KernelContext, inputs: list, attrs: dict[str, Any]) -> np.ndarray:
    """Run the standard op ``op_type`` with the registry's kernel (or onnx.reference)."""
    fn = KERNELS.lookup(op_type, domain="", version=ctx.opset)
    if fn is not None:
        import inspect

        if "_ctx" in inspect.signature(fn).parameters:
            attrs = {**attrs, "_ctx": dataclasses.replace(ctx, op_type=op_type)}
        return fn(*inputs, **attrs)
    frozen = tuple(sorted((k, _freeze(v)) for k, v in attrs.items()))
    return _reference_op(op_type, ctx.opset, frozen, len(inputs))(*inputs)


def _fused(op_type: str, inputs: list, attrs: dict[str, Any], ctx: KernelContext) -> np.ndarray:
    base, name, params = ei_ops.split_activation(attrs)
    # The base op runs at the default-domain opset the graph was built for; ctx.opset is
    # the edgeinfer domain's version, so the base resolves to its newest kernel.
    base_ctx = dataclasses.replace(ctx, opset=ei_ops._LATEST_OPSET)
    while inputs and inputs[-1] is None:
        inputs = inputs[:-1]
    y = _run_base(op_type, base_ctx, inputs, base)
    return apply_activation(np.asarray(y), name, params)


def in_place_activation(name: str, params: tuple[float, ...]) -> Callable[[np.ndarray], None] | None:
    """A function applying ``activation`` to a writable float block in place (None for none)."""
    if name == "":
        return None

    def activate(block: np.ndarray) -> None:
        result = apply_activation(block, name, params)
        if result is not block:
            block[...] = result

    return activate


def _computes_in_place(dtype: np.dtype) -> bool:
    """float32/float64: the base op's result is final, so the activation can run block by block."""
    return dtype in (np.float32, np.float64)


@kernel("FusedConv", domain="edgeinfer")
def fused_conv(x, w, b=None, *, _ctx: KernelContext, **attrs):
    base, name, params = ei_ops.split_activation(attrs)
    if _computes_in_place(x.dtype) and w.dtype == x.dtype and set(base) <= _CONV_ATTRS:
        return convolve(x, w, b, activation=in_place_activation(name, params), **base)
    return _fused("Conv", [x, w, b], attrs, _ctx)


_CONV_ATTRS = frozenset({"auto_pad", "dilations", "group", "kernel_shape", "pads", "strides"})


@kernel("FusedGemm", domain="edgeinfer")
def fused_gemm(a, b, c=None, *, _ctx: KernelContext, **attrs):
    return _fused("Gemm", [a, b, c], attrs, _ctx)


@kernel("FusedMatMul", domain="edgeinfer")
def fused_matmul(a, b, bias=None, *, activation: str = "", activation_params=()):
    _, name, params = ei_ops.split_activation({"activation": activation, "activation_params": activation_params})
    if (_computes_in_place(a.dtype) and b.dtype == a.dtype and a.ndim >= 2 and b.ndim == 2
            and (bias is None or (bias.dtype == a.dtype and bias.shape in ((b.shape[1],), (1, b.shape[1]))))):
        return matmul_rows(a, b, bias, in_place_activation(name, params))
    y = np.matmul(a, b)
    if bias is not None:
        y = _add_bias(y, bias)
    return apply_activation(y, name, params)


def _add_bias(y: np.ndarray, bias: np.ndarray) -> np.ndarray:
    if np.broadcast_shapes(y.shape, bias.shape) == y.shape and y.flags.writeable:
        return np.add(y, bias, out=y, casting="same_kind")
    return y + bias


@kernel("Gelu", domain="edgeinfer")
def gelu(x, *, approximate: str = "none"):
    return apply_activation(np.array(x), "GeluTanh" if approximate == "tanh" else "Gelu", ())


@kernel("LayerNormalization", domain="edgeinfer")
def layer_normalization(x, scale, bias=None, *, axis: int = -1, epsilon: float = 1e-5):
    axes = tuple(range(axis if axis >= 0 else x.ndim + axis, x.ndim))
    mean = x.mean(axis=axes, keepdims=True)
    centered = x - mean
    var = np.mean(centered * centered, axis=axes, keepdims=True)
    y = centered / np.sqrt(var + x.dtype.type(epsilon))
    y *= scale
    if bias is not None:
        y += bias
    return y


@kernel("Attention", domain="edgeinfer")
def attention(q, k, v, mask=None, *, num_heads: int, scale: float = 1.0):
    batch, seq, _ = q.shape
    heads_q = q.reshape(batch, seq, num_heads, -1).transpose(0, 2, 1, 3)
    heads_k = k.reshape(k.shape[0], k.shape[1], num_heads, -1).transpose(0, 2, 3, 1)
    heads_v = v.reshape(v.shape[0], v.shape[1], num_heads, -1).transpose(0, 2, 1, 3)
    # the MatMul, Softmax and MatMul kernels of its lowering, so fusing changes no result and
    # half-precision inputs compute and round as those ops do (and stay in their dtype)
    scores = matmul(heads_q, heads_k)
    scores *= q.dtype.type(scale)
    if mask is not None:
        scores = _add_bias(scores, mask)
    context = matmul(softmax(scores, axis=-1), heads_v)
    return context.transpose(0, 2, 1, 3).reshape(batch, seq, -1)
