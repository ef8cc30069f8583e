"""Small Keras models with random weights, built once per test session.

Each builder returns a functional model; ``MODELS`` maps a name to (builder, input shape
without batch). BatchNormalization gets random statistics so that folding it is exercised.
"""

from __future__ import annotations

import numpy as np
import pytest

keras = pytest.importorskip("keras")
pytest.importorskip("tensorflow")
layers = keras.layers


def small_cnn():
    inputs = keras.Input((16, 16, 3))
    x = layers.Conv2D(4, 3, padding="same", activation="relu")(inputs)
    x = layers.MaxPooling2D(2)(x)
    x = layers.Conv2D(8, 3, strides=2, padding="valid")(x)
    x = layers.AveragePooling2D(2, padding="same")(x)
    x = layers.Flatten()(x)
    return keras.Model(inputs, layers.Dense(5)(x), name="small_cnn")


def separable_net():
    inputs = keras.Input((16, 16, 3))
    x = layers.Conv2D(8, 3, strides=2, padding="same", use_bias=False)(inputs)
    x = layers.BatchNormalization()(x)
    x = layers.ReLU(6.0)(x)
    for filters in (16, 16):
        x = layers.DepthwiseConv2D(3, padding="same", use_bias=False)(x)
        x = layers.BatchNormalization()(x)
        x = layers.ReLU(6.0)(x)
        x = layers.Conv2D(filters, 1, use_bias=False)(x)
        x = layers.BatchNormalization()(x)
        x = layers.ReLU(6.0)(x)
    return keras.Model(inputs, x, name="separable_net")


def residual_net():
    inputs = keras.Input((16, 16, 4))
    y = layers.Conv2D(4, 3, padding="same", activation="relu")(inputs)
    y = layers.Conv2D(4, 3, padding="same")(y)
    x = layers.Activation("relu")(layers.Add()([inputs, y]))
    x = layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, layers.Dense(3)(x), name="residual_net")


def decoder():
    inputs = keras.Input((8, 8, 4))
    x = layers.UpSampling2D()(inputs)
    x = layers.Conv2D(4, 3, padding="same", activation="relu")(x)
    x = layers.Conv2DTranspose(3, 3, strides=2, padding="same")(x)
    x = layers.UpSampling2D(interpolation="bilinear")(x)
    return keras.Model(inputs, x, name="decoder")


def dense_softmax():
    inputs = keras.Input((10,))
    x = layers.Dense(16, activation="relu")(inputs)
    x = layers.Dropout(0.5)(x)
    x = layers.Dense(4)(x)
    return keras.Model(inputs, layers.Softmax()(x), name="dense_softmax")


def lstm():
    inputs = keras.Input((5, 3))
    return keras.Model(inputs, layers.LSTM(6)(inputs), name="lstm")


def encoder_block():
    inputs = keras.Input((6, 8))
    attention = layers.MultiHeadAttention(num_heads=2, key_dim=4)(inputs, inputs)
    x = layers.LayerNormalization()(layers.Add()([inputs, attention]))
    ff = layers.Dense(16, activation="relu")(x)
    ff = layers.Dense(8)(ff)
    return keras.Model(inputs, layers.LayerNormalization()(layers.Add()([x, ff])), name="encoder_block")


def assorted():
    inputs = keras.Input((12, 12, 3))
    x = layers.ZeroPadding2D(((1, 0), (0, 1)))(inputs)
    x = layers.SeparableConv2D(6, 3, activation="swish")(x)
    a = layers.LeakyReLU(0.2)(layers.Conv2D(4, 1)(x))
    b = layers.MaxPooling2D(3, strides=1, padding="same")(x)
    x = layers.Concatenate()([a, b])
    x = layers.Multiply()([x, layers.Activation("sigmoid")(x)])
    x = layers.GlobalMaxPooling2D()(x)
    x = layers.Reshape((5, 2))(x)
    return keras.Model(inputs, layers.Dense(3, activation="tanh")(x), name="assorted")


def gru():
    inputs = keras.Input((4, 3))
    x = layers.GRU(5, return_sequences=True)(inputs)
    return keras.Model(inputs, layers.SimpleRNN(4)(x), name="gru")


MODELS = {
    "assorted": assorted,
    "gru": gru,
    "small_cnn": small_cnn,
    "separable_net": separable_net,
    "residual_net": residual_net,
    "decoder": decoder,
    "dense_softmax": dense_softmax,
    "lstm": lstm,
    "encoder_block": encoder_block,
}


