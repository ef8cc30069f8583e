"""ONNX external data: big tensors are memory-mapped (never read into the protobuf, never held
twice), the checker never serializes them, and export writes them beside the file."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import edgeinfer as ei
from devkit.testing import assert_close


def _save_external(tmp_path, weights: dict[str, np.ndarray], nodes, inputs, outputs) -> str:
    graph = helper.make_graph(nodes, "ext", inputs, outputs, [numpy_helper.from_array(a, n) for n, a in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "model.onnx"
    onnx.save_model(model, path, save_as_external_data=True, all_tensors_to_one_file=True, location="model.data",
                    size_threshold=1024)  # small tensors (the Reshape's shape) inline, as exporters write them
    return os.fspath(path)


def _anonymous_bytes() -> int:
    """Anonymous (heap, copied) memory of this process, from /proc/self/smaps_rollup."""
    try:
        text = open("/proc/self/smaps_rollup").read()
    except OSError:
        pytest.skip("needs Linux /proc/self/smaps_rollup")
    line = next(line for line in text.splitlines() if line.startswith("Anonymous:"))
    return int(line.split()[1]) * 1024


def _mlp(tmp_path, rng, k=512, n=768) -> tuple[str, dict]:
    weights = {"w1": rng.standard_normal((k, n)).astype(np.float32),  # 1.5 MiB: mapped
               "b1": rng.standard_normal(n).astype(np.float32),       # small: read
               "shape": np.array([1, -1], np.int64)}
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Add", ["h", "b1"], ["a"]),
             helper.make_node("Reshape", ["a", "shape"], ["y"])]
    path = _save_external(tmp_path, weights, nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, k])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n])])
    return path, weights


def test_large_external_tensors_are_memory_mapped_and_match_onnxruntime(tmp_path, rng):
    import onnxruntime as ort

    path, weights = _mlp(tmp_path, rng)
    model = ei.convert(path, optimize=0)
    w1 = model.graph.initializers["w1"]
    assert not w1.flags.owndata and not w1.flags.writeable  # a read-only view of the mapped file
    assert [v.name for v in model.graph.inputs] == ["x"]
    x = rng.standard_normal((1, 512)).astype(np.float32)
    expected = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    for backend in ("numpy", "onnxruntime"):
        assert_close(ei.Session(ei.convert(path), backend=backend).run({"x": x})["y"], expected, rtol=1e-4, atol=1e-5)


def test_external_location_outside_the_folder_is_refused(tmp_path, rng):
    path, _ = _mlp(tmp_path, rng)
    model = onnx.load_model(path, load_external_data=False)
    for tensor in model.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = "../model.data"
    onnx.save_model(model, path)
    with pytest.raises(ei.ModelFormatError, match="must be a relative path inside"):
        ei.convert(path)


def test_checker_never_sees_weights_past_protobufs_limit(tmp_path):
    """A 2.1 GB external weight (a sparse file: no disk) converts without the checker
    serializing the model and without a copy: the process's anonymous memory stays small (the
    mapped file's pages, which the NaN check reads, are file-backed and can be dropped)."""
    k, n = 16384, 32770  # 2.15e9 bytes of float32, past protobuf's 2 GB
    data = tmp_path / "big.data"
    with open(data, "wb") as handle:
        handle.truncate(k * n * 4)
    tensor = onnx.TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[k, n], data_location=TensorProto.EXTERNAL)
    for key, value in (("location", "big.data"), ("offset", "0"), ("length", str(k * n * 4))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "big",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n])], [tensor])
    path = tmp_path / "big.onnx"
    path.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    before = _anonymous_bytes()
    model = ei.convert(path)
    grown = _anonymous_bytes() - before
    assert model.graph.initializers["w"].shape == (k, n)
    assert model.outputs[0].shape == (1, n)
    assert grown < 256 << 20, f"conversion grew anonymous memory by {grown >> 20} MiB"


def test_export_with_external_data_streams_weights_beside_the_file(tmp_path, rng):
    import onnxruntime as ort

    path, _ = _mlp(tmp_path, rng)
    model = ei.convert(path)
    out = tmp_path / "out" / "exported.onnx"
    out.parent.mkdir()
    ei.export(model, out, external_data=True)
    assert (out.parent / "exported.onnx.data").stat().st_size >= 512 * 768 * 4
    assert out.stat().st_size < 64 << 10
    assert sorted(p.name for p in out.parent.iterdir()) == ["exported.onnx", "exported.onnx.data"]
    x = rng.standard_normal((1, 512)).astype(np.float32)
    got = ort.InferenceSession(os.fspath(out), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert_close(got, ei.Session(model).run({"x": x})["y"], rtol=1e-4, atol=1e-5)
    # and the exported pair converts back through the mapped path
    assert not ei.convert(out, optimize=0).graph.initializers["w1"].flags.owndata


def test_tflite_export_past_two_gigabytes_is_a_typed_error_and_writes_nothing(tmp_path):
    k, n = 16384, 32770
    weight = np.broadcast_to(np.float32(0.5), (k, n))  # 2.1 GB declared, no memory behind it
    graph = ei.Graph([ei.Node("MatMul", ["x", "w"], ["y"])], [ei.Value("x", "float32", (1, k))],
                     [ei.Value("y", "float32", (1, n))], {"w": weight})
    target = tmp_path / "big.tflite"
    with pytest.raises(ei.UnsupportedOpError, match="flatbuffer holds at most"):
        ei.export(ei.Model(graph), target)
    assert list(tmp_path.iterdir()) == []
