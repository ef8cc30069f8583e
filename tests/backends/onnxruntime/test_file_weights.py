"""Weights of a loaded .eim reach onnxruntime as external-data references into the .eim file
itself (onnxruntime maps it: no copy), other weights in memory; results match the numpy
backend either way, and a file saved over since it was loaded is never read."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import edgeinfer as ei
from devkit.testing import assert_close
from edgeinfer.backend import get_backend
from edgeinfer.backends.onnxruntime.backend import FOLDER_CONFIG
from edgeinfer.ir.weights import with_stored_weights


def _two_layer(rng, k: int = 256, n: int = 384) -> ei.Model:
    """MatMul -> Add -> MatMul: two big weights (file route candidates), one small bias."""
    w0 = rng.standard_normal((k, n)).astype(np.float32)
    w1 = rng.standard_normal((n, 100)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w0"], ["h"]), helper.make_node("Add", ["h", "b"], ["a"]),
         helper.make_node("MatMul", ["a", "w1"], ["y"])], "two",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 100])],
        [numpy_helper.from_array(w0, "w0"), numpy_helper.from_array(b, "b"), numpy_helper.from_array(w1, "w1")])
    return ei.convert(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


def _feeds(rng, k: int = 256) -> dict[str, np.ndarray]:
    return {"x": rng.standard_normal((3, k)).astype(np.float32)}


def _numpy_result(model, feeds) -> np.ndarray:
    """The numpy backend's output of a Model or a Graph."""
    return get_backend("numpy").compile(getattr(model, "graph", model)).run(feeds)["y"]


def _assert_numpy_result(got: np.ndarray, model, feeds, rtol: float = 1e-4) -> None:
    """``got`` equals the numpy backend's result within float32 rounding of sums of hundreds of
    products: the outputs are of order 300, so an element near zero after cancellation carries
    the sums' absolute rounding (4.7e-4 seen on an AMD EPYC), not a relative one."""
    assert_close(got, _numpy_result(model, feeds), rtol=rtol, atol=rtol, scaled_atol=rtol * 0.1)


def _folder_config(executable) -> str | None:
    try:
        return executable.session.get_session_options().get_session_config_entry(FOLDER_CONFIG)
    except RuntimeError:  # onnxruntime raises for a key that was never set
        return None


def test_loaded_eim_weights_go_by_file_reference(tmp_path, rng):
    path = tmp_path / "two.eim"
    _two_layer(rng).save(path)
    model = ei.load(path)
    feeds = _feeds(rng)
    executable = get_backend("onnxruntime", prepack=False).compile(model.graph)
    weights = executable.stats()["weights"]
    assert weights["file"] == {"tensors": 2, "bytes": (256 * 384 + 384 * 100) * 4}
    assert weights["memory"]["tensors"] == 0
    assert weights["file_folder"] == str(tmp_path.resolve())
    assert _folder_config(executable) == str(tmp_path.resolve())
    if sys.platform.startswith("linux"):  # onnxruntime mapped the .eim itself (prepacking off keeps the map)
        with open("/proc/self/maps") as maps:
            assert any(line.rstrip().endswith(str(path.resolve())) and "rw-p" in line for line in maps)
    _assert_numpy_result(executable.run(feeds)["y"], model, feeds)  # float32 sums


def test_prepacked_file_weights_match_numpy(tmp_path, rng):
    path = tmp_path / "two.eim"
    _two_layer(rng).save(path)
    model = ei.load(path)
    feeds = _feeds(rng)
    with ei.Session(model, backend="onnxruntime", prepack=True) as session:
        assert session.stats()["weights"]["file"]["tensors"] == 2
        got = session.run(feeds)["y"]
    _assert_numpy_result(got, model, feeds)


def test_in_memory_weights_are_handed_over_and_say_why(rng):
    model = _two_layer(rng)  # converted, never saved: nothing is mapped
    feeds = _feeds(rng)
    executable = get_backend("onnxruntime").compile(model.graph)
    weights = executable.stats()["weights"]
    assert weights["file"]["tensors"] == 0 and weights["memory"]["tensors"] == 2
    assert weights["file_folder"] is None and _folder_config(executable) is None
    assert list(weights["memory_because"]) == ["not a view of a mapped file (computed or widened at load)"]
    _assert_numpy_result(executable.run(feeds)["y"], model, feeds)


def test_file_saved_over_since_loading_is_not_read(tmp_path, rng):
    path = tmp_path / "two.eim"
    _two_layer(rng).save(path)
    model = ei.load(path)
    _two_layer(np.random.default_rng(99)).save(path)  # other weights, same path (a new file renamed in)
    feeds = _feeds(rng)
    executable = get_backend("onnxruntime").compile(model.graph)
    weights = executable.stats()["weights"]
    assert weights["file"]["tensors"] == 0 and weights["memory"]["tensors"] == 2
    _assert_numpy_result(executable.run(feeds)["y"], model, feeds)


