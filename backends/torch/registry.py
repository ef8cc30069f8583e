"""The torch backend's lowering registry, keyed by ``(domain, op_type, since)``.

A lowering turns one IR node into torch calls. It is a function of the op's inputs
(positional torch tensors, ``None`` for an omitted optional input) and attributes (keyword,
with the ONNX spec's defaults), like a numpy kernel::

    @lowering("Reshape", since=5, static=(1,))
    def reshape(data, shape, *, allowzero=0): ...

``static`` names the input positions that are shapes, axes or sizes: when such an input is a
constant it arrives as a Python list (no device read per call); otherwise it is a tensor
(host-side when computed from ``Shape``, see ``compiler``) and ``ints`` reads it.
``check(node, graph) -> reason or None`` refuses attribute combinations the lowering does
not implement, so ``supports`` stays truthful. A lowering that needs more than its inputs and
attributes declares a keyword-only ``_ctx`` and receives a ``LoweringContext``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from edgeinfer.registry import OpRegistry


@dataclass(frozen=True)
class Lowering:
    fn: Callable[..., Any]
    static: tuple[int, ...]
    check: Callable[..., str | None] | None
    keywords: frozenset[str]
    var_keywords: bool
    wants_ctx: bool


@dataclass(frozen=True)
class LoweringContext:
    """What a lowering may need beyond inputs and attributes."""

    label: str
    opset: int
    device: torch.device
    num_outputs: int
    output_dtypes: tuple  # torch dtypes (None where not a tensor or unknown), compute precision applied
    input_dtypes: tuple
    float_dtype: torch.dtype  # what float32 computes in (torch.float16 under precision="fp16")

    def dtype(self, dtype: torch.dtype) -> torch.dtype:
        """``dtype`` with float32 replaced by the compute precision."""
        return self.float_dtype if dtype == torch.float32 else dtype


LOWERINGS: OpRegistry[Lowering] = OpRegistry("torch lowering")


def lowering(op_type: str | tuple[str, ...], *, since: int = 1, domain: str = "", static: tuple[int, ...] = (),
             check: Callable[..., str | None] | None = None) -> Callable[[Callable], Callable]:
    """Register a torch lowering for ``(domain, op_type)`` valid from opset ``since``."""

    def register(fn: Callable) -> Callable:
        params = inspect.signature(fn).parameters.values()
        keywords = frozenset(p.name for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD))
        var_kw = any(p.kind == p.VAR_KEYWORD for p in params)
        entry = Lowering(fn, tuple(static), check, keywords, var_kw, "_ctx" in keywords)
        LOWERINGS.decorator(op_type, domain=domain, since=since)(entry)
        return fn

    return register


def ints(value: Any) -> list[int]:
    """A shape/axes input as a list of Python ints (a constant list, or a tensor read once)."""
    if value is None:
        return []
    if isinstance(value, torch.Tensor):
        return [int(v) for v in value.reshape(-1).tolist()]
    if isinstance(value, (list, tuple)):
        return [int(v) for v in value]
    return [int(value)]


def scalar(value: Any) -> float | int | bool:
    """A one-element input as a Python number."""
    if isinstance(value, torch.Tensor):
        return value.reshape(-1)[0].item()
    if isinstance(value, (list, tuple)):
        return value[0]
    return value


def axis_of(axis: int, rank: int) -> int:
    return axis + rank if axis < 0 else axis
