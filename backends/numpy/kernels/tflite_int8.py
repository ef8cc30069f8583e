"""TFLite's integer kernels (``edgeinfer::TFLite*``), bit-exact, vectorized in int64.

The ops are defined in ``edgeinfer.ir.lowering_tflite``. A full-integer TFLite model computes
each quantized op in fixed point; where that differs from dequantize -> float op -> quantize
the importer emits these ops, and the kernels below reproduce the arithmetic of the TFLite
interpreter's builtin CPU kernels (TF 2.21 / LiteRT, x86):

- ``quantize_multiplier``: ``QuantizeMultiplier`` (a real multiplier as a Q31 integer and a
  power-of-two exponent, the mantissa rounded half away from zero);
- ``multiply_by_quantized_multiplier``: gemmlowp's ``SaturatingRoundingDoublingHighMul``
  followed by ``RoundingDivideByPOT`` (round half away from zero). FULLY_CONNECTED runs
  through ruy, whose final rounding shift rounds half up instead (``rounding="half_up"``).

Every intermediate is an int64 array, so no step wraps where TFLite's int32 would not.
"""

from __future__ import annotations

import numpy as np

from edgeinfer.backends.numpy.registry import kernel

INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1
_ONE = np.int64(1)


# -- fixed-point primitives (tensorflow/lite/kernels/internal/common.h) ---------------------
def round_half_away(x: np.ndarray) -> np.ndarray:
    """``std::round``: ties away from zero."""
    return np.sign(x) * np.floor(np.abs(x) + 0.5)


