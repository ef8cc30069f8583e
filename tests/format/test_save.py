"""Saving: atomic (a failure never leaves a partial file nor harms an existing one), typed
errors for what the format cannot hold, and nothing written but the given path."""

from __future__ import annotations

import os

import numpy as np
import pytest

import edgeinfer as ei
from edgeinfer.errors import EdgeInferError, ModelFormatError
from edgeinfer.format import eim
from edgeinfer.ir import Graph, Node, Value, dtypes


class Crash(RuntimeError):
    pass


def test_failure_while_writing_tensors_keeps_the_old_file(saved, small_model, monkeypatch, rng,
                                                          identity_graph):
    before = saved.read_bytes()
    calls = []

    def write_then_crash(handle, array):
        calls.append(array.shape)
        handle.write(b"\xab" * 100)  # a partial tensor reaches the temporary file
        raise Crash("disk pulled out")

    monkeypatch.setattr(eim, "_write_tensor", write_then_crash)
    bigger = ei.Model(identity_graph({"w": rng.standard_normal((50, 50)).astype(np.float32)}))
    with pytest.raises(Crash):
        bigger.save(saved)
    assert calls  # the failure happened in the tensor-writing step
    assert saved.read_bytes() == before
    assert sorted(os.listdir(saved.parent)) == [saved.name]  # no temporary file left behind
    monkeypatch.undo()
    assert ei.load(saved).graph.content_hash() == small_model.graph.content_hash()


def test_os_error_while_writing_is_a_typed_error(saved, monkeypatch):
    before = saved.read_bytes()

    def disk_full(handle, array):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(eim, "_write_tensor", disk_full)
    with pytest.raises(ModelFormatError, match="No space left on device"):
        ei.load(saved).save(saved)
    assert saved.read_bytes() == before
    assert sorted(os.listdir(saved.parent)) == [saved.name]


def test_failure_without_an_existing_file_leaves_nothing(tmp_path, small_model, monkeypatch):
    monkeypatch.setattr(eim, "_write_tensor", lambda handle, array: (_ for _ in ()).throw(Crash()))
    with pytest.raises(Crash):
        small_model.save(tmp_path / "new.eim")
    assert os.listdir(tmp_path) == []


def test_missing_folder(tmp_path, small_model):
    with pytest.raises(EdgeInferError, match="does not exist"):
        small_model.save(tmp_path / "no" / "such" / "folder" / "m.eim")
    assert os.listdir(tmp_path) == []


def test_path_is_a_directory(tmp_path, small_model):
    (tmp_path / "dir.eim").mkdir()
    with pytest.raises(ModelFormatError, match="cannot write"):
        small_model.save(tmp_path / "dir.eim")
    assert os.listdir(tmp_path) == ["dir.eim"]


def test_saved_file_gets_ordinary_permissions(tmp_path, small_model):
    umask = os.umask(0o022)
    try:
        small_model.save(tmp_path / "m.eim")
        assert (tmp_path / "m.eim").stat().st_mode & 0o777 == 0o644
        (tmp_path / "m.eim").chmod(0o600)
        small_model.save(tmp_path / "m.eim")  # replacing keeps the existing file's mode
        assert (tmp_path / "m.eim").stat().st_mode & 0o777 == 0o600
    finally:
        os.umask(umask)


def graph_with(initializer: np.ndarray | None = None, **attrs) -> ei.Model:
    inits = {} if initializer is None else {"c": initializer}
    inputs = [] if initializer is not None else [Value("c", "float32", (1,))]
    node = Node("Custom", ["c"], ["y"], attrs, domain="test")
    return ei.Model(Graph([node], inputs, [Value("y", "float32", None)], inits, opset={"": 17, "test": 1}))


@pytest.mark.parametrize("model, match", [
    (lambda: graph_with(np.zeros(2, np.complex64)), "dtype complex64"),
    (lambda: graph_with(np.array([1, None], dtype=object)), "str or bytes elements"),
    (lambda: graph_with(np.zeros(2, dtypes.numpy_dtype("float8e4m3fn"))), "dtype float8e4m3fn"),
    (lambda: graph_with(bad={1, 2}), "attribute 'bad'"),
    (lambda: graph_with(bad=None), "attribute 'bad'"),
    (lambda: graph_with(bad=np.complex64(1)), "numeric numpy scalar"),
    (lambda: graph_with(bad=(np.zeros(1), 2)), "mixing tensors"),
    (lambda: graph_with(bad=((Graph([], [], []),),)), "nested list"),
])
def test_unsavable_content_is_refused_and_nothing_is_written(tmp_path, model, match):
    model = model()
    with pytest.raises(ModelFormatError, match=match) as info:
        model.save(tmp_path / "m.eim")
    assert str(tmp_path / "m.eim") in str(info.value)
    assert os.listdir(tmp_path) == []


def test_metadata_must_be_strings(tmp_path, small_model):
    small_model.metadata["version"] = 3
    with pytest.raises(ModelFormatError, match="metadata 'version'"):
        small_model.save(tmp_path / "m.eim")


def test_not_a_model(tmp_path):
    with pytest.raises(ModelFormatError, match="expected an edgeinfer Model"):
        eim.save_model("model", tmp_path / "m.eim")
