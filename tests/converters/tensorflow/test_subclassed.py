"""Subclassed Keras models (no functional inputs) against Keras' own ``model(x)``: traced from
``input_shapes``, an example input, or the shape they were built with."""

from __future__ import annotations

import numpy as np
import pytest

import edgeinfer as ei
from devkit.testing import assert_close

keras = pytest.importorskip("keras")
pytest.importorskip("tensorflow")
layers = keras.layers


class PNet(keras.Model):
    """Fully convolutional, MTCNN's P-Net in miniature: any image size."""

    def __init__(self):
        super().__init__()
        self.conv = layers.Conv2D(6, 3)
        self.prelu = layers.PReLU(shared_axes=[1, 2], alpha_initializer=keras.initializers.Constant(0.25))
        self.pool = layers.MaxPooling2D(2)
        self.score = layers.Conv2D(2, 1, activation="softmax")
        self.box = layers.Conv2D(4, 1)

    def call(self, image, training=False):
        x = self.pool(self.prelu(self.conv(image)))
        return self.score(x) + keras.ops.mean(self.box(x), axis=-1, keepdims=True)


class Scaled(keras.Model):
    """call() takes two tensors: TensorFlow's converter records only the first one's shape."""

    def __init__(self):
        super().__init__()
        self.dense = layers.Dense(5, activation="relu")
        self.out = layers.Dense(3)

    def call(self, features, scale):
        return self.out(self.dense(features)) * scale


class Embedder(keras.Model):
    def __init__(self):
        super().__init__()
        self.embed = layers.Embedding(20, 4)
        self.dense = layers.Dense(2)

    def call(self, tokens):
        return self.dense(keras.ops.mean(self.embed(tokens), axis=1))


def _run(model: ei.Model, feeds_by_suffix: dict[str, np.ndarray]) -> np.ndarray:
    feeds = {value.name: next(a for name, a in feeds_by_suffix.items() if f"_{name}" in value.name)
             for value in model.inputs}
    (out,) = ei.Session(model).run(feeds).values()
    return out


def _seeded(model):
    keras.utils.set_random_seed(0)
    return model


def test_built_only_with_dynamic_image_size():
    net = _seeded(PNet())
    net.build((None, None, None, 3))
    converted = ei.convert(net)
    assert "subclassed PNet" in converted.metadata["source_route"]
    assert converted.inputs[0].shape[0] == "N" and converted.inputs[0].shape[3] == 3
    rng = np.random.default_rng(0)
    for shape in ((1, 12, 12, 3), (2, 20, 24, 3)):
        image = rng.standard_normal(shape).astype(np.float32)
        assert_close(_run(converted, {"image": image}), np.asarray(net(image)), rtol=1e-4, atol=1e-5)


def test_two_tensor_call_from_input_shapes():
    net = _seeded(Scaled())
    rng = np.random.default_rng(1)
    features, scale = rng.standard_normal((2, 6)).astype(np.float32), rng.random((2, 1)).astype(np.float32)
    net(features, scale)  # a real call records only the first tensor's shape
    converted = ei.convert(net, input_shapes={"scale": (1, 1), "features": (1, 6)}, dynamic_batch=True)
    assert sorted(v.shape for v in converted.inputs) == [("N", 1), ("N", 6)]
    expected = np.asarray(net(features, scale))
    assert_close(_run(converted, {"features": features, "scale": scale}), expected, rtol=1e-4, atol=1e-5)


def test_static_shapes_from_input_shapes():
    net = _seeded(Scaled())
    converted = ei.convert(net, input_shapes={"features": (3, 6), "scale": (3, 1)})
    assert sorted(v.shape for v in converted.inputs) == [(3, 1), (3, 6)]
    rng = np.random.default_rng(2)
    features, scale = rng.standard_normal((3, 6)).astype(np.float32), rng.random((3, 1)).astype(np.float32)
    assert_close(_run(converted, {"features": features, "scale": scale}), np.asarray(net(features, scale)),
                 rtol=1e-4, atol=1e-5)


def test_integer_example_input():
    net = _seeded(Embedder())
    tokens = np.random.default_rng(3).integers(0, 20, (2, 7)).astype(np.int32)
    converted = ei.convert(net, example_inputs=tokens)
    assert converted.inputs[0].shape == (2, 7) and converted.inputs[0].dtype == "int32"
    assert_close(_run(converted, {"tokens": tokens}), np.asarray(net(tokens)), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("model_class, named", [(PNet, "image"), (Scaled, "features, scale")])
def test_unknown_shapes_are_a_typed_error(model_class, named):
    net = model_class()
    if model_class is Scaled:
        net(np.zeros((1, 6), np.float32), np.ones((1, 1), np.float32))  # only 'features' gets recorded
    with pytest.raises(ei.ConversionError, match="input_shapes") as info:
        ei.convert(net)
    assert named in str(info.value) and model_class.__name__ in str(info.value)


def test_bad_input_shape_is_an_input_error():
    with pytest.raises(ei.InputError, match="features"):
        ei.convert(Scaled(), input_shapes={"features": (1, 0), "scale": (1, 1)})
