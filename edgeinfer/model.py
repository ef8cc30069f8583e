"""``Model``: a typed IR graph plus metadata; what ``convert`` returns and ``.eim`` holds."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from edgeinfer.ir import Graph


@dataclass(frozen=True)
class TensorInfo:
    """A model input or output: name, dtype name, shape (symbolic dims as strings)."""

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

    @property
    def inputs(self) -> list[TensorInfo]:
        return [TensorInfo(v.name, v.dtype, v.shape) for v in self.graph.inputs]

    @property
    def outputs(self) -> list[TensorInfo]:
        return [TensorInfo(v.name, v.dtype, v.shape) for v in self.graph.outputs]

    def save(self, path: str | os.PathLike) -> None:
        """Write this model as one ``.eim`` file (atomically)."""
        from edgeinfer.format import save_model

        save_model(self, path)

    def summary(self) -> dict[str, Any]:
        return self.graph.summary()

    def __repr__(self) -> str:
        ins = ", ".join(str(t) for t in self.inputs)
        outs = ", ".join(str(t) for t in self.outputs)
        return f"Model({len(self.graph.nodes)} nodes; {ins} -> {outs})"
