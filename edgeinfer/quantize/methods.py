"""Quantized types, scale/zero-point arithmetic, and the calibration methods.

A calibration method turns a tensor's ``TensorHistogram`` into a float range ``(lo, hi)``:

- ``minmax``: the exact minimum and maximum seen.
- ``percentile``: drop the ``(100 - p) / 2`` percent tails on each side (p = 99.999 by
  default); a tensor that never goes negative keeps its minimum.
- ``entropy``: the clipping threshold ``t`` on ``|x|`` whose quantized distribution is closest
  to the original in KL divergence (TensorRT's calibrator): for each candidate, the reference
  ``P`` is the histogram up to ``t`` with everything beyond added to the last bin, ``Q`` is
  ``P`` merged into as many levels as the quantized type has over ``[0, t]`` and expanded back
  over the non-empty bins; the ``t`` with the smallest ``KL(P || Q)`` wins.
- ``mse``: the threshold ``t`` whose quantize-dequantize round trip (with the real scale and
  zero point of the range it implies) has the smallest mean squared error over the histogram.

Every range is then widened to contain 0 (so that 0 is exactly representable, which padding
and ReLU need) and turned into a scale and zero point by ``quant_params``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from edgeinfer.errors import InputError
from edgeinfer.quantize.histogram import TensorHistogram

MAX_CANDIDATES = 256  # thresholds tried by entropy and mse


@dataclass(frozen=True)
class QuantType:
    """An integer type for quantized values: its name, numpy dtype, range and symmetry."""

    name: str
    dtype: type
    qmin: int
    qmax: int
    symmetric: bool

    @property
    def levels(self) -> int:
        return self.qmax - self.qmin + 1


UINT8 = QuantType("uint8", np.uint8, 0, 255, symmetric=False)
INT8 = QuantType("int8", np.int8, -127, 127, symmetric=True)  # symmetric: -128 stays unused
# 7-bit weights stored as int8 (``reduce_range``): no pair of uint8 x int8 products leaves int16,
# so x86 CPUs without VNNI keep their fast u8 x s8 kernels exactly (see backends/onnxruntime/int8.py)
INT8_7BIT = QuantType("int8", np.int8, -63, 63, symmetric=True)
INT32_BIAS = QuantType("int32", np.int32, -(2**31 - 1), 2**31 - 1, symmetric=True)
ACTIVATION_TYPES = {"uint8": UINT8, "int8": INT8}


def activation_type(name: str) -> QuantType:
    if name not in ACTIVATION_TYPES:
        raise InputError(f"activation type {name!r}: expected one of {sorted(ACTIVATION_TYPES)} "
                         "(uint8: asymmetric, int8: symmetric)")
    return ACTIVATION_TYPES[name]


def quant_params(lo: float, hi: float, qtype: QuantType) -> tuple[np.float32, np.ndarray]:
    """(scale, zero point) mapping ``[lo, hi]`` (widened to contain 0) onto ``qtype``.

    A degenerate range (all zeros) gets scale 1 so that quantization stays well defined."""
    lo, hi = min(float(lo), 0.0), max(float(hi), 0.0)
    if qtype.symmetric:
        bound = max(-lo, hi)
        scale = bound / ((qtype.qmax - qtype.qmin) / 2)
        zero_point = 0
    else:
        scale = (hi - lo) / (qtype.qmax - qtype.qmin)
        zero_point = 0 if scale == 0 else int(np.clip(np.round(qtype.qmin - lo / scale), qtype.qmin, qtype.qmax))
    if not np.isfinite(scale) or scale < np.finfo(np.float32).tiny:
        return np.float32(1.0), np.array(0 if qtype.symmetric else qtype.qmin, dtype=qtype.dtype)
    return np.float32(scale), np.array(zero_point, dtype=qtype.dtype)


def fake_quantize(values: np.ndarray, scale, zero_point, qtype: QuantType) -> np.ndarray:
    """``dequantize(quantize(values))`` in float64 (for error estimates)."""
    q = np.clip(np.rint(values / scale) + zero_point, qtype.qmin, qtype.qmax)
    return (q - zero_point) * scale


# -- methods ------------------------------------------------------------------------------
RangeFn = Callable[..., tuple[float, float]]
CALIBRATION_METHODS: dict[str, RangeFn] = {}


def calibration_method(name: str) -> Callable[[RangeFn], RangeFn]:
    """Register ``fn(histogram, qtype, **options) -> (lo, hi)`` as method ``name``."""

    def register(fn: RangeFn) -> RangeFn:
        if name in CALIBRATION_METHODS:
            raise ValueError(f"duplicate calibration method {name!r}")
        CALIBRATION_METHODS[name] = fn
        return fn

    return register


def calibration_range(histogram: TensorHistogram, method: str, qtype: QuantType,
                      **options: float) -> tuple[float, float]:
    """The range ``method`` picks for a tensor (widened to contain 0)."""
    fn = CALIBRATION_METHODS.get(method)
    if fn is None:
        raise InputError(f"calibration method {method!r}: expected one of {sorted(CALIBRATION_METHODS)}")
    if histogram.samples == 0:
        return 0.0, 0.0
    if histogram.limit == 0.0:  # only zeros seen
        return 0.0, 0.0
    lo, hi = fn(histogram, qtype, **options)
    return min(lo, 0.0), max(hi, 0.0)


@calibration_method("minmax")
def minmax_range(histogram: TensorHistogram, qtype: QuantType) -> tuple[float, float]:
    return histogram.minimum, histogram.maximum


@calibration_method("percentile")
def percentile_range(histogram: TensorHistogram, qtype: QuantType, percentile: float = 99.999) -> tuple[float, float]:
    if not 50.0 < percentile <= 100.0:
        raise InputError(f"percentile {percentile}: expected a value in (50, 100]")
    cdf = np.cumsum(histogram.counts)
    total = cdf[-1]
    tail = total * (100.0 - percentile) / 200.0
    edges = histogram.edges
    lo_index = int(np.searchsorted(cdf, tail, side="right"))
    hi_index = int(np.searchsorted(cdf, total - tail, side="left"))
    lo = max(histogram.minimum, edges[min(lo_index, histogram.bins)])
    hi = min(histogram.maximum, edges[min(hi_index + 1, histogram.bins)])
    return (histogram.minimum if histogram.minimum >= 0 else lo), hi


def _clipped(histogram: TensorHistogram, threshold: float) -> tuple[float, float]:
    return max(histogram.minimum, -threshold), min(histogram.maximum, threshold)


def _levels_over_threshold(histogram: TensorHistogram, qtype: QuantType) -> int:
    """How many quantization levels fall in [0, t] once the range is [-t, t] or [0, t]."""
    one_sided = histogram.minimum >= 0 and not qtype.symmetric
    return qtype.levels if one_sided else qtype.levels // 2


def _candidates(first: int, last: int) -> np.ndarray:
    stride = max(1, (last - first) // MAX_CANDIDATES)
    candidates = np.arange(first, last + 1, stride)
    return candidates if candidates[-1] == last else np.append(candidates, last)


@calibration_method("entropy")
def entropy_range(histogram: TensorHistogram, qtype: QuantType) -> tuple[float, float]:
    counts, width = histogram.magnitude_histogram()
    used = int(np.nonzero(counts)[0][-1]) + 1
    counts = counts.copy()
    counts[0] = 0  # values at ~0 (a ReLU's spike) are exact on every grid: they must not decide t
    levels = _levels_over_threshold(histogram, qtype)
    if used <= levels:
        return histogram.minimum, histogram.maximum  # fewer occupied bins than levels: no loss
    best_kl, best_end = np.inf, used
    for end in _candidates(levels, used):
        kl = _kl_divergence(counts, int(end), levels)
        if kl < best_kl:
            best_kl, best_end = kl, int(end)
    return _clipped(histogram, best_end * width)


def _kl_divergence(counts: np.ndarray, end: int, levels: int) -> float:
    reference = counts[:end].copy()
    reference[-1] += counts[end:].sum()
    sliced = counts[:end]
    level_of_bin = (np.arange(end) * levels) // end
    nonzero = sliced > 0
    level_sums = np.bincount(level_of_bin, weights=sliced, minlength=levels)
    level_bins = np.bincount(level_of_bin, weights=nonzero, minlength=levels)
    expanded = np.where(nonzero, level_sums[level_of_bin] / np.maximum(level_bins[level_of_bin], 1), 0.0)
    p = reference / reference.sum()
    q_total = expanded.sum()
    if q_total == 0:
        return np.inf
    q = expanded / q_total
    mask = p > 0
    q = np.where(mask & (q == 0), 1e-12, q)  # a reference bin Q cannot represent costs a lot, not infinity
    return float(np.sum(p[mask] * np.log(p[mask] / q[mask])))


@calibration_method("mse")
def mse_range(histogram: TensorHistogram, qtype: QuantType) -> tuple[float, float]:
    counts, centers = histogram.counts, histogram.centers
    magnitude, width = histogram.magnitude_histogram()
    used = int(np.nonzero(magnitude)[0][-1]) + 1
    first = max(1, used // 64)
    best_error, best = np.inf, (histogram.minimum, histogram.maximum)
    occupied = counts > 0
    values, weights = centers[occupied], counts[occupied]
    for end in _candidates(first, used):
        lo, hi = _clipped(histogram, float(end) * width)
        scale, zero_point = quant_params(lo, hi, qtype)
        error = float(np.sum(weights * (values - fake_quantize(values, float(scale), int(zero_point), qtype)) ** 2))
        if error < best_error:
            best_error, best = error, (lo, hi)
    return best
