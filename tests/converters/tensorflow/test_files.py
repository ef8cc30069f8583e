"""File inputs: ``.keras`` archives and ``.h5`` files (safe mode), SavedModel directories, and the CLI."""

from __future__ import annotations

import os

import numpy as np
import pytest
from click.testing import CliRunner

import edgeinfer as ei
from devkit.testing import assert_close
from edgeinfer.api import detect_frontend
from edgeinfer.cli import main
from edgeinfer.converters import tensorflow as tf_frontend

keras = pytest.importorskip("keras")


def _run(model: ei.Model, x: np.ndarray) -> np.ndarray:
    (out,) = ei.Session(model).run({model.inputs[0].name: x}).values()
    return out


def test_accepts_is_cheap_and_specific(keras_models, tmp_path):
    saved = tmp_path / "saved"
    saved.mkdir()
    assert not tf_frontend.accepts(saved)  # no saved_model.pb yet
    (saved / "saved_model.pb").write_bytes(b"")
    assert tf_frontend.accepts(saved)
    assert tf_frontend.accepts(tmp_path / "m.keras")
    assert tf_frontend.accepts(keras_models["small_cnn"])
    assert not tf_frontend.accepts(tmp_path / "m.onnx")
    assert not tf_frontend.accepts(object())
    assert detect_frontend(keras_models["small_cnn"]) == "tensorflow"


def test_keras_file(keras_models, tmp_path, make_input):
    model = keras_models["residual_net"]
    path = tmp_path / "residual.keras"
    model.save(path)
    converted = ei.convert(path)
    assert converted.metadata["source_file"] == "residual.keras"
    x = make_input(model)
    assert_close(_run(converted, x), np.asarray(model(x)), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("suffix", [".keras", ".h5"])
def test_lambda_layer_is_refused_before_it_can_run(tmp_path, suffix):
    path = tmp_path / f"lambda{suffix}"
    ran = str(tmp_path / "ran")  # a str: the closure is saved in the file with the bytecode
    inputs = keras.Input((4,))
    keras.Model(inputs, keras.layers.Lambda(lambda t: (open(ran, "w").close(), t * 2.0)[1])(inputs)).save(path)
    os.unlink(ran)  # building the model here called the function once
    with pytest.raises(ei.ModelFormatError, match="Lambda") as info:
        ei.convert(path)
    assert "safe_mode" in str(info.value) and str(path) in str(info.value)
    assert not os.path.exists(ran)


@pytest.mark.parametrize("content", [b"", b"PK\x03\x04 not really a zip", b"\x00" * 64])
def test_broken_keras_file(tmp_path, content):
    path = tmp_path / "broken.keras"
    path.write_bytes(content)
    with pytest.raises(ei.ModelFormatError, match="broken.keras"):
        ei.convert(path)


def test_missing_keras_file(tmp_path):
    with pytest.raises(ei.ModelFormatError, match="no such file"):
        ei.convert(tmp_path / "absent.keras")


@pytest.fixture(scope="module")
def saved_model_dir(keras_models, tmp_path_factory):
    folder = tmp_path_factory.mktemp("saved") / "dense_softmax"
    keras_models["dense_softmax"].export(str(folder), verbose=False)
    return folder


def test_saved_model_directory(saved_model_dir, keras_models, make_input):
    model = keras_models["dense_softmax"]
    converted = ei.convert(saved_model_dir)
    x = make_input(model, batch=2)
    assert_close(_run(converted, x), np.asarray(model(x)), rtol=1e-4, atol=1e-5)


def test_saved_model_with_fixed_batch(saved_model_dir, keras_models, make_input):
    converted = ei.convert(saved_model_dir, batch_size=3)
    assert converted.inputs[0].shape == (3, 10)
    x = make_input(keras_models["dense_softmax"], batch=3)
    assert_close(_run(converted, x), np.asarray(keras_models["dense_softmax"](x)), rtol=1e-4, atol=1e-5)


def test_cli_converts_saved_model_and_tflite(saved_model_dir, tflite_files, keras_models, tmp_path, make_input):
    runner = CliRunner()
    for source, name in ((saved_model_dir, "dense_softmax"), (tflite_files["small_cnn"][0], "small_cnn")):
        target = tmp_path / f"{name}.eim"
        result = runner.invoke(main, ["convert", str(source), "-o", str(target)])
        assert result.exit_code == 0, result.output
        model = ei.load(target)
        x = make_input(keras_models[name])
        assert_close(_run(model, x), np.asarray(keras_models[name](x)), rtol=1e-4, atol=1e-5)


def test_cli_reports_a_bad_file_in_one_line(tmp_path):
    bad = tmp_path / "bad.tflite"
    bad.write_bytes(b"\x10\x00\x00\x00TFL3" + b"\xff" * 8)
    result = CliRunner().invoke(main, ["convert", str(bad), "-o", str(tmp_path / "x.eim")])
    assert result.exit_code != 0
    assert "Traceback" not in result.output and "bad.tflite" in result.output
