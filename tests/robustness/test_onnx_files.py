"""Hostile and broken ONNX files: typed errors naming the file and the field, never a crash,
never a read outside the model's folder."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from corpus import wire_field
from onnx import TensorProto, helper, numpy_helper

import edgeinfer as ei
from edgeinfer import limits
from edgeinfer.errors import ModelFormatError, ModelValidationError, UnsupportedOpError

OPSET = [helper.make_opsetid("", 17)]


def tensor_info(name: str, shape=(1,), dtype=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, dtype, list(shape))


def identity_model(node_name: str = "layerA", value_info=()) -> onnx.ModelProto:
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"], name=node_name)], "g",
                              [tensor_info("x")], [tensor_info("y")], value_info=list(value_info))
    return helper.make_model(graph, opset_imports=OPSET)


def save(tmp_path, raw: bytes, name: str = "model.onnx"):
    path = tmp_path / name
    path.write_bytes(raw)
    return path


# -- strings and names ---------------------------------------------------------------------------
@pytest.mark.parametrize("field", ["node name", "op_type"])
def test_invalid_utf8_in_a_string_field(tmp_path, field):
    """protobuf hands an undecodable proto2 string over as bytes; found by fuzzing (a
    UnicodeDecodeError and a TypeError escaped from the checker and the op lookup)."""
    raw = identity_model().SerializeToString()
    old = b"layerA" if field == "node name" else b"Identity"
    raw = raw.replace(old, old[:-1] + b"\xff")
    path = save(tmp_path, raw)
    with pytest.raises(ModelFormatError, match="expected a UTF-8 string, found undecodable bytes") as info:
        ei.convert(path)
    assert str(path) in str(info.value)


def test_name_longer_than_the_limit(tmp_path, monkeypatch):
    monkeypatch.setattr(limits, "MAX_NAME_CHARS", 100)
    path = save(tmp_path, identity_model("n" * 101).SerializeToString())
    with pytest.raises(ModelFormatError, match="expected a name of at most 100 characters, found 101"):
        ei.convert(path)


def test_duplicate_output_names_are_a_validation_error():
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Neg", ["x"], ["y"])],
                              "g", [tensor_info("x")], [tensor_info("y")])
    with pytest.raises(ModelValidationError, match="'y'"):
        ei.convert(helper.make_model(graph, opset_imports=OPSET))


def test_cyclic_graph_is_a_validation_error():
    graph = helper.make_graph([helper.make_node("Add", ["x", "b"], ["a"]), helper.make_node("Relu", ["a"], ["b"])],
                              "g", [tensor_info("x")], [tensor_info("b")])
    with pytest.raises(ModelValidationError, match="cycle|topologically sorted"):
        ei.convert(helper.make_model(graph, opset_imports=OPSET))


def test_unknown_op_names_op_and_node():
    graph = helper.make_graph([helper.make_node("Frobnicate", ["x"], ["y"], name="n7")], "g",
                              [tensor_info("x")], [tensor_info("y")])
    with pytest.raises(UnsupportedOpError, match="'n7'.*'Frobnicate'"):
        ei.convert(helper.make_model(graph, opset_imports=OPSET))


# -- shapes and sizes ------------------------------------------------------------------------------
def test_absurd_rank_of_a_declared_shape():
    model = identity_model(value_info=[tensor_info("x2", [1] * (limits.MAX_RANK + 1))])
    with pytest.raises(ModelFormatError, match=f"at most {limits.MAX_RANK} dims, found {limits.MAX_RANK + 1}"):
        ei.convert(model)


def test_absurd_rank_of_an_initializer():
    tensor = helper.make_tensor("w", TensorProto.FLOAT, [1] * 100, [1.0])
    graph = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "g", [tensor_info("x")],
                              [tensor_info("y")], [tensor])
    with pytest.raises(ModelFormatError, match="'w': expected at most 64 dims, found 100"):
        ei.convert(helper.make_model(graph, opset_imports=OPSET))


@pytest.mark.parametrize("dims", [[2**40, 2**40], [-3, 2], [2**62, 4]])
def test_initializer_dims_that_do_not_match_its_data(dims):
    tensor = helper.make_tensor("w", TensorProto.FLOAT, [2], [1.0, 2.0])
    tensor.dims[:] = dims
    graph = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "g", [tensor_info("x", [2])],
                              [tensor_info("y", [2])], [tensor])
    with pytest.raises((ModelFormatError, ModelValidationError)):
        ei.convert(helper.make_model(graph, opset_imports=OPSET))


def test_protobuf_larger_than_its_limit(tmp_path, monkeypatch):
    path = save(tmp_path, identity_model().SerializeToString())
    monkeypatch.setattr(limits, "MAX_PROTOBUF_BYTES", 10)
    with pytest.raises(ModelFormatError, match="at most 10 bytes"):
        ei.convert(path)


# -- deep nesting ---------------------------------------------------------------------------------------
def nested_if_model(depth: int) -> onnx.ModelProto:
    """``depth`` If nodes, each holding the next one in its then-branch."""
    body = helper.make_graph([helper.make_node("Identity", ["x"], ["y0"])], "g0", [], [tensor_info("y0")])
    for level in range(1, depth + 1):
        other = helper.make_graph([helper.make_node("Identity", ["x"], [f"y{level}"])], f"e{level}", [],
                                  [tensor_info(f"y{level}")])
        node = helper.make_node("If", ["c"], [f"y{level}"], then_branch=body, else_branch=other)
        body = helper.make_graph([node], f"g{level}", [], [tensor_info(f"y{level}")])
    graph = helper.make_graph(body.node, "top", [tensor_info("c", [], TensorProto.BOOL), tensor_info("x")],
                              list(body.output))
    return helper.make_model(graph, opset_imports=OPSET)


def test_nesting_up_to_the_limit_converts_and_runs():
    model = ei.convert(nested_if_model(limits.MAX_GRAPH_NESTING - 1))
    x = np.array([3.0], np.float32)
    assert ei.Session(model).run({"c": np.array(True), "x": x})["y15"].tolist() == [3.0]


def test_nesting_beyond_the_limit_is_refused():
    with pytest.raises(ModelFormatError, match=f"nested at most {limits.MAX_GRAPH_NESTING} deep"):
        ei.convert(nested_if_model(limits.MAX_GRAPH_NESTING + 1))


def test_subgraphs_nested_1000_deep_in_a_file(tmp_path):
    """Written on the wire directly (protobuf's Python API refuses to build it)."""
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g", [], [tensor_info("y")])
    raw = graph.SerializeToString()
    for _ in range(1000):
        attr = onnx.AttributeProto(name="then_branch", type=onnx.AttributeProto.GRAPH).SerializeToString()
        attr += wire_field(6, raw)  # AttributeProto.g
        node = helper.make_node("If", ["c"], ["y"]).SerializeToString() + wire_field(5, attr)  # NodeProto.attribute
        raw = helper.make_graph([], "g", [], [tensor_info("y")]).SerializeToString() + wire_field(1, node)  # .node
    model = helper.make_model(helper.make_graph([], "top", [tensor_info("x")], [tensor_info("y")]),
                              opset_imports=OPSET)
    model.ClearField("graph")
    path = save(tmp_path, model.SerializeToString() + wire_field(7, raw))  # ModelProto.graph
    with pytest.raises(ModelFormatError, match="model.onnx"):
        ei.convert(path)


# -- external data -------------------------------------------------------------------------------------
def external_model(folder, location: str, offset: int = 0, length: int | None = None, *, write_data: bool = True):
    w = np.arange(6, dtype=np.float32).reshape(2, 3)
    if write_data:
        (folder / "weights.bin").write_bytes(b"\0" * offset + w.tobytes())
    tensor = numpy_helper.from_array(w, "w")
    tensor.ClearField("raw_data")
    tensor.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", str(offset)),
                       ("length", str(w.nbytes if length is None else length))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g", [tensor_info("x", [1, 2])],
                              [tensor_info("y", [1, 3])], [tensor])
    path = folder / "model.onnx"
    path.write_bytes(helper.make_model(graph, opset_imports=OPSET).SerializeToString())
    return path


