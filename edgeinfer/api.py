"""The public entry points: ``convert``, ``load`` and the front-end dispatch."""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import Any

from edgeinfer.errors import ModelFormatError
from edgeinfer.ir.infer import infer_types
from edgeinfer.model import Model

# name -> module in edgeinfer.converters; each exposes accepts(source) and convert(source, **kw)
# accepts() must be cheap and must not import the framework itself.
FRONTENDS: dict[str, str] = {
    "onnx": "edgeinfer.converters.onnx",
    "pytorch": "edgeinfer.converters.pytorch",
    "tflite": "edgeinfer.converters.tflite",
    "tensorflow": "edgeinfer.converters.tensorflow",
    "caffe": "edgeinfer.converters.caffe",
}
EIM_SUFFIX = ".eim"


def _frontend(name: str):
    return importlib.import_module(FRONTENDS[name])


def detect_frontend(source: Any) -> str:
    """Which front end converts ``source`` (a path or an in-memory model)."""
    for name, module_name in FRONTENDS.items():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name == module_name:  # that front end is not part of this build
                continue
            raise
        if module.accepts(source):
            return name
    what = f"file {os.fspath(source)!r}" if isinstance(source, (str, os.PathLike)) else type(source).__name__
    raise ModelFormatError(f"cannot convert {what}: expected one of the formats of "
                           f"{', '.join(FRONTENDS)} (by file suffix or object type)")


def convert(source: Any, *, optimize: int = 1, **options: Any) -> Model:
    """Convert a model (file path or in-memory object) into an edgeinfer ``Model``.

    ``options`` are front-end specific (e.g. ``weights=`` for Caffe, ``example_inputs=`` for
    PyTorch). The graph is type-inferred and verified before it is returned.
    """
    name = detect_frontend(source)
    graph = _frontend(name).convert(source, **options)
    graph = infer_types(graph.sorted())
    if optimize:
        try:
            from edgeinfer.passes import optimize as run_passes
        except ImportError:  # passes not built yet
            run_passes = None
        if run_passes is not None:
            graph = run_passes(graph, level=optimize)
    graph.verify()
    metadata = {"source_format": name}
    if isinstance(source, (str, os.PathLike)):
        metadata["source_file"] = Path(source).name
    return Model(graph, metadata)


def load(path: str | os.PathLike) -> Model:
    """Load an ``.eim`` file (weights are memory-mapped, not copied)."""
    from edgeinfer.format import load_model

    return load_model(path)


def load_any(path: str | os.PathLike) -> Model:
    """An ``.eim`` file is loaded; any other model file is converted."""
    if Path(path).suffix.lower() == EIM_SUFFIX:
        return load(path)
    return convert(path)
