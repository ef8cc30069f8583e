"""Quantization parameters and weights that make results meaningless: zero, negative,
subnormal, NaN or infinite scales and out-of-range zero points are typed errors when a QDQ
model is loaded (and so never run); NaN/Inf weights warn, or refuse with ``strict=True``."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import edgeinfer as ei
from edgeinfer.errors import ModelFormatError, ModelValidationError
from edgeinfer.ir.verify import NonFiniteWeightsWarning

OPSET = [helper.make_opsetid("", 17)]


def zero_point(value: int, dtype: int = TensorProto.INT8) -> onnx.TensorProto:
    """Stored widened in int32_data, as ONNX does (so out-of-range values can be written)."""
    tensor = onnx.TensorProto(name="z", data_type=dtype, dims=[])
    tensor.int32_data.append(value)
    return tensor


def qdq_model(scale=0.1, zero=None, weight_scale=0.05) -> onnx.ModelProto:
    """x -> QuantizeLinear -> DequantizeLinear -> MatMul with an int8 weight through DequantizeLinear."""
    initializers = [numpy_helper.from_array(np.asarray(scale, np.float32), "s"),
                    zero if zero is not None else zero_point(0),
                    numpy_helper.from_array(np.arange(12, dtype=np.int8).reshape(4, 3), "wq"),
                    numpy_helper.from_array(np.asarray(weight_scale, np.float32), "ws"),
                    numpy_helper.from_array(np.array(0, np.int8), "wz")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"], name="quant_x"),
             helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"], name="dequant_x"),
             helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["w"], name="dequant_w"),
             helper.make_node("MatMul", ["xd", "w"], ["y"], name="matmul")]
    graph = helper.make_graph(nodes, "qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])], initializers)
    return helper.make_model(graph, opset_imports=OPSET)


@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
def test_valid_qdq_model_runs(backend):
    x = np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)
    y = ei.Session(ei.convert(qdq_model()), backend=backend).run({"x": x})["y"]
    assert y.shape == (2, 3) and np.isfinite(y).all()


@pytest.mark.parametrize("scale, which", [(scale, which) for scale in [0.0, -0.1, float("nan"), float("inf"), 1e-45,
                                                                       [0.1, 0.0]]
                                           for which in ["activation", "weight"]
                                           if not (which == "weight" and scale == 1e-45)])
def test_bad_scales_are_refused(tmp_path, scale, which):
    model = qdq_model(scale=scale) if which == "activation" else qdq_model(weight_scale=scale)
    path = tmp_path / "qdq.onnx"
    onnx.save(model, path)
    node = "quant_x" if which == "activation" else "dequant_w"
    with pytest.raises((ModelValidationError, ModelFormatError), match=f"{node}|scale"):
        ei.convert(path)


@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
def test_subnormal_scale_of_a_stored_weight_is_accepted(backend):
    """Only multiplying constant integers, it is exact and finite: onnxruntime runs it (and its
    own quantize_static writes such bias scales), so loading accepts it."""
    x = np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)
    y = ei.Session(ei.convert(qdq_model(weight_scale=1e-45)), backend=backend).run({"x": x})["y"]
    assert np.isfinite(y).all() and np.abs(y).max() < 1e-40  # 1e-45 * int8 products: (sub)normal, ~0


@pytest.mark.parametrize("value, dtype", [(300, TensorProto.UINT8), (-1, TensorProto.UINT8),
                                          (-129, TensorProto.INT8), (128, TensorProto.INT8),
                                          (70000, TensorProto.UINT16)])
def test_out_of_range_zero_point_is_refused(value, dtype):
    """numpy_helper wraps (uint8 300 -> 44) or clips such values silently."""
    with pytest.raises(ModelFormatError, match=f"values in .*found {value}"):
        ei.convert(qdq_model(zero=zero_point(value, dtype)))


def test_bad_scale_in_an_eim_file_is_refused_on_load(tmp_path):
    """The check is part of Graph.verify, which loading an .eim file runs too."""
    graph = ei.convert(qdq_model(), optimize=0).graph
    zeroed = {**graph.initializers, "s": np.zeros_like(graph.initializers["s"])}
    path = tmp_path / "q.eim"
    ei.Model(graph.replace(initializers=zeroed)).save(path)  # saving does not verify
    with pytest.raises(ModelValidationError, match="quant_x.*expected finite positive"):
        ei.load(path)


def float_model(weight: np.ndarray, op: str = "MatMul") -> onnx.ModelProto:
    node = helper.make_node(op, ["x", "w"], ["y"], name="layer")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])],
                              [numpy_helper.from_array(weight, "w")])
    return helper.make_model(graph, opset_imports=OPSET)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nonfinite_weights_warn_or_refuse_when_strict(bad):
    weight = np.eye(2, dtype=np.float32)
    weight[0, 1] = bad
    with pytest.warns(NonFiniteWeightsWarning, match="'w'.*strict=True"):
        ei.convert(float_model(weight), optimize=0)
    with pytest.raises(ModelValidationError, match="'w'.*strict=True"):
        ei.convert(float_model(weight), optimize=0, strict=True)


def test_an_infinite_mask_added_to_scores_is_not_a_bad_weight():
    mask = np.array([[0.0, -np.inf]], np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error", NonFiniteWeightsWarning)
        ei.convert(float_model(mask, op="Add"), optimize=0, strict=True)


def test_finite_weights_are_quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("error", NonFiniteWeightsWarning)
        ei.convert(float_model(np.eye(2, dtype=np.float32)), strict=True)