@pytest.mark.parametrize("location", ["../secret.bin", "sub/../../secret.bin", "{abs}", "", "weights.bin\0x"])
def test_external_data_outside_the_folder_is_refused(tmp_path, location):
    inner = tmp_path / "model"
    inner.mkdir()
    secret = tmp_path / "secret.bin"
    secret.write_bytes(np.arange(6, dtype=np.float32).tobytes())
    path = external_model(inner, location.format(abs=secret))
    with pytest.raises(ModelFormatError, match="external data"):
        ei.convert(path)


def test_external_data_through_a_symlink_out_of_the_folder_is_refused(tmp_path):
    inner = tmp_path / "model"
    inner.mkdir()
    secret = tmp_path / "secret.bin"
    secret.write_bytes(np.arange(6, dtype=np.float32).tobytes())
    (inner / "link.bin").symlink_to(secret)
    path = external_model(inner, "link.bin", write_data=False)
    with pytest.raises(ModelFormatError, match="inside"):
        ei.convert(path)


def test_external_data_folder_symlinked_out_is_refused(tmp_path):
    inner, outside = tmp_path / "model", tmp_path / "elsewhere"
    inner.mkdir()
    outside.mkdir()
    (outside / "weights.bin").write_bytes(np.arange(6, dtype=np.float32).tobytes())
    (inner / "data").symlink_to(outside, target_is_directory=True)
    path = external_model(inner, "data/weights.bin", write_data=False)
    with pytest.raises(ModelFormatError, match="inside"):
        ei.convert(path)


