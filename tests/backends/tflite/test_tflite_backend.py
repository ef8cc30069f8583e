"""The tflite backend through the backend interface and ``Session``, and the export API/CLI."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from click.testing import CliRunner

import edgeinfer as ei
from devkit import zoo
from devkit.testing import assert_close, parse_model
from edgeinfer.backend import CompileOptions, get_backend, installed_backends
from edgeinfer.errors import BackendError, InputError, UnsupportedOpError

EDGE_PAD = """<ir_version: 8, opset_import: ["" : 17]>
t (float[1, 4, 6, 6] x) => (float[1, 4, 8, 8] y) <int64[8] p = {0, 0, 1, 1, 0, 0, 1, 1}>
{ r = Relu (x)
  y = Pad <mode = "edge"> (r, p) }"""


@pytest.fixture(scope="module")
def cnn():
    onnx_model = zoo.cnn_residual_depthwise()
    return ei.convert(onnx_model), zoo.example_inputs(onnx_model, seed=5)


def test_installed_and_thread_safe_through_an_interpreter_per_concurrent_call(cnn):
    """An interpreter runs one invocation at a time; the executable lends each concurrent call
    its own (made from the same flatbuffer when all are busy), so threads may share it."""
    from concurrent.futures import ThreadPoolExecutor

    assert "tflite" in installed_backends()
    backend = get_backend("tflite")
    assert backend.name == "tflite" and backend.device == "cpu"
    model, feeds = cnn
    executable = backend.compile(model.graph, CompileOptions(threads=2))
    assert executable.thread_safe is True
    assert executable.stats()["num_threads"] == 2
    rng = np.random.default_rng(0)
    requests = [{name: rng.standard_normal(value.shape).astype(value.dtype) for name, value in feeds.items()}
                for _ in range(16)]
    expected = [executable.run(r)["logits"] for r in requests]
    assert executable.stats()["interpreters"] == 1  # one at a time: one interpreter
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda r: executable.run(r)["logits"], requests * 4))
    for index, value in enumerate(got):
        np.testing.assert_array_equal(value, expected[index % len(requests)])
    assert 1 <= executable.stats()["interpreters"] <= 4
    executable.close()


def test_an_interpreter_moves_between_threads_and_streams_reuse_it(cnn):
    """A CPU interpreter may be invoked from any thread, one call at a time: stream workers
    (fresh threads every stream) borrow the stage's interpreters instead of compiling their own,
    and a delegate's interpreter stays on the thread that made it."""
    import threading

    from edgeinfer.backends.tflite.backend import TFLiteExecutable

    model, feeds = cnn
    expected = ei.Session(model).run(feeds)["logits"]
    with ei.Session(model, backend="tflite", threads=2) as session:
        outs = list(session.stream([feeds] * 4, stages=1, replicas=2))
        parts = [p for stage in session.pipeline_plan(feeds, stages=1, replicas=2).stages
                 for runner in stage.runners for p in runner.parts]
        made = sum(p.first.stats()["interpreters"] for p in parts)
        outs += list(session.stream([feeds] * 4, stages=1, replicas=2))
        assert sum(p.first.stats()["interpreters"] for p in parts) == made
        assert sum(p.compiled for p in parts) == len(parts)  # one compile (one export) each
        moved: list[np.ndarray] = []
        worker = threading.Thread(target=lambda: moved.append(session.executable.run(feeds)["logits"]))
        worker.start()
        worker.join()
        first = session.executable  # close() closes it: look at it while the session is open
        delegated = TFLiteExecutable(model.graph, first._one, first.flatbuffer, {"delegate": "libgpu.so"})
        assert delegated.thread_affine is True and delegated.thread_safe is False
    for got in [o["logits"] for o in outs] + moved:
        assert_close(got, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("op_resolver", ["auto", "builtin", "reference"])
def test_session_matches_numpy(cnn, op_resolver):
    model, feeds = cnn
    expected = ei.Session(model).run(feeds)
    got = ei.Session(model, backend="tflite", threads=1, op_resolver=op_resolver).run(feeds)
    assert_close(got["logits"], expected["logits"], rtol=1e-4, atol=1e-5)


def test_dynamic_batch_resizes_between_runs():
    onnx_model = zoo.mlp_symbolic_batch()
    model = ei.convert(onnx_model)
    session = ei.Session(model, backend="tflite")
    for batch in (3, 1, 4):
        feeds = zoo.example_inputs(onnx_model, seed=batch, batch=batch)
        assert_close(session.run(feeds)["probs"], ei.Session(model).run(feeds)["probs"], rtol=1e-4, atol=1e-6)


def test_supports_reports_what_the_exporter_refuses():
    model = ei.convert(parse_model(EDGE_PAD), optimize=0)
    backend = get_backend("tflite")
    relu, pad = model.graph.nodes
    assert backend.supports(relu, model.graph) is None
    assert "edge" in backend.supports(pad, model.graph)
    with pytest.raises(BackendError, match="cannot run 1 node"):
        backend.compile(model.graph, CompileOptions())


def test_engine_option_errors():
    with pytest.raises(BackendError, match="unknown engine option"):
        get_backend("tflite", providers=["x"])
    with pytest.raises(BackendError, match="op_resolver"):
        get_backend("tflite", op_resolver="fast")
    with pytest.raises(BackendError, match="cannot be loaded"):
        get_backend("tflite", delegate="/nonexistent/libdelegate.so")


def test_gpu_needs_a_delegate(caplog):
    with pytest.raises(BackendError, match="needs a delegate"):
        get_backend("tflite", device="gpu")
    with caplog.at_level(logging.WARNING, logger="edgeinfer.backends.tflite"):
        backend = get_backend("tflite", device="npu", fallback=True)
    assert backend.device == "cpu" and "falling back" in caplog.text
    with caplog.at_level(logging.WARNING, logger="edgeinfer.backends.tflite"):
        backend = get_backend("tflite", device="gpu", fallback=True, delegate="/nonexistent/libgpu.so")
    assert backend.device == "cpu"


def test_export_api_and_cli(cnn, tmp_path):
    from edgeinfer.cli import main

    model, feeds = cnn
    eim = tmp_path / "cnn.eim"
    model.save(eim)
    result = CliRunner().invoke(main, ["export", str(eim), "-o", str(tmp_path / "cnn.tflite")], catch_exceptions=False)
    assert result.exit_code == 0 and "wrote" in result.output
    reimported = ei.convert(tmp_path / "cnn.tflite")
    got = ei.Session(reimported).run({reimported.graph.input_names[0]: feeds["input"]})
    assert_close(next(iter(got.values())), ei.Session(model).run(feeds)["logits"], rtol=1e-4, atol=1e-5)
    assert ei.export(model, tmp_path / "cnn.onnx").stat().st_size > 0
    bad = CliRunner().invoke(main, ["export", str(eim), "-o", str(tmp_path / "cnn.pb")])
    assert bad.exit_code == 2 and "expected a path ending in one of .onnx, .tflite" in bad.output
    with pytest.raises(InputError):
        ei.export(model, tmp_path / "cnn.txt")


def test_failed_export_leaves_no_file(tmp_path):
    target = tmp_path / "edge.tflite"
    target.write_bytes(b"old")
    with pytest.raises(UnsupportedOpError, match="edge"):
        ei.export(ei.convert(parse_model(EDGE_PAD), optimize=0), target)
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["edge.tflite"]


def test_run_errors_are_backend_errors(cnn):
    model, feeds = cnn
    executable = get_backend("tflite").compile(model.graph, CompileOptions())
    with pytest.raises(BackendError, match="failed to run"):
        executable.run({"input": np.zeros((1, 3, 5), np.float32)})


class _RefusingInterpreter:
    """Fails at its first invocation, as XNNPACK does when it cannot plan a graph ("XNNPack
    delegate failed to reshape"), though it allocated its tensors."""

    def get_input_details(self):
        return [{"index": 0, "shape": np.array([1, 3]), "shape_signature": np.array([1, 3]), "dtype": np.float32}]

    def set_tensor(self, index, value):
        assert value.shape == (1, 3)

    def invoke(self):
        raise RuntimeError("XNNPack delegate failed to reshape runtime\nNode number 3 failed")


def test_compile_probes_the_interpreter_so_a_part_fails_where_it_can_move():
    from edgeinfer.backends.tflite.backend import _probe

    graph = ei.convert(parse_model(EDGE_PAD), optimize=0).graph
    with pytest.raises(BackendError, match=r"probed with zeros when compiled\): XNNPack delegate failed to reshape"):
        _probe(_RefusingInterpreter(), graph)


def test_a_fixed_shape_part_takes_strided_feeds_and_refuses_another_dtype(cnn):
    """A graph of fixed input shapes runs on idle engines with no per-request shape bookkeeping:
    the engine copies a strided array itself, and a feed of another dtype is refused in one line."""
    from edgeinfer.errors import BackendError

    model, feeds = cnn
    executable = get_backend("tflite").compile(model.graph, CompileOptions(threads=1))
    expected = executable.run(feeds)["logits"]
    (name, x), = feeds.items()
    strided = np.asfortranarray(x)
    assert not strided.flags.c_contiguous
    np.testing.assert_array_equal(executable.run({name: strided})["logits"], expected)
    with pytest.raises(BackendError, match="failed to run"):
        executable.run({name: x.astype(np.float64)})
    np.testing.assert_array_equal(executable.run(feeds)["logits"], expected)
    assert executable.stats()["interpreters"] == 1
    executable.close()
