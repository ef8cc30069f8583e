"""The torch backend as a whole: zoo models against the numpy backend and onnxruntime, device
placement, engine options (precision, CUDA graphs, torch.compile), device-resident outputs
between two parts, threads, close(), and plans mixing backends.

They run on torch's CPU device, or on ``EDGEINFER_TORCH_DEVICE`` (``benchmarks/gpu_check.sh``
sets ``cuda:0``, with ``NVIDIA_TF32_OVERRIDE=0`` so float32 stays float32)."""

from __future__ import annotations

import logging
import os
import threading

import numpy as np
import pytest
import torch

import edgeinfer as ei
from devkit import zoo
from devkit.testing import assert_close, parse_model
from edgeinfer.backend import CompileOptions, get_backend
from edgeinfer.backends.torch import TorchBackend, TorchExecutable, available_devices, resolve_device
from edgeinfer.errors import BackendError

DEVICE = os.environ.get("EDGEINFER_TORCH_DEVICE", "cpu")
on_cuda = pytest.mark.skipif(not DEVICE.startswith("cuda"), reason="needs EDGEINFER_TORCH_DEVICE=cuda:N")

# Deep float32 networks: torch (oneDNN / MKL) and numpy sum convolutions and matmuls in different
# orders; over 50 layers the rounding differences reach ~1e-5 of the logits' scale.
DEEP_RTOL, DEEP_ATOL = 1e-4, 1e-4

ZOO = {
    "cnn_residual_depthwise": lambda: zoo.cnn_residual_depthwise(batch=2),
    "transformer_encoder_block": lambda: zoo.transformer_encoder_block(batch=2),
    "mlp_symbolic_batch": zoo.mlp_symbolic_batch,
    "mobilenet_v2": lambda: zoo.mobilenet_v2(64, batch=2, width_mult=0.5),
    "resnet50": lambda: zoo.resnet50(batch=1, size=64),
    "inception_net": lambda: zoo.inception_net(32, batch=2),
}


@pytest.fixture(scope="module")
def cnn():
    proto = zoo.cnn_residual_depthwise(batch=2)
    return ei.convert(proto), zoo.example_inputs(proto)


@pytest.mark.parametrize("optimize", [1, 2], ids=["standard-ops", "fused-ops"])
@pytest.mark.parametrize("name", list(ZOO))
def test_zoo_model_matches_numpy_and_onnxruntime(name: str, optimize: int):
    proto = ZOO[name]()
    model = ei.convert(proto, optimize=optimize)
    feeds = zoo.example_inputs(proto, batch=2)
    with ei.Session(model, backend="torch", device=DEVICE) as session:
        assert session.plan.backend_names == ["torch"], session.plan.describe()
        got = session.run(feeds)
    numpy_ref = ei.Session(model, backend="numpy").run(feeds)
    ort_ref = ei.Session(ei.convert(proto, optimize=0), backend="onnxruntime").run(feeds)
    for output in numpy_ref:
        assert got[output].dtype == np.float32
        assert_close(got[output], numpy_ref[output], rtol=DEEP_RTOL, atol=DEEP_ATOL, name=f"{output} vs numpy")
        assert_close(got[output], ort_ref[output], rtol=DEEP_RTOL, atol=DEEP_ATOL, name=f"{output} vs onnxruntime")


# -- devices -----------------------------------------------------------------------------------
def test_available_devices_start_with_the_cpu_and_resolve():
    devices = available_devices()
    assert devices[0] == "cpu"
    for device in devices:
        assert str(resolve_device(device)) == device


@pytest.mark.parametrize("device", ["cuda:0", "gpu", "mps"])
def test_missing_device_is_a_clear_error_or_a_logged_fallback(cnn, device, caplog):
    if device == "gpu" and len(available_devices()) > 1 or device in available_devices() or device == "gpu" and \
            DEVICE != "cpu":
        pytest.skip(f"this machine has {device}")
    model, feeds = cnn
    with pytest.raises(BackendError, match=r"not available.*available: \['cpu'.*fallback=True"):
        ei.Session(model, backend="torch", device=device)
    with caplog.at_level(logging.WARNING):
        session = ei.Session(model, backend="torch", device=device, options=ei.RunOptions(fallback=True))
    assert "running on the CPU" in caplog.text
    assert session.backends[0].device == "cpu"
    assert_close(session.run(feeds)["logits"], ei.Session(model, backend="numpy").run(feeds)["logits"])


