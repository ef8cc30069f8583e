"""Ahead of time: ``ei.compile`` stores the plan and each part's engine artifact in the ``.eim``; a
Session on that file builds every part from its artifact (no export, no toolchain import) and
computes what the source framework computes. An artifact that is stale, foreign or damaged is
never handed to an engine: that part compiles from the IR, with one warning line."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import edgeinfer as ei
from devkit import zoo
from devkit.testing import assert_close
from edgeinfer.backends.onnxruntime.artifact import _placeholder
from edgeinfer.ir import dtypes
from edgeinfer.ir.onnx_io import external_placeholder
from tests.format.conftest import EimFile

ENGINES = ("onnxruntime", "tflite", "openvino")
# what a Session on a compiled file must not import (beside the engines its plan does not name)
TOOLCHAIN = ("onnx", "ml_dtypes", "edgeinfer.passes", "edgeinfer.converters", "edgeinfer.quantize",
             "edgeinfer.backends.numpy", "edgeinfer.format.tflite", "edgeinfer.ir.infer", "edgeinfer.cli")
# what a cold start spends most of its imports on beside the engine (about 45 ms on a 2-core board:
# dataclasses with inspect, logging, concurrent.futures, tempfile); openvino imports them itself
HEAVY_STDLIB = ("dataclasses", "inspect", "logging", "concurrent.futures", "tempfile")
ENGINE_MODULES = {"onnxruntime": "onnxruntime", "tflite": "ai_edge_litert", "openvino": "openvino",
                  "torch": "torch"}


@pytest.fixture(scope="module")
def source() -> onnx.ModelProto:
    """A CNN whose 64-channel convolutions hold weights big enough to stay in the file (>= 16 KiB)."""
    return zoo.cnn_residual_depthwise(size=32, channels=64)


@pytest.fixture(scope="module")
def feeds(source) -> dict[str, np.ndarray]:
    return zoo.example_inputs(source, seed=3)


@pytest.fixture(scope="module")
def expected(source, feeds) -> list[np.ndarray]:
    """The source framework's answer: onnxruntime on the original model."""
    return ort.InferenceSession(source.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


@pytest.fixture(scope="module")
def compiled(source, tmp_path_factory) -> dict[str, Path]:
    model = ei.convert(source)
    folder = tmp_path_factory.mktemp("aot")
    return {engine: ei.compile(model, folder / f"{engine}.eim", backend=engine, threads=1) and folder / f"{engine}.eim"
            for engine in ENGINES}


@pytest.mark.parametrize("engine", ENGINES)
def test_a_compiled_file_runs_its_plan_from_the_stored_artifact(engine, compiled, feeds, expected, monkeypatch):
    def no_export(*args, **kwargs):
        raise AssertionError("exported again: the stored artifact was not used")

    target = {"onnxruntime": "edgeinfer.backends.onnxruntime.backend._export",
              "tflite": "edgeinfer.backends.tflite.backend.TFLiteBackend._export",
              "openvino": "edgeinfer.backends.openvino.convert.export"}[engine]
    monkeypatch.setattr(target, no_export)
    model = ei.load(compiled[engine])
    assert [(p["backend"], p["nodes"], p["artifact"]) for p in model.compiled.parts] == \
        [(engine, list(range(len(model.graph.nodes))), 0)]
    assert [v.name for v in model.compiled.parts[0]["outputs"]] == ["logits"]
    with ei.Session(compiled[engine]) as session:  # no backend: the file's own plan
        assert_close(session.run(feeds)["logits"], expected[0], rtol=1e-4, atol=1e-4)
        assert not session.model.loaded  # built from the artifact: the graph was never read
        assert [p.backend for p in session.plan.parts] == [engine]
        assert "compiled ahead of time" in session.compiled_plan(feeds).describe()  # reads the graph to say it
        assert session.model.loaded and len(session.model.graph.nodes) == len(model.graph.nodes)
    with ei.Session(compiled[engine], backend=engine) as session:  # the same backend named: the same plan
        assert session.compiled_plan(feeds).section is not None


def test_onnxruntime_reads_the_weights_from_the_file_itself(compiled, feeds):
    with ei.Session(compiled["onnxruntime"]) as session:
        session.run(feeds)
        weights = session.compiled_plan(feeds).runner.parts[0].first.stats()["weights"]
    assert weights["file"]["tensors"] > 0 and weights["memory"]["tensors"] == 0
    assert weights["file_folder"] == str(compiled["onnxruntime"].parent)


@pytest.mark.parametrize("engine", ENGINES)
def test_loading_a_compiled_file_imports_no_toolchain_and_no_other_engine(engine, compiled, feeds, tmp_path):
    np.save(tmp_path / "x.npy", feeds["input"])
    script = (f"import json, sys, numpy as np, edgeinfer as ei\n"
              f"s = ei.Session({str(compiled[engine])!r})\n"
              f"y = s.run({{'input': np.load({str(tmp_path / 'x.npy')!r})}})['logits']\n"
              f"print(json.dumps(sorted(sys.modules)))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    modules = set(json.loads(done.stdout.splitlines()[-1]))
    loaded = {name for name in TOOLCHAIN if name in modules}
    others = {m for name, m in ENGINE_MODULES.items() if name != engine and m in modules}
    assert not loaded and not others, (loaded, others)
    assert ENGINE_MODULES[engine] in modules
    if engine != "openvino":
        assert not [name for name in HEAVY_STDLIB if name in modules]


def test_auto_decides_at_compile_time_and_the_device_does_not_measure(source, feeds, expected, tmp_path, monkeypatch):
    path = tmp_path / "auto.eim"
    model = ei.compile(ei.convert(source), path, backend="auto", threads=1, options=ei.AutoOptions(cache=False))
    assert model.compiled.auto["backends"] == model.compiled.backends
    assert set(model.compiled.auto["median_ms"]) >= {"onnxruntime,numpy"}
    # every candidate is timed or said why not (the race's pruning, recorded for the benchmark)
    skipped = model.compiled.auto["skipped"]
    assert isinstance(skipped, dict) and all(isinstance(why, str) and why for why in skipped.values())
    assert not set(skipped) & set(model.compiled.auto["median_ms"])

    def no_measuring(*args, **kwargs):
        raise AssertionError("auto measured again on the device")

    monkeypatch.setattr("edgeinfer.runtime.auto.measure", no_measuring)
    for backend in (None, "auto"):
        with ei.Session(path, backend=backend) as session:
            assert_close(session.run(feeds)["logits"], expected[0], rtol=1e-4, atol=1e-4)
            assert [p.backend for p in session.plan.parts] == [b for b in model.compiled.assignment[:1]]


def test_a_file_compiled_for_another_engine_version_compiles_from_the_ir(compiled, feeds, expected, tmp_path, caplog):
    parsed = EimFile.read(compiled["onnxruntime"])
    parsed.document["compiled"]["engines"]["onnxruntime"] = "0.0.1"
    path = tmp_path / "old.eim"
    path.write_bytes(parsed.pack())
    with caplog.at_level(logging.WARNING), ei.Session(path) as session:
        got = session.run(feeds)["logits"]
    said = [r.getMessage() for r in caplog.records if "compile from the IR" in r.getMessage()]
    assert len(said) == 1 and "made for onnxruntime 0.0.1" in said[0] and str(path) in said[0]
    assert_close(got, expected[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_file_compiled_on_another_cpu_compiles_from_the_ir(engine, compiled, feeds, expected, tmp_path, caplog):
    parsed = EimFile.read(compiled[engine])
    parsed.document["compiled"]["machine"] = "riscv64 V"
    path = tmp_path / "other_cpu.eim"
    path.write_bytes(parsed.pack())
    with caplog.at_level(logging.WARNING), ei.Session(path) as session:
        got = session.run(feeds)["logits"]
    assert any("made on a riscv64 V CPU" in r.getMessage() for r in caplog.records)
    assert_close(got, expected[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("engine", ENGINES)
def test_damaged_artifact_bytes_are_never_handed_to_the_engine(engine, compiled, feeds, expected, tmp_path, caplog):
    raw = bytearray(compiled[engine].read_bytes())
    parsed = EimFile.parse(bytes(raw))
    entry = parsed.document["compiled"]["artifacts"][0]
    start = parsed.data_offset + entry["offset"]
    raw[start + entry["nbytes"] // 2] ^= 0xFF  # the data section carries no checksum: only the artifact's own
    path = tmp_path / "damaged.eim"
    path.write_bytes(bytes(raw))
    with caplog.at_level(logging.WARNING), ei.Session(path) as session:
        got = session.run(feeds)["logits"]
    assert any("changed after it was written" in r.getMessage() for r in caplog.records)
    assert_close(got, expected[0], rtol=1e-4, atol=1e-4)


def erf_between_convolutions() -> onnx.ModelProto:
    """Two onnxruntime parts around a node onnxruntime has no kernel for (Erf on double)."""
    rng = np.random.default_rng(0)
    w1, w2 = (helper.make_tensor(n, TensorProto.FLOAT, [64, 64, 1, 1], rng.standard_normal((64, 64, 1, 1)).ravel())
              for n in ("w1", "w2"))
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"]), helper.make_node("Cast", ["a"], ["a64"], to=11),
             helper.make_node("Erf", ["a64"], ["e64"]), helper.make_node("Cast", ["e64"], ["e"], to=1),
             helper.make_node("Conv", ["e", "w2"], ["y"])]
    graph = helper.make_graph(nodes, "two_parts", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64, 4, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64, 4, 4])], [w1, w2])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_artifacts_swapped_between_parts_are_refused(tmp_path, caplog):
    proto = erf_between_convolutions()
    model = ei.convert(proto, optimize=0)
    path = tmp_path / "two.eim"
    compiled = ei.compile(model, path, backend="onnxruntime")
    assert [p["backend"] for p in compiled.compiled.parts] == ["onnxruntime", "numpy", "onnxruntime"]
    parsed = EimFile.read(path)
    parts = parsed.document["compiled"]["parts"]
    parts[0]["artifact"], parts[2]["artifact"] = parts[2]["artifact"], parts[0]["artifact"]
    swapped = tmp_path / "swapped.eim"
    swapped.write_bytes(parsed.pack())
    feeds = {"x": np.random.default_rng(1).standard_normal((1, 64, 4, 4)).astype(np.float32)}
    expected = ei.Session(model, backend="numpy").run(feeds)["y"]
    with caplog.at_level(logging.WARNING), ei.Session(swapped) as session:
        got = session.run(feeds)["y"]
    refused = [r.getMessage() for r in caplog.records if "made for another part" in r.getMessage()]
    assert len(refused) == 2 and all("compile from the IR" in m for m in refused)
    assert_close(got, expected, rtol=1e-4, atol=1e-4)


def test_a_section_made_from_another_ir_is_ignored(compiled, tmp_path, caplog):
    parsed = EimFile.read(compiled["onnxruntime"])
    parsed.document["metadata"]["edited"] = "after compiling"
    path = tmp_path / "edited.eim"
    path.write_bytes(parsed.pack())
    with caplog.at_level(logging.WARNING):
        model = ei.load(path)
    assert model.compiled is None
    assert any("made from another IR" in r.getMessage() for r in caplog.records)


def test_symbolic_dims_need_example_inputs_or_shapes(tmp_path):
    model = ei.convert(zoo.mlp_symbolic_batch())
    with pytest.raises(ei.InputError, match="symbolic dims: give example inputs.*or static shapes"):
        ei.compile(model, tmp_path / "never-written.eim")
    assert not (tmp_path / "never-written.eim").exists()
    feeds = {"x": np.random.default_rng(0).standard_normal((4, 32)).astype(np.float32)}
    kept = ei.compile(model, tmp_path / "symbolic.eim", backend="onnxruntime", example_feeds=feeds)
    assert kept.inputs[0].shape == ("N", 32)  # the artifact keeps the symbolic batch
    bound = ei.compile(model, tmp_path / "bound.eim", backend="onnxruntime", shapes={"x": (2, 32)})
    assert bound.inputs[0].shape == (2, 32)
    with ei.Session(tmp_path / "symbolic.eim") as session:
        for batch in (1, 4):
            x = {"x": feeds["x"][:batch]}
            assert_close(session.run(x)["probs"], ei.Session(model).run(x)["probs"], rtol=1e-5, atol=1e-6)


def test_placeholders_are_the_messages_onnx_writes():
    array = np.zeros((3, 0, 7), np.float16)
    for location in ({"location": "model.eim", "offset": "4096", "length": "0"}, {"location": "edgeinfer-in-memory"}):
        ours = onnx.TensorProto.FromString(_placeholder("w\u00e9ight", array, location))
        assert ours == external_placeholder("w\u00e9ight", array, location)


def test_the_common_element_types_are_onnxs():
    for code, name in dtypes._COMMON.items():
        assert helper.tensor_dtype_to_string(code).removeprefix("TensorProto.").lower() in (name, {
            "float32": "float", "float64": "double", "str": "string"}.get(name))
        assert dtypes.from_onnx(code) == name and dtypes.to_onnx(name) == code


def test_a_flatbuffer_whose_outputs_the_exporter_renamed_loads_from_its_artifact(tmp_path, monkeypatch, caplog):
    """A .tflite convolution comes in as NHWC Conv + Transpose; exported again, its output leaves
    through a layout change the exporter names after it (``y@0231_Conv@0231``): the artifact is
    still this part's, bound by the part's own names."""
    rng = np.random.default_rng(2)
    weight = helper.make_tensor("w", TensorProto.FLOAT, [8, 3, 3, 3], rng.standard_normal((8, 3, 3, 3)).ravel())
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1]),
             helper.make_node("Transpose", ["y"], ["z"], perm=[0, 2, 3, 1])]
    graph = helper.make_graph(nodes, "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 16, 16, 8])], [weight])
    ei.export(ei.convert(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])), tmp_path / "conv.tflite")
    path = tmp_path / "conv.eim"
    model = ei.compile(tmp_path / "conv.tflite", path, backend="tflite")
    monkeypatch.setattr("edgeinfer.backends.tflite.backend.TFLiteBackend._export", None)  # never called
    feeds = {model.inputs[0].name: rng.standard_normal(model.inputs[0].shape).astype(np.float32)}
    with caplog.at_level(logging.WARNING), ei.Session(path) as session:
        got = list(session.run(feeds).values())[0]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    from ai_edge_litert.interpreter import Interpreter

    native = Interpreter(model_path=str(tmp_path / "conv.tflite"))
    native.allocate_tensors()
    native.set_tensor(native.get_input_details()[0]["index"], list(feeds.values())[0])
    native.invoke()
    assert_close(got, native.get_tensor(native.get_output_details()[0]["index"]), rtol=1e-4, atol=1e-4)


