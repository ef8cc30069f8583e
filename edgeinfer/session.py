"""``Session``: compile a model once on a backend, then run it many times.

Feeds are checked against the model's declared inputs before anything runs: unknown or
missing names, wrong rank, a fixed dim that differs, a symbolic dim (``"N"``) bound to two
different sizes, and a wrong dtype each raise ``InputError`` quoting what was expected and
what was given.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from edgeinfer.backend import CompileOptions, Executable, get_backend
from edgeinfer.errors import InputError
from edgeinfer.ir import dtypes
from edgeinfer.model import Model, TensorInfo


class Session:
    def __init__(self, model: Model | str | os.PathLike, backend: str = "numpy",
                 threads: int | None = None, *, debug: bool | None = None, **engine_options: Any):
        if not isinstance(model, Model):
            from edgeinfer.api import load_any

            model = load_any(model)
        self.model = model
        self.backend_name = backend
        if debug is None:
            debug = os.environ.get("EDGEINFER_DEBUG", "") not in ("", "0")
        self.options = CompileOptions(threads=threads, debug=debug)
        self.backend = get_backend(backend, **engine_options)
        self.executable: Executable = self.backend.compile(model.graph, self.options)
        self._inputs = model.inputs
        self._expected = {t.name: t for t in self._inputs}
        self._np_dtypes = {t.name: _feed_dtype(t.dtype) for t in self._inputs}

    @property
    def inputs(self) -> list[TensorInfo]:
        return list(self._inputs)

    @property
    def outputs(self) -> list[TensorInfo]:
        return self.model.outputs

    def run(self, feeds: Mapping[str, Any], outputs: list[str] | None = None) -> dict[str, np.ndarray]:
        """Run once. ``feeds`` maps input name -> array; returns output name -> array."""
        checked = self._check_feeds(feeds)
        results = self.executable.run(checked)
        if outputs is None:
            return results
        unknown = [o for o in outputs if o not in results]
        if unknown:
            raise InputError(f"unknown output(s) {unknown}: expected some of {list(results)}")
        return {name: results[name] for name in outputs}

    def stats(self) -> dict[str, Any]:
        return self.executable.stats()

    def _check_feeds(self, feeds: Mapping[str, Any]) -> dict[str, np.ndarray]:
        if not isinstance(feeds, Mapping):
            raise InputError(f"feeds: expected a dict of input name -> array, got {type(feeds).__name__}")
        unknown = [k for k in feeds if k not in self._expected]
        missing = [k for k in self._expected if k not in feeds]
        if unknown or missing:
            raise InputError(f"feeds: expected inputs {list(self._expected)}, got {list(feeds)}"
                             + (f" (unknown: {unknown})" if unknown else "")
                             + (f" (missing: {missing})" if missing else ""))
        bound: dict[str, tuple[int, str]] = {}
        checked = {}
        for name, info in self._expected.items():
            array = feeds[name]
            if info.dtype is not None and not dtypes.is_tensor_type(info.dtype):
                checked[name] = _check_container(name, info.dtype, array)
                continue
            if not isinstance(array, np.ndarray):
                array = np.asarray(array)
            want = self._np_dtypes[name]
            if want is not None and array.dtype != want and not (want.kind == "O" and array.dtype.kind in "OUS"):
                raise InputError(f"input {name!r}: expected dtype {info.dtype}, got {array.dtype}")
            if info.shape is not None:
                _check_shape(name, info.shape, array.shape, bound)
            checked[name] = array
        return checked


def _check_container(name: str, dtype: str, value: Any) -> Any:
    """Sequence inputs take a list of arrays; optional inputs also take None."""
    if dtype.startswith("optional(") and value is None:
        return None
    inner = dtype[dtype.index("(") + 1:-1]
    if dtype.startswith("optional("):
        return _check_container(name, inner, value) if not dtypes.is_tensor_type(inner) else np.asarray(value)
    if not isinstance(value, (list, tuple)):
        raise InputError(f"input {name!r}: expected a list of arrays ({dtype}), got {type(value).__name__}")
    return [np.asarray(item) for item in value]


def _feed_dtype(name: str | None):
    if name is None or not dtypes.is_tensor_type(name):
        return None
    return dtypes.numpy_dtype(name)


def _check_shape(name: str, expected: tuple, got: tuple, bound: dict[str, tuple[int, str]]) -> None:
    def show(shape) -> str:
        return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"

    if len(expected) != len(got):
        raise InputError(f"input {name!r}: expected rank {len(expected)} shape {show(expected)}, "
                         f"got rank {len(got)} shape {show(got)}")
    for axis, (want, have) in enumerate(zip(expected, got)):
        if isinstance(want, int) and want != have:
            raise InputError(f"input {name!r}: expected shape {show(expected)}, got {show(got)} "
                             f"(dim {axis} must be {want})")
        if isinstance(want, str):
            previous = bound.setdefault(want, (have, name))
            if previous[0] != have:
                raise InputError(f"input {name!r}: dim {axis} is symbol {want!r} = {have}, but input "
                                 f"{previous[1]!r} bound {want!r} = {previous[0]}")
