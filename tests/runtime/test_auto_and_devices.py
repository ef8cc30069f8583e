"""backend="auto" (measure, choose, cache) and device selection with its errors and fallback."""

from __future__ import annotations

import json
import logging

import onnxruntime as ort
import pytest

import edgeinfer as ei
from devkit import zoo
from devkit.testing import assert_close
from edgeinfer.backend import get_backend, installed_backends
from edgeinfer.backends.onnxruntime import device_providers
from edgeinfer.errors import BackendError
from edgeinfer.runtime import auto
from edgeinfer.runtime.stream.planner import SAME_RATE

from .backends import RestrictedBackend


@pytest.fixture(scope="module")
def model():
    return ei.convert(zoo.cnn_residual_depthwise(seed=2))


def test_auto_measures_then_reuses_its_cached_choice(model, tmp_path, monkeypatch):
    feeds = model.random_feeds(seed=4)
    reference = ei.Session(model, backend="numpy").run(feeds)
    first = ei.Session(model, backend="auto", threads=1, options=ei.AutoOptions(cache=tmp_path))
    choice = first.auto_choice
    assert not choice.cached and choice.median_ms
    timed = set(choice.median_ms) | set(choice.skipped)
    assert {",".join(c) for c in auto.candidates(installed_backends())} == timed
    assert choice.backends == auto.decide(choice.median_ms, choice.native)[0].split(",")
    assert choice.native == "onnxruntime,numpy"  # converted from ONNX: its native engine
    assert_close(first.run(feeds)["logits"], reference["logits"], rtol=1e-4, atol=1e-5)
    stored = json.loads((tmp_path / auto.CACHE_FILE).read_text())
    assert stored[choice.key]["backends"] == choice.backends

    def no_measuring(*args, **kwargs):
        raise AssertionError("a cached choice must not be measured again")

    monkeypatch.setattr(auto, "measure", no_measuring)
    second = ei.Session(model, backend="auto", threads=1, options=ei.AutoOptions(cache=tmp_path))
    assert second.auto_choice.cached and second.auto_choice.backends == choice.backends
    assert_close(second.run(feeds)["logits"], reference["logits"], rtol=1e-4, atol=1e-5)
    # another thread count is another key: measured again
    with pytest.raises(AssertionError, match="must not be measured"):
        ei.Session(model, backend="auto", threads=2, options=ei.AutoOptions(cache=tmp_path))


def test_a_corrupt_cache_is_ignored_and_rewritten(model, tmp_path, caplog):
    (tmp_path / auto.CACHE_FILE).write_text("{not json")
    with caplog.at_level(logging.WARNING, logger="edgeinfer.runtime.auto"):
        session = ei.Session(model, backend="auto", threads=1, options=ei.AutoOptions(cache=tmp_path))
    assert "unreadable" in caplog.text
    assert json.loads((tmp_path / auto.CACHE_FILE).read_text())[session.auto_choice.key]


def test_cache_dir_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEINFER_CACHE_DIR", str(tmp_path / "c"))
    assert auto.cache_dir(None) == tmp_path / "c"
    assert auto.cache_dir(False) is None
    assert auto.cache_dir(tmp_path) == tmp_path


def test_auto_skips_a_candidate_that_cannot_run(model, tmp_path, monkeypatch):
    monkeypatch.setattr(auto, "candidates", lambda installed: [["tensorrt"], ["onnxruntime", "numpy"]])
    session = ei.Session(model, backend="auto", options=ei.AutoOptions(cache=False))
    assert session.auto_choice.backends == ["onnxruntime", "numpy"]
    assert "unknown backend 'tensorrt'" in session.auto_choice.skipped["tensorrt"]


