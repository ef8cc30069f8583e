"""Feeds and shape signatures.

``FeedChecker`` checks feeds against the model's declared inputs before anything runs:
unknown or missing names, wrong rank, a fixed dim that differs, a symbolic dim (``"N"``)
bound to two different sizes, and a wrong dtype each raise ``InputError`` quoting what was
expected and what was given.

A ``Signature`` is what a compiled plan depends on: each symbolic dim bound to its value
(``height=480, width=640``), optionally bucketed (``buckets={"height": [320, 640]}`` files 480
under ``height<=640``), so that everything measured for one shape (auto's choice, the executor,
stage plans) is reused for requests of the same signature and decided again for another.
A model whose inputs are all static has one signature, ``static``.
"""

from __future__ import annotations

from collections import namedtuple
from collections.abc import Mapping, Sequence
from operator import attrgetter
from typing import Any

import numpy as np

from edgeinfer.errors import InputError
from edgeinfer.ir import dtypes
from edgeinfer.model import TensorInfo


class Signature(namedtuple("Signature", ("dims",), defaults=((),))):
    """Symbol -> value (or bucket label), sorted by symbol."""

    __slots__ = ()
    dims: tuple[tuple[str, int | str], ...]

    def __str__(self) -> str:
        return ",".join(f"{name}={value}" for name, value in self.dims) or "static"


STATIC = Signature()


def is_static(inputs: Sequence[TensorInfo]) -> bool:
    """Every input a tensor whose dims are all known integers."""
    return all(info.shape is not None and dtypes.is_tensor_type(info.dtype)
               and all(isinstance(d, int) for d in info.shape) for info in inputs)


def check_buckets(buckets: Mapping[str, Sequence[int]] | None) -> dict[str, list[int]]:
    checked: dict[str, list[int]] = {}
    for name, edges in dict(buckets or {}).items():
        if not isinstance(name, str) or isinstance(edges, (str, bytes)) or not all(
                isinstance(e, int) and e > 0 for e in edges) or not edges:
            raise InputError(f"buckets: expected symbol name -> list of positive ints, got {name!r}: {edges!r}")
        checked[name] = sorted(edges)
    return checked


_shape = attrgetter("shape")


def _bucket(value: int, edges: list[int]) -> int | str:
    for edge in edges:
        if value <= edge:
            return f"<={edge}"
    return f">{edges[-1]}"


