"""Keras models (in memory) against ``model(x)``, and their ``.eim`` round trip."""

from __future__ import annotations

import numpy as np
import pytest

import edgeinfer as ei
from devkit.testing import assert_close

# LSTM/GRU: TF's converter turns the recurrence into a WHILE loop whose float32 accumulation order
# differs from Keras' kernel; errors stay around 1e-6 absolute on outputs of magnitude ~0.1.
ATOL = {"lstm": 1e-5, "gru": 1e-5}


def _run(model: ei.Model, x: np.ndarray) -> np.ndarray:
    session = ei.Session(model)
    (out,) = session.run({model.inputs[0].name: x}).values()
    return out


@pytest.fixture(scope="module")
def converted(keras_models):
    return {name: ei.convert(model) for name, model in keras_models.items()}


def test_matches_keras(model_name, keras_models, converted, make_input):
    name = model_name
    model = keras_models[name]
    x = make_input(model)
    expected = np.asarray(model(x, training=False))
    assert_close(_run(converted[name], x), expected, rtol=1e-4, atol=ATOL.get(name, 1e-5))


def test_eim_round_trip(model_name, keras_models, converted, tmp_path, make_input):
    name = model_name
    model = converted[name]
    path = tmp_path / f"{name}.eim"
    model.save(path)
    loaded = ei.load(path)
    x = make_input(keras_models[name], seed=3)
    assert [t.name for t in loaded.inputs] == [t.name for t in model.inputs]
    assert_close(_run(loaded, x), _run(model, x), rtol=0, atol=0)


def test_dynamic_batch_runs_several_samples(keras_models, converted, make_input):
    model = keras_models["small_cnn"]
    assert converted["small_cnn"].inputs[0].shape[0] == "N"
    x = make_input(model, batch=3)
    assert_close(_run(converted["small_cnn"], x), np.asarray(model(x)), rtol=1e-4, atol=1e-5)


def test_lstm_falls_back_to_a_fixed_batch(converted):
    # Keras 3's LSTM lowers to a TensorList loop that TF's converter handles only with a
    # static batch: the front end retries with batch 1 and says so in the metadata.
    model = converted["lstm"]
    assert model.graph.metadata["tensorflow_fixed_batch"] == "1"
    assert model.inputs[0].shape == (1, 5, 3)
    assert "Loop" in model.graph.op_histogram()


def test_explicit_batch_size(keras_models, make_input):
    model = keras_models["dense_softmax"]
    converted = ei.convert(model, batch_size=4)
    assert converted.inputs[0].shape == (4, 10)
    x = make_input(model, batch=4)
    assert_close(_run(converted, x), np.asarray(model(x)), rtol=1e-4, atol=1e-5)


def test_no_transposes_left_between_layers(converted):
    # Only the NHWC input transpose (and one before an NHWC graph output) may remain.
    for name in ("small_cnn", "separable_net", "decoder"):
        assert converted[name].graph.op_histogram().get("Transpose", 0) <= 2, name


def test_int8_from_keras_with_calibration_data(keras_models, make_input):
    litert = pytest.importorskip("ai_edge_litert.interpreter")
    from edgeinfer.converters.tensorflow import to_tflite

    model = keras_models["residual_net"]
    calibration = [make_input(model, seed=s) for s in range(8)]
    converted = ei.convert(model, representative_data=calibration)
    assert converted.inputs[0].dtype == "int8" and converted.outputs[0].dtype == "int8"
    assert converted.graph.op_histogram()["DequantizeLinear"] > 0
    # Oracle: the TFLite interpreter on the same calibrated flatbuffer (calibration is
    # deterministic for the same data).
    interpreter = litert.Interpreter(model_content=to_tflite(model, representative_data=calibration)[0])
    interpreter.allocate_tensors()
    detail = interpreter.get_input_details()[0]
    scale, zero = detail["quantization"]
    x = np.clip(np.round(make_input(model) / scale) + zero, -128, 127).astype(np.int8)
    interpreter.set_tensor(detail["index"], x)
    interpreter.invoke()
    expected = interpreter.get_tensor(interpreter.get_output_details()[0]["index"])
    assert_close(_run(converted, x), expected, int_steps=1)
