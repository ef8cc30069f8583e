"""Session: feeds are validated with messages quoting expected vs got; outputs in graph order."""

from __future__ import annotations

import numpy as np
import pytest

import edgeinfer as ei
from devkit.testing import parse_model
from edgeinfer.errors import BackendError, InputError


@pytest.fixture
def session(mlp_model):
    return ei.Session(ei.convert(mlp_model), backend="numpy", threads=1)


def test_inputs_and_outputs_describe_the_model(session):
    assert [(t.name, t.dtype, t.shape) for t in session.inputs] == [("x", "float32", ("N", 8))]
    assert [(t.name, t.dtype, t.shape) for t in session.outputs] == [("y", "float32", ("N", 4))]


def test_symbolic_batch_runs_at_several_sizes(session, rng):
    for batch in (1, 5):
        out = session.run({"x": rng.standard_normal((batch, 8)).astype(np.float32)})["y"]
        assert out.shape == (batch, 4)
        np.testing.assert_allclose(out.sum(axis=1), 1.0, rtol=1e-5)  # softmax rows


@pytest.mark.parametrize("feeds, message", [
    ({}, r"expected inputs \['x'\], got \[\].*missing"),
    ({"x": np.zeros((1, 8), np.float32), "extra": np.zeros(1)}, r"unknown: \['extra'\]"),
    ({"x": np.zeros((1, 8), np.float64)}, "expected dtype float32, got float64"),
    ({"x": np.zeros((8,), np.float32)}, r"expected rank 2 shape \[N, 8\], got rank 1 shape \[8\]"),
    ({"x": np.zeros((2, 7), np.float32)}, r"expected shape \[N, 8\], got \[2, 7\] \(dim 1 must be 8\)"),
])
def test_bad_feeds_raise_input_error(session, feeds, message):
    with pytest.raises(InputError, match=message):
        session.run(feeds)


def test_symbol_bound_consistently_across_inputs(rng):
    model = ei.convert(parse_model("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[N, 3] a, float[N, 3] b) => (float[N, 3] y) { y = Add(a, b) }"""))
    sess = ei.Session(model)
    with pytest.raises(InputError, match="symbol 'N' = 4, but input 'a' bound 'N' = 2"):
        sess.run({"a": np.zeros((2, 3), np.float32), "b": np.zeros((4, 3), np.float32)})


def test_session_from_path_and_unknown_backend(tmp_path, mlp_model):
    import onnx

    path = tmp_path / "mlp.onnx"
    onnx.save(mlp_model, path)
    assert ei.Session(path).inputs[0].name == "x"
    with pytest.raises(BackendError, match="unknown backend 'tpu'"):
        ei.Session(path, backend="tpu")


def test_requesting_named_outputs(session):
    with pytest.raises(InputError, match="unknown output"):
        session.run({"x": np.zeros((1, 8), np.float32)}, outputs=["nope"])