def test_a_lean_session_streams_and_describes_by_reading_its_graph_then(compiled, feeds, expected):
    with ei.Session(compiled["onnxruntime"], threads=2) as session:
        assert not session.model.loaded
        got = list(session.stream([feeds] * 6, stages=1))
        assert session.model.loaded  # the stage planner works on the graph
    for out in got:
        assert_close(out["logits"], expected[0], rtol=1e-4, atol=1e-4)


def test_a_first_run_that_fails_on_the_artifacts_is_run_again_from_the_ir(compiled, feeds, expected, monkeypatch,
                                                                           caplog):
    from edgeinfer.backends.onnxruntime.backend import OnnxRuntimeExecutable

    original = OnnxRuntimeExecutable.run
    calls = []

    def fails_once(self, inputs):
        calls.append(1)
        if len(calls) == 1:
            raise ei.BackendError("a kernel failed")
        return original(self, inputs)

    monkeypatch.setattr(OnnxRuntimeExecutable, "run", fails_once)
    with caplog.at_level(logging.WARNING), ei.Session(compiled["onnxruntime"]) as session:
        got = session.run(feeds)["logits"]
        assert session.model.loaded
    assert any("first run from the stored artifacts failed" in r.getMessage() for r in caplog.records)
    assert_close(got, expected[0], rtol=1e-4, atol=1e-4)


