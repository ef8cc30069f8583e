"""The real-model corpus (issue 19): every model converts, runs on every installed backend and
with ``backend="auto"``, survives a ``.eim`` round trip and export, and matches its own runtime.

Each model is converted once per process; the checks are separate tests so that a failure
names the model and the place. A place may refuse a model only with a typed error that the
model's entry expects (``RealModel.refuses``)."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

import edgeinfer as ei
from edgeinfer.backend import installed_backends

from .checks import RealModel, compare, export_path, native_outputs, run_litert, run_onnxruntime, run_session
from .models_keras import MODELS as KERAS_MODELS
from .models_onnx import MODELS as ONNX_MODELS
from .models_tflite import MODELS as TFLITE_MODELS
from .models_torch import MODELS as TORCH_MODELS

MODELS: list[RealModel] = [*ONNX_MODELS, *TFLITE_MODELS, *TORCH_MODELS, *KERAS_MODELS]
BY_ID = {m.id: m for m in MODELS}
assert len(BY_ID) == len(MODELS), "duplicate corpus ids"


@dataclass
class Prepared:
    source: Any
    feeds: list[np.ndarray]
    reference: list[np.ndarray]
    model: ei.Model
    convert_seconds: float


_PREPARED: dict[str, Prepared] = {}


def prepared(entry: RealModel) -> Prepared:
    if entry.id not in _PREPARED:
        source = entry.source()
        feeds = [np.asarray(f) for f in entry.feeds()]
        reference = native_outputs(entry, source, feeds)
        kwargs = entry.convert_kwargs(feeds) if callable(entry.convert_kwargs) else entry.convert_kwargs
        start = time.perf_counter()
        model = ei.convert(source, **kwargs)
        _PREPARED[entry.id] = Prepared(source, feeds, reference, model, time.perf_counter() - start)
    return _PREPARED[entry.id]


def expect_refusal(entry: RealModel, place: str):
    """``pytest.raises`` for a refusal the entry declares, else None."""
    if place not in entry.refuses:
        return None
    return pytest.raises(ei.EdgeInferError, match=re.escape(entry.refuses[place]))


ids = [m.id for m in MODELS]


@pytest.mark.parametrize("entry", MODELS, ids=ids)
def test_converts_and_matches_native_runtime(entry: RealModel):
    p = prepared(entry)
    with ei.Session(p.model, backend="numpy", threads=2) as session:
        compare(run_session(session, p.model, p.feeds), p.reference, entry, "numpy")
    if all(info.shape is not None and all(isinstance(d, int) for d in info.shape) for info in p.model.inputs):
        for info in p.model.outputs:  # a fully static model reports concrete output shapes
            assert info.shape is not None and all(isinstance(d, int) for d in info.shape), info


@pytest.mark.parametrize("backend", installed_backends())
@pytest.mark.parametrize("entry", MODELS, ids=ids)
def test_eim_round_trip_on_every_backend(entry: RealModel, backend: str, tmp_path):
    p = prepared(entry)
    path = export_path(tmp_path, entry, ".eim")
    p.model.save(path)
    loaded = ei.load(path)
    refusal = expect_refusal(entry, backend)
    if refusal is not None:
        with refusal:
            with ei.Session(loaded, backend=backend, threads=2) as session:
                if not session.plan.node_counts().get(backend):  # declined every node: the plan says why
                    assert entry.refuses[backend] in session.plan.describe(), session.plan.describe()
                    raise ei.EdgeInferError(entry.refuses[backend])
                run_session(session, loaded, p.feeds)
        return
    with ei.Session(loaded, backend=backend, threads=2) as session:
        counts = session.plan.node_counts()
        assert counts.get(backend, 0) > 0 or backend == "numpy", \
            f"{entry.id}: backend {backend} took no node ({counts}); refuse with a typed error instead"
        compare(run_session(session, loaded, p.feeds), p.reference, entry, f".eim on {backend}")


@pytest.mark.parametrize("entry", MODELS, ids=ids)
def test_auto_backend(entry: RealModel):
    p = prepared(entry)
    with ei.Session(p.model, backend="auto", threads=2, options=ei.AutoOptions(cache=False)) as session:
        compare(run_session(session, p.model, p.feeds), p.reference, entry, "auto")


@pytest.mark.parametrize("entry", MODELS, ids=ids)
def test_onnx_export_loads_in_onnxruntime(entry: RealModel, tmp_path):
    p = prepared(entry)
    path = export_path(tmp_path, entry, ".onnx")
    refusal = expect_refusal(entry, "onnx-export")
    if refusal is not None:
        with refusal:
            ei.export(p.model, path)
        return
    ei.export(p.model, path)
    compare(run_onnxruntime(path, p.feeds), p.reference, entry, "exported .onnx in onnxruntime")


@pytest.mark.parametrize("entry", MODELS, ids=ids)
def test_tflite_export_loads_in_litert(entry: RealModel, tmp_path):
    p = prepared(entry)
    path = export_path(tmp_path, entry, ".tflite")
    refusal = expect_refusal(entry, "tflite-export")
    if refusal is not None:
        with refusal:
            ei.export(p.model, path)
        assert not path.exists()
        return
    ei.export(p.model, path)  # an NCHW model keeps its NCHW interface in the exported file
    compare(run_litert(path, p.feeds), p.reference, entry, "exported .tflite in LiteRT")
