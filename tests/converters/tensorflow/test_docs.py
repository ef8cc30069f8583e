"""docs/tensorflow_ops.md is generated from the registries and must be current, and the
verified-layer list must match the layers the test models use."""

from __future__ import annotations

from pathlib import Path

from edgeinfer.converters.tensorflow import docs

DOC = Path(__file__).parents[3] / "docs" / "tensorflow_ops.md"


def test_doc_is_up_to_date():
    assert DOC.read_text() == docs.render(), (
        "docs/tensorflow_ops.md is stale: run python -m edgeinfer.converters.tensorflow.docs > "
        "docs/tensorflow_ops.md")


def test_verified_layers_are_the_tested_layers(keras_models):
    used = {type(layer).__name__ for model in keras_models.values() for layer in model.layers}
    used.discard("InputLayer")
    assert used == set(docs.VERIFIED_KERAS_LAYERS)