def test_device_names_are_checked():
    with pytest.raises(BackendError, match="expected 'cpu', 'gpu', 'cuda:N' or 'mps'"):
        TorchBackend(device="tpu")
    with pytest.raises(BackendError, match="device 'npu' is not available"):
        TorchBackend(device="npu")
    with pytest.raises(BackendError, match="expected one of cpu, gpu, npu, 'cuda:N' or 'mps'"):
        get_backend("torch", device="cuda")
    with pytest.raises(BackendError, match="onnxruntime.*does not address device 'cuda:0'"):
        get_backend("onnxruntime", device="cuda:0")


# -- engine options ----------------------------------------------------------------------------
def test_engine_options_are_checked():
    with pytest.raises(BackendError, match="unknown engine option"):
        TorchBackend(threads_per_part=2)
    with pytest.raises(BackendError, match="precision 'fp8'"):
        TorchBackend(precision="fp8")
    with pytest.raises(BackendError, match="torch_compile must be"):
        TorchBackend(torch_compile="yes")


def test_cuda_graphs_need_a_cuda_device():
    """A CUDA graph option on the CPU is refused rather than ignored: ignoring it would let a
    benchmark report eager figures as graph figures."""
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(BackendError, match="cuda_graphs=True needs a CUDA device"):
        ei.Session(ei.convert(zoo.mlp_symbolic_batch()), backend="torch", cuda_graphs=True)


# fp16 keeps 11 significant bits: after ~10 layers the logits carry relative errors of a few
# 1e-3 of their scale; bf16 keeps 8 bits, so ten times that.
HALF_TOLERANCES = {"fp16": (2e-2, 2e-2), "bf16": (1e-1, 1e-1)}


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("name", ["cnn_residual_depthwise", "transformer_encoder_block"])
def test_half_precision_on_the_cpu(name: str, precision: str):
    proto = ZOO[name]()
    model = ei.convert(proto, optimize=2)
    feeds = zoo.example_inputs(proto, batch=2)
    session = ei.Session(model, backend="torch", device=DEVICE, precision=precision)
    got = session.run(feeds)
    assert session.stats()["precision"] == precision
    reference = ei.Session(model, backend="numpy").run(feeds)
    rtol, atol = HALF_TOLERANCES[precision]
    for output, expected in reference.items():
        assert got[output].dtype == np.float32  # float32 outputs are returned in float32
        scale = float(np.abs(expected).max())
        assert_close(got[output], expected, rtol=rtol, atol=atol * scale, name=output)
        assert not np.array_equal(got[output], expected)  # it did compute in half precision


def test_torch_compile_when_asked(cnn):
    """``torch_compile`` takes torch.compile's arguments; the eager backend keeps this test
    free of a C compiler (inductor) while still running through dynamo's graph capture."""
    model, feeds = cnn
    session = ei.Session(model, backend="torch", device=DEVICE, torch_compile={"backend": "eager"})
    assert session.stats()["torch_compile"] is True
    assert_close(session.run(feeds)["logits"], ei.Session(model, backend="numpy").run(feeds)["logits"])


