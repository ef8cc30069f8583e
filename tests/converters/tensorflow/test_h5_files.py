"""Legacy Keras HDF5 files (``.h5``/``.hdf5``): converted against Keras' own output, and refused
(typed, before Keras deserializes anything) when their config names code or is damaged."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from click.testing import CliRunner

import edgeinfer as ei
from devkit.testing import assert_close
from edgeinfer.api import detect_frontend
from edgeinfer.cli import main

keras = pytest.importorskip("keras")
h5py = pytest.importorskip("h5py")


def _feeds(model: ei.Model, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The converted inputs are named ``serving_default_<keras name>:0``; ``arrays`` by Keras name."""
    return {value.name: next(a for name, a in arrays.items() if f"_{name}" in value.name) for value in model.inputs}


def _run(model: ei.Model, arrays: dict[str, np.ndarray]) -> np.ndarray:
    (out,) = ei.Session(model).run(_feeds(model, arrays)).values()
    return out


@pytest.fixture(scope="module")
def two_input_model():
    keras.utils.set_random_seed(2)
    left, right = keras.Input((8,), name="left"), keras.Input((4, 2), name="right")
    x = keras.layers.Concatenate()([left, keras.layers.Flatten()(right)])
    x = keras.layers.BatchNormalization()(keras.layers.Dense(6, activation="tanh")(x))
    model = keras.Model([left, right], keras.layers.Dense(3)(x))
    model.layers[-2].set_weights([np.linspace(0.5, 1.5, 6, dtype=np.float32), np.full(6, 0.1, np.float32),
                                  np.full(6, -0.2, np.float32), np.linspace(0.6, 1.4, 6, dtype=np.float32)])
    return model


@pytest.fixture(scope="module")
def two_input_h5(two_input_model, tmp_path_factory):
    path = tmp_path_factory.mktemp("h5") / "two_inputs.h5"
    two_input_model.save(path)
    return path


def _inputs(batch: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(batch)
    return {"left": rng.standard_normal((batch, 8)).astype(np.float32),
            "right": rng.standard_normal((batch, 4, 2)).astype(np.float32)}


def test_two_input_h5_with_a_dynamic_batch(two_input_model, two_input_h5):
    assert detect_frontend(two_input_h5) == "tensorflow"
    converted = ei.convert(two_input_h5)
    assert converted.metadata["source_file"] == "two_inputs.h5"
    assert all(value.shape[0] == "N" for value in converted.inputs)
    for batch in (1, 3):
        arrays = _inputs(batch)
        expected = np.asarray(two_input_model([arrays["left"], arrays["right"]], training=False))
        assert_close(_run(converted, arrays), expected, rtol=1e-4, atol=1e-5)


def test_hdf5_suffix_and_content_without_a_suffix(two_input_model, two_input_h5, tmp_path):
    arrays = _inputs(2)
    expected = np.asarray(two_input_model([arrays["left"], arrays["right"]], training=False))
    for name in ("model.hdf5", "model.bin"):  # .bin: recognised by the HDF5 signature
        path = tmp_path / name
        shutil.copyfile(two_input_h5, path)
        assert_close(_run(ei.convert(path), arrays), expected, rtol=1e-4, atol=1e-5)


def test_keras2_written_h5(keras2_files):
    converted = ei.convert(keras2_files["h5"])
    assert_close(_run(converted, {"features": keras2_files["input"]}), keras2_files["expected"],
                 rtol=1e-4, atol=1e-5)


def _with_config(source, target, edit) -> None:
    shutil.copyfile(source, target)
    with h5py.File(target, "r+") as handle:
        config = json.loads(handle.attrs["model_config"])
        edit(config["config"]["layers"][-1])
        handle.attrs["model_config"] = json.dumps(config)


UNSAFE_EDITS = {
    "unregistered class": lambda layer: layer.update(class_name="EvilDense"),
    "module outside keras": lambda layer: layer["config"].update(
        kernel_initializer={"module": "os", "class_name": "system", "config": {}, "registered_name": None}),
    "keras 3 lambda marker": lambda layer: layer["config"].update(
        activation={"class_name": "__lambda__", "config": {"code": ""}}),
}


@pytest.mark.parametrize("case", sorted(UNSAFE_EDITS))
def test_config_naming_code_outside_keras_is_refused(two_input_h5, tmp_path, case):
    path = tmp_path / "edited.h5"
    _with_config(two_input_h5, path, UNSAFE_EDITS[case])
    with pytest.raises(ei.ModelFormatError, match="refused to load") as info:
        ei.convert(path)
    assert str(path) in str(info.value)


def test_registered_custom_layer_is_loaded(tmp_path):
    @keras.saving.register_keras_serializable(package="h5_test")
    class Doubler(keras.layers.Layer):
        def call(self, tensor):
            return tensor * 2.0

    inputs = keras.Input((4,), name="values")
    model = keras.Model(inputs, Doubler()(keras.layers.Dense(3)(inputs)))
    path = tmp_path / "custom.h5"
    model.save(path)
    x = np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)
    assert_close(_run(ei.convert(path), {"values": x}), np.asarray(model(x)), rtol=1e-4, atol=1e-5)


