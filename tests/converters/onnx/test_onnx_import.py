"""The ONNX front end: import, export, external data, old opsets, and bad input."""

from __future__ import annotations

import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

import edgeinfer as ei
from devkit.testing import assert_close, parse_model
from edgeinfer.converters.onnx import export, import_model
from edgeinfer.errors import ModelFormatError, ModelValidationError, UnsupportedOpError


def ort_run(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def test_import_export_round_trip_matches_onnxruntime(mlp_model, rng):
    graph = ei.convert(mlp_model).graph
    exported = export(graph)
    onnx.checker.check_model(exported, full_check=True)
    x = rng.standard_normal((5, 8)).astype(np.float32)
    expected = ort_run(mlp_model, {"x": x})[0]
    assert_close(ort_run(exported, {"x": x})[0], expected)
    assert_close(ei.Session(ei.Model(graph)).run({"x": x})["y"], expected, rtol=1e-5, atol=1e-6)


def test_export_to_file_is_written_atomically(mlp_model, tmp_path):
    path = tmp_path / "out.onnx"
    export(ei.convert(mlp_model).graph, path)
    assert onnx.load(path).graph.output[0].name == "y"
    assert [p.name for p in tmp_path.iterdir()] == ["out.onnx"]


def _external_model(folder, location: str, offset: int = 0, length: int | None = None):
    w = np.arange(6, dtype=np.float32).reshape(2, 3)
    (folder / "weights.bin").write_bytes(b"\0" * offset + w.tobytes())
    tensor = numpy_helper.from_array(w, "w")
    tensor.ClearField("raw_data")
    tensor.data_location = onnx.TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", str(offset)),
                       ("length", str(w.nbytes if length is None else length))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    node = helper.make_node("MatMul", ["x", "w"], ["y"])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", 1, [1, 2])],
                              [helper.make_tensor_value_info("y", 1, [1, 3])], [tensor])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = folder / "model.onnx"
    path.write_bytes(model.SerializeToString())
    return path, w


def test_external_data_inside_model_folder(tmp_path):
    path, w = _external_model(tmp_path, "weights.bin", offset=16)
    model = ei.convert(path)
    x = np.ones((1, 2), np.float32)
    assert_close(ei.Session(model).run({"x": x})["y"], x @ w)


@pytest.mark.parametrize("location", ["../weights.bin", "/etc/passwd", "sub/../../weights.bin"])
def test_external_data_outside_folder_is_refused(tmp_path, location):
    inner = tmp_path / "inner"
    inner.mkdir()
    path, _ = _external_model(inner, location)
    with pytest.raises(ModelFormatError, match="inside"):
        ei.convert(path)


def test_external_data_out_of_bounds_is_refused(tmp_path):
    path, _ = _external_model(tmp_path, "weights.bin", length=10_000)
    with pytest.raises(ModelFormatError, match="outside"):
        ei.convert(path)


@pytest.mark.parametrize("content", [b"", b"\x08\x07garbage", os.urandom(256)])
def test_bad_onnx_files_raise_model_format_error(tmp_path, content):
    path = tmp_path / "bad.onnx"
    path.write_bytes(content)
    with pytest.raises(ModelFormatError, match="bad.onnx"):
        ei.convert(path)