@pytest.mark.parametrize("offset, length", [(0, 10_000), (20_000, 4), (0, -4), (-8, 24), ("x", 24)])
def test_external_data_past_the_end_of_its_file_is_refused(tmp_path, offset, length):
    path = external_model(tmp_path, "weights.bin")  # 24 bytes of data
    model = onnx.load(path, load_external_data=False)
    entries = model.graph.initializer[0].external_data
    entries[1].value, entries[2].value = str(offset), str(length)
    path.write_bytes(model.SerializeToString())
    with pytest.raises(ModelFormatError, match="outside|non-integer"):
        ei.convert(path)


def test_external_data_shorter_than_its_tensor_is_a_validation_error(tmp_path):
    path = external_model(tmp_path, "weights.bin", length=8)
    with pytest.raises(ModelValidationError, match="too small"):
        ei.convert(path)


def test_external_data_that_is_a_directory_a_loop_or_missing(tmp_path):
    (tmp_path / "adir").mkdir()
    (tmp_path / "loop.bin").symlink_to(tmp_path / "loop.bin")
    for location in ("adir", "absent.bin", "loop.bin"):
        path = external_model(tmp_path, location, write_data=False)
        with pytest.raises(ModelFormatError, match="not found|inside"):
            ei.convert(path)


def test_external_data_inside_the_folder_still_loads(tmp_path):
    path = external_model(tmp_path, "weights.bin", offset=8)
    x = np.ones((1, 2), np.float32)
    got = ei.Session(ei.convert(path)).run({"x": x})["y"]
    np.testing.assert_allclose(got, x @ np.arange(6, dtype=np.float32).reshape(2, 3))


def test_a_model_proto_with_external_data_is_refused(tmp_path):
    model = onnx.load(external_model(tmp_path, "weights.bin"), load_external_data=False)
    with pytest.raises(ModelFormatError, match="external data"):
        ei.convert(model)


