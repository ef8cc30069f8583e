"""Elementwise arithmetic, math, comparison, logic and Cast (ONNX numpy-style broadcasting).

Results keep the input dtype as the spec requires: integer ``Div`` truncates toward zero,
``Mod`` follows the divisor's sign unless ``fmod=1``, ``Pow`` returns the base's dtype.
"""

from __future__ import annotations

import torch

from edgeinfer.backends.torch.registry import LoweringContext, lowering
from edgeinfer.backends.torch.tensors import torch_dtype
from edgeinfer.ir import dtypes


@lowering("Add", since=7)
def add(a, b):
    return torch.add(a, b)


@lowering("Sub", since=7)
def sub(a, b):
    return torch.sub(a, b)


@lowering("Mul", since=7)
def mul(a, b):
    return torch.mul(a, b)


@lowering("Div", since=7)
def div(a, b):
    if a.is_floating_point():
        return torch.div(a, b)
    return torch.div(a, b, rounding_mode="trunc")


@lowering("Mod", since=10)
def mod(a, b, *, fmod=0):
    return torch.fmod(a, b) if fmod else torch.remainder(a, b)


@lowering("Pow", since=7)
def power(base, exponent):
    if not base.is_floating_point() and not exponent.is_floating_point() and bool((exponent < 0).any()):
        return torch.pow(base.double(), exponent.double()).to(base.dtype)
    if base.is_floating_point() and not exponent.is_floating_point():
        exponent = exponent.to(base.dtype)
    return torch.pow(base, exponent).to(base.dtype)


def _unary(op_type: str, since: int, fn) -> None:
    def run(x):
        return fn(x)

    run.__name__ = run.__qualname__ = op_type.lower()
    lowering(op_type, since=since)(run)


for _op, _since, _fn in [
    ("Neg", 6, torch.neg), ("Abs", 6, torch.abs), ("Sqrt", 6, torch.sqrt), ("Exp", 6, torch.exp),
    ("Log", 6, torch.log), ("Floor", 6, torch.floor), ("Ceil", 6, torch.ceil), ("Reciprocal", 6, torch.reciprocal),
    ("Round", 11, torch.round), ("Sign", 9, torch.sign), ("Sin", 7, torch.sin), ("Cos", 7, torch.cos),
    ("Tan", 7, torch.tan), ("Asin", 7, torch.asin), ("Acos", 7, torch.acos), ("Atan", 7, torch.atan),
    ("Sinh", 9, torch.sinh), ("Cosh", 9, torch.cosh), ("Asinh", 9, torch.asinh), ("Acosh", 9, torch.acosh),
    ("Atanh", 9, torch.atanh), ("IsNaN", 9, torch.isnan), ("Not", 1, torch.logical_not),
    ("BitwiseNot", 18, torch.bitwise_not),
]:
    _unary(_op, _since, _fn)


@lowering("Erf", since=9)
def erf(x):
    return torch.erf(x) if x.is_floating_point() else torch.erf(x.double()).to(x.dtype)


@lowering("IsInf", since=10)
def isinf(x, *, detect_negative=1, detect_positive=1):
    if detect_negative and detect_positive:
        return torch.isinf(x)
    if detect_negative:
        return torch.isneginf(x)
    if detect_positive:
        return torch.isposinf(x)
    return torch.zeros_like(x, dtype=torch.bool)


def _binary(op_type: str, since: int, fn) -> None:
    def run(a, b):
        return fn(a, b)

    run.__name__ = run.__qualname__ = op_type.lower()
    lowering(op_type, since=since)(run)


for _op, _since, _fn in [
    ("Equal", 7, torch.eq), ("Greater", 7, torch.gt), ("GreaterOrEqual", 12, torch.ge), ("Less", 7, torch.lt),
    ("LessOrEqual", 12, torch.le), ("And", 7, torch.logical_and), ("Or", 7, torch.logical_or),
    ("Xor", 7, torch.logical_xor), ("BitwiseAnd", 18, torch.bitwise_and), ("BitwiseOr", 18, torch.bitwise_or),
    ("BitwiseXor", 18, torch.bitwise_xor),
]:
    _binary(_op, _since, _fn)


@lowering("BitShift", since=11)
def bit_shift(x, y, *, direction):
    if direction == "LEFT":
        return torch.bitwise_left_shift(x, y)
    return torch.bitwise_right_shift(x, y)


def _fold(fn, xs):
    result = xs[0]
    for x in xs[1:]:
        result = fn(result, x)
    return result.clone() if len(xs) == 1 else result


@lowering("Max", since=8)
def maximum(*xs):
    return _fold(torch.maximum, xs)


@lowering("Min", since=8)
def minimum(*xs):
    return _fold(torch.minimum, xs)


@lowering("Sum", since=8)
def sum_(*xs):
    return _fold(torch.add, xs)


@lowering("Mean", since=8)
def mean(*xs):
    return _fold(torch.add, xs) / len(xs)


@lowering("Where", since=9)
def where(condition, x, y):
    return torch.where(condition, x, y)


def cast_tensor(x: torch.Tensor, to: torch.dtype) -> torch.Tensor:
    if to == torch.bool or x.dtype == to:
        return x.to(to)
    if x.is_floating_point() and not to.is_floating_point:
        x = torch.trunc(x)  # float -> int truncates toward zero (C semantics), NaN is undefined
    return x.to(to)


@lowering("Cast", since=6)
def cast(x, *, to, saturate=1, round_mode="up", _ctx: LoweringContext):
    return cast_tensor(x, _ctx.dtype(torch_dtype(dtypes.from_onnx(to))))


@lowering("CastLike", since=15)
def cast_like(x, target_type, *, saturate=1, round_mode="up"):
    return cast_tensor(x, target_type.dtype)
