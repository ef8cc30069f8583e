"""Per-backend devices in one plan, and ``backend="auto"`` considering torch on the GPU.

No GPU here: device availability is monkeypatched, and torch's CPU device stands in where a
candidate must really run (``torch@cpu``)."""

from __future__ import annotations

import numpy as np
import pytest

import edgeinfer as ei
from devkit.testing import assert_close, parse_model
from edgeinfer.errors import BackendError
from edgeinfer.runtime import auto_gpu
from edgeinfer.runtime.placement import make_backends

torch = pytest.importorskip("torch")
from edgeinfer.backends.torch import TorchBackend  # noqa: E402  (needs torch)

# pre-processing (Cast, scaling), a body, and a post-processing Softmax that the tests make
# torch refuse, as it refuses ops it has no lowering for
TEXT = """
<ir_version: 8, opset_import: ["" : 17]>
g (uint8[1, 32] pixels) => (float[1, 32] probs) {
  x = Cast<to = 1>(pixels)
  scale = Constant<value = float {0.0078125}>()
  s = Mul(x, scale)
  h = Tanh(s)
  z = Relu(h)
  probs = Softmax<axis = -1>(z)
}
"""


@pytest.fixture
def model():
    return ei.convert(parse_model(TEXT), optimize=0)


@pytest.fixture
def feeds():
    return {"pixels": np.random.default_rng(0).integers(0, 255, (1, 32), dtype=np.uint8)}


@pytest.fixture
def torch_refuses_softmax(monkeypatch):
    supports = TorchBackend.supports

    def refusing(self, node, graph):
        if node.op_type == "Softmax":
            return "no torch lowering for Softmax (refused by this test)"
        return supports(self, node, graph)

    monkeypatch.setattr(TorchBackend, "supports", refusing)


# -- one device per backend ------------------------------------------------------------------
def test_backend_options_place_one_backend_on_a_device_of_its_own(model, feeds):
    with ei.Session(model, backend=["torch", "onnxruntime"], device="npu",
                    options=ei.RunOptions(backend_options={"torch": {"device": "cpu"}}, fallback=True)) as session:
        devices = {b.name: b.device for b in session.backends}
        got = session.run(feeds)
    assert devices["torch"] == "cpu"
    reference = ei.Session(model, backend="numpy").run(feeds)
    assert_close(got["probs"], reference["probs"])


def test_a_device_torch_does_not_see_is_named_in_the_error(model):
    with pytest.raises(BackendError, match=r"device 'cuda:0' is not available.*available: \['cpu'"):
        ei.Session(model, backend=["torch", "onnxruntime"],
                   options=ei.RunOptions(backend_options={"torch": {"device": "cuda:0"}}))
    with pytest.raises(BackendError, match="is not available"):
        ei.Session(model, backend=["torch@cuda:0", "onnxruntime"])


def test_two_devices_for_one_backend_is_an_error():
    with pytest.raises(BackendError, match="name two devices"):
        make_backends(["torch@cpu", "numpy"], options={"torch": {"device": "mps"}})
    with pytest.raises(BackendError, match="more than once"):
        ei.Session(ei.convert(parse_model(TEXT)), backend=["torch@cpu", "torch"])


def test_a_mixed_plan_puts_what_torch_refuses_on_the_cpu_engine(model, feeds, torch_refuses_softmax):
    with ei.Session(model, backend=["torch@cpu", "onnxruntime@cpu"]) as session:
        placed = [part.backend for part in session.plan.parts]
        got = session.run(feeds)
    assert placed == ["torch", "onnxruntime"], session.plan.describe()
    reference = ei.Session(model, backend="numpy").run(feeds)
    assert_close(got["probs"], reference["probs"])