def test_float16_stored_weight_is_widened_and_handed_over_in_memory(tmp_path, rng):
    model = _two_layer(rng)
    graph = model.graph
    narrow = graph.initializers["w0"].astype(np.float16).astype(np.float32)  # exactly representable
    graph = graph.replace(initializers={**graph.initializers, "w0": narrow})
    graph.metadata = with_stored_weights(graph.metadata, ["w0"])
    path = tmp_path / "half.eim"
    ei.Model(graph, model.metadata).save(path)
    loaded = ei.load(path)
    assert loaded.graph.initializers["w0"].dtype == np.float32  # widened at load: a copy
    feeds = _feeds(rng)
    executable = get_backend("onnxruntime").compile(loaded.graph)
    weights = executable.stats()["weights"]
    assert weights["file"] == {"tensors": 1, "bytes": 384 * 100 * 4}  # w1, stored raw
    assert weights["memory"] == {"tensors": 1, "bytes": 256 * 384 * 4}  # w0, stored as float16
    _assert_numpy_result(executable.run(feeds)["y"], loaded, feeds)


def test_weights_from_two_folders_use_one_by_file(tmp_path, rng):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    _two_layer(rng).save(tmp_path / "a" / "m.eim")
    _two_layer(np.random.default_rng(5)).save(tmp_path / "b" / "m.eim")
    first, second = ei.load(tmp_path / "a" / "m.eim"), ei.load(tmp_path / "b" / "m.eim")
    graph = first.graph.replace(initializers={**first.graph.initializers, "w1": second.graph.initializers["w1"]})
    feeds = _feeds(rng)
    executable = get_backend("onnxruntime").compile(graph)
    weights = executable.stats()["weights"]
    assert weights["file_folder"] == str((tmp_path / "a").resolve())  # w0 is the bigger share
    assert weights["file"]["tensors"] == 1 and weights["memory"]["tensors"] == 1
    assert list(weights["memory_because"]) == ["mapped from a second folder"]
    got = executable.run(feeds)["y"]
    _assert_numpy_result(got, graph, feeds)


@pytest.mark.parametrize("block_size", [32])
def test_int4_packed_weights_go_by_file(tmp_path, rng, block_size):
    path = tmp_path / "q.eim"
    ei.quantize(_two_layer(rng), weights="int4", mode="weight_only", block_size=block_size).save(path)
    model = ei.load(path)
    feeds = _feeds(rng)
    executable = get_backend("onnxruntime").compile(model.graph)
    weights = executable.stats()["weights"]
    assert weights["file"]["tensors"] >= 1 and weights["memory"]["tensors"] == 0  # packed uint8 blocks, raw
    _assert_numpy_result(executable.run(feeds)["y"], model, feeds, rtol=1e-3)  # fp32 sums of dequantized blocks


def test_onnx_external_data_goes_by_file_reference(tmp_path, rng):
    import onnx

    w = rng.standard_normal((512, 512)).astype(np.float32)  # 1 MiB: mapped by the importer
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "ext",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 512])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 512])],
                              [numpy_helper.from_array(w, "w")])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save_model(proto, tmp_path / "ext.onnx", save_as_external_data=True, location="ext.onnx.data",
                    size_threshold=1024)
    model = ei.convert(tmp_path / "ext.onnx")
    feeds = {"x": rng.standard_normal((2, 512)).astype(np.float32)}
    executable = get_backend("onnxruntime").compile(model.graph)
    weights = executable.stats()["weights"]
    assert weights["file"] == {"tensors": 1, "bytes": w.nbytes}
    assert weights["file_folder"] == str(tmp_path.resolve())
    _assert_numpy_result(executable.run(feeds)["y"], model, feeds)


def test_external_data_onnxruntime_refuses_goes_in_memory_and_says_so(tmp_path, rng, monkeypatch, caplog):
    from edgeinfer.backends.onnxruntime import backend as ort_backend
    from edgeinfer.ir.mapped import FileSpan

    model = _two_layer(rng)
    missing = str(tmp_path / "missing.eim")  # a reference onnxruntime cannot follow
    monkeypatch.setattr(ort_backend, "file_span", lambda array: FileSpan(missing, 0, array.nbytes, (0, 0, 0, 0)))
    feeds = _feeds(rng)
    with caplog.at_level("WARNING", logger="edgeinfer.backends.onnxruntime"):
        executable = get_backend("onnxruntime").compile(model.graph)
    assert "handed over in memory instead" in caplog.text
    weights = executable.stats()["weights"]
    assert weights["file"]["tensors"] == 0 and weights["memory"]["tensors"] == 2
    assert list(weights["memory_because"]) == ["onnxruntime refused the file references"]
    _assert_numpy_result(executable.run(feeds)["y"], model, feeds)
