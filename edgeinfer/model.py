"""``Model``: a typed IR graph plus metadata; what ``convert`` returns and ``.eim`` holds."""

from __future__ import annotations

import os
from collections import namedtuple
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from edgeinfer.ir import Graph


class TensorInfo(namedtuple("TensorInfo", ("name", "dtype", "shape"))):
    """A model input or output: name, dtype name, shape (symbolic dims as strings). (Named tuples here
    are ``collections.namedtuple``'s: ``typing.NamedTuple`` compiles every string annotation at import,
    0.3 ms a class of a device's cold start.)"""

    __slots__ = ()
    name: str
    dtype: str | None
    shape: tuple | None

    def __str__(self) -> str:
        dims = "?" if self.shape is None else "x".join("?" if d is None else str(d) for d in self.shape)
        return f"{self.name}: {self.dtype or '?'}[{dims}]"


class Model:
    def __init__(self, graph: Graph, metadata: dict[str, str] | None = None):
        self.graph = graph
        self.metadata: dict[str, str] = dict(metadata or {})
        self.compiled: Any = None  # a compiled .eim's plan and artifacts (edgeinfer.format.compiled)
        self.on_device: str | None = None  # the file a plan decided here is written back to (runtime.write_back)

    @property
    def inputs(self) -> list[TensorInfo]:
        return [TensorInfo(v.name, v.dtype, v.shape) for v in self.graph.inputs]

    @property
    def outputs(self) -> list[TensorInfo]:
        return [TensorInfo(v.name, v.dtype, v.shape) for v in self.graph.outputs]

    def random_feeds(self, *, batch: int = 1, seed: int = 0,
                     shapes: Mapping[str, Sequence[int]] | None = None) -> dict[str, np.ndarray]:
        """Random feeds of the declared shapes (symbolic dims bound to ``batch``), or of the
        concrete ``shapes`` given for some inputs ({name: shape}): standard normal floats, 0/1
        booleans, integers in [0, 10). For timing and planning."""
        from edgeinfer.errors import InputError
        from edgeinfer.ir import dtypes

        rng = np.random.default_rng(seed)
        feeds: dict[str, np.ndarray] = {}
        for info in self.inputs:
            given = (shapes or {}).get(info.name)
            if given is not None and dtypes.is_tensor_type(info.dtype):
                shape = tuple(given)
            elif info.shape is None or any(d is None for d in info.shape) or not dtypes.is_tensor_type(info.dtype):
                raise InputError(f"input {info.name!r} has unknown dims or a non-tensor type "
                                 f"({info.dtype} {info.shape}): give real feeds")
            else:
                shape = tuple(batch if isinstance(d, str) else d for d in info.shape)
            dtype = dtypes.numpy_dtype(info.dtype)
            if dtype.kind in "fc":
                feeds[info.name] = rng.standard_normal(shape).astype(dtype)
            elif dtype.kind == "b":
                feeds[info.name] = rng.integers(0, 2, shape).astype(dtype)
            else:
                feeds[info.name] = rng.integers(0, 10, shape).astype(dtype)
        return feeds

    def save(self, path: str | os.PathLike, *, progress: Any = None) -> None:
        """Write this model as one ``.eim`` file (atomically), streaming the weights;
        ``progress`` (``edgeinfer.progress.Steps``) gets the write step in bytes."""
        from edgeinfer.format import save_model

        save_model(self, path, progress=progress)

    def summary(self) -> dict[str, Any]:
        return self.graph.summary()

    def __repr__(self) -> str:
        ins = ", ".join(str(t) for t in self.inputs)
        outs = ", ".join(str(t) for t in self.outputs)
        return f"Model({len(self.graph.nodes)} nodes; {ins} -> {outs})"
