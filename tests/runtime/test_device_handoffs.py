"""Values between parts of one device stay on it: two torch parts hand torch tensors to each
other with no host round trip, and a value a host part (numpy) reads is copied to the host once.

Torch's CPU device stands in for a GPU: what is counted (the tensors each torch part is given,
the copies to the host) is the same on CUDA, where ``benchmarks/gpu_check.sh`` runs these
tests with ``EDGEINFER_TORCH_DEVICE=cuda:0``."""

from __future__ import annotations

import os

import numpy as np
import pytest

import edgeinfer as ei
from devkit.testing import assert_close, parse_model
from edgeinfer.runtime.compile import compile
from edgeinfer.runtime.placement import make_backends

torch = pytest.importorskip("torch")
from edgeinfer.backends.torch import TorchExecutable  # noqa: E402  (needs torch)

DEVICE = os.environ.get("EDGEINFER_TORCH_DEVICE", "cpu")

# a -> (numpy part) b, then a, b and the input x meet again on torch: torch, numpy, torch
# parts; ``a`` is read by both a torch part and the numpy part, ``x`` by both torch parts
TEXT = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[2, 8] x) => (float[2, 8] y, float[2, 8] b) {
  a = Relu(x)
  h = Mul(a, a)
  b = Neg(a)
  s = Add(h, b)
  t = Add(s, x)
  y = Sigmoid(t)
}
"""
NEG = 2  # node index of Neg: pinned to numpy


class Recorder:
    """Wraps the torch executables' resident calls and host copies, counting what they see."""

    def __init__(self, monkeypatch):
        self.feeds: list[dict] = []
        self.outputs: list[dict] = []
        self.host_copies = 0
        self.device_copies: list = []
        run_resident, to_host = TorchExecutable.run_resident, TorchExecutable.to_host
        from_host = TorchExecutable.from_host

        def recording_run(executable, feeds):
            self.feeds.append(dict(feeds))
            results = run_resident(executable, feeds)
            self.outputs.append(dict(results))
            return results

        def counting_to_host(executable, value):
            self.host_copies += 1
            return to_host(executable, value)

        def counting_from_host(executable, value):
            copy = from_host(executable, value)
            self.device_copies.append(copy)
            return copy

        monkeypatch.setattr(TorchExecutable, "run_resident", recording_run)
        monkeypatch.setattr(TorchExecutable, "from_host", counting_from_host)
        monkeypatch.setattr(TorchExecutable, "to_host", counting_to_host)


@pytest.fixture
def model():
    return ei.convert(parse_model(TEXT))


@pytest.mark.parametrize("executor", ["sequential", "dag"])
def test_torch_parts_hand_tensors_to_each_other_and_copy_to_the_host_once(model, monkeypatch, executor):
    feeds = {"x": np.random.default_rng(0).standard_normal((2, 8)).astype(np.float32)}
    backends = make_backends(["torch", "numpy"], options={"torch": {"device": DEVICE}})
    recorder = Recorder(monkeypatch)
    plan, runner = compile(model.graph, backends, pinned={NEG: "numpy"}, threads=2, executor=executor)
    assert [p.backend for p in plan.parts] == ["torch", "numpy", "torch"], plan.describe()
    try:
        got = runner.run(feeds)
    finally:
        runner.close()
    first, second = recorder.outputs[0], recorder.feeds[1]
    assert set(second) == {"a", "b", "x"}
    # the second torch part gets the first one's tensor itself; the numpy part's value as numpy
    assert second["a"] is first["a"] and isinstance(second["a"], torch.Tensor)
    assert isinstance(second["b"], np.ndarray)
    # the input both torch parts read is copied to the device once, and both read that copy
    assert len(recorder.device_copies) == 1
    assert recorder.feeds[0]["x"] is recorder.device_copies[0] is second["x"]
    # one copy of ``a`` for the numpy part, one of ``y`` for the caller (``b`` is numpy's own)
    assert recorder.host_copies == 2
    assert all(isinstance(value, np.ndarray) for value in got.values())
    reference = ei.Session(model, backend="numpy").run(feeds)
    for name, expected in reference.items():
        assert_close(got[name], expected, name=name)


def test_a_plan_of_numpy_parts_only_passes_arrays_as_before(model):
    """No resident part: the executor's plain path, no host copies planned."""
    backends = make_backends(["onnxruntime", "numpy"])
    _, runner = compile(model.graph, backends, pinned={NEG: "numpy"}, threads=1)
    try:
        assert not runner.resident and not any(runner.host_copies)
        feeds = {"x": np.ones((2, 8), np.float32)}
        got = runner.run(feeds)
    finally:
        runner.close()
    reference = ei.Session(model, backend="numpy").run(feeds)
    for name, expected in reference.items():
        assert_close(got[name], expected, name=name)


def test_a_failed_first_run_keeps_host_feeds_for_the_probes(model, monkeypatch):
    """The re-partition probes a failed part on the numpy reference: what it kept of the part's
    feeds is on the host even where the part was handed device tensors."""
    backends = make_backends(["torch", "numpy"], options={"torch": {"device": DEVICE}})
    run_resident = TorchExecutable.run_resident
    calls = []

    def fail_second(executable, feeds):
        calls.append(executable)
        if len(calls) == 2:
            raise RuntimeError("refusing the second torch part on purpose")
        return run_resident(executable, feeds)

    monkeypatch.setattr(TorchExecutable, "run_resident", fail_second)
    _, runner = compile(model.graph, backends, pinned={NEG: "numpy"}, threads=1)
    try:
        with pytest.raises(RuntimeError, match="on purpose"):
            runner.prove({"x": np.ones((2, 8), np.float32)})
        index, _, kept = runner.failure
        assert index == 2
    finally:
        runner.close()
    assert set(kept) == {"a", "b", "x"} and all(isinstance(v, np.ndarray) for v in kept.values())
