"""Work sharing in the numpy backend: parallel_for, runs with threads=N against onnxruntime
(also from several threads at once), and the in-place GELU against math.erf."""

from __future__ import annotations

import math
import threading

import numpy as np
import pytest

import edgeinfer as ei
from devkit import zoo
from devkit.testing import assert_close
from edgeinfer.backends.numpy import parallel
from edgeinfer.backends.numpy.kernels.fused import apply_activation


@pytest.mark.parametrize("workers", [1, 2, 4])
@pytest.mark.parametrize("count", [1, 3, 17])
def test_parallel_for_runs_every_chunk_once(workers, count):
    seen: list[int] = []
    lock = threading.Lock()

    def body(index: int) -> None:
        with lock:
            seen.append(index)

    with parallel.use_workers(workers):
        parallel.parallel_for(count, body)
    assert sorted(seen) == list(range(count))


def test_parallel_for_raises_a_chunk_error_after_all_chunks():
    done: list[int] = []

    def body(index: int) -> None:
        if index == 2:
            raise ValueError("chunk 2 failed")
        done.append(index)

    with parallel.use_workers(2), pytest.raises(ValueError, match="chunk 2 failed"):
        parallel.parallel_for(6, body)
    assert sorted(done) == [0, 1, 3, 4, 5]


def test_workers_are_per_thread_and_restored():
    seen = {}
    with parallel.use_workers(3):
        other = threading.Thread(target=lambda: seen.setdefault("other", parallel.workers()))
        other.start()
        other.join()
        seen["inside"] = parallel.workers()
    assert seen == {"other": 1, "inside": 3}
    assert parallel.workers() == 1


def test_split_covers_the_range_with_aligned_starts():
    blocks = parallel.split(100, 3, align=8)
    assert blocks[0][0] == 0 and blocks[-1][1] == 100
    assert all(a[1] == b[0] for a, b in zip(blocks, blocks[1:]))
    assert all(start % 8 == 0 for start, _ in blocks)


MODELS = {
    "mobilenet_v2": lambda: zoo.mobilenet_v2(size=64, seed=3),
    "transformer": lambda: zoo.transformer_encoder_block(seq=64, d=128, heads=4, seed=3),
    "resnet50": lambda: zoo.resnet50(batch=1, size=64, seed=3),
}


@pytest.mark.parametrize("split_all", [False, True], ids=["default thresholds", "everything split"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_threads_two_matches_onnxruntime_also_from_several_threads(name, split_all, monkeypatch):
    """Depthwise blocks, GEMM epilogues, GELU and attention split between workers (and BLAS
    threads for big GEMMs) give onnxruntime's outputs, also with four runs at once. These
    small models stay under the size thresholds, so they also run with every split forced."""
    if split_all:
        monkeypatch.setattr(parallel, "_MIN_PARALLEL_WORK", 0)
        monkeypatch.setattr(parallel, "BLAS_SPLIT_MACS", 0)
    proto = MODELS[name]()
    model = ei.convert(proto, optimize=2)
    feeds = zoo.example_inputs(proto, seed=1)
    reference = ei.Session(model, backend="onnxruntime", threads=1).run(feeds)
    session = ei.Session(model, backend="numpy", threads=2)
    for output, value in session.run(feeds).items():
        assert_close(value, reference[output], rtol=1e-4, atol=1e-5, scaled_atol=1e-5, name=output)  # fp32 sums in other orders
    results: list[dict] = []
    runners = [threading.Thread(target=lambda: results.append(session.run(feeds))) for _ in range(4)]
    for runner in runners:
        runner.start()
    for runner in runners:
        runner.join()
    assert len(results) == 4
    for result in results:
        for output, value in result.items():
            assert_close(value, reference[output], rtol=1e-4, atol=1e-5, scaled_atol=1e-5, name=output)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gelu_matches_math_erf_including_the_tails(dtype):
    x = np.concatenate([np.linspace(-12, 12, 4001), [-0.0, 0.0, 1e-30, -1e-30, 40.0, -40.0]]).astype(dtype)
    expected = np.array([0.5 * v * math.erfc(-v / math.sqrt(2.0)) for v in x.astype(np.float64)])
    got = apply_activation(x.copy(), "Gelu", ())
    assert got.dtype == dtype
    scale = np.abs(expected)
    # relative to each value (erfc keeps the negative tail precise), with a floor near zero
    error = np.abs(got.astype(np.float64) - expected) / np.maximum(scale, 1e-30 if dtype == np.float64 else 1e-6)
    assert error.max() < (2e-6 if dtype == np.float32 else 5e-7), float(error.max())


@pytest.mark.parametrize("shape", [(0, 8, 6, 6), (0, 8, 1, 9)])
def test_depthwise_conv_of_an_empty_tensor_is_empty(shape):
    from edgeinfer.backends.numpy.kernels.conv import conv

    x = np.zeros(shape, np.float32)
    w = np.ones((8, 1, 3, 3), np.float32)
    y = conv(x, w, np.ones(8, np.float32), group=8, pads=(1, 1, 1, 1))
    assert y.shape == shape


def test_a_run_keeps_blas_at_one_thread_except_for_big_gemms_and_restores_it():
    """While an executable with threads= is alive, BLAS stays at one thread between runs too
    (restoring it after each run woke OpenBLAS's pool); the last one gone restores it."""
    import gc

    def blas_threads() -> list[int]:  # the libraries the backend manages
        return [library.num_threads for library in parallel._blas_libraries()]

    if not blas_threads():
        pytest.skip("numpy is not linked to a BLAS that threadpoolctl can see")
    gc.collect()  # executables of earlier tests release BLAS when collected
    alone = parallel._holders == 0
    before = blas_threads()
    parallel.hold_blas()
    try:
        with parallel.RunThreads(2):
            assert blas_threads() == [1] * len(before) and parallel.workers() == 2
            with parallel.blas_for(parallel.BLAS_SPLIT_MACS):
                assert max(blas_threads()) == 2  # raised (a single-threaded BLAS build stays at 1)
            with parallel.blas_for(parallel.BLAS_SPLIT_MACS - 1):
                assert blas_threads() == [1] * len(before)
            assert blas_threads() == [1] * len(before)
        assert blas_threads() == [1] * len(before) and parallel.workers() == 1  # between runs
    finally:
        parallel.release_blas()
    if alone:  # no other executable holds BLAS: the count it had is back
        assert blas_threads() == before
