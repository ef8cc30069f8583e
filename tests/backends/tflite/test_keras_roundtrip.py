"""The converter tests' Keras zoo (tests/converters/tensorflow) as TensorFlow-written .tflite
files (fp32 and full INT8): imported into the IR, exported again by edgeinfer, and run by
the interpreter. Float files match the numpy backend (rtol 1e-4); INT8 files match the
original file on TFLite's builtin kernels and the numpy backend within one step."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

import edgeinfer as ei
from devkit.testing import assert_close
from edgeinfer.format.tflite import export_tflite

from .conftest import opcodes, run_flatbuffer

_spec = importlib.util.spec_from_file_location(
    "keras_zoo", Path(__file__).parents[2] / "converters" / "tensorflow" / "conftest.py")
keras_zoo = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(keras_zoo)  # skips this module when TensorFlow/Keras are missing
keras_models, tflite_files, make_input = keras_zoo.keras_models, keras_zoo.tflite_files, keras_zoo.make_input
# The float LSTM/GRU keep TFLite's WHILE loop, imported as an ONNX Loop: no export rule.
FLOAT_MODELS = sorted(set(keras_zoo.MODELS) - {"lstm", "gru"})
# UNSUPPORTED: type inference leaves values of the unrolled INT8 SimpleRNN (inside "gru") without
# shapes, and TFLite tensors need every rank.
INT8_MODELS = sorted(set(keras_zoo.MODELS) - {"gru"})


def _static(path: Path, x: np.ndarray) -> ei.Model:
    """The file imported with its batch fixed (shape computations fold; the exporter writes
    no SHAPE arithmetic)."""
    from edgeinfer.converters.tflite import convert

    name = convert(path).input_names[0]
    return ei.convert(path, input_shapes={name: x.shape})


def _quantize_input(path: Path, x: np.ndarray) -> np.ndarray:
    from .conftest import interpreter

    scale, zero = interpreter(path.read_bytes()).get_input_details()[0]["quantization"]
    return np.clip(np.round(x / scale) + zero, -128, 127).astype(np.int8)


@pytest.mark.parametrize("name", FLOAT_MODELS)
def test_fp32_roundtrip(name, tflite_files, keras_models, make_input):
    fp32, _ = tflite_files[name]
    x = make_input(keras_models[name])
    model = _static(fp32, x)
    (expected,) = ei.Session(model).run({model.graph.input_names[0]: x}).values()
    data = export_tflite(model.graph)
    (got,) = run_flatbuffer(data, {"x": x})
    assert_close(got, expected, rtol=1e-4, atol=1e-5)
    if "CONV_2D" in opcodes(data):  # NHWC in, NHWC throughout: no layout changes at all
        assert "TRANSPOSE" not in opcodes(data)


@pytest.mark.parametrize("name", INT8_MODELS)
def test_int8_roundtrip(name, tflite_files, keras_models, make_input):
    _, int8 = tflite_files[name]
    x = _quantize_input(int8, make_input(keras_models[name]))
    model = _static(int8, x)
    data = export_tflite(model.graph)
    (got,) = run_flatbuffer(data, {"x": x})
    (original,) = run_flatbuffer(int8.read_bytes(), {"x": x})
    (numpy_result,) = ei.Session(model).run({model.graph.input_names[0]: x}).values()
    assert got.dtype == np.int8
    assert_close(got, original, int_steps=1)
    assert_close(got, numpy_result, int_steps=1)
