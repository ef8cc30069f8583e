"""End to end: ONNX -> ``ei.convert`` -> ``.eim`` -> ``ei.load`` -> Session on every backend, and
IR -> ONNX export, each compared with onnxruntime on the original ONNX model."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import edgeinfer as ei
from devkit import zoo
from devkit.testing import assert_close
from edgeinfer.converters.onnx import export

RTOL, ATOL = 1e-4, 1e-5  # different engines, summation orders and folded BatchNormalization
MODELS = {
    "cnn_residual_depthwise": lambda: zoo.cnn_residual_depthwise(seed=21),
    "transformer_encoder_block": lambda: zoo.transformer_encoder_block(seed=21),
    "mlp_symbolic_batch": lambda: zoo.mlp_symbolic_batch(seed=21),
}
BACKENDS = ("numpy", "onnxruntime")


def onnxruntime_outputs(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds), strict=True))


@pytest.fixture(scope="module", params=sorted(MODELS))
def case(request):
    """(name, original ONNX model, converted Model, feeds, onnxruntime's outputs on the original)."""
    proto = MODELS[request.param]()
    feeds = zoo.example_inputs(proto, seed=5, batch=3)
    return request.param, proto, ei.convert(proto), feeds, onnxruntime_outputs(proto, feeds)


def assert_outputs_close(got: dict[str, np.ndarray], reference: dict[str, np.ndarray], where: str) -> None:
    assert list(got) == list(reference), where
    for name, ref in reference.items():
        assert_close(got[name], ref, rtol=RTOL, atol=ATOL, name=f"{where}: {name}")


@pytest.mark.parametrize("backend", BACKENDS)
def test_eim_roundtrip_runs_like_the_original(case, backend, tmp_path):
    name, _, model, feeds, reference = case
    path = tmp_path / f"{name}.eim"
    model.save(path)
    loaded = ei.load(path)
    assert loaded.graph.content_hash() == model.graph.content_hash()
    assert [str(t) for t in loaded.inputs] == [str(t) for t in model.inputs]
    got = ei.Session(loaded, backend=backend, threads=1).run(feeds)
    assert_outputs_close(got, reference, f"{name} via .eim on {backend}")


def test_session_opens_an_eim_path_directly(case, tmp_path):
    name, _, model, feeds, reference = case
    path = tmp_path / f"{name}.eim"
    model.save(path)
    assert_outputs_close(ei.Session(str(path), backend="onnxruntime").run(feeds), reference, f"{name} by path")


def test_onnx_export_is_valid_and_runs_like_the_original(case, tmp_path):
    name, _, model, feeds, reference = case
    path = tmp_path / f"{name}.onnx"
    exported = export(model.graph, path)
    onnx.checker.check_model(exported, full_check=True)
    assert_outputs_close(onnxruntime_outputs(exported, feeds), reference, f"{name} exported")
    reread = onnx.load(str(path))
    assert_outputs_close(onnxruntime_outputs(reread, feeds), reference, f"{name} exported file")
    again = ei.convert(path)  # ONNX -> IR -> ONNX -> IR
    assert_outputs_close(ei.Session(again, backend="numpy").run(feeds), reference, f"{name} re-imported")


def test_symbolic_batch_survives_the_roundtrip(tmp_path):
    proto = zoo.mlp_symbolic_batch(seed=3)
    path = tmp_path / "mlp.eim"
    ei.convert(proto).save(path)
    loaded = ei.load(path)
    assert loaded.inputs[0].shape == ("N", 32)
    exported = export(loaded.graph)
    assert exported.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "N"
    for batch in (1, 4):
        feeds = zoo.example_inputs(proto, seed=batch, batch=batch)
        reference = onnxruntime_outputs(proto, feeds)
        for backend in BACKENDS:
            assert_outputs_close(ei.Session(loaded, backend=backend).run(feeds), reference,
                                 f"mlp batch {batch} on {backend}")
