"""The numpy backend's kernel registry.

A kernel is a function of the op's inputs (positional, ``None`` for an omitted optional
input) and attributes (keyword, with the ONNX spec's defaults)::

    @kernel("Conv", since=11)
    def conv(x, w, b=None, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None,
             pads=None, strides=None): ...

It returns one array or a tuple of arrays (one per output). A kernel that needs more than
its inputs and attributes (the number of outputs, output types, the opset) declares a
keyword-only parameter ``_ctx`` and receives a ``KernelContext``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from edgeinfer.registry import OpRegistry

Kernel = Callable[..., object]
KERNELS: OpRegistry[Kernel] = OpRegistry("numpy kernel")


def kernel(op_type: str | tuple[str, ...], *, since: int = 1, domain: str = "") -> Callable[[Kernel], Kernel]:
    """Register a numpy kernel for ``(domain, op_type)`` valid from opset ``since``."""
    return KERNELS.decorator(op_type, domain=domain, since=since)


@dataclass(frozen=True)
class KernelContext:
    op_type: str
    name: str
    opset: int
    num_outputs: int
    output_dtypes: tuple  # numpy dtypes or None, per output
    output_shapes: tuple  # inferred shapes (may hold symbols / None)
    input_dtypes: tuple