def _numpy_wins_warm(monkeypatch) -> None:
    """auto's warm race says numpy won (whatever the timings), so the cold-start weighing runs."""
    monkeypatch.setattr("edgeinfer.runtime.auto_choice.decide", lambda medians, native=None, margin=0.0: ("numpy", "forced"))


def test_compile_weighs_the_first_result_when_auto_leaves_the_native_engine(source, feeds, expected, tmp_path,
                                                                             monkeypatch):
    """A warm winner that is not the native engine stays only if its first result in a fresh
    process is within COLD_MARGIN of the native engine's: both are timed, both figures kept."""
    from edgeinfer.runtime.coldstart import COLD_MARGIN

    _numpy_wins_warm(monkeypatch)
    path = tmp_path / "auto.eim"
    model = ei.compile(ei.convert(source), path, backend="auto", threads=1, example_feeds=feeds,
                       options=ei.AutoOptions(cache=False))
    auto = model.compiled.auto
    cold = auto["first_result_s"]
    assert auto["warm_winner"] == ["numpy"] and 0 < cold["auto"] < 60 and 0 < cold["native"] < 60
    kept = cold["auto"] <= cold["native"] * (1 + COLD_MARGIN)
    assert model.compiled.backends == (["numpy"] if kept else ["onnxruntime", "numpy"])
    assert ("first result in a fresh process" in auto["reason"]) and (kept or "kept" in auto["reason"])
    assert not [p for p in tmp_path.iterdir() if p.name != "auto.eim"]  # the native candidate's file is gone
    with ei.Session(path) as session:
        assert_close(session.run(feeds)["logits"], expected[0], rtol=1e-4, atol=1e-4)


