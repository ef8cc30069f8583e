"""Elementwise arithmetic and math with ONNX (numpy-style multidirectional) broadcasting.

Results keep the input dtype as the spec requires: integer ``Div`` truncates toward zero
like C, ``Mod`` follows the divisor's sign unless ``fmod=1``, ``Pow`` returns the base's
dtype whatever the exponent's.
"""

from __future__ import annotations

import math

import numpy as np

from edgeinfer.backends.numpy.kernels._general import as_array
from edgeinfer.backends.numpy.registry import kernel


@kernel("Add", since=7)
def add(a, b):
    return as_array(np.add(a, b))


@kernel("Sub", since=7)
def sub(a, b):
    return as_array(np.subtract(a, b))


@kernel("Mul", since=7)
def mul(a, b):
    return as_array(np.multiply(a, b))


@kernel("Div", since=7)
def div(a, b):
    if a.dtype.kind not in "iu":
        return as_array(np.divide(a, b))
    with np.errstate(divide="ignore"):  # x / 0 is undefined for integers; numpy yields 0
        quotient = np.floor_divide(a, b)
        if a.dtype.kind == "i":
            inexact = np.remainder(a, b) != 0
            quotient = quotient + (inexact & ((a < 0) ^ (b < 0))).astype(quotient.dtype)
    return as_array(quotient).astype(a.dtype, copy=False)


@kernel("Mod", since=10)
def mod(a, b, *, fmod=0):
    with np.errstate(divide="ignore", invalid="ignore"):
        result = np.fmod(a, b) if fmod else np.mod(a, b)
    return as_array(result).astype(a.dtype, copy=False)


@kernel("Pow", since=7)
def power(base, exponent):
    with np.errstate(all="ignore"):
        if base.dtype.kind in "iu" and exponent.dtype.kind in "iu" and (exponent < 0).any():
            result = np.power(base.astype(np.float64), exponent.astype(np.float64))
        elif base.dtype.kind == "f" and exponent.dtype.kind in "iub":
            result = np.power(base, exponent.astype(base.dtype))
        else:
            result = np.power(base, exponent)
    return as_array(result).astype(base.dtype, copy=False)


def _unary(op_type: str, since: int, ufunc) -> None:
    def run(x):
        with np.errstate(all="ignore"):  # domain errors give NaN/inf, as in IEEE arithmetic
            return as_array(ufunc(x))

    run.__name__ = run.__qualname__ = op_type.lower()
    run.__doc__ = f"ONNX {op_type}: elementwise ``numpy.{ufunc.__name__}``."
    kernel(op_type, since=since)(run)


for _op, _since, _ufunc in [
    ("Neg", 6, np.negative), ("Abs", 6, np.absolute), ("Sqrt", 6, np.sqrt), ("Exp", 6, np.exp),
    ("Log", 6, np.log), ("Floor", 6, np.floor), ("Ceil", 6, np.ceil), ("Reciprocal", 6, np.reciprocal),
    ("Round", 11, np.round), ("Sign", 9, np.sign), ("Sin", 7, np.sin), ("Cos", 7, np.cos),
    ("Tan", 7, np.tan), ("Asin", 7, np.arcsin), ("Acos", 7, np.arccos), ("Atan", 7, np.arctan),
    ("Sinh", 9, np.sinh), ("Cosh", 9, np.cosh), ("Asinh", 9, np.arcsinh), ("Acosh", 9, np.arccosh),
    ("Atanh", 9, np.arctanh),
]:
    _unary(_op, _since, _ufunc)


_TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)
_ERF_TAYLOR_TERMS = 13  # |x| < 0.5: the 13th term is below 1e-17
ERFC_CHEBYSHEV = (-1.26551223, 1.00002368, 0.37409196, 0.09678418, -0.18628806, 0.27886807,
                  -1.13520398, 1.48851587, -0.82215223, 0.17087277)


def erfc_abs(z: np.ndarray) -> np.ndarray:
    """erfc(|z|) in float64, relative error below 1.2e-7 (Numerical Recipes' Chebyshev fit)."""
    z = np.abs(z)
    t = 1.0 / (1.0 + 0.5 * z)
    poly = np.zeros_like(t)
    for coefficient in reversed(ERFC_CHEBYSHEV[1:]):
        poly = t * (coefficient + poly)
    return t * np.exp(-z * z + ERFC_CHEBYSHEV[0] + poly)