def quantize_multiplier(real) -> tuple[np.ndarray, np.ndarray]:
    """``QuantizeMultiplier``: real = multiplier * 2**(shift - 31), multiplier in [2**30, 2**31)."""
    mantissa, shift = np.frexp(np.asarray(real, np.float64))
    fixed = round_half_away(mantissa * float(1 << 31)).astype(np.int64)
    carry = fixed == (1 << 31)
    fixed, shift = np.where(carry, fixed // 2, fixed), np.where(carry, shift + 1, shift).astype(np.int64)
    tiny = shift < -31
    return np.where(tiny, 0, fixed), np.where(tiny, 0, shift)


def doubling_high_mul(a, b) -> np.ndarray:
    """``SaturatingRoundingDoublingHighMul``: round(a * b / 2**31), ties away from zero."""
    a, b = np.asarray(a, np.int64), np.asarray(b, np.int64)
    product = a * b + np.where(a * b >= 0, 1 << 30, 1 - (1 << 30))
    high = np.where(product >= 0, product >> 31, -((-product) >> 31))  # C++ division truncates
    return np.where((a == b) & (a == INT32_MIN), INT32_MAX, high)


def rounding_divide_by_pot(x, exponent) -> np.ndarray:
    """``RoundingDivideByPOT``: x / 2**exponent, ties away from zero."""
    x, exponent = np.asarray(x, np.int64), np.asarray(exponent, np.int64)
    mask = (_ONE << exponent) - 1
    threshold = (mask >> 1) + (x < 0)
    return (x >> exponent) + ((x & mask) > threshold)


def multiply_by_quantized_multiplier(x, multiplier, shift, rounding: str = "away") -> np.ndarray:
    """``MultiplyByQuantizedMultiplier``: x * multiplier * 2**(shift - 31), two roundings."""
    shift = np.asarray(shift, np.int64)
    left, right = np.maximum(shift, 0), np.maximum(-shift, 0)
    high = doubling_high_mul(np.asarray(x, np.int64) << left, multiplier)
    if rounding == "half_up":  # ruy: rounding right shift, ties toward +inf
        return (high + np.where(right > 0, _ONE << np.maximum(right - 1, 0), 0)) >> right
    return rounding_divide_by_pot(high, right)


def _saturating_left_shift(x: np.ndarray, exponent: int) -> np.ndarray:
    """gemmlowp ``SaturatingRoundingMultiplyByPOT`` for a positive exponent."""
    threshold = (1 << (31 - exponent)) - 1
    return np.where(x > threshold, INT32_MAX, np.where(x < -threshold, INT32_MIN, x << exponent))


def _wrap32(x: np.ndarray) -> np.ndarray:
    return ((x - INT32_MIN) % (1 << 32)) + INT32_MIN


def inv_sqrt_multiplier_exp(value: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``GetInvSqrtQuantizedMultiplierExp(value, kReverseShift)``: 1/sqrt(value) as a Q31
    multiplier and a left shift, by gemmlowp's 5-step Newton-Raphson iteration in Q3.28."""
    value = np.asarray(value, np.int64)
    shift = np.full(value.shape, 11, np.int64)
    v = np.maximum(value, 2)
    while (large := v >= (1 << 29)).any():
        v, shift = np.where(large, v // 4, v), shift + large
    leading_zeros = 31 - np.floor(np.log2(v)).astype(np.int64)  # exact below 2**29
    pairs = (leading_zeros - 1) // 2 - 1
    shift -= pairs
    half_input = rounding_divide_by_pot((v << (2 * pairs)) >> 1, 1)
    half_three = (1 << 28) + (1 << 27)
    x = np.full(value.shape, 1 << 28, np.int64)  # 1.0 in Q3.28
    for _ in range(5):
        x_cubed = _saturating_left_shift(doubling_high_mul(doubling_high_mul(x, x), x), 6)
        x = _saturating_left_shift(_wrap32(doubling_high_mul(half_three, x) - doubling_high_mul(half_input, x_cubed)), 3)
    x = doubling_high_mul(x, 1518500250)  # sqrt(2) / 2 in Q0.31
    x, shift = np.where(shift < 0, x << np.maximum(-shift, 0), x), np.maximum(shift, 0)
    small = value <= 1
    return np.where(small, INT32_MAX, x), np.where(small, 0, -shift)


# -- helpers ---------------------------------------------------------------------------------
def _scalar(op: str, name: str, value) -> float | int:
    value = np.asarray(value)
    if value.size != 1:
        raise ValueError(f"{op}: expected a scalar {name}, found shape {list(value.shape)}")
    return value.reshape(()).item()


def _saturate(op: str, acc: np.ndarray, zero_point, clip_min: int, clip_max: int) -> np.ndarray:
    dtype = np.asarray(zero_point).dtype
    if dtype != np.int8:
        raise ValueError(f"{op}: expected an int8 output zero point, found {dtype}")
    lo, hi = max(int(clip_min), -128), min(int(clip_max), 127)
    return np.clip(acc + int(_scalar(op, "y_zero_point", zero_point)), lo, hi).astype(np.int8)


def _shifted(op: str, x: np.ndarray, zero_point) -> np.ndarray:
    if x.dtype != np.int8:
        raise ValueError(f"{op}: expected an int8 input, found {x.dtype}")
    return x.astype(np.int64) - int(_scalar(op, "zero point", zero_point))


def _product_multiplier(a_scale, b_scale, y_scale) -> tuple[np.ndarray, np.ndarray]:
    """TFLite forms per-tensor ``a_scale * b_scale`` in float32, per-channel in double."""
    b_scale = np.asarray(b_scale, np.float32)
    if b_scale.size == 1:
        product = np.float64(np.float32(_scalar("multiplier", "scale", a_scale)) * b_scale.reshape(()))
    else:
        product = np.float64(_scalar("multiplier", "scale", a_scale)) * b_scale.astype(np.float64)
    return quantize_multiplier(product / np.float64(_scalar("multiplier", "y_scale", y_scale)))


# -- kernels ---------------------------------------------------------------------------------
@kernel("TFLiteFullyConnected", domain="edgeinfer")
def fully_connected(x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point, bias=None, *,
                    clip_min: int = -128, clip_max: int = 127):
    op = "TFLiteFullyConnected"
    if w.ndim != 2 or x.shape[-1] != w.shape[1]:
        raise ValueError(f"{op}: expected weights [units, {x.shape[-1]}], found {list(w.shape)}")
    acc = np.matmul(_shifted(op, x, x_zero_point), w.astype(np.int64).T - np.asarray(w_zero_point, np.int64)
                    .reshape(-1, 1).T)
    if bias is not None:
        acc += bias.astype(np.int64)
    multiplier, shift = _product_multiplier(x_scale, w_scale, y_scale)
    return _saturate(op, multiply_by_quantized_multiplier(acc, multiplier, shift, "half_up"), y_zero_point,
                     clip_min, clip_max)


@kernel("TFLiteBatchMatMul", domain="edgeinfer")
def batch_matmul(a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point):
    op = "TFLiteBatchMatMul"
    acc = np.matmul(_shifted(op, a, a_zero_point), _shifted(op, b, b_zero_point))
    multiplier, shift = _product_multiplier(a_scale, b_scale, y_scale)
    return _saturate(op, multiply_by_quantized_multiplier(acc, multiplier, shift), y_zero_point, -128, 127)


def _rescale_pair(op, a, a_scale, a_zero_point, b, b_scale, b_zero_point, left_shift: int):
    """ADD/SUB/SQUARED_DIFFERENCE: both inputs on a common scale 2 * max(scales), << left_shift."""
    a_scale, b_scale = (np.float32(_scalar(op, "scale", s)) for s in (a_scale, b_scale))
    twice_max = np.float64(2 * max(a_scale, b_scale))
    scaled = []
    for x, scale, zero in ((a, a_scale, a_zero_point), (b, b_scale, b_zero_point)):
        multiplier, shift = quantize_multiplier(np.float64(scale) / twice_max)
        scaled.append(multiply_by_quantized_multiplier(_shifted(op, x, zero) << left_shift, multiplier, shift))
    return scaled[0], scaled[1], twice_max


@kernel(("TFLiteAdd", "TFLiteSub"), domain="edgeinfer")
def add_sub(a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point, *,
            clip_min: int = -128, clip_max: int = 127, _ctx=None):
    op = _ctx.op_type if _ctx is not None else "TFLiteAdd"
    left_shift = 20
    sa, sb, twice_max = _rescale_pair(op, a, a_scale, a_zero_point, b, b_scale, b_zero_point, left_shift)
    total = sa - sb if op == "TFLiteSub" else sa + sb
    multiplier, shift = quantize_multiplier(twice_max / (float(1 << left_shift) * np.float64(_scalar(op, "y_scale", y_scale))))
    return _saturate(op, multiply_by_quantized_multiplier(total, multiplier, shift), y_zero_point, clip_min, clip_max)


@kernel("TFLiteSquaredDifference", domain="edgeinfer")
def squared_difference(a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point):
    op, left_shift = "TFLiteSquaredDifference", 7
    sa, sb, twice_max = _rescale_pair(op, a, a_scale, a_zero_point, b, b_scale, b_zero_point, left_shift)
    multiplier, shift = quantize_multiplier(twice_max * twice_max / (float(1 << 2 * left_shift)
                                                                     * np.float64(_scalar(op, "y_scale", y_scale))))
    return _saturate(op, multiply_by_quantized_multiplier((sa - sb) ** 2, multiplier, shift), y_zero_point, -128, 127)


@kernel("TFLiteMul", domain="edgeinfer")
def mul(a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point, *,
        clip_min: int = -128, clip_max: int = 127):
    op = "TFLiteMul"
    multiplier, shift = _product_multiplier(a_scale, b_scale, y_scale)
    product = _shifted(op, a, a_zero_point) * _shifted(op, b, b_zero_point)
    return _saturate(op, multiply_by_quantized_multiplier(product, multiplier, shift), y_zero_point,
                     clip_min, clip_max)


@kernel("TFLiteMean", domain="edgeinfer")
def mean(x, x_scale, x_zero_point, y_scale, y_zero_point, *, axes, keepdims: int = 1):
    """``QuantizedMeanOrSum``: the integer sum, 1/count folded into the multiplier."""
    op = "TFLiteMean"
    axes = tuple(sorted({a % x.ndim for a in axes})) if x.ndim else ()
    count = int(np.prod([x.shape[a] for a in axes], dtype=np.int64))
    if count == 0:
        raise ValueError(f"{op}: expected non-empty reduced axes {list(axes)}, found shape {list(x.shape)}")
    total = _shifted(op, x, x_zero_point).sum(axis=axes, keepdims=bool(keepdims))
    multiplier, shift = quantize_multiplier(np.float64(_scalar(op, "x_scale", x_scale))
                                            / np.float64(_scalar(op, "y_scale", y_scale)))
    fold = min(count.bit_length() - 1, 32, 31 + int(shift))
    multiplier = (int(multiplier) << fold) // count
    return _saturate(op, multiply_by_quantized_multiplier(total, multiplier, int(shift) - fold), y_zero_point,
                     -128, 127)


@kernel("TFLiteSoftmax", domain="edgeinfer")
def softmax(x, x_scale, x_zero_point, y_scale, y_zero_point, *, beta: float = 1.0):
    """The float lookup-table kernel (``optimized_ops::Softmax`` for int8 on x86): exp of the
    distance to the row maximum from a 256-entry float32 table, a sequential float32 sum."""
    op = "TFLiteSoftmax"
    _shifted(op, x, x_zero_point)
    step = np.float32(-np.float32(_scalar(op, "x_scale", x_scale)) * np.float32(beta))
    table = np.exp(step * np.arange(256, dtype=np.float32)).astype(np.float32)
    values = x.astype(np.int64)
    exps = table[values.max(axis=-1, keepdims=True) - values]
    total = np.cumsum(exps, axis=-1, dtype=np.float32)[..., -1:]  # in order, as the C++ loop adds
    inverse = np.float32(1.0) / (total * np.float32(_scalar(op, "y_scale", y_scale)))
    return _saturate(op, round_half_away(exps * inverse).astype(np.int64), y_zero_point, -128, 127)


@kernel("TFLiteRsqrt", domain="edgeinfer")
def rsqrt(x, x_scale, x_zero_point, y_scale, y_zero_point):
    op = "TFLiteRsqrt"
    value = _shifted(op, x, x_zero_point)
    if (value < 0).any():
        raise ValueError(f"{op}: expected inputs at or above the zero point (rsqrt of a non-negative "
                         f"value), found {int(value.min())} below it")
    root = np.float32(np.sqrt(np.float32(_scalar(op, "x_scale", x_scale))))
    out_multiplier, out_shift = quantize_multiplier(1.0 / np.float64(root * np.float32(_scalar(op, "y_scale", y_scale))))
    levels = np.arange(int(value.max()) + 1 if value.size else 1, dtype=np.int64)  # one entry per level
    inv_multiplier, inv_shift = inv_sqrt_multiplier_exp(levels)
    kshift = 20  # keeps the intermediate an integer
    data = multiply_by_quantized_multiplier(np.ones_like(levels), inv_multiplier, inv_shift + kshift)
    table = multiply_by_quantized_multiplier(data, out_multiplier, out_shift - kshift)
    table = np.where(levels == 0, INT32_MAX, table + int(_scalar(op, "y_zero_point", y_zero_point)))
    return _saturate(op, table[value], np.int8(0), -128, 127)
