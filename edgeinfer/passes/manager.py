"""The pass manager: one pipeline list, run to a fixed point with a step bound.

A pass is a function ``graph -> PassResult(graph, modified, fired)`` registered with
``@graph_pass(name, level)``. ``optimize(graph, level)`` runs every pass of that level or
lower, in registration order of ``PIPELINE``, repeatedly until no pass modifies the graph (or
``max_rounds`` is reached). A pass that raises is reported as ``PassError`` naming it and the
passes that ran before it. With ``verify=True`` (tests, ``EDGEINFER_DEBUG``) the graph is
verified after every pass.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field

from edgeinfer.errors import EdgeInferError, PassError
from edgeinfer.ir import Graph


@dataclass
class PassResult:
    graph: Graph
    modified: bool
    fired: dict[str, int] = field(default_factory=dict)  # what rewrote, and how often


@dataclass(frozen=True)
class PassInfo:
    name: str
    level: int
    fn: Callable[[Graph], PassResult]


PIPELINE: list[PassInfo] = []


def graph_pass(name: str, level: int = 1):
    """Register a pass in the pipeline (order of registration = order of running)."""

    def register(fn: Callable[[Graph], PassResult]):
        if any(p.name == name for p in PIPELINE):
            raise ValueError(f"duplicate pass {name!r}")
        PIPELINE.append(PassInfo(name, level, fn))
        return fn

    return register


@dataclass
class PassReport:
    name: str
    nodes_before: int
    nodes_after: int
    fired: dict[str, int]


def optimize(graph: Graph, level: int = 1, *, max_rounds: int = 10, verify: bool | None = None,
             report: list[PassReport] | None = None) -> Graph:
    """Run the pipeline's passes of ``level`` or lower to a fixed point."""
    from edgeinfer.passes import load_all

    load_all()
    if verify is None:
        verify = os.environ.get("EDGEINFER_DEBUG", "") not in ("", "0")
    passes = [p for p in PIPELINE if p.level <= level]
    ran: list[str] = []
    for _ in range(max_rounds):
        changed = False
        for info in passes:
            before = len(graph.nodes)
            try:
                result = info.fn(graph)
                if verify and result.modified:
                    result.graph.verify()
            except EdgeInferError as exc:
                raise PassError(f"pass {info.name!r} failed after {ran or 'no passes'}: {exc}") from exc
            except Exception as exc:
                raise PassError(f"pass {info.name!r} failed after {ran or 'no passes'}: "
                                f"{type(exc).__name__}: {exc}") from exc
            ran.append(info.name)
            graph = result.graph
            changed |= result.modified
            if report is not None and result.modified:
                report.append(PassReport(info.name, before, len(graph.nodes), dict(result.fired)))
        if not changed:
            break
    return graph
