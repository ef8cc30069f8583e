"""numpy kernels on what real models feed them (issue 19): Softmax before opset 13 on a 4-D
tensor (onnx's shipped light SqueezeNet ends in one), at every thread count, and Sigmoid on
inputs large enough to overflow ``exp``. onnxruntime is the oracle."""

from __future__ import annotations

import os
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper

import edgeinfer as ei
from devkit.testing import assert_close


def ort_run(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def one_node(op: str, opset: int, shape, **attrs) -> onnx.ModelProto:
    graph = helper.make_graph([helper.make_node(op, ["x"], ["y"], **attrs)], op,
                              [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, shape)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


@pytest.mark.parametrize("upgrade", [False, True])
@pytest.mark.parametrize("threads", [1, 2, 4])
@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_softmax_before_opset_13_on_4d_at_every_thread_count(op, threads, upgrade, rng):
    """Axis 1 of a 4-D NCHW tensor, as classifier heads end: normalized over C*H*W, not per
    pixel; the result must not depend on ``threads``."""
    x = (4 * rng.standard_normal((2, 10, 3, 5))).astype(np.float32)
    model = one_node(op, 9, x.shape, axis=1)
    (expected,) = ort_run(model, {"x": x})
    with ei.Session(ei.convert(model, upgrade=upgrade), backend="numpy", threads=threads) as session:
        assert_close(session.run({"x": x})["y"], expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("threads", [1, 2])
def test_light_squeezenet_matches_onnxruntime(threads):
    """onnx's light SqueezeNet (opset 9) ends in Softmax-1 over a (1, 1000, 1, 1) tensor."""
    path = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light", "light_squeezenet.onnx")
    model = onnx.load(path)
    x = np.random.default_rng(3).uniform(-2, 2, (1, 3, 224, 224)).astype(np.float32)
    (expected,) = ort_run(model, {"data_0": x})
    for upgrade in (False, True):
        with ei.Session(ei.convert(path, upgrade=upgrade), backend="numpy", threads=threads) as session:
            got = session.run({"data_0": x})["softmaxout_1"]
        assert_close(got, expected, rtol=1e-4, atol=1e-7)
        assert_close(got.sum(), np.float32(1.0), rtol=1e-5)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
def test_sigmoid_on_large_inputs_is_exact_and_silent(dtype):
    x = np.array([-1e30, -1e4, -100, -88.8, -20, -1, 0, 1, 20, 88.8, 100, 1e4, 1e30], np.float64)
    with np.errstate(over="ignore"):
        x = x[np.isfinite(x.astype(dtype))].astype(dtype)
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    graph = helper.make_graph([helper.make_node("Sigmoid", ["x"], ["y"])], "sigmoid",
                              [helper.make_tensor_value_info("x", elem, x.shape)],
                              [helper.make_tensor_value_info("y", elem, x.shape)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    (expected,) = ort_run(model, {"x": x})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "invalid value" nor "overflow" from inside the kernel
        with ei.Session(ei.convert(model), backend="numpy") as session:
            got = session.run({"x": x})["y"]
    assert not np.isnan(got).any()
    # onnxruntime's kernel flushes results below about 1e-8 to 0; ours keeps them
    assert_close(got, expected, rtol=1e-6 if dtype != np.float16 else 1e-3, atol=1e-7)
    with np.errstate(over="ignore"):
        exact = 1.0 / (1.0 + np.exp(-x.astype(np.float64)))
    smallest = float(np.finfo(dtype).smallest_subnormal)  # subnormal results carry few digits
    assert_close(got.astype(np.float64), exact, rtol=1e-6 if dtype != np.float16 else 1e-3, atol=4 * smallest)


def test_fused_sigmoid_and_silu_on_large_inputs_are_silent():
    """Conv + Sigmoid / Conv + Mul(x, Sigmoid(x)) fuse into FusedConv at optimize=2: the fused
    epilogue must give 0 and 1 at the extremes without overflow warnings."""
    w = helper.make_tensor("w", onnx.TensorProto.FLOAT, [2, 1, 1, 1], [1e4, -1e4])
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Sigmoid", ["c"], ["s"]),
             helper.make_node("Mul", ["c", "s"], ["y"])]
    graph = helper.make_graph(nodes, "silu", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 1, 2, 2])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 2, 2, 2])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = np.array([[[[1.0, -1.0], [50.0, -50.0]]]], np.float32)
    (expected,) = ort_run(model, {"x": x})
    converted = ei.convert(model, optimize=2)
    assert any(node.op_type == "FusedConv" for node in converted.graph.nodes)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with ei.Session(converted, backend="numpy") as session:
            got = session.run({"x": x})["y"]
    assert_close(got, expected, rtol=1e-6, atol=0)