def test_an_auto_sessions_stream_measures_the_other_engines_too(model, tmp_path):
    """``auto`` chose its engine for one request on all threads; a stream's replicas run on one
    thread each, where engines rank differently, so the stream planner also measures a replica
    plan on every other installed engine that takes the whole graph, and may serve on it."""
    feeds = [model.random_feeds(seed=s) for s in range(6)]
    reference = ei.Session(model, backend="numpy")
    expected = [reference.run(f)["logits"] for f in feeds]
    with ei.Session(model, backend="auto", threads=2, options=ei.AutoOptions(cache=tmp_path)) as session:
        plan = session.pipeline_plan(feeds[0], stages="auto")
        chosen = set(session.auto_choice.backends)
        others = {c["on"] for c in plan.candidates if "on" in c}
        engines = [name for name in installed_backends() if name != "numpy"]
        assert others == {name for name in engines if name not in chosen
                          and [p.backend for p in ei.Session(model, backend=name).plan.parts] == [name]}
        assert all("measured" in c for c in plan.candidates)
        best = max(c["measured"] for c in plan.candidates)
        served = [c for c in plan.candidates if c.get("served")]
        assert len(served) == 1 and served[0]["measured"] >= best * (1 - SAME_RATE)  # noise: the simpler one
        assert not any(c["measured"] >= best * (1 - SAME_RATE) for c in plan.candidates[:plan.candidates.index(served[0])])
        serving = {p.part.backend for stage in plan.stages for p in stage.runner.parts}
        assert serving == ({served[0]["on"]} if "on" in served[0] else serving & (chosen | {"numpy"}))
        assert "on " in plan.describe() or not others
        got = list(session.stream(feeds, stages="auto"))
    for out, ref in zip(got, expected):
        assert_close(out["logits"], ref, rtol=1e-4, atol=1e-5)


# -- devices ---------------------------------------------------------------------------------------
def test_missing_gpu_provider_is_a_clear_error_or_a_logged_fallback(model, caplog):
    if any(p in ort.get_available_providers() for p in ("CUDAExecutionProvider", "DmlExecutionProvider")):
        pytest.skip("this onnxruntime build has a GPU provider")
    with pytest.raises(BackendError, match=r"no GPU execution provider.*fallback=True runs on the CPU"):
        ei.Session(model, backend="onnxruntime", device="gpu")
    with caplog.at_level(logging.WARNING):
        session = ei.Session(model, backend="onnxruntime", device="gpu",
                             options=ei.RunOptions(fallback=True))
    assert "falling back to CPUExecutionProvider" in caplog.text
    assert session.stats()["providers"] == ["CPUExecutionProvider"]
    assert session.backends[0].device == "cpu"


def test_explicit_missing_provider_errors_or_falls_back(model, caplog):
    with pytest.raises(BackendError, match=r"provider\(s\) \['QNNExecutionProvider'\] are not available"):
        ei.Session(model, backend="onnxruntime", providers=["QNNExecutionProvider"])
    with caplog.at_level(logging.WARNING):
        session = ei.Session(model, backend="onnxruntime", providers=["QNNExecutionProvider"],
                             options=ei.RunOptions(fallback=True))
    assert "falling back" in caplog.text and session.stats()["providers"] == ["CPUExecutionProvider"]


@pytest.mark.parametrize("device, available, expected", [
    ("gpu", ["CUDAExecutionProvider", "CPUExecutionProvider"], ["CUDAExecutionProvider", "CPUExecutionProvider"]),
    ("gpu", ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"],
     ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]),
    ("npu", ["QNNExecutionProvider", "CPUExecutionProvider"], ["QNNExecutionProvider", "CPUExecutionProvider"]),
    ("npu", ["NnapiExecutionProvider", "CPUExecutionProvider"], ["NnapiExecutionProvider", "CPUExecutionProvider"]),
    ("npu", ["OpenVINOExecutionProvider", "CPUExecutionProvider"],
     [("OpenVINOExecutionProvider", {"device_type": "NPU"}), "CPUExecutionProvider"]),
    ("cpu", ["CUDAExecutionProvider", "CPUExecutionProvider"], ["CPUExecutionProvider"]),
])
def test_device_picks_the_builds_providers_in_preference_order(device, available, expected):
    assert device_providers(available, device) == expected


def test_numpy_runs_on_the_cpu_only(model, caplog):
    with pytest.raises(BackendError, match="numpy backend runs on the CPU only"):
        get_backend("numpy", device="npu")
    with caplog.at_level(logging.WARNING):
        get_backend("numpy", device="npu", fallback=True)
    assert "running on the CPU" in caplog.text
    with pytest.raises(BackendError, match="device 'tpu': expected one of cpu, gpu, npu"):
        ei.Session(model, device="tpu")


def test_partition_as_if_an_npu_existed(model):
    """An NPU that runs convolutions only: they go to it, the rest to onnxruntime, then numpy."""
    npu = RestrictedBackend("npu", {"Conv"})
    feeds = model.random_feeds(seed=1)
    session = ei.Session(model, backend=[npu, "onnxruntime"])
    assert set(session.plan.backend_names) == {"npu", "onnxruntime"}
    assert all(b == "npu" for i, b in enumerate(session.plan.assignment.backends)
               if model.graph.nodes[i].op_type == "Conv")
    reference = ei.Session(model).run(feeds)
    assert_close(session.run(feeds)["logits"], reference["logits"], rtol=1e-4, atol=1e-5)