def erf64(x: np.ndarray) -> np.ndarray:
    """erf in float64: a Taylor series near 0 (where 1 - erfc would lose digits), else 1 - erfc.

    Accurate to about 1.2e-7 relative, i.e. to float32 precision, with a fixed number of
    vectorized passes (no per-element Python)."""
    x = np.asarray(x, dtype=np.float64)
    x2 = x * x
    term, series = x.copy(), x.copy()
    for n in range(1, _ERF_TAYLOR_TERMS):
        term = term * (-x2 / n)
        series = series + term / (2 * n + 1)
    with np.errstate(over="ignore", under="ignore"):
        tail = np.copysign(1.0 - erfc_abs(x), x)
    return np.where(np.abs(x) < 0.5, series * _TWO_OVER_SQRT_PI, tail)


@kernel("Erf", since=9)
def erf(x):
    return erf64(x).astype(x.dtype)  # integers: truncated, as a cast from float would


@kernel("IsNaN", since=9)
def isnan(x):
    return as_array(np.isnan(x))


@kernel("IsInf", since=10)
def isinf(x, *, detect_negative=1, detect_positive=1):
    if detect_negative and detect_positive:
        return as_array(np.isinf(x))
    if detect_negative:
        return as_array(np.isneginf(x))
    if detect_positive:
        return as_array(np.isposinf(x))
    return np.zeros(np.shape(x), dtype=bool)


@kernel("Max", since=8)
def maximum(*xs):
    return as_array(_fold(np.maximum, xs))


@kernel("Min", since=8)
def minimum(*xs):
    return as_array(_fold(np.minimum, xs))


@kernel("Sum", since=8)
def sum_(*xs):
    return as_array(_fold(np.add, xs))


@kernel("Mean", since=8)
def mean(*xs):
    total = _fold(np.add, xs)
    return as_array(total / np.asarray(len(xs), dtype=total.dtype))


def _fold(ufunc, xs):
    if not xs:
        raise ValueError("expected at least one input, got none")
    result = xs[0]
    for x in xs[1:]:
        result = ufunc(result, x)
    if len(xs) == 1:
        result = np.array(result, copy=True)  # never hand out the caller's array as a new value
    return result


_FLOAT8_SATURATING = ("float8e4m3fn", "float8e4m3fnuz", "float8e5m2", "float8e5m2fnuz")


def cast_array(x: np.ndarray, to: str, *, saturate: int = 1, round_mode: str = "up") -> np.ndarray:
    """``x`` converted to the edgeinfer dtype name ``to`` with ONNX Cast semantics.

    float -> int truncates toward zero; strings are parsed/printed as numpy does; with
    ``saturate`` an out-of-range value (including +-inf) cast to a float8 type becomes the
    type's largest finite value instead of inf/NaN; float8e8m0 rounds as ``round_mode`` says."""
    from edgeinfer.ir import dtypes

    if to == "str":
        return x.astype(np.str_).astype(object) if x.dtype != object else x.copy()
    target = dtypes.numpy_dtype(to)
    if x.dtype == object:  # strings: parse as float64 first, then cast (so "1e3" -> int works)
        x = x.astype(np.float64)
    if to == "float8e8m0":
        from onnx.numpy_helper import to_float8e8m0

        return as_array(to_float8e8m0(x, bool(saturate), round_mode)).astype(target)
    if saturate and to in _FLOAT8_SATURATING and x.dtype.kind != "b":
        import ml_dtypes

        info = ml_dtypes.finfo(target)
        x = np.clip(x.astype(np.float32), np.float32(info.min), np.float32(info.max))
    with np.errstate(invalid="ignore", over="ignore"):  # NaN/out-of-range -> int is undefined
        return x.astype(target)


@kernel("Cast", since=6)
def cast(x, *, to, saturate=1, round_mode="up"):
    from edgeinfer.ir import dtypes

    return cast_array(x, dtypes.from_onnx(to), saturate=saturate, round_mode=round_mode)


@kernel("CastLike", since=15)
def cast_like(x, target_type, *, saturate=1, round_mode="up"):
    from edgeinfer.ir import dtypes

    return cast_array(x, dtypes.name_of(target_type.dtype), saturate=saturate, round_mode=round_mode)