def test_truncated_onnx_file(tmp_path, mlp_model):
    data = mlp_model.SerializeToString()
    for cut in (1, len(data) // 3, len(data) // 2, len(data) - 7):
        path = tmp_path / f"cut{cut}.onnx"
        path.write_bytes(data[:cut])
        with pytest.raises((ModelFormatError, ModelValidationError)):
            ei.convert(path)


def test_missing_file(tmp_path):
    with pytest.raises(ModelFormatError, match="no such file"):
        ei.convert(tmp_path / "absent.onnx")


def test_unknown_op_names_op_and_node():
    node = helper.make_node("FancyConv", ["x"], ["y"], name="layer7")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", 1, [1])],
                              [helper.make_tensor_value_info("y", 1, [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(UnsupportedOpError, match="layer7.*FancyConv"):
        ei.convert(model)


def test_cycle_is_a_validation_error():
    nodes = [helper.make_node("Add", ["x", "b"], ["a"], name="n1"),
             helper.make_node("Relu", ["a"], ["b"], name="n2")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", 1, [1])],
                              [helper.make_tensor_value_info("b", 1, [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(ModelValidationError):
        import_model(model)


@pytest.mark.parametrize("opset", [7, 9, 11, 13, 17, onnx.defs.onnx_opset_version()])
def test_every_opset_from_7_imports_and_runs(opset, rng):
    """A conv net written at each opset (version-specific op forms included) runs correctly."""
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Flatten", ["p"], ["f"], axis=1),
             helper.make_node("Softmax", ["f"], ["y"], axis=1)]
    if opset < 13:
        nodes.append(helper.make_node("Unsqueeze", ["y"], ["z"], axes=[0]))
    else:
        axes = numpy_helper.from_array(np.array([0], np.int64), "axes")
        nodes.insert(0, helper.make_node("Constant", [], ["axes"], value=axes))
        nodes.append(helper.make_node("Unsqueeze", ["y", "axes"], ["z"]))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", 1, [2, 3, 8, 8])],
                              [helper.make_tensor_value_info("z", 1, [1, 2, 64])],
                              [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 7 if opset < 21 else onnx.IR_VERSION
    x = rng.standard_normal((2, 3, 8, 8)).astype(np.float32)
    expected = ort_run(model, {"x": x})[0] if opset <= 21 else None
    converted = ei.convert(model)
    got = ei.Session(converted).run({"x": x})["z"]
    if expected is not None:
        assert_close(got, expected, rtol=1e-5, atol=1e-6)
    assert got.shape == (1, 2, 64)


def test_opset_older_than_7_is_upgraded_when_the_converter_can(rng):
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", 1, [4])],
                              [helper.make_tensor_value_info("y", 1, [4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 6)])
    converted = ei.convert(model)
    assert converted.graph.opset[""] >= 7
    x = rng.standard_normal(4).astype(np.float32)
    assert_close(ei.Session(converted).run({"x": x})["y"], np.maximum(x, 0))


def test_local_functions_are_inlined(rng):
    model = parse_model("""
        <ir_version: 8, opset_import: ["" : 17, "local" : 1]>
        g (float[3] x) => (float[3] y)
        {
            y = local.Swish(x)
        }
        <domain: "local", opset_import: ["" : 17]>
        Swish (a) => (b)
        {
            s = Sigmoid(a)
            b = Mul(a, s)
        }""")
    graph = ei.convert(model).graph
    assert {n.op_type for n in graph.nodes} == {"Sigmoid", "Mul"}
    x = rng.standard_normal(3).astype(np.float32)
    assert_close(ei.Session(ei.Model(graph)).run({"x": x})["y"], ort_run(model, {"x": x})[0])


@pytest.mark.parametrize("op, opset, attrs", [
    ("Upsample", 9, {"mode": "linear"}),
    ("Resize", 10, {"mode": "linear"}),
    ("Hardmax", 11, {"axis": 1}),
    ("Softmax", 11, {"axis": 1}),
])
def test_old_opset_semantics_survive_import(op, opset, attrs, rng):
    """Ops whose meaning changed across opsets give the old results (onnxruntime on the original)."""
    x = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    inits = []
    inputs = ["x"]
    if op in ("Upsample", "Resize"):
        inits.append(numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales"))
        inputs.append("scales")
    graph = helper.make_graph([helper.make_node(op, inputs, ["y"], **attrs)], "g",
                              [helper.make_tensor_value_info("x", 1, x.shape)],
                              [helper.make_tensor_value_info("y", 1, ["a", "b", "c", "d"])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 7
    expected = ort_run(model, {"x": x})[0]
    assert_close(ei.Session(ei.convert(model)).run({"x": x})["y"], expected)
