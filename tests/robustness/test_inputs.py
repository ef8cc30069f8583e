"""Inference feeds that do not fit the model: ``InputError`` saying what was expected; unusual
but valid arrays (non-contiguous, read-only, a zero-size batch) give the contiguous result."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import edgeinfer as ei
from devkit.testing import assert_close
from edgeinfer.backend import available_backends
from edgeinfer.errors import EdgeInferError, InputError

BACKENDS = ["numpy", "onnxruntime"]
CNN = Path(__file__).resolve().parents[2] / "models" / "sample_cnn.onnx"


@pytest.fixture(scope="module")
def mlp(seeds):
    return ei.convert(seeds.path("onnx"))


@pytest.fixture(scope="module")
def x():
    return np.random.default_rng(0).standard_normal((6, 4)).astype(np.float32)


def readonly(array: np.ndarray) -> np.ndarray:
    array = array.copy()
    array.setflags(write=False)
    return array


BAD_FEEDS = {
    "unknown name": (lambda x: {"z": x}, "unknown: ['z']"),
    "extra name": (lambda x: {"x": x, "z": x}, "unknown: ['z']"),
    "missing input": (lambda x: {}, "missing: ['x']"),
    "rank too high": (lambda x: {"x": x[None]}, "expected rank 2"),
    "scalar": (lambda x: {"x": np.float32(1.0)}, "expected rank 2"),
    "float64": (lambda x: {"x": x.astype(np.float64)}, "expected dtype float32, got float64"),
    "int32": (lambda x: {"x": x.astype(np.int32)}, "expected dtype float32, got int32"),
    "object": (lambda x: {"x": x.astype(object)}, "expected dtype float32, got object"),
    "strings": (lambda x: {"x": np.array([["a"] * 4])}, "expected dtype float32"),
    "wrong dim": (lambda x: {"x": x[:, :3]}, "dim 1 must be 4"),
    "not a dict": (lambda x: [x], "expected a dict"),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", sorted(BAD_FEEDS))
def test_bad_feeds_are_input_errors(mlp, x, backend, case):
    make, message = BAD_FEEDS[case]
    with ei.Session(mlp, backend=backend) as session, pytest.raises(InputError, match=message.replace("[", r"\[")):
        session.run(make(x))


GOOD_VARIANTS = {
    "fortran order": lambda x: np.asfortranarray(x),
    "strided view": lambda x: np.repeat(x, 2, axis=1)[:, ::2],
    "reversed view": lambda x: x[::-1].copy()[::-1],
    "read-only": readonly,
    "read-only strided": lambda x: readonly(np.repeat(x, 2, axis=1))[:, ::2],
    "unaligned": lambda x: np.frombuffer(b"\0" + x.tobytes(), np.float32, offset=1).reshape(x.shape),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("variant", sorted(GOOD_VARIANTS))
def test_unusual_arrays_give_the_contiguous_result(mlp, x, backend, variant):
    feed = GOOD_VARIANTS[variant](x)
    assert np.array_equal(feed, x)
    with ei.Session(mlp, backend=backend) as session:
        expected = session.run({"x": np.ascontiguousarray(x)})["y"]
        assert_close(session.run({"x": feed})["y"], expected)
    assert np.array_equal(feed, x)  # the feed was not written to


@pytest.mark.parametrize("backend", BACKENDS)
def test_zero_size_batch(mlp, x, backend):
    with ei.Session(mlp, backend=backend) as session:
        assert session.run({"x": x[:0]})["y"].shape == (0, 3)


@pytest.mark.parametrize("backend", [b for b in ("numpy", "onnxruntime", "tflite", "openvino")
                                     if b in available_backends()])
def test_zero_size_batch_through_a_cnn(backend):
    """numpy and onnxruntime return empty outputs; engines that cannot (XNNPACK, OpenVINO)
    must fail with a typed error, not crash."""
    model = ei.convert(CNN, dynamic_batch=True)
    name = model.inputs[0].name
    batch = np.random.default_rng(1).standard_normal((2, 3, 64, 64)).astype(np.float32)
    with ei.Session(model, backend=backend) as session:
        try:
            out = session.run({name: batch[:0]})
        except EdgeInferError:
            assert backend not in BACKENDS
        else:
            assert next(iter(out.values())).shape[0] == 0
        nchw_view = np.ascontiguousarray(batch.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
        assert_close(next(iter(session.run({name: nchw_view}).values())),
                     next(iter(session.run({name: batch}).values())))
