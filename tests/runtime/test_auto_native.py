"""backend="auto" counts the native engine of the model's source format on the whole graph as a
candidate, and keeps it unless another is more than ``NATIVE_MARGIN`` faster (issue 22)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import pytest

import edgeinfer as ei
from devkit import zoo
from devkit.testing import assert_close
from edgeinfer.model import Model
from edgeinfer.runtime import auto, measure

litert = pytest.importorskip("ai_edge_litert.interpreter")


def _litert_outputs(path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    interpreter = litert.Interpreter(model_path=str(path), num_threads=1)
    interpreter.allocate_tensors()
    for detail, array in zip(interpreter.get_input_details(), feeds.values(), strict=True):
        interpreter.set_tensor(detail["index"], array)
    interpreter.invoke()
    return [interpreter.get_tensor(d["index"]) for d in interpreter.get_output_details()]


def _opcodes(data: bytes) -> Counter:
    from edgeinfer.converters.tflite.reader import read_model

    return Counter(op.opcode for op in read_model(data).subgraphs[0].operators)


@pytest.fixture(scope="module")
def tflite_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("native") / "cnn.tflite"
    ei.export(ei.convert(zoo.cnn_residual_depthwise(seed=3)), path)
    return path


def test_auto_on_a_tflite_model_times_litert_on_the_whole_graph(tflite_file, tmp_path):
    from edgeinfer.format.tflite import export_tflite

    model = ei.convert(tflite_file)
    assert model.metadata["source_format"] == "tflite" and auto.native_engine(model) == "tflite"
    # what the tflite backend compiles is the file the user had: its operators, none added (the
    # import may cancel a pair of reshapes the file wrote)
    compiled, original = _opcodes(export_tflite(model.graph)), _opcodes(tflite_file.read_bytes())
    assert not compiled - original and set(compiled) == set(original)
    feeds = model.random_feeds(seed=1)
    with ei.Session(model, backend="auto", threads=1, options=ei.AutoOptions(cache=tmp_path)) as session:
        choice = session.auto_choice
        assert choice.native == "tflite,numpy" and not choice.native_note
        assert "tflite,numpy" in choice.median_ms  # timed beside the others, never dropped
        assert choice.backends == auto.decide(choice.median_ms, choice.native)[0].split(",")
        assert choice.reason == auto.decide(choice.median_ms, choice.native)[1]
        text = choice.describe()
        assert f"tflite,numpy: {choice.median_ms['tflite,numpy']:.3g} ms (native engine, whole graph" in text
        assert choice.reason in text.splitlines()[0]
        got = session.run(feeds)
    for value, expected in zip(got.values(), _litert_outputs(tflite_file, feeds), strict=True):
        assert_close(value, expected, rtol=1e-4, atol=1e-5)
    with ei.Session(model, backend="auto", threads=1, options=ei.AutoOptions(cache=tmp_path)) as again:  # from the disk cache
        assert again.auto_choice.cached
        assert (again.auto_choice.backends, again.auto_choice.native, again.auto_choice.reason) == \
            (choice.backends, choice.native, choice.reason)


@pytest.mark.parametrize("others_ms, native_ms, winner", [
    ({"openvino,numpy": 9.7, "numpy": 40.0}, 10.0, "tflite,numpy"),  # 3% faster: within the margin
    ({"openvino,numpy": 9.3, "numpy": 40.0}, 10.0, "tflite,numpy"),  # 7.5% faster: within it too
    ({"openvino,numpy": 9.0, "numpy": 40.0}, 10.0, "openvino,numpy"),  # 11% faster: beyond it
    ({"openvino,numpy": 10.2}, 10.0, "tflite,numpy"),  # the native engine is the fastest
])
def test_the_native_engine_is_kept_unless_another_is_faster_by_the_margin(others_ms, native_ms, winner):
    medians = {"tflite,numpy": native_ms, **others_ms}
    chosen, why = auto.decide(medians, "tflite,numpy")
    assert chosen == winner
    assert why.startswith("the native engine") == (winner == "tflite,numpy")
    # without a native candidate the fastest wins
    assert auto.decide(medians, None)[0] == min(medians, key=medians.get)


@pytest.fixture(scope="module")
def onnx_model():
    return ei.convert(zoo.cnn_residual_depthwise(seed=2))


def _fake_timing(monkeypatch, seconds: dict[str, float]) -> list[tuple[str, ...]]:
    """Every candidate's calls take ``seconds[label]`` (measured calls still run): the timings
    are injected, so the rule is tested, not this machine."""
    rounds: list[tuple[str, ...]] = []

    def fake(runs, *, calls, warmup=0, **kwargs):
        rounds.append(tuple(runs))
        for run in runs.values():
            run()
        return {label: [seconds[label]] * max(calls, 1) for label in runs}

    monkeypatch.setattr(measure, "time_engines", fake)  # the timing loop auto races through
    monkeypatch.setattr(measure, "probe", lambda runs, factor=None: {label: seconds[label] for label in runs})  # its first call
    return rounds


@pytest.mark.parametrize("native_s, winner, timed_again", [
    (1.08e-3, "onnxruntime,numpy", True),  # within the margin, near its bar: timed again, kept
    (1.30e-3, "numpy", False),  # 30% slower: the faster one wins
    (4.00e-3, "numpy", False),  # over 3x slower in the first rounds: still timed to the end
])
def test_measure_applies_the_rule_to_injected_timings(onnx_model, monkeypatch, native_s, winner, timed_again):
    assert auto.native_engine(onnx_model) == "onnxruntime"
    rounds = _fake_timing(monkeypatch, {"onnxruntime,numpy": native_s, "numpy": 1.0e-3})
    choice = auto.measure(onnx_model, [["numpy"]], onnx_model.random_feeds(seed=0), threads=1, device="cpu",
                          fallback=False, options={}, native="onnxruntime")
    try:
        assert choice.native == "onnxruntime,numpy"  # added to the candidates, first
        assert set(choice.median_ms) == {"onnxruntime,numpy", "numpy"} and not choice.skipped
        assert ",".join(choice.backends) == winner
        assert choice.median_ms["onnxruntime,numpy"] == pytest.approx(native_s * 1000)
        assert (("numpy", "onnxruntime,numpy") in rounds) == timed_again
        backends, plan, runner = choice.prepared
        assert set(plan.node_counts()) == {winner.split(",")[0]}
        reference = ei.Session(onnx_model, backend="numpy").run(onnx_model.random_feeds(seed=0))
        assert_close(runner.run(onnx_model.random_feeds(seed=0))["logits"], reference["logits"],
                     rtol=1e-4, atol=1e-5)
    finally:
        choice.prepared[2].close()


def test_a_native_engine_that_leaves_nodes_to_numpy_is_no_whole_graph_candidate(monkeypatch):
    helper = onnx.helper
    graph = helper.make_graph(  # CumSum and Einsum have no TFLite export rule
        [helper.make_node("CumSum", ["x", "axis"], ["c"], name="running_sum"),
         helper.make_node("Einsum", ["c"], ["y"], name="transpose", equation="ij->ji")],
        "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [3, 2])],
        initializer=[onnx.numpy_helper.from_array(np.array(1, np.int64), "axis")])
    converted = ei.convert(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    model = Model(converted.graph, {"source_format": "tflite"})  # as if imported from a .tflite
    _fake_timing(monkeypatch, {"tflite,numpy": 1e-3, "onnxruntime,numpy": 2e-3})
    choice = auto.measure(model, [["onnxruntime", "numpy"]], {"x": np.ones((2, 3), np.float32)}, threads=1,
                          device="cpu", fallback=False, options={}, native="tflite")
    try:
        assert choice.native is None
        assert choice.native_note.startswith("tflite takes 0 of 2 nodes, not the whole graph")
        assert choice.native_note in choice.describe()
        assert choice.backends == ["tflite", "numpy"]  # timed as any other candidate: the fastest
        assert choice.median_ms["tflite,numpy"] == pytest.approx(1.0)
    finally:
        choice.prepared[2].close()


@pytest.mark.parametrize("native", ["onnxruntime", "tflite"])
def test_the_native_engine_compiles_one_part_as_the_raw_engine_would(onnx_model, monkeypatch, native):
    """Kept, the native engine runs the whole graph as one part compiled with the raw engine's
    settings: onnxruntime with every graph optimization, the caller's intra-op threads and its
    spinning workers (as ``InferenceSession`` defaults to), LiteRT with XNNPACK on that many threads."""
    model = Model(onnx_model.graph, {"source_format": "onnx" if native == "onnxruntime" else "tflite"})
    _fake_timing(monkeypatch, {f"{native},numpy": 1.0e-3, "numpy": 1.0e-3})
    choice = auto.measure(model, [["numpy"]], model.random_feeds(seed=0), threads=2, device="cpu",
                          fallback=False, options={}, native=native)
    try:
        assert choice.backends == [native, "numpy"] and choice.native == f"{native},numpy"
        backends, plan, runner = choice.prepared
        assert [part.backend for part in plan.parts] == [native]
        (part,) = runner.parts
        executable = part.executable()
        if native == "onnxruntime":
            import onnxruntime as ort

            options = executable.session_options
            raw = ort.SessionOptions()
            assert options.intra_op_num_threads == 2
            assert options.graph_optimization_level == raw.graph_optimization_level == \
                ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            assert options.execution_mode == raw.execution_mode
            assert options.enable_mem_pattern == raw.enable_mem_pattern
            assert options.enable_cpu_mem_arena == raw.enable_cpu_mem_arena
            try:  # absent: onnxruntime's default, spinning on
                spinning = options.get_session_config_entry("session.intra_op.allow_spinning")
            except RuntimeError:
                spinning = "1"
            assert spinning == "1"
        else:
            stats = executable.stats()
            assert (stats["num_threads"], stats["op_resolver"], stats["delegate"]) == (2, "auto", None)
        reference = ei.Session(model, backend="numpy").run(model.random_feeds(seed=0))
        assert_close(runner.run(model.random_feeds(seed=0))["logits"], reference["logits"], rtol=1e-4, atol=1e-5)
    finally:
        choice.prepared[2].close()


def test_decisive_names_every_candidate_that_may_lie_either_side_of_the_native_bar():
    """The runner-up too (chosen should the fastest start too slowly), and a ratio whose rounds
    straddle the bar although the medians do not (timing noise under load)."""
    from edgeinfer.runtime.auto_choice import decisive

    steady = {"openvino": [1.0] * 10, "tflite": [1.6] * 10, "onnxruntime": [1.8] * 10}  # 1.125x: near 1.10
    assert decisive(steady, "onnxruntime") == ("tflite", "onnxruntime")
    apart = {"openvino": [1.0] * 10, "tflite": [1.2] * 10, "onnxruntime": [1.8] * 10}  # 1.5x, steady
    assert decisive(apart, "onnxruntime") is None
    # medians 1.25x apart, but round by round 1.0x to 1.5x: the bar lies within the rounds' spread
    noisy = {"tflite": [1.0] * 20, "onnxruntime": [1.0] * 5 + [1.5] * 5 + [1.05] * 5 + [1.3] * 5}
    assert decisive(noisy, "onnxruntime") == ("tflite", "onnxruntime")
    assert decisive({"onnxruntime": [1.0] * 10, "tflite": [1.01] * 10}, "onnxruntime") is None  # native fastest
    assert decisive({"a": [1.0] * 10, "b": [1.03] * 10}, None) == ("a", "b")  # no native: the leaders, close
    assert decisive({"a": [1.0] * 10, "b": [1.3] * 10}, None) is None
