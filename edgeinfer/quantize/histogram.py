"""One histogram per tensor, shared by every calibration method.

``TensorHistogram`` keeps the exact minimum and maximum of everything it saw and a histogram
of the values over ``[-R, R]`` with a fixed number of bins. The range starts at the first
batch's largest magnitude and doubles when a later batch exceeds it: doubling merges pairs of
neighbouring bins and pads the ends with empty bins, which is exact (no interpolation), so the
histogram of a stream does not depend on how the stream was split into batches beyond the
choice of the first range. Each calibration method (``methods.py``) turns the same histogram
into a range, so calibrating once serves every method.
"""

from __future__ import annotations

import numpy as np

DEFAULT_BINS = 2048  # over [-R, R]; must be a multiple of 4 (halving keeps the centre at 0)


class TensorHistogram:
    __slots__ = ("bins", "counts", "limit", "minimum", "maximum", "samples")

    def __init__(self, bins: int = DEFAULT_BINS):
        if bins < 8 or bins % 4:
            raise ValueError(f"histogram bins: expected a multiple of 4 of at least 8, got {bins}")
        self.bins = bins
        self.counts = np.zeros(bins, dtype=np.float64)
        self.limit = 0.0  # R; 0 until a non-zero value arrives
        self.minimum = np.inf
        self.maximum = -np.inf
        self.samples = 0

    @property
    def edges(self) -> np.ndarray:
        return np.linspace(-self.limit, self.limit, self.bins + 1)

    @property
    def centers(self) -> np.ndarray:
        edges = self.edges
        return (edges[:-1] + edges[1:]) / 2

    @property
    def bin_width(self) -> float:
        return 2 * self.limit / self.bins

    def update(self, values: np.ndarray) -> None:
        """Add the finite values of ``values`` (any shape, any float type)."""
        flat = np.asarray(values, dtype=np.float32).reshape(-1)
        if not np.isfinite(flat).all():
            flat = flat[np.isfinite(flat)]
        if flat.size == 0:
            return
        low, high = float(flat.min()), float(flat.max())
        self.minimum, self.maximum = min(self.minimum, low), max(self.maximum, high)
        self.samples += flat.size
        magnitude = max(abs(low), abs(high))
        if magnitude == 0.0 and self.limit == 0.0:
            return  # all zeros so far; counted once a scale exists
        if self.limit == 0.0:
            self.limit = magnitude
            zeros = self.samples - flat.size
            if zeros:  # earlier batches were all zeros: they sit in the bins around 0
                self.counts[self.bins // 2] += zeros
        while magnitude > self.limit:
            self._double()
        scale = self.bins / (2 * self.limit)
        index = np.floor((flat.astype(np.float64) + self.limit) * scale).astype(np.int64)
        np.clip(index, 0, self.bins - 1, out=index)
        self.counts += np.bincount(index, minlength=self.bins)

    def _double(self) -> None:
        self.counts = _doubled(self.counts)
        self.limit *= 2

    def magnitude_histogram(self) -> tuple[np.ndarray, float]:
        """(counts of |x| over [0, R] in bins/2 bins, bin width)."""
        half = self.bins // 2
        return self.counts[half:] + self.counts[:half][::-1], self.bin_width

    def __repr__(self) -> str:
        return (f"TensorHistogram(samples={self.samples}, min={self.minimum:.4g}, max={self.maximum:.4g}, "
                f"R={self.limit:.4g})")


def _doubled(counts: np.ndarray) -> np.ndarray:
    """The counts over [-2R, 2R] of a histogram over [-R, R] (same number of bins)."""
    quarter = counts.size // 4
    return np.concatenate([np.zeros(quarter), counts.reshape(-1, 2).sum(axis=1), np.zeros(quarter)])


class ChannelMean:
    """The mean of a tensor per channel (``axis``) over every batch and position it saw: what
    the bias correction of rounded weights needs (``bias_correction.rounding_corrected``)."""

    __slots__ = ("axis", "total", "count")

    def __init__(self, axis: int):
        self.axis = axis
        self.total: np.ndarray | None = None
        self.count = 0

    def update(self, values: np.ndarray) -> None:
        data = np.asarray(values)
        if data.ndim == 0 or data.size == 0:
            return
        axis = self.axis % data.ndim
        sums = data.sum(axis=tuple(i for i in range(data.ndim) if i != axis), dtype=np.float64)
        if self.total is not None and self.total.shape != sums.shape:
            self.total, self.count = None, -1  # the channel count changed between batches: no mean
        if self.count < 0:
            return
        self.total = sums if self.total is None else self.total + sums
        self.count += data.size // data.shape[axis]

    @property
    def mean(self) -> np.ndarray | None:
        """Per channel (float64), or None when nothing (or inconsistent data) arrived."""
        return None if self.total is None or self.count <= 0 else self.total / self.count


GRID_LEVELS = 256  # at most this many distinct values: an 8-bit grid
MIN_GRID_VALUES = 32  # at least this many: a few values (a scalar input over 8 samples) sit on
# some coarse grid by chance, and real inputs between them would be rounded to it
GRID_TOLERANCE = 1e-3  # of a step: how far a value may sit off its level (float32 rounding: ~1e-5)


class ValueGrid:
    """Whether every value a tensor took lies on one evenly spaced grid through 0 with at most
    ``GRID_LEVELS`` distinct values: a graph input made from 8-bit pixels (``x / 255``, or
    ``x - 128``). Quantized with that step and a zero point on the grid, such an input is
    exact (``Calibration.ranges``); any other scale rounds every pixel again."""

    __slots__ = ("values", "dead")

    def __init__(self) -> None:
        self.values: np.ndarray | None = None  # the distinct values seen, sorted (float64)
        self.dead = False  # more than GRID_LEVELS distinct values, or one not finite

    def update(self, values: np.ndarray) -> None:
        if self.dead:
            return
        data = np.asarray(values)
        if data.dtype.kind != "f":
            self.dead = True
            return
        flat = data.reshape(-1)
        if flat.size > 4 * GRID_LEVELS and np.unique(flat[:4 * GRID_LEVELS]).size > GRID_LEVELS:
            self.dead, self.values = True, None  # a continuous input: no need to sort all of it
            return
        distinct = np.unique(flat.astype(np.float64))
        merged = distinct if self.values is None else np.union1d(self.values, distinct)
        if merged.size > GRID_LEVELS or not np.all(np.isfinite(merged)):
            self.dead, self.values = True, None
            return
        self.values = merged

    @property
    def grid(self) -> tuple[float, int, int] | None:
        """``(step, first, last)``: every value seen is ``level * step`` for an integer level
        from ``first`` to ``last`` (0 is on the grid); None when no such grid holds them, or
        fewer than ``MIN_GRID_VALUES`` distinct values were seen."""
        values = self.values
        if self.dead or values is None or values.size < MIN_GRID_VALUES:
            return None
        rough = float(np.diff(values).min())
        levels = np.rint(values / rough)
        if np.abs(values / rough - levels).max() > 0.1 or not np.any(levels):
            return None
        step = float(np.dot(values, levels) / np.dot(levels, levels))  # least squares through 0
        if not step > 0 or np.abs(values - levels * step).max() > GRID_TOLERANCE * step:
            return None
        return step, int(levels[0]), int(levels[-1])

