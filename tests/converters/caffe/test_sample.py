"""The shipped sample: a LeNet trained on scikit-learn's digits, stored as a real Caffe model."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

import edgeinfer as ei
from edgeinfer.runtime.session import Session

SAMPLE = Path(__file__).resolve().parents[3] / "models" / "caffe_lenet_digits"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"caffe_lenet_digits_{name}", SAMPLE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_sample_files_are_small():
    sizes = {p.name: p.stat().st_size for p in SAMPLE.iterdir() if p.is_file()}
    assert {"lenet_digits.prototxt", "lenet_digits.caffemodel", "train.py", "evaluate.py", "README.md"} <= set(sizes)
    assert sum(sizes.values()) < 300 * 1024


def test_sample_classifies_held_out_digits_like_opencv():
    import cv2

    train = _load("train")
    _, images, _, labels = train.split()
    model = ei.convert(train.PROTOTXT, weights=train.CAFFEMODEL, input_shapes={"data": images.shape})
    probabilities = Session(model).run({"data": images})["prob"]
    accuracy = float(np.mean(probabilities.argmax(1) == labels))
    net = cv2.dnn.readNetFromCaffe(str(train.PROTOTXT), str(train.CAFFEMODEL))
    net.setInput(images)
    reference = net.forward("prob")
    assert accuracy >= 0.97
    assert np.array_equal(probabilities.argmax(1), reference.argmax(1))
    assert np.abs(probabilities - reference).max() < 1e-4


def test_evaluate_script_reports_accuracy_and_latency():
    results = _load("evaluate").evaluate(repeats=3)
    assert results["accuracy"] >= 0.97 and results["accuracy"] == results["opencv_accuracy"]
    assert results["latency_ms"] > 0


def test_cli_converts_the_sample_and_runs_it(tmp_path):
    """`edgeinfer convert deploy.prototxt --weights net.caffemodel -o net.eim`, then `run`."""
    from click.testing import CliRunner

    from devkit.testing import assert_close
    from edgeinfer.cli import main

    train = _load("train")
    _, images, _, _ = train.split()
    out = tmp_path / "lenet.eim"
    runner = CliRunner()
    result = runner.invoke(main, ["convert", str(train.PROTOTXT), "--weights", str(train.CAFFEMODEL),
                                  "-o", str(out), "--dynamic-batch"])
    assert result.exit_code == 0, result.output
    loaded = ei.load(out)
    expected = Session(ei.convert(train.PROTOTXT, weights=train.CAFFEMODEL,
                                  input_shapes={"data": images[:5].shape})).run({"data": images[:5]})["prob"]
    assert_close(Session(loaded).run({"data": images[:5]})["prob"], expected)
    np.save(tmp_path / "x.npy", images[:1])
    result = runner.invoke(main, ["run", str(out), "--input", f"data={tmp_path / 'x.npy'}", "--repeat", "1"])
    assert result.exit_code == 0 and "output prob: float32[1, 10]" in result.output, result.output
    result = runner.invoke(main, ["convert", str(train.PROTOTXT), "--weights", str(tmp_path / "none.caffemodel"),
                                  "-o", str(tmp_path / "bad.eim")])
    assert result.exit_code == 2 and "none.caffemodel" in result.output
