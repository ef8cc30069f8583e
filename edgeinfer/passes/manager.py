"""The pass manager: one ordered pipeline, run to a fixed point with a step bound.

A pass is a function ``graph -> PassResult(graph, modified, fired)`` registered with
``@graph_pass(name, level)`` (a pass whose behaviour depends on the optimization level, e.g.
one that may emit ``edgeinfer``-domain ops only at level 2, takes a keyword ``level``).
``PIPELINE_ORDER`` below is the one place that says in which order passes run; a registered
pass missing from it is an error, a name in it that no module registered is skipped (a pass
family that is not part of this build).

``optimize(graph, level)`` runs the passes of that level or lower, in pipeline order,
repeatedly until a whole round modifies nothing, at most ``max_rounds`` rounds. A pass that
raises is reported as ``PassError`` naming it and the passes that ran before it. With
``verify=True`` (tests, ``EDGEINFER_DEBUG=1``) the graph is verified after every pass that
modified it, so a broken rewrite is caught where it happens.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable
from dataclasses import dataclass, field

from edgeinfer.errors import EdgeInferError, PassError
from edgeinfer.ir import Graph
from edgeinfer.progress import Steps, steps

# The pipeline: cleanup first (so patterns see canonical graphs), then folding into
# weights, then fusion of op groups into single ops, activation fusion last (it consumes
# what the others produce: Gemm, FusedMatMul, Gelu).
PIPELINE_ORDER: tuple[str, ...] = (
    "fold_constants",
    "remove_identity",
    "eliminate_dead_nodes",
    "cancel_transposes",  # edgeinfer/passes/layout.py
    "cancel_reshapes",
    "fold_pad",
    "fold_batch_norm",
    "fold_scale_shift",
    "fuse_layer_norm",
    "fuse_gelu",
    "fuse_attention",
    "matmul_add_to_gemm",
    "fuse_bias_activation",
)


@dataclass
class PassResult:
    graph: Graph
    modified: bool
    fired: dict[str, int] = field(default_factory=dict)  # what rewrote, and how often


@dataclass(frozen=True)
class PassInfo:
    name: str
    level: int
    fn: Callable[..., PassResult]
    takes_level: bool = False

    def run(self, graph: Graph, level: int) -> PassResult:
        return self.fn(graph, level=level) if self.takes_level else self.fn(graph)


_REGISTERED: dict[str, PassInfo] = {}
PIPELINE: list[PassInfo] = []  # registered passes in pipeline order (kept in sync)


def graph_pass(name: str, level: int = 1):
    """Register a pass (it runs at optimization ``level`` and above, in pipeline order)."""

    def register(fn: Callable[..., PassResult]):
        if name in _REGISTERED:
            raise ValueError(f"duplicate pass {name!r}")
        if name not in PIPELINE_ORDER:
            raise ValueError(f"pass {name!r} is not in PIPELINE_ORDER (edgeinfer/passes/manager.py): "
                             "add it there so its place in the pipeline is explicit")
        takes_level = "level" in inspect.signature(fn).parameters
        _REGISTERED[name] = PassInfo(name, level, fn, takes_level)
        PIPELINE[:] = [_REGISTERED[n] for n in PIPELINE_ORDER if n in _REGISTERED]
        return fn

    return register


def get_pass(name: str) -> PassInfo:
    from edgeinfer.passes import load_all

    load_all()
    if name not in _REGISTERED:
        raise PassError(f"unknown pass {name!r}: expected one of {sorted(_REGISTERED)}")
    return _REGISTERED[name]


@dataclass
class PassReport:
    name: str
    nodes_before: int
    nodes_after: int
    fired: dict[str, int]


def run_pass(name: str, graph: Graph, level: int = 2, *, verify: bool = True) -> PassResult:
    """Run one pass once (tests and debugging); errors are wrapped like ``optimize`` does."""
    info = get_pass(name)
    return _run_one(info, graph, level, verify, [])


def _run_one(info: PassInfo, graph: Graph, level: int, verify: bool, ran: list[str]) -> PassResult:
    where = f"pass {info.name!r} failed after {ran[-8:] if ran else 'no passes'}"
    try:
        result = info.run(graph, level)
        if verify and result.modified:
            result.graph.verify()
    except EdgeInferError as exc:
        raise PassError(f"{where}: {exc}") from exc
    except Exception as exc:
        raise PassError(f"{where}: {type(exc).__name__}: {exc}") from exc
    return result


def optimize(graph: Graph, level: int = 1, *, max_rounds: int = 10, verify: bool | None = None,
             report: list[PassReport] | None = None, progress: Steps | None = None) -> Graph:
    """Run the pipeline's passes of ``level`` or lower to a fixed point (``progress``: one
    step a round, counted in passes, sized by the graph's weights)."""
    from edgeinfer.passes import load_all

    load_all()
    if verify is None:
        verify = os.environ.get("EDGEINFER_DEBUG", "") not in ("", "0")
    passes = [p for p in PIPELINE if p.level <= level]
    ran: list[str] = []
    for round_ in range(max_rounds):
        changed = False
        weights = sum(array.nbytes for array in graph.initializers.values())
        with steps(progress).step(f"passes, round {round_ + 1}", len(passes), "passes", weights) as step:
            for info in passes:
                before = len(graph.nodes)
                result = _run_one(info, graph, level, verify, ran)
                ran.append(info.name)
                graph = result.graph
                changed |= result.modified
                if report is not None and result.modified:
                    report.append(PassReport(info.name, before, len(graph.nodes), dict(result.fired)))
                step.advance()
        if not changed:
            break
    return graph
