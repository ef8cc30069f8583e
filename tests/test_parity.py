"""``convert --verify``: source framework vs edgeinfer, first diverging node, reproducer."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from click.testing import CliRunner

import edgeinfer as ei
from edgeinfer.cli import main
from edgeinfer.cli import parity as verification

ROOT = Path(__file__).resolve().parents[1]
LENET = ROOT / "models" / "caffe_lenet_digits"


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.fixture
def onnx_file(tmp_path, mlp_model):
    path = tmp_path / "mlp.onnx"
    onnx.save(mlp_model, path)
    return path


@pytest.fixture
def broken_relu(monkeypatch):
    """The numpy backend's Relu kernel with a bug: negative inputs leak through at a tenth."""
    from edgeinfer.backends.numpy.registry import KERNELS

    def leaky(x):
        return np.where(x > 0, x, 0.1 * x).astype(x.dtype)

    monkeypatch.setitem(KERNELS._entries, ("", "Relu"), [(1, leaky)])


def test_verify_onnx_reports_every_output_and_writes_the_model(tmp_path, onnx_file):
    out = tmp_path / "m.eim"
    result = invoke("convert", onnx_file, "-o", out, "--verify")
    assert result.exit_code == 0, result.output
    assert "output y: max abs error" in result.output and "ok" in result.output
    assert out.is_file()


def test_verify_result_matches_an_independent_comparison(onnx_file):
    model = ei.convert(onnx_file)
    feeds = model.random_feeds(batch=2, seed=3)
    result = verification.verify(onnx_file, model, feeds=feeds)
    reference = ort.InferenceSession(str(onnx_file)).run(None, feeds)[0]
    ours = ei.Session(model).run(feeds)["y"]
    expected_abs = float(np.max(np.abs(ours.astype(np.float64) - reference)))
    assert result.ok and result.engine == "onnxruntime"
    assert result.outputs[0].max_abs == pytest.approx(expected_abs)
    assert result.outputs[0].max_rel == pytest.approx(expected_abs / float(np.max(np.abs(reference))))


def test_mismatch_names_the_first_diverging_node_and_saves_a_reproducer(tmp_path, onnx_file, broken_relu):
    out, repro = tmp_path / "m.eim", tmp_path / "repro"
    result = invoke("convert", onnx_file, "-o", out, "--verify", "--repro-dir", repro)
    assert result.exit_code == 2
    relu = next(n for n in ei.convert(onnx_file).graph.nodes if n.op_type == "Relu")
    assert f"first diverging node: {relu.label}" in result.output
    last = result.output.strip().splitlines()[-1]
    assert last.startswith("error: --verify: output(s) y differ") and "nothing written" in last
    assert not out.exists()
    # the reproducer is the Relu alone, with the inputs it got; onnxruntime on them gives the
    # reference outputs saved beside it, which differ from what edgeinfer gave
    [model_path] = repro.glob("*.onnx")
    proto = onnx.load(model_path)
    assert [n.op_type for n in proto.graph.node] == ["Relu"]
    arrays = np.load(model_path.with_suffix(".npz"))
    feeds = {i.name: arrays[f"input:{i.name}"] for i in proto.graph.input}
    got = ort.InferenceSession(str(model_path)).run(None, feeds)[0]
    name = proto.graph.output[0].name
    np.testing.assert_array_equal(got, arrays[f"reference:{name}"])
    assert not np.allclose(arrays[f"edgeinfer:{name}"], arrays[f"reference:{name}"])


def test_tflite_source_checked_by_litert_and_localized_on_the_exported_graph(tmp_path, onnx_file, monkeypatch):
    pytest.importorskip("ai_edge_litert")
    model = ei.convert(onnx_file, input_shapes={"x": (2, 8)})
    tflite = tmp_path / "m.tflite"
    ei.export(model, tflite)
    converted = ei.convert(tflite)
    assert verification.verify(tflite, converted).ok
    from edgeinfer.backends.numpy.registry import KERNELS

    monkeypatch.setitem(KERNELS._entries, ("", "Relu"), [(1, lambda x: np.abs(x))])
    result = verification.verify(tflite, converted)
    assert result.engine == "LiteRT interpreter" and not result.ok
    assert result.divergence is not None and result.divergence.op == "Relu"
    assert "exported to ONNX" in result.divergence.reference


def test_caffe_checked_by_opencv(tmp_path):
    pytest.importorskip("cv2")
    prototxt, weights = LENET / "lenet_digits.prototxt", LENET / "lenet_digits.caffemodel"
    result = invoke("convert", prototxt, "--weights", weights, "-o", tmp_path / "l.eim", "--verify")
    assert result.exit_code == 0, result.output
    assert "OpenCV DNN vs edgeinfer" in result.output


def test_caffe_oracle_needs_the_weights():
    pytest.importorskip("cv2")
    prototxt = LENET / "lenet_digits.prototxt"
    model = ei.convert(prototxt, weights=LENET / "lenet_digits.caffemodel")
    with pytest.raises(ei.InputError, match="needs its weights"):
        verification.verify(prototxt, model)


def test_pytorch_exported_program_checked_by_torch(tmp_path):
    torch = pytest.importorskip("torch")
    module = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
                                 torch.nn.Flatten(), torch.nn.Linear(4 * 6 * 6, 5)).eval()
    with torch.no_grad():
        module[1].running_mean.uniform_(-1, 1)
        module[1].running_var.uniform_(0.5, 2)
    path = tmp_path / "m.pt2"
    torch.export.save(torch.export.export(module, (torch.randn(1, 3, 8, 8),)), path)
    result = invoke("convert", path, "-o", tmp_path / "m.eim", "--verify")
    assert result.exit_code == 0, result.output
    assert "torch vs edgeinfer" in result.output


def test_repro_dir_without_verify_is_an_error(tmp_path, onnx_file):
    result = invoke("convert", onnx_file, "-o", tmp_path / "m.eim", "--repro-dir", tmp_path)
    assert result.exit_code == 2 and "go with --verify" in result.output


@pytest.mark.parametrize("got, ref, ok", [
    (np.ones((2, 3), np.float32), np.ones((2, 3), np.float32), True),
    (np.ones((2, 3), np.float32), np.ones((3, 2), np.float32), True),  # same elements, another shape
    (np.ones(4, np.float32), np.ones(5, np.float32), False),
    (np.array([np.nan, 1], np.float32), np.array([0, 1], np.float32), False),
    (np.array([1, 2], np.int64), np.array([1, 3], np.int64), False),
    (np.array([1, 2], np.int64), np.array([1, 2], np.int64), True),
])
def test_compare(got, ref, ok):
    assert verification.compare(got, ref, 1e-4)[2] is ok


def test_every_frontend_has_an_oracle():
    from edgeinfer.api import FRONTENDS

    assert set(verification.ORACLES) == set(FRONTENDS)
