import numpy as np
import pytest

from edgeinfer.errors import InputError
from edgeinfer.quantize.histogram import TensorHistogram
from edgeinfer.quantize.methods import INT8, UINT8, calibration_range, fake_quantize, quant_params


def _histogram(values: np.ndarray, batches: int = 1) -> TensorHistogram:
    hist = TensorHistogram()
    for part in np.array_split(values, batches):
        hist.update(part)
    return hist


def _mse(values: np.ndarray, lo: float, hi: float, qtype) -> float:
    scale, zero_point = quant_params(lo, hi, qtype)
    return float(np.mean((values - fake_quantize(values.astype(np.float64), float(scale), int(zero_point), qtype)) ** 2))


@pytest.fixture
def heavy_tailed(rng) -> np.ndarray:
    values = rng.standard_normal(200_000).astype(np.float32)
    values[:20] = rng.uniform(20, 40, 20)  # rare outliers far from the bulk
    return values


def test_histogram_tracks_extremes_and_counts_across_growing_batches(rng):
    values = np.concatenate([rng.uniform(-1, 1, 1000), rng.uniform(-50, 50, 1000)]).astype(np.float32)
    hist = _histogram(values, batches=2)  # the second batch forces the range to double repeatedly
    assert hist.minimum == values.min() and hist.maximum == values.max()
    assert hist.counts.sum() == values.size
    assert hist.limit >= np.abs(values).max()
    edges = hist.edges
    expected, _ = np.histogram(values, bins=edges)
    # merged bins are exact: every value sits in the bin numpy assigns it (ties at edges aside)
    assert np.abs(expected - hist.counts).sum() <= 2


def test_minmax_is_the_exact_range(rng):
    values = rng.uniform(1, 7, 10_000).astype(np.float32)
    lo, hi = calibration_range(_histogram(values, 4), "minmax", UINT8)
    assert (lo, hi) == (0.0, float(values.max()))  # widened to contain 0
    values -= 10
    lo, hi = calibration_range(_histogram(values), "minmax", UINT8)
    assert (lo, hi) == (float(values.min()), 0.0)


def test_percentile_matches_numpy_within_one_bin(rng):
    values = rng.standard_normal(100_000).astype(np.float32)
    hist = _histogram(values)
    lo, hi = calibration_range(hist, "percentile", UINT8, percentile=99.0)
    assert abs(hi - np.percentile(values, 99.5)) <= 2 * hist.bin_width
    assert abs(lo - np.percentile(values, 0.5)) <= 2 * hist.bin_width


@pytest.mark.parametrize("method, options", [("entropy", {}), ("percentile", {"percentile": 99.9})])
def test_clipping_methods_resolve_the_bulk_better_than_minmax(method, options, heavy_tailed):
    hist = _histogram(heavy_tailed, 3)
    lo, hi = calibration_range(hist, method, INT8, **options)
    assert hi < 20  # the outliers are clipped
    bulk = heavy_tailed[np.abs(heavy_tailed) < 4]
    assert _mse(bulk, lo, hi, INT8) < _mse(bulk, hist.minimum, hist.maximum, INT8) / 4


def test_mse_is_close_to_the_brute_force_optimum(heavy_tailed):
    lo, hi = calibration_range(_histogram(heavy_tailed), "mse", INT8)
    thresholds = np.linspace(1, 40, 400)
    best = min(_mse(heavy_tailed, -t, t, INT8) for t in thresholds)
    assert _mse(heavy_tailed, lo, hi, INT8) <= best * 1.05


def test_entropy_ignores_the_relu_spike_at_zero(rng):
    values = np.maximum(rng.standard_normal(100_000), 0).astype(np.float32)
    lo, hi = calibration_range(_histogram(values), "entropy", UINT8)
    assert lo == 0.0 and hi > 0.6 * values.max()


def test_quant_params_represent_zero_exactly():
    for lo, hi in ((-1.3, 2.7), (0.0, 5.0), (-4.0, -1.0)):
        scale, zero_point = quant_params(lo, hi, UINT8)
        assert fake_quantize(np.array([0.0]), float(scale), int(zero_point), UINT8)[0] == 0.0
        assert 0 <= int(zero_point) <= 255
    scale, zero_point = quant_params(-1.0, 3.0, INT8)
    assert int(zero_point) == 0 and np.isclose(scale, 3.0 / 127)
    scale, zero_point = quant_params(0.0, 0.0, UINT8)  # degenerate: stays well defined
    assert scale == 1.0


def test_unknown_method_is_refused():
    with pytest.raises(InputError, match="expected one of"):
        calibration_range(_histogram(np.ones(4, np.float32)), "kl-magic", UINT8)
