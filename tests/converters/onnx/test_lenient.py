"""Real-file failure classes (issue 19): what exporters write that onnxruntime runs although
``onnx.checker`` or the IR's invariants reject it. Each model is run by onnxruntime (the
oracle), converted with a warning where something was repaired, run on every installed
backend, and exported to an ONNX file that onnxruntime loads and the checker accepts."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import edgeinfer as ei
from devkit.testing import assert_close
from edgeinfer.backend import installed_backends
from edgeinfer.converters.onnx import OnnxLeniencyWarning
from edgeinfer.errors import ModelValidationError

OPSET = [helper.make_opsetid("", 17)]


def ort_run(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def info(name: str, shape, elem=TensorProto.FLOAT) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def conv_model(x_shape, y_shape, *, value_info=(), nodes=None, name="g") -> onnx.ModelProto:
    """Conv -> Relu -> Softmax over channels: a small net with weights, so the checks compare
    real arithmetic, not an identity."""
    rng = np.random.default_rng(0)
    w = helper.make_tensor("w", TensorProto.FLOAT, [4, 3, 3, 3], rng.standard_normal(108).astype(np.float32))
    nodes = nodes or [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
                      helper.make_node("Relu", ["c"], ["r"], name="relu"),
                      helper.make_node("Softmax", ["r"], ["y"], name="softmax", axis=1)]
    graph = helper.make_graph(nodes, name, [info("x", x_shape)], [info("y", y_shape)], [w],
                              value_info=list(value_info))
    return helper.make_model(graph, opset_imports=OPSET)


def check_everywhere(model: onnx.ModelProto, x: np.ndarray, tmp_path, *, warns: str | None) -> ei.Model:
    """onnxruntime runs ``model``; edgeinfer converts it (warning ``warns`` if given, else
    silently), matches on every installed backend, and exports a file onnxruntime matches with."""
    expected = ort_run(model, {"x": x})[0]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        converted = ei.convert(model)
    leniency = [str(w.message) for w in caught if issubclass(w.category, OnnxLeniencyWarning)]
    if warns is None:
        assert not leniency, leniency
    else:
        assert any(warns in text for text in leniency), (warns, leniency)
    for backend in installed_backends():
        with ei.Session(converted, backend=backend) as session:
            assert_close(session.run({"x": x})["y"], expected, rtol=1e-4, atol=1e-6, name=backend)
    path = tmp_path / "exported.onnx"
    ei.export(converted, path)
    onnx.checker.check_model(onnx.load(path), full_check=True)
    assert_close(ort_run(onnx.load(path), {"x": x})[0], expected, rtol=1e-4, atol=1e-6, name="export")
    return converted


def photo_like(shape, seed=0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1, 1, shape).astype(np.float32)


def dims(value) -> tuple:
    return tuple(value.shape)


# -- dynamic dims declared as -1 or 0 --------------------------------------------------------
def test_dim_value_minus_one_is_a_dynamic_dim(tmp_path):
    """paddle2onnx declares dynamic dims as ``dim_value: -1``; onnxruntime takes any size."""
    model = conv_model([-1, 3, -1, -1], [-1, 4, -1, -1], value_info=[info("c", [-1, 4, -1, -1])])
    converted = check_everywhere(model, photo_like((2, 3, 8, 10)), tmp_path, warns=None)
    assert dims(converted.inputs[0])[1] == 3 and not any(isinstance(d, int) and d < 0
                                                         for d in dims(converted.inputs[0]))
    ei.Session(converted, backend="numpy").run({"x": photo_like((1, 3, 5, 7))})  # another size


def test_dims_named_question_mark_are_independent(tmp_path):
    """paddle2onnx names every unknown dim ``?``; onnxruntime never ties them together, so an
    image 48 high and 192 wide is fine."""
    model = conv_model([-1, 3, "?", "?"], [-1, 4, "?", "?"])
    converted = check_everywhere(model, photo_like((1, 3, 6, 10)), tmp_path, warns=None)
    assert "?" not in dims(converted.inputs[0])


def test_dim_value_zero_on_an_input_is_dynamic_with_a_warning(tmp_path):
    """A 0 declared on an input (some exporters' "unknown"): onnxruntime would take only an
    empty tensor there; edgeinfer takes the dim as dynamic and says so."""
    model = conv_model([1, 3, 8, 8], [0, 4, 0, 0], value_info=[info("c", [0, 4, 8, 8])])
    check_everywhere(model, photo_like((1, 3, 8, 8)), tmp_path, warns=None)
    model = conv_model([0, 3, 8, 8], [1, 4, 8, 8])
    with pytest.warns(OnnxLeniencyWarning, match="input 'x' dim 0 declared 0 is taken as dynamic"):
        converted = ei.convert(model)
    x = photo_like((2, 3, 8, 8))
    expected = ort_run(conv_model([2, 3, 8, 8], [2, 4, 8, 8]), {"x": x})[0]
    assert_close(ei.Session(converted, backend="numpy").run({"x": x})["y"], expected, rtol=1e-4, atol=1e-6)


# -- outputs and value_info without a shape -------------------------------------------------
def untyped(name: str, elem: int | None = None) -> onnx.ValueInfoProto:
    value = onnx.ValueInfoProto()
    value.name = name
    if elem is not None:
        value.type.tensor_type.elem_type = elem
    return value


@pytest.mark.parametrize("output", ["no type", "no shape"])
def test_graph_output_without_a_shape_gets_one(output, tmp_path):
    model = conv_model([1, 3, 8, 8], [1, 4, 8, 8], value_info=[untyped("c"), untyped("r", TensorProto.FLOAT)])
    model.graph.output[0].CopyFrom(untyped("y") if output == "no type" else untyped("y", TensorProto.FLOAT))
    converted = check_everywhere(model, photo_like((1, 3, 8, 8)), tmp_path, warns="typed by shape inference")
    assert dims(converted.outputs[0]) == (1, 4, 8, 8)
    assert converted.outputs[0].dtype == "float32"


# -- node names --------------------------------------------------------------------------------
def test_nodes_sharing_a_name_or_with_none(tmp_path):
    """spox names its Constant nodes ``F0::anon``, all of them (onnxruntime turns Constant
    nodes into initializers before it checks names); exporters leave other names empty."""
    scale = helper.make_tensor("scale", TensorProto.FLOAT, [1, 4, 1, 1], [0.5, 1.0, 1.5, 2.0])
    nodes = [helper.make_node("Constant", [], ["k1"], name="F0::anon", value=scale),
             helper.make_node("Constant", [], ["k2"], name="F0::anon", value_float=0.25),
             helper.make_node("Conv", ["x", "w"], ["c"], name="", pads=[1, 1, 1, 1]),
             helper.make_node("Mul", ["c", "k1"], ["m"], name="F0::anon_1"),
             helper.make_node("Add", ["m", "k2"], ["r"], name=""),
             helper.make_node("Softmax", ["r"], ["y"], name="softmax", axis=1)]
    model = conv_model([1, 3, 8, 8], [1, 4, 8, 8], nodes=nodes)
    check_everywhere(model, photo_like((1, 3, 8, 8)), tmp_path, warns="renamed that shared a name")
    with pytest.warns(OnnxLeniencyWarning):
        unfolded = ei.convert(model, optimize=0)
    names = [node.name for node in unfolded.graph.nodes if node.name]
    assert sorted(names) == ["F0::anon", "F0::anon_1", "F0::anon_2", "softmax"]


def test_unnamed_nodes_everywhere(tmp_path):
    model = conv_model([1, 3, 8, 8], [1, 4, 8, 8])
    for node in model.graph.node:
        node.name = ""
    check_everywhere(model, photo_like((1, 3, 8, 8)), tmp_path, warns=None)


# -- what the checker rejects and onnxruntime runs --------------------------------------------
def reversed_nodes(model):
    nodes = list(model.graph.node)[::-1]
    del model.graph.node[:]
    model.graph.node.extend(nodes)


def duplicate_initializer(model):
    stale = helper.make_tensor("w", TensorProto.FLOAT, [4, 3, 3, 3], np.zeros(108, np.float32))
    model.graph.initializer.append(stale)  # onnxruntime uses the first one


LENIENT = {
    "nodes out of order": (reversed_nodes, "sorted topologically"),
    "unnamed graph": (lambda m: setattr(m.graph, "name", ""), "unnamed graph"),
    "no ir_version": (lambda m: setattr(m, "ir_version", 0), "ir_version set"),
    "duplicate initializer": (duplicate_initializer, "duplicate initializer"),
}


@pytest.mark.parametrize("case", LENIENT)
def test_checker_rejects_what_onnxruntime_runs(case, tmp_path):
    breaks, repair = LENIENT[case]
    model = conv_model([1, 3, 8, 8], [1, 4, 8, 8])
    breaks(model)
    with pytest.raises(onnx.checker.ValidationError):
        onnx.checker.check_model(model)
    check_everywhere(model, photo_like((1, 3, 8, 8)), tmp_path, warns=repair)


def test_what_onnxruntime_refuses_is_still_refused():
    model = conv_model([1, 3, 8, 8], [1, 4, 8, 8])
    model.graph.node[1].attribute.extend([helper.make_attribute("slope", 0.5)])  # Relu has none
    with pytest.raises(Exception, match="slope"):
        ort_run(model, {"x": photo_like((1, 3, 8, 8))})
    with pytest.raises(ModelValidationError, match="Unrecognized attribute: slope"):
        ei.convert(model)


def test_a_cycle_is_refused_not_sorted():
    model = conv_model([1, 3, 8, 8], [1, 4, 8, 8])
    model.graph.node[0].input[0] = "y"  # conv reads the softmax's output
    with pytest.raises(ModelValidationError, match="topologically sorted|cycle"):
        ei.convert(model)