class FeedChecker:
    """Checks feeds against ``inputs`` and names their signature."""

    def __init__(self, inputs: Sequence[TensorInfo], buckets: Mapping[str, Sequence[int]] | None = None):
        self.inputs = list(inputs)
        self.expected = {t.name: t for t in self.inputs}
        self.np_dtypes = {t.name: _feed_dtype(t.dtype) for t in self.inputs}
        self.buckets = check_buckets(buckets)
        # (input, axis, symbol) of every dim a signature binds: named symbols and unnamed dims
        self._symbolic = [(t.name, axis, d if isinstance(d, str) else f"{t.name}[{axis}]")
                          for t in self.inputs if t.shape is not None and dtypes.is_tensor_type(t.dtype)
                          for axis, d in enumerate(t.shape) if not isinstance(d, int)]
        self.static = is_static(self.inputs)
        self._names = frozenset(self.expected)
        # per input: name, numpy dtype, declared shape, the shape when every dim is fixed, and
        # whether it is a container (sequence/optional): looked up once, not per request
        self._specs = [(t.name, self.np_dtypes[t.name], t.shape,
                        tuple(t.shape) if t.shape is not None and all(isinstance(d, int) for d in t.shape) else None,
                        t.dtype is not None and not dtypes.is_tensor_type(t.dtype)) for t in self.inputs]
        # every input a tensor (the common case): (name, numpy dtype) is all a check looks up
        self._containers = any(spec[4] or spec[1] is None for spec in self._specs)
        self._tensors = [(name, want, fixed) for name, want, _, fixed, _ in self._specs]
        self._symbolic_inputs = tuple(dict.fromkeys(name for name, _, _ in self._symbolic))
        self._signatures: dict[tuple, Signature] = {}  # the shapes of the symbolic inputs -> signature
        self._valid_shapes: set[tuple] = set()  # feed shapes (in input order) that passed the shape checks

    def signature(self, checked: Mapping[str, Any]) -> Signature:
        """The signature of checked feeds (``check`` has made the symbols consistent)."""
        if not self._symbolic:
            return STATIC
        try:
            key = tuple(map(_shape, map(checked.__getitem__, self._symbolic_inputs)))
        except AttributeError:  # a container input: no memo
            return self._signature(checked)
        found = self._signatures.get(key)
        if found is None:
            found = self._signature(checked)
            if len(self._signatures) >= 256:  # many shapes: start over rather than grow
                self._signatures.clear()
            self._signatures[key] = found
        return found

    def _signature(self, checked: Mapping[str, Any]) -> Signature:
        bound: dict[str, int | str] = {}
        for name, axis, symbol in self._symbolic:
            value = checked[name]
            if isinstance(value, np.ndarray) and symbol not in bound:
                size = int(value.shape[axis])
                edges = self.buckets.get(symbol)
                bound[symbol] = _bucket(size, edges) if edges else size
        return Signature(tuple(sorted(bound.items())))

    def check(self, feeds: Mapping[str, Any]) -> dict[str, Any]:
        """A copy of ``feeds`` (arrays as given, lists made arrays) once they match the inputs."""
        if type(feeds) is not dict and not isinstance(feeds, Mapping):
            raise InputError(f"feeds: expected a dict of input name -> array, got {type(feeds).__name__}")
        if len(feeds) != len(self._names) or self._containers:
            return self._check_with_containers(feeds)
        checked = dict(feeds)  # the caller may change its dict later (a stream holds this one)
        shapes = []
        varying = False
        try:
            for name, want, fixed in self._tensors:
                array = checked[name]  # as many names as inputs: a missing one means an unknown one
                if type(array) is not np.ndarray:
                    array = checked[name] = np.asarray(array)
                dtype = array.dtype
                if dtype is not want and dtype != want and not (want.kind == "O" and dtype.kind in "OUS"):
                    raise InputError(f"input {name!r}: expected dtype {self.expected[name].dtype}, got {dtype}")
                shape = array.shape
                if shape != fixed:  # a symbolic dim, or a fixed one that differs
                    varying = True
                shapes.append(shape)
        except KeyError:
            self._check_names(feeds)
            raise
        if varying:
            key = tuple(shapes)
            if key not in self._valid_shapes:  # shapes seen before passed already: nothing to check again
                self._check_shapes(key)
        return checked

    def _check_names(self, feeds: Mapping[str, Any]) -> None:
        """``InputError`` unless ``feeds`` names exactly the inputs."""
        if feeds.keys() == self._names:
            return
        expected = self.expected
        unknown = [k for k in feeds if k not in expected]
        missing = [k for k in expected if k not in feeds]
        raise InputError(f"feeds: expected inputs {list(expected)}, got {list(feeds)}"
                         + (f" (unknown: {unknown})" if unknown else "")
                         + (f" (missing: {missing})" if missing else ""))

    def _check_with_containers(self, feeds: Mapping[str, Any]) -> dict[str, Any]:
        self._check_names(feeds)
        checked = {}
        shapes = []
        for name, want, _, _, container in self._specs:
            array = feeds[name]
            if container:
                checked[name] = _check_container(name, self.expected[name].dtype, array)
                shapes.append(None)
                continue
            if type(array) is not np.ndarray:
                array = np.asarray(array)
            if want is not None and array.dtype != want and not (want.kind == "O" and array.dtype.kind in "OUS"):
                raise InputError(f"input {name!r}: expected dtype {self.expected[name].dtype}, got {array.dtype}")
            checked[name] = array
            shapes.append(array.shape)
        key = tuple(shapes)
        if key not in self._valid_shapes:
            self._check_shapes(key)
        return checked

    def _check_shapes(self, key: tuple) -> None:
        """Each feed's shape (in input order; None for a container) against the declared ones;
        ``key`` is remembered once they pass."""
        bound: dict[str, tuple[int, str]] = {}
        for (name, _, shape, fixed, container), got in zip(self._specs, key):
            if container or shape is None or got == fixed:
                continue
            _check_shape(name, shape, got, bound)  # raises, saying how it differs
        if len(self._valid_shapes) >= 256:
            self._valid_shapes.clear()
        self._valid_shapes.add(key)


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


def select_outputs(results: dict[str, Any], outputs: Sequence[str] | None) -> dict[str, Any]:
    """``results`` restricted to ``outputs``, in that order (None: all of them)."""
    if outputs is None:
        return results
    try:
        return dict(zip(outputs, map(results.__getitem__, outputs)))
    except (KeyError, TypeError):
        unknown = [o for o in outputs if o not in results]
        raise InputError(f"unknown output(s) {unknown}: expected some of {list(results)}") from None