def _randomize_batch_norm(model, rng: np.random.Generator) -> None:
    for layer in model.layers:
        if isinstance(layer, layers.BatchNormalization):
            gamma, beta, mean, var = layer.get_weights()
            layer.set_weights([rng.uniform(0.5, 1.5, gamma.shape).astype(np.float32),
                               rng.normal(0, 0.1, beta.shape).astype(np.float32),
                               rng.normal(0, 0.1, mean.shape).astype(np.float32),
                               rng.uniform(0.5, 1.5, var.shape).astype(np.float32)])


@pytest.fixture(scope="session")
def keras_models():
    """name -> built keras.Model (random weights, seeded)."""
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    built = {}
    for name, builder in MODELS.items():
        model = builder()
        _randomize_batch_norm(model, rng)
        built[name] = model
    return built


def sample_input(model, batch: int = 1, seed: int = 1) -> np.ndarray:
    shape = (batch,) + tuple(model.inputs[0].shape[1:])
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@pytest.fixture(scope="session")
def make_input():
    """``make_input(model, batch=1, seed=1)``: a seeded float32 sample for the model's input."""
    return sample_input


def pytest_generate_tests(metafunc):
    """Tests taking ``model_name`` run once per model of ``MODELS``."""
    if "model_name" in metafunc.fixturenames:
        metafunc.parametrize("model_name", sorted(MODELS))


@pytest.fixture(scope="session")
def tflite_files(keras_models, tmp_path_factory):
    """name -> (float .tflite path, full-INT8 .tflite path), converted once. The INT8 LSTM and
    GRU are unrolled by ``to_tflite`` (their float files keep the WHILE loop)."""
    from edgeinfer.converters.tensorflow import to_tflite

    folder = tmp_path_factory.mktemp("tflite")
    files = {}
    for name, model in keras_models.items():
        fp32, _ = to_tflite(model)
        calibration = [sample_input(model, seed=s) for s in range(8)]
        int8 = to_tflite(model, representative_data=calibration)[0]
        paths = []
        for suffix, data in (("fp32", fp32), ("int8", int8)):
            path = folder / f"{name}_{suffix}.tflite"
            path.write_bytes(data)
            paths.append(path)
        files[name] = tuple(paths)
    return files


KERAS2_SCRIPT = """
import sys
from pathlib import Path

import numpy as np
import tf_keras

folder = Path(sys.argv[1])
tf_keras.utils.set_random_seed(0)
inputs = tf_keras.Input((6,), name="features")
hidden = tf_keras.layers.BatchNormalization()(tf_keras.layers.Dense(8, activation="relu")(inputs))
model = tf_keras.Model(inputs, tf_keras.layers.Dense(3)(hidden))
# The legacy Adam (OptimizerV2, Keras 2's default before TF 2.11) saves its slot variables.
model.compile(optimizer=tf_keras.optimizers.legacy.Adam(), loss="mse")
rng = np.random.default_rng(0)
model.fit(rng.random((4, 6), dtype=np.float32), rng.random((4, 3), dtype=np.float32), epochs=1, verbose=0)
model.save(folder / "saved_model", save_format="tf")
model.save(folder / "keras2.h5")
x = rng.standard_normal((3, 6)).astype(np.float32)
np.save(folder / "input.npy", x)
np.save(folder / "expected.npy", model(x, training=False).numpy())
"""


@pytest.fixture(scope="session")
def keras2_files(tmp_path_factory):
    """A SavedModel and an ``.h5`` file written by Keras 2 (``tf_keras``) after one Adam step,
    with an input and Keras 2's output for it: {"saved_model", "h5", "input", "expected"}.

    Written in a child process so that importing tf_keras (which registers Keras 2's
    optimizer type with TensorFlow's SavedModel loader) leaves this test process as it was."""
    import importlib.util
    import os
    import subprocess
    import sys

    if importlib.util.find_spec("tf_keras") is None:
        pytest.skip("tf_keras (Keras 2) is not installed: no Keras-2-written files to test with")
    folder = tmp_path_factory.mktemp("keras2")
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    done = subprocess.run([sys.executable, "-c", KERAS2_SCRIPT, str(folder)], capture_output=True, text=True,
                          env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return {"saved_model": folder / "saved_model", "h5": folder / "keras2.h5",
            "input": np.load(folder / "input.npy"), "expected": np.load(folder / "expected.npy")}