# -- backend="auto" with a GPU ----------------------------------------------------------------
def test_the_accelerator_follows_torchs_device_availability(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    assert auto_gpu.accelerator() is None
    assert auto_gpu.accelerator_candidates(["onnxruntime", "torch", "numpy"], "cpu", {}) == []
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    assert auto_gpu.accelerator() == "mps"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert auto_gpu.accelerator() == "cuda:0"
    installed = ["onnxruntime", "openvino", "torch", "numpy"]
    assert auto_gpu.accelerator_candidates(installed, "cpu", {}) == [
        ["torch@cuda:0", "numpy"], ["torch@cuda:0", "onnxruntime@cpu", "numpy"]]
    assert auto_gpu.accelerator_candidates(installed, "gpu", {}) == auto_gpu.accelerator_candidates(installed, "cpu", {})
    # not without torch, not when the caller chose a device auto must keep, or placed torch itself
    assert auto_gpu.accelerator_candidates(["onnxruntime", "numpy"], "cpu", {}) == []
    assert auto_gpu.accelerator_candidates(installed, "npu", {}) == []
    assert auto_gpu.accelerator_candidates(installed, "cpu", {"torch": {"device": "cpu"}}) == []


def test_auto_times_torch_on_the_accelerator_and_the_mixed_plan(model, feeds, monkeypatch, torch_refuses_softmax):
    """With an accelerator (here torch's CPU device stands in for it), auto times torch on it
    and the mixed plan (Softmax, refused by torch, on onnxruntime): each is a candidate of its
    own, the one placing every node as another candidate does is skipped as such, and the
    winner runs correctly whichever it is."""
    from edgeinfer.runtime import auto

    monkeypatch.setattr(auto_gpu, "accelerator", lambda: "cpu")
    monkeypatch.setattr(auto, "accelerator", lambda: "cpu")
    with ei.Session(model, backend="auto", options=ei.AutoOptions(cache=False)) as session:
        choice = session.auto_choice
        got = session.run(feeds)
    mixed = "torch@cpu,onnxruntime@cpu,numpy"
    # it ran (compiled, warmed up) and was timed; torch's per-call overhead may drop it early on so small a model
    assert mixed in choice.median_ms or "x the best" in choice.skipped.get(mixed, ""), choice
    # torch alone "on the accelerator" places every node as the torch candidate does: the same device here
    assert "places every node as 'torch,numpy' does" in choice.skipped["torch@cpu,numpy"]
    reference = ei.Session(model, backend="numpy").run(feeds)
    assert_close(got["probs"], reference["probs"])


def test_a_cached_choice_on_the_accelerator_is_reused(model, feeds, monkeypatch, tmp_path, torch_refuses_softmax):
    from edgeinfer.runtime import auto

    monkeypatch.setattr(auto_gpu, "accelerator", lambda: "cpu")
    monkeypatch.setattr(auto, "accelerator", lambda: "cpu")
    monkeypatch.setattr(auto, "candidates", lambda installed: [])  # only the accelerator candidates
    monkeypatch.setattr(auto, "native_engine", lambda model: None)  # (not the ONNX model's onnxruntime either)
    first = ei.Session(model, backend="auto", options=ei.AutoOptions(cache=tmp_path))
    assert first.auto_choice.backends[0] == "torch@cpu"
    second = ei.Session(model, backend="auto", options=ei.AutoOptions(cache=tmp_path))
    assert second.auto_choice.cached and second.auto_choice.backends == first.auto_choice.backends
    assert_close(second.run(feeds)["probs"], first.run(feeds)["probs"])
    # another accelerator is another machine's choice: measured again, not reused
    monkeypatch.setattr(auto, "accelerator", lambda: "mps")
    third = ei.Session(model, backend="auto", options=ei.AutoOptions(cache=tmp_path))
    assert not third.auto_choice.cached
    for session in (first, second, third):
        session.close()


def test_the_cli_takes_a_backend_on_a_device_of_its_own(tmp_path, torch_refuses_softmax):
    import onnx
    from click.testing import CliRunner

    from edgeinfer.cli import main

    path = tmp_path / "m.onnx"
    onnx.save(parse_model(TEXT), path)
    result = CliRunner().invoke(main, ["run", str(path), "--random-inputs", "--backend", "torch@cpu+onnxruntime"])
    assert result.exit_code == 0, result.output
    assert "placement:" not in result.output  # every node went where it was asked: torch or onnxruntime
    shown = CliRunner().invoke(main, ["inspect", str(path), "--plan", "--backend", "torch@cpu+onnxruntime"])
    assert shown.exit_code == 0, shown.output
    # Softmax, refused by torch, goes to onnxruntime
    assert "(Softmax) -> onnxruntime (torch: no torch lowering for Softmax" in shown.output, shown.output
    assert "part 0: torch" in shown.output and "part 1: onnxruntime" in shown.output, shown.output
    missing = CliRunner().invoke(main, ["run", str(path), "--random-inputs", "--backend", "torch@cuda:0"])
    assert missing.exit_code != 0 and "device 'cuda:0' is not available" in missing.output
    assert "Traceback" not in missing.output


def test_a_spec_device_travels_as_the_backends_device_option():
    from edgeinfer.runtime.placement import spec_options

    options = {"torch": {"precision": "fp16"}, "onnxruntime": {}}
    assert spec_options(["torch@cuda:0", "onnxruntime", "numpy"], options) == {
        "torch": {"precision": "fp16", "device": "cuda:0"}, "onnxruntime": {}}
    assert options["torch"] == {"precision": "fp16"}  # the caller's options are left as they were


def test_ray_stage_actors_make_each_backend_on_its_own_device(model, feeds, torch_refuses_softmax):
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        # the session's device is one this machine lacks, with no fallback: only the specs' own
        # devices reaching the actors let them make their backends
        with ei.Session(model, backend=["torch@cpu", "onnxruntime@cpu"], device="gpu", executor="ray",
                        options=[ei.StreamOptions(stages=1, replicas=1), ei.RayOptions(stage_resources={"num_cpus": 0.5})]) as session:
            got = session.run(feeds)
            backends = ray.get(session.ray_pipeline.actors[0][0].__ray_call__.remote(
                lambda worker: {p.backend.name: p.backend.device for p in worker.runner.parts}))
    finally:
        ray.shutdown()
    assert backends["torch"] == "cpu"  # from "torch@cpu", not the session's device
    reference = ei.Session(model, backend="numpy").run(feeds)
    assert_close(got["probs"], reference["probs"])