def test_the_native_engine_is_kept_when_the_warm_winner_starts_slower(source, feeds, tmp_path, monkeypatch):
    _numpy_wins_warm(monkeypatch)
    monkeypatch.setattr("edgeinfer.runtime.coldstart.first_results",
                        lambda files, feeds, threads: {"auto": 0.5, "native": 0.2})
    model = ei.compile(ei.convert(source), tmp_path / "a.eim", backend="auto", threads=1, example_feeds=feeds,
                       options=ei.AutoOptions(cache=False))
    assert model.compiled.backends == ["onnxruntime", "numpy"]
    assert model.compiled.auto["backends"] == ["onnxruntime", "numpy"]
    assert "0.5 s against the native engine's 0.2 s" in model.compiled.auto["reason"]
    off = ei.compile(ei.convert(source), tmp_path / "b.eim", backend="auto", threads=1, example_feeds=feeds,
                     options=ei.AutoOptions(cache=False, cold_start=False))
    assert off.compiled.backends == ["numpy"] and "first_result_s" not in off.compiled.auto


def test_a_winner_that_starts_too_slowly_gives_way_to_the_next_candidate(source, feeds, expected, tmp_path,
                                                                         monkeypatch):
    """The warm winner fails the cold check; the next candidate faster warm than the native engine
    is weighed the same way and kept where it starts as fast (the choice does not hang on which
    of the two won warm)."""
    _numpy_wins_warm(monkeypatch)
    monkeypatch.setattr("edgeinfer.runtime.aot_compile._runner_up", lambda choice: "tflite,numpy")
    monkeypatch.setattr("edgeinfer.runtime.coldstart.first_results",
                        lambda files, feeds, threads: {"auto": 0.2 if ".next." in files["auto"].name else 0.5,
                                                       "native": 0.2})
    path = tmp_path / "a.eim"
    model = ei.compile(ei.convert(source), path, backend="auto", threads=1, example_feeds=feeds,
                       options=ei.AutoOptions(cache=False))
    assert model.compiled.backends == ["tflite", "numpy"] and model.compiled.auto["warm_winner"] == ["numpy"]
    assert "then" in model.compiled.auto["reason"] and model.compiled.auto["first_result_s"]["auto"] == 0.2
    assert [p.name for p in tmp_path.iterdir()] == ["a.eim"]
    with ei.Session(path) as session:
        assert_close(session.run(feeds)["logits"], expected[0], rtol=1e-4, atol=1e-4)