# -- the executable ----------------------------------------------------------------------------
def _halves(model: ei.Model):
    graph = model.graph
    nodes = graph.nodes
    return graph.subgraph(nodes[: len(nodes) // 2]), graph.subgraph(nodes[len(nodes) // 2:])


def test_two_parts_pass_device_tensors(cnn):
    """``run_tensors`` returns torch tensors on the device, which the next part takes as they
    are: no numpy round trip between two parts of the same device."""
    model, feeds = cnn
    first, second = (TorchBackend(device=DEVICE).compile(part) for part in _halves(model))
    middle = first.run_tensors(feeds)
    assert all(isinstance(t, torch.Tensor) and t.device == resolve_device(DEVICE) for t in middle.values())
    result = second.run_tensors({name: middle[name] for name in second.input_names})
    expected = ei.Session(model, backend="numpy").run(feeds)["logits"]
    assert isinstance(result["logits"], torch.Tensor)
    assert_close(result["logits"].cpu().numpy(), expected, rtol=DEEP_RTOL, atol=DEEP_ATOL)


def test_runs_from_several_threads_at_once(cnn):
    model, feeds = cnn
    executable = TorchBackend(device=DEVICE).compile(model.graph, CompileOptions())
    assert executable.thread_safe
    expected = executable.run(feeds)["logits"]
    results, errors = [], []

    def work():
        try:
            for _ in range(5):
                results.append(executable.run(feeds)["logits"])
        except Exception as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors and len(results) == 20
    for result in results:
        np.testing.assert_array_equal(result, expected)


def test_close_releases_and_refuses_later_runs(cnn):
    model, feeds = cnn
    executable = TorchBackend(device=DEVICE).compile(model.graph)
    assert isinstance(executable, TorchExecutable)
    executable.close()
    with pytest.raises(BackendError, match="after close"):
        executable.run(feeds)


def test_a_failing_node_is_named():
    model = ei.convert(parse_model("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[N, 4] x) => (float[3, M] y) <int64[2] shape = {3, -1}> { r = Relu (x)
        y = Reshape (r, shape) }"""))
    session = ei.Session(model, backend="torch", device=DEVICE)
    with pytest.raises(BackendError, match=r"Reshape.*RuntimeError"):
        session.run({"x": np.ones((2, 4), np.float32)})


def test_priority_list_puts_what_torch_declines_on_numpy():
    """``Det`` has no torch lowering (and no numpy kernel: numpy runs it on onnx.reference):
    with ["torch", "numpy"] the plan cuts around it and the results match numpy alone."""
    model = ei.convert(parse_model("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[2, 3, 3] x) => (float[2] y) { r = Relu (x)
        d = Det (r)
        y = Sigmoid (d) }"""))
    feeds = {"x": np.random.default_rng(3).standard_normal((2, 3, 3)).astype(np.float32)}
    session = ei.Session(model, backend=["torch", "numpy"], device=DEVICE)
    assert [p.backend for p in session.plan.parts] == ["torch", "numpy", "torch"]
    assert "Det" in TorchBackend().unsupported(model.graph).popitem()[0]
    assert_close(session.run(feeds)["y"], ei.Session(model, backend="numpy").run(feeds)["y"])


@on_cuda
def test_cuda_graphs_capture_once_per_signature():
    proto = zoo.cnn_residual_depthwise(batch=2)
    model = ei.convert(proto, optimize=2)
    feeds = zoo.example_inputs(proto)
    eager = ei.Session(model, backend="torch", device=DEVICE).run(feeds)["logits"]
    session = ei.Session(model, backend="torch", device=DEVICE, cuda_graphs=True)
    first, second = (session.run(feeds)["logits"] for _ in range(2))
    assert session.stats()["cuda_graph_captures"] == 1  # captured once, replayed after
    np.testing.assert_array_equal(first, second)
    assert_close(first, eager, rtol=DEEP_RTOL, atol=DEEP_ATOL)


def test_fp32_on_cuda_says_once_when_torch_computes_it_in_tf32(monkeypatch, caplog):
    """torch's process-wide TF32 switches are the user's: the backend leaves them as they are,
    and says once that float32 convolutions then run in TF32 (5e-3 of ResNet-50's output scale
    on an H200), and how to turn it off."""
    from edgeinfer.backends.torch import backend as torch_backend

    monkeypatch.delenv("NVIDIA_TF32_OVERRIDE", raising=False)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", True)
    monkeypatch.setattr(torch_backend, "_TF32_WARNED", threading.Event())
    with caplog.at_level(logging.WARNING, logger="edgeinfer.backends.torch"):
        torch_backend._warn_if_tf32()
        torch_backend._warn_if_tf32()
    assert caplog.text.count("computes convolutions in TF32") == 1
    assert "allow_tf32 = False" in caplog.text
    monkeypatch.setenv("NVIDIA_TF32_OVERRIDE", "0")
    assert not torch_backend.tf32_enabled()
    monkeypatch.delenv("NVIDIA_TF32_OVERRIDE")
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    matmul = torch.backends.cuda.matmul.allow_tf32  # a module property monkeypatch cannot restore
    try:
        torch.backends.cuda.matmul.allow_tf32 = False
        assert not torch_backend.tf32_enabled()
        torch.backends.cuda.matmul.allow_tf32 = True
        assert torch_backend.tf32_enabled()
    finally:
        torch.backends.cuda.matmul.allow_tf32 = matmul


def test_link_bandwidth_is_measured_on_an_accelerator_and_absent_on_the_cpu():
    """The stream planner charges a host<->device cut with this probe: nothing to copy on the
    CPU; on CUDA both directions measured from pinned memory, finite and positive."""
    from edgeinfer.backends.torch.backend import link_bytes_per_second

    device = resolve_device(DEVICE)
    links = link_bytes_per_second(device)
    if device.type == "cpu":
        assert links == {}
        return
    assert set(links) == {("cpu", str(device)), (str(device), "cpu")}
    assert all(np.isfinite(rate) and rate > 0 for rate in links.values()), links
    assert TorchBackend(device=DEVICE).link_bytes_per_second() == links  # measured once per process