def test_weights_only_file_is_refused(two_input_model, tmp_path):
    path = tmp_path / "model.weights.h5"
    two_input_model.save_weights(path)
    with pytest.raises(ei.ModelFormatError, match="weights-only"):
        ei.convert(path)


def _truncated(source, target):
    data = source.read_bytes()
    target.write_bytes(data[: len(data) // 2])


def _no_weights(source, target):
    shutil.copyfile(source, target)
    with h5py.File(target, "r+") as handle:
        del handle["model_weights"]


BROKEN = {
    "empty": lambda source, target: target.write_bytes(b""),
    "garbage": lambda source, target: target.write_bytes(b"not an hdf5 file at all" * 10),
    "signature then garbage": lambda source, target: target.write_bytes(b"\x89HDF\r\n\x1a\n" + b"\xff" * 600),
    "truncated": _truncated,
    "weights group removed": _no_weights,
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_broken_h5_is_a_model_format_error(two_input_h5, tmp_path, case):
    path = tmp_path / "broken.h5"
    BROKEN[case](two_input_h5, path)
    with pytest.raises(ei.ModelFormatError, match="broken.h5"):
        ei.convert(path)


@pytest.mark.parametrize("case", ["truncated", "lambda"])
def test_cli_reports_a_bad_h5_in_one_line(two_input_h5, tmp_path, case):
    path = tmp_path / f"{case}.h5"
    if case == "truncated":
        _truncated(two_input_h5, path)
    else:
        inputs = keras.Input((4,))
        keras.Model(inputs, keras.layers.Lambda(lambda t: t * 2.0)(inputs)).save(path)
    result = CliRunner().invoke(main, ["convert", str(path), "-o", str(tmp_path / "x.eim")])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in result.output and f"{case}.h5" in lines[0], result.output
    assert not (tmp_path / "x.eim").exists()


def test_cli_converts_an_h5(two_input_model, two_input_h5, tmp_path):
    target = tmp_path / "two_inputs.eim"
    result = CliRunner().invoke(main, ["convert", str(two_input_h5), "-o", str(target), "-q"])
    assert result.exit_code == 0, result.output
    arrays = _inputs(2)
    expected = np.asarray(two_input_model([arrays["left"], arrays["right"]], training=False))
    assert_close(_run(ei.load(target), arrays), expected, rtol=1e-4, atol=1e-5)


def test_verify_feeds_each_keras_input_by_name(two_input_model, two_input_h5):
    """``convert --verify`` runs the file as the converter loads it (safe mode) and feeds the
    Keras inputs by name: the converted model's inputs need not come in Keras's order."""
    from edgeinfer.cli import parity

    converted = ei.convert(two_input_h5)
    feeds = _feeds(converted, _inputs(2))
    result = parity.verify(two_input_h5, converted, feeds=feeds)
    assert result.ok and result.engine == "tensorflow", result
    arrays = _inputs(2)
    expected = np.asarray(two_input_model([arrays["left"], arrays["right"]], training=False))
    assert_close(_run(converted, arrays), expected, rtol=1e-4, atol=1e-5)
