"""SavedModels that TensorFlow's object loader cannot rebuild (Keras 2 optimizer slots) are
converted through TensorFlow's session-based loader, with a warning that says so."""

from __future__ import annotations

import logging
import sys

import numpy as np
import pytest

import edgeinfer as ei
from devkit.testing import assert_close
from edgeinfer.converters.tensorflow.saved_model import SESSION_ROUTE, unrevivable_object

pytest.importorskip("tensorflow")


def _without_keras2(monkeypatch) -> None:
    """This process as it is where Keras 2 is not installed (the reported setup): TensorFlow's
    loader imports tf_keras to revive an ``"optimizer"`` object, and tf_keras registers that type
    on import, so both the import and a registration left by an earlier import are taken away."""
    from tensorflow.python.saved_model import revived_types

    monkeypatch.setitem(sys.modules, "tf_keras", None)
    monkeypatch.delitem(revived_types._REVIVED_TYPE_REGISTRY, "optimizer", raising=False)


def _run(model: ei.Model, x: np.ndarray) -> np.ndarray:
    (out,) = ei.Session(model).run({model.inputs[0].name: x}).values()
    return out


@pytest.mark.parametrize("batch_size", [None, 3])
def test_keras2_saved_model_with_optimizer_slots(keras2_files, monkeypatch, caplog, batch_size):
    _without_keras2(monkeypatch)
    with caplog.at_level(logging.WARNING, logger="edgeinfer.converters.tensorflow"):
        converted = ei.convert(keras2_files["saved_model"], batch_size=batch_size)
    assert "add_slot" in caplog.text and "session-based" in caplog.text
    assert converted.metadata["source_route"] == SESSION_ROUTE
    assert converted.inputs[0].shape == (("N", 6) if batch_size is None else (3, 6))
    assert_close(_run(converted, keras2_files["input"]), keras2_files["expected"], rtol=1e-4, atol=1e-5)


def test_other_saved_model_errors_are_not_retried(tmp_path):
    folder = tmp_path / "garbage"
    folder.mkdir()
    (folder / "saved_model.pb").write_bytes(b"\x0a\xff\xff not a protobuf")
    with pytest.raises(ei.ModelFormatError, match="garbage: TensorFlow cannot read the SavedModel"):
        ei.convert(folder)


def test_only_unrevived_objects_take_the_session_route():
    assert unrevivable_object(AttributeError("'_UserObject' object has no attribute 'add_slot'"))
    assert not unrevivable_object(AttributeError("'Dense' object has no attribute 'kernel'"))
    assert not unrevivable_object(ValueError("'_UserObject' object has no attribute 'add_slot'"))


def test_verify_runs_a_keras2_saved_model_through_the_session_loader(keras2_files, monkeypatch):
    """``convert --verify``'s TensorFlow oracle reads the SavedModel the way the converter did:
    where the object loader fails on Keras 2's optimizer, through the session-based loader."""
    from edgeinfer.cli import parity

    _without_keras2(monkeypatch)
    converted = ei.convert(keras2_files["saved_model"])
    result = parity.verify(keras2_files["saved_model"], converted,
                           feeds={converted.inputs[0].name: keras2_files["input"]})
    assert result.ok and result.engine == "tensorflow", result
