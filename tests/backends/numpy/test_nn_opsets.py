"""Old-opset semantics of the NN kernels, run without the ONNX front end's opset upgrade.

Softmax, LogSoftmax and Hardmax before opset 13 normalize over the input coerced to 2-D at
``axis``; Upsample (opsets 7 and 9) and Resize-10 use asymmetric coordinates. Each model is
converted with ``upgrade=False`` so the versioned kernel registry must pick the old kernel,
and compared with onnxruntime: onnx.reference applies the opset-13 per-axis semantics to
Softmax-11 and disagrees with onnxruntime (and the spec) on BatchNormalization-9.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import edgeinfer as ei
from devkit.testing import assert_close


def _model(op: str, opset: int, x: np.ndarray, consts: dict[str, np.ndarray] | None = None, n_outputs: int = 1,
           **attrs) -> onnx.ModelProto:
    consts = consts or {}
    outputs = [f"y{k}" for k in range(n_outputs)]
    node = helper.make_node(op, ["x", *consts], outputs, **attrs)
    graph = helper.make_graph(
        [node], op, [helper.make_tensor_value_info("x", helper.np_dtype_to_tensor_dtype(x.dtype), x.shape)],
        [helper.make_empty_tensor_value_info(o) for o in outputs],
        [numpy_helper.from_array(v, k) for k, v in consts.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 7
    return onnx.shape_inference.infer_shapes(model)


def _onnxruntime(model: onnx.ModelProto, x: np.ndarray) -> list[np.ndarray]:
    ort = pytest.importorskip("onnxruntime")
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})


def _run(model: onnx.ModelProto, x: np.ndarray) -> list[np.ndarray]:
    session = ei.Session(ei.convert(model, upgrade=False), backend="numpy")
    assert not session.stats().get("fallback_ops")
    results = session.run({"x": x})
    return [results[o.name] for o in model.graph.output]


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax", "Hardmax"])
@pytest.mark.parametrize("axis", [0, 1, 2, -1])
def test_softmax_family_opset_11_flattens(rng, op: str, axis: int) -> None:
    x = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    model = _model(op, 11, x, axis=axis)
    (expected,) = _onnxruntime(model, x)
    (got,) = _run(model, x)
    assert got.dtype == expected.dtype
    assert_close(got, expected)


def test_softmax_opset_13_is_per_axis(rng) -> None:
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    (got,) = _run(_model("Softmax", 13, x, axis=1), x)
    assert_close(got.sum(axis=1), np.ones((2, 4), np.float32))


@pytest.mark.parametrize("opset", [7, 9])
def test_upsample_nearest(rng, opset: int) -> None:
    x = rng.standard_normal((1, 2, 3, 4)).astype(np.float32)
    scales = [1.0, 1.0, 3.0, 2.0]
    if opset == 7:
        model = _model("Upsample", 7, x, mode="nearest", scales=scales)
    else:
        model = _model("Upsample", 9, x, {"scales": np.array(scales, np.float32)}, mode="nearest")
    (got,) = _run(model, x)
    assert_close(got, np.repeat(np.repeat(x, 3, axis=2), 2, axis=3))


@pytest.mark.parametrize("op, opset", [("Upsample", 9), ("Resize", 10)])
def test_upsample_linear_matches_onnxruntime(rng, op: str, opset: int) -> None:
    x = rng.standard_normal((1, 2, 3, 4)).astype(np.float32)
    model = _model(op, opset, x, {"scales": np.array([1, 1, 2.0, 1.5], np.float32)}, mode="linear")
    (expected,) = _onnxruntime(model, x)
    (got,) = _run(model, x)
    assert_close(got, expected)


def test_max_pool_opset_8_indices(rng) -> None:
    x = rng.standard_normal((1, 2, 6, 7)).astype(np.float32)
    model = _model("MaxPool", 8, x, n_outputs=2, kernel_shape=[2, 3], strides=[2, 2], storage_order=1)
    expected = ReferenceEvaluator(model).run(None, {"x": x})
    got = _run(model, x)
    for g, e in zip(got, expected, strict=True):
        assert g.dtype == e.dtype
        assert_close(g, e)


def test_batch_normalization_opset_9(rng) -> None:
    x = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    params = {k: rng.uniform(0.5, 1.5, 3).astype(np.float32) for k in ("scale", "b", "mean", "var")}
    model = _model("BatchNormalization", 9, x, params, epsilon=1e-3)
    (expected,) = _onnxruntime(model, x)
    (got,) = _run(model, x)
    assert_close(got, expected)