def test_nothing_outside_the_folder_is_opened(tmp_path, monkeypatch):
    """The check happens before any open(): a location outside is refused unread."""
    inner = tmp_path / "model"
    inner.mkdir()
    path = external_model(inner, "../secret.bin")
    opened: list[str] = []
    real_open = open

    def spy(file, *args, **kwargs):
        opened.append(os.fspath(file) if isinstance(file, (str, os.PathLike)) else str(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr("builtins.open", spy)
    with pytest.raises(ModelFormatError):
        ei.convert(path)
    assert not any("secret" in name for name in opened)


@pytest.mark.parametrize("dims, indices, error", [
    ([2**20, 2**20], [0, 1], ModelFormatError),  # 4 TiB once dense: refused before allocating
    ([4], [0, 99], ModelValidationError),
    ([-1], [0, 1], ModelValidationError),
])
def test_sparse_constant_with_absurd_dims_or_indices(dims, indices, error):
    values = helper.make_tensor("v", TensorProto.FLOAT, [2], [1.0, 2.0])
    sparse = helper.make_sparse_tensor(values, helper.make_tensor("i", TensorProto.INT64, [2], indices), dims)
    graph = helper.make_graph([helper.make_node("Constant", [], ["y"], sparse_value=sparse)], "g", [],
                              [tensor_info("y", [4])])
    with pytest.raises(error, match="sparse|Sparse"):
        ei.convert(helper.make_model(graph, opset_imports=OPSET))


def _one_node_model(node, initializers=(), rank=4) -> onnx.ModelProto:
    out = tensor_info("y", [f"d{i}" for i in range(rank)])
    graph = helper.make_graph([node], "g", [tensor_info("x", [1, 4, 4, 4])], [out], list(initializers))
    return helper.make_model(graph, opset_imports=OPSET)


_W = numpy_helper.from_array(np.ones((2, 4, 1, 1), np.float32), "w")


def _const(name, values, dtype=np.int64):
    return numpy_helper.from_array(np.asarray(values, dtype), name)


DIVIDING_ATTRIBUTES = {
    "Conv strides 0": (helper.make_node("Conv", ["x", "w"], ["y"], strides=[0, 0]), [_W]),
    "Conv dilations 0": (helper.make_node("Conv", ["x", "w"], ["y"], dilations=[0, 0]), [_W]),
    "Conv group 0": (helper.make_node("Conv", ["x", "w"], ["y"], group=0), [_W]),
    "MaxPool strides 0": (helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2], strides=[0, 0]), []),
    "MaxPool kernel 0": (helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[0, 0]), []),
    "AveragePool kernel larger than input": (helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[9, 9]), []),
    "DepthToSpace blocksize 0": (helper.make_node("DepthToSpace", ["x"], ["y"], blocksize=0), []),
    "SpaceToDepth blocksize 0": (helper.make_node("SpaceToDepth", ["x"], ["y"], blocksize=0), []),
    "LRN size 0": (helper.make_node("LRN", ["x"], ["y"], size=0), []),
    "Resize scales 0": (helper.make_node("Resize", ["x", "", "s"], ["y"]), [_const("s", [1, 1, 0, 0], np.float32)]),
    "Resize to 233 TiB": (helper.make_node("Resize", ["x", "", "s"], ["y"]),
                          [_const("s", [1, 1, 1e6, 1e6], np.float32)]),
    "Tile to 2 TiB": (helper.make_node("Tile", ["x", "r"], ["y"]), [_const("r", [10**5, 10**5, 1, 1])]),
    "Reshape with two -1": (helper.make_node("Reshape", ["x", "s"], ["y"]), [_const("s", [-1, -1])]),
}


@pytest.mark.parametrize("case", sorted(DIVIDING_ATTRIBUTES))
def test_zero_or_absurd_sizes_where_a_kernel_divides_or_allocates(case):
    """Refused when converting or when running: a typed error, never ZeroDivisionError or MemoryError."""
    node, initializers = DIVIDING_ATTRIBUTES[case]
    with pytest.raises(ei.EdgeInferError):
        model = ei.convert(_one_node_model(node, initializers))
        ei.Session(model, backend="numpy").run({"x": np.ones((1, 4, 4, 4), np.float32)})