def test_a_file_left_to_the_device_is_compiled_by_its_first_session_and_written_back(source, feeds, expected,
                                                                                      tmp_path, caplog):
    path = tmp_path / "device.eim"
    written = ei.compile(ei.convert(source), path, backend=["onnxruntime", "tflite"], threads=1, on_device=True)
    assert written.compiled is None and "edgeinfer.compile_on_device" in written.metadata
    with caplog.at_level(logging.INFO, logger="edgeinfer.runtime.aot"), ei.Session(path) as session:
        first = session.run(feeds)
    assert any("compiled on the device" in r.getMessage() and "written back" in r.getMessage()
               for r in caplog.records)
    back = ei.load(path)
    assert back.compiled is not None and back.compiled.backends[0] == "onnxruntime"
    assert "edgeinfer.compile_on_device" not in back.metadata and back.compiled.threads == 1
    assert all(part["artifact"] is not None for part in back.compiled.parts)
    with ei.Session(path) as again:  # every later start: the stored plan, from its artifacts
        assert type(again._single).__name__ == "LeanCompiledPlan"
        second = again.run(feeds)
    for got in (first, second):
        for value, want in zip(got.values(), expected):
            assert_close(value, want, rtol=1e-4, atol=1e-5)


def test_a_read_only_file_left_to_the_device_is_decided_in_memory_and_left_as_it_was(source, feeds, expected,
                                                                                      tmp_path, caplog, monkeypatch):
    import os

    from edgeinfer.runtime import write_back

    path = tmp_path / "device.eim"
    ei.compile(ei.convert(source), path, backend="onnxruntime", threads=1, on_device=True)
    before = path.read_bytes()
    # as a user who may not write there (root writes read-only files: the check is os.access's)
    monkeypatch.setattr(write_back.os, "access", lambda p, mode: not mode & os.W_OK)
    with caplog.at_level(logging.WARNING), ei.Session(path) as session:
        got = session.run(feeds)
    assert session.backend_name == "onnxruntime"
    assert any("not written back: the file or its folder is read-only" in r.getMessage() for r in caplog.records)
    assert path.read_bytes() == before
    for value, want in zip(got.values(), expected):
        assert_close(value, want, rtol=1e-4, atol=1e-5)


def test_compile_on_device_refuses_inputs_that_are_for_compiling_here(source, feeds, tmp_path):
    with pytest.raises(ei.EdgeInferError, match="the device decides on its own inputs"):
        ei.compile(ei.convert(source), tmp_path / "x.eim", backend="auto", example_feeds=feeds, on_device=True)
