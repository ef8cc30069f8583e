"""The converted outputs come in the source's order, not TensorFlow's TFLite converter's: a Keras
model's in the order calling it returns them (list/tuple order, a dict's own order), a
SavedModel's by sorted ``serving_default`` key. Each output is compared by position against
Keras's output at the same position, on the numpy and onnxruntime backends."""

from __future__ import annotations

import logging

import numpy as np
import pytest

import edgeinfer as ei
from devkit.testing import assert_close

keras = pytest.importorskip("keras")
tf = pytest.importorskip("tensorflow")
layers = keras.layers

BACKENDS = ["numpy", "onnxruntime"]
# Output names that sort otherwise than the model returns them (z, a, m), with distinct shapes,
# so a swapped output fails on its shape before its values.
HEADS = (("z_box", 4), ("a_prob", 2), ("m_landmarks", 10))


def _three_heads(inputs):
    x = layers.Dense(12, activation="relu")(layers.Flatten()(layers.Conv2D(4, 3, strides=2)(inputs)))
    return [layers.Dense(units, name=name)(x) for name, units in HEADS]


@pytest.fixture(scope="module")
def functional():
    keras.utils.set_random_seed(3)
    inputs = keras.Input((12, 12, 3), name="image")
    return keras.Model(inputs, _three_heads(inputs), name="three_heads")


class TupleNet(keras.Model):
    """Subclassed, returning a tuple (box, probability, landmarks) as MTCNN's R-Net/O-Net do."""

    def __init__(self):
        super().__init__()
        self.conv = layers.Conv2D(4, 3, strides=2, activation="relu")
        self.flatten = layers.Flatten()
        self.box = layers.Dense(4)
        self.prob = layers.Dense(2, activation="softmax")
        self.landmarks = layers.Dense(10)

    def call(self, image):
        x = self.flatten(self.conv(image))
        return self.box(x), self.prob(x), self.landmarks(x)


def _image(batch: int = 2) -> np.ndarray:
    return np.random.default_rng(batch).standard_normal((batch, 12, 12, 3)).astype(np.float32)


def _expected(model, image: np.ndarray) -> list[np.ndarray]:
    out = model(image, training=False)
    out = list(out.values()) if isinstance(out, dict) else list(out) if isinstance(out, (list, tuple)) else [out]
    return [np.asarray(t) for t in out]


def _assert_in_keras_order(converted: ei.Model, expected: list[np.ndarray], image: np.ndarray, backend: str):
    if backend == "onnxruntime":
        pytest.importorskip("onnxruntime")
    got = list(ei.Session(converted, backend=backend).run({converted.inputs[0].name: image}).values())
    assert [g.shape for g in got] == [e.shape for e in expected]
    for i, (g, e) in enumerate(zip(got, expected, strict=True)):
        assert_close(g, e, rtol=1e-4, atol=1e-5, name=f"output {i}")  # conv/dense sums in another order


@pytest.mark.parametrize("backend", BACKENDS)
def test_functional_outputs_in_keras_order(functional, backend):
    image = _image()
    converted = ei.convert(functional)
    _assert_in_keras_order(converted, _expected(functional, image), image, backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_subclassed_tuple_outputs_in_keras_order(backend):
    keras.utils.set_random_seed(4)
    net = TupleNet()
    image = _image(1)
    expected = _expected(net, image)
    converted = ei.convert(net, input_shapes={"image": (1, 12, 12, 3)})
    assert "subclassed TupleNet" in converted.metadata["source_route"]
    _assert_in_keras_order(converted, expected, image, backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_h5_round_trip_outputs_in_keras_order(functional, tmp_path, backend):
    path = tmp_path / "three_heads.h5"
    functional.save(path)
    image = _image()
    _assert_in_keras_order(ei.convert(path), _expected(keras.models.load_model(path), image), image, backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_keras_archive_outputs_in_keras_order(functional, tmp_path, backend):
    path = tmp_path / "three_heads.keras"
    functional.save(path)
    image = _image()
    _assert_in_keras_order(ei.convert(path), _expected(functional, image), image, backend)


def test_dict_outputs_in_the_dicts_order():
    keras.utils.set_random_seed(5)
    inputs = keras.Input((12, 12, 3), name="image")
    heads = _three_heads(inputs)
    model = keras.Model(inputs, {name: head for (name, _), head in zip(HEADS, heads, strict=True)})
    image = _image()
    _assert_in_keras_order(ei.convert(model), _expected(model, image), image, "numpy")


def test_fixed_batch_outputs_in_keras_order(functional):
    """``batch_size`` lowers a frozen concrete function, whose flatbuffer has no signature: the
    outputs are matched by the function's output tensor names."""
    image = _image(1)
    converted = ei.convert(functional, batch_size=1)
    assert converted.graph.metadata["tensorflow_fixed_batch"] == "1"
    _assert_in_keras_order(converted, _expected(functional, image), image, "numpy")


def test_saved_model_outputs_by_sorted_signature_key(functional, tmp_path):
    path = tmp_path / "three_heads_saved_model"
    # A serving signature with dict outputs keyed otherwise than the Keras heads are ordered.
    archive = keras.export.ExportArchive()
    archive.track(functional)
    archive.add_endpoint("serve", lambda image: dict(zip(("zeta", "alpha", "mid"), functional(image), strict=True)),
                         input_signature=[tf.TensorSpec((None, 12, 12, 3), tf.float32, name="image")])
    archive.write_out(str(path), verbose=False)
    image = _image()
    produced = tf.saved_model.load(str(path)).signatures["serving_default"](image=tf.constant(image))
    converted = ei.convert(path)
    _assert_in_keras_order(converted, [produced[key].numpy() for key in sorted(produced)], image, "numpy")


def test_unmatched_names_keep_the_converters_order(functional, caplog):
    from edgeinfer.converters import tflite
    from edgeinfer.converters.tensorflow import to_tflite
    from edgeinfer.converters.tensorflow.output_order import SourceOutputs, in_source_order

    flatbuffer, _ = to_tflite(functional)
    model = tflite.read_model(flatbuffer)
    graph = tflite.import_model(model)
    assert sorted(model.signatures[0].outputs) == ["output_0", "output_1", "output_2"]
    with caplog.at_level(logging.WARNING, logger="edgeinfer.converters.tensorflow"):
        kept = in_source_order(graph, model, SourceOutputs(("box", "prob", "landmarks")), "three_heads")
    assert [v.name for v in kept.outputs] == [v.name for v in graph.outputs]
    assert "keep the order of TensorFlow's TFLite converter" in caplog.text
    assert "expected outputs ['box', 'prob', 'landmarks']" in caplog.text
