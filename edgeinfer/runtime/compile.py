"""Compiling: a graph partitioned over backends and its parts compiled into an executor.

``compile`` partitions (``placement.make_plan``) and compiles every part through
``parts.engine_compile``, the runtime's one call of ``Backend.compile``. A part that its backend
accepted but cannot compile is probed node by node on that backend (``probe_compile``); the
culprits are barred from it and the graph is partitioned again, so they go to the next backend
in priority (numpy, the reference, last). Session plans, auto's candidates,
``executor="auto"``'s runners, stream stages, replicas and Ray's stage actors all compile here,
so all of them re-partition.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from edgeinfer.backend import Backend, CompileOptions
from edgeinfer.errors import BackendError, first_line
from edgeinfer.ir import Graph
from edgeinfer.log import get_logger
from edgeinfer.runtime.executors import DagExecutor, PlanRunner, SequentialExecutor
from edgeinfer.runtime.parts import CompiledPart, PartCompileError, close_executable, engine_compile
from edgeinfer.runtime.placement import EXECUTORS, REFERENCE, Plan, concurrency, make_plan

log = get_logger("edgeinfer.runtime.compile")


def compile_parts(plan: Plan, backends: Sequence[Backend], *, threads: int | None, debug: bool = False,
                  share_threads: bool = False, busy_wait: bool = True, artifacts: Any = None) -> list[CompiledPart]:
    """Compile every part on its backend (``PartCompileError`` names the first that fails; the
    ones before it are closed). With ``share_threads`` (the DAG executor) a part that may run
    beside others gets a share of ``threads``; a part that runs alone gets them all.
    ``artifacts(part, backend)``: a part's ahead-of-time artifact or None (``aot``)."""
    by_name = {b.name: b for b in backends}
    shares = concurrency(plan.parts) if share_threads and threads else [0] * len(plan.parts)
    compiled: list[CompiledPart] = []
    try:
        for part, others in zip(plan.parts, shares):
            part_threads = threads if not others else max(1, threads // min(others + 1, threads))
            backend = by_name[part.backend]
            options = CompileOptions(threads=part_threads, debug=debug, busy_wait=busy_wait,
                                     artifact=artifacts(part, backend) if artifacts is not None else None)
            compiled.append(CompiledPart(part, by_name[part.backend], options))
    except BaseException:
        for done in compiled:
            done.close()
        raise
    return compiled


def _executor(plan: Plan, backends: Sequence[Backend], executor: str, threads: int | None, debug: bool,
              busy_wait: bool | None, artifacts: Any = None) -> PlanRunner:
    parallel = executor == "dag"
    if parallel and threads is None:
        threads = os.cpu_count() or 1
    parts = compile_parts(plan, backends, threads=threads, debug=debug, share_threads=parallel,
                          busy_wait=not parallel if busy_wait is None else busy_wait, artifacts=artifacts)
    if not parallel:
        return SequentialExecutor(plan.graph, parts)
    workers = max(1, min(threads, max(concurrency(plan.parts), default=0) + 1))
    return DagExecutor(plan.graph, parts, workers)


def compile(graph: Graph, backends: Sequence[Backend], *, executor: str = "sequential", threads: int | None = None,
            debug: bool = False, pinned: Mapping[int, str] | None = None, busy_wait: bool | None = None,
            excluded: dict[int, dict[str, str]] | None = None, notes: list[str] | None = None,
            prior: Sequence[str] | None = None, artifacts: Any = None) -> tuple[Plan, PlanRunner]:
    """Partition ``graph`` over ``backends`` (priority order; ``pinned``: node index -> backend)
    and compile it into a ``"sequential"`` or ``"dag"`` executor. A part that fails to compile is
    probed; its culprits go to the next backend (a pinned node too) and the graph is partitioned
    again. ``excluded`` (node -> {backend: why}) keeps and collects what is barred where;
    ``notes`` collects one line per move. ``busy_wait``: whether idle engine threads may spin
    (default: only in a sequential executor, where nothing else runs on the cores). ``prior``
    (the backend of every node) and ``artifacts`` come from a compiled ``.eim`` (``aot``).
    Returns (plan, runner); the caller owns the runner and closes it."""
    if executor not in EXECUTORS:
        raise BackendError(f"executor {executor!r}: expected one of {', '.join(EXECUTORS)} "
                           "(streams use Session.stream)")
    excluded = excluded if excluded is not None else {}
    by_name = {b.name: b for b in backends}
    while True:
        plan = make_plan(graph, backends, pinned=pinned, branches=executor == "dag", excluded=excluded, prior=prior)
        try:
            return plan, _executor(plan, backends, executor, threads, debug, busy_wait, artifacts)
        except PartCompileError as failure:
            part = failure.part
            if part.backend == REFERENCE or part.backend not in by_name:
                raise failure.cause from None
            culprits = probe_compile(part, by_name[part.backend]) or {
                i: f"failed to compile: {first_line(failure.cause, 300)}" for i in part.nodes}
            note = bar(excluded, graph, part.backend, culprits)
            log.warning("re-partitioned: %s (%s claimed nodes it could not compile: a bug in its claim)",
                        note, part.backend)
            if notes is not None:
                notes.append(note)


def bar(excluded: dict[int, dict[str, str]], graph: Graph, backend: str, culprits: Mapping[int, str]) -> str:
    """Bar ``culprits`` (node index -> why) from ``backend``; the line that says so."""
    for index, reason in culprits.items():
        excluded.setdefault(index, {})[backend] = reason
    labels = [graph.nodes[i].label for i in list(culprits)[:4]]
    more = f" and {len(culprits) - 4} more" if len(culprits) > 4 else ""
    first = next(iter(culprits.values()))
    return f"{len(culprits)} node(s) moved off {backend} ({', '.join(labels)}{more}): {first}"


def probe_compile(part: Any, backend: Backend) -> dict[int, str]:
    """Node index -> why ``backend`` cannot compile that node alone (empty if none fails alone:
    then only their combination fails). Nodes are probed as ``probe_units`` groups them."""
    culprits: dict[int, str] = {}
    options = CompileOptions(threads=1)
    for indices, sub in probe_units(part):
        try:
            close_executable(engine_compile(backend, sub, options))
        except Exception as exc:  # noqa: BLE001 - the culprit's reason
            for index in indices:
                culprits.setdefault(index, f"failed to compile: {first_line(exc, 300)}")
    return culprits


def probe_units(part: Any) -> Iterator[tuple[list[int], Graph]]:
    """(node indices, probe graph) per node of ``part``: the node with the nodes computing its
    constant inputs (a weight's DequantizeLinear), whose outputs are the node's own. Such
    constant nodes are judged with their readers, not alone, where a constant output or a
    computed weight would fail though the part does not; one whose output leaves the part is
    probed alone too."""
    graph = part.graph
    constant_inputs = graph.computed_from_constants()
    leaving = set(graph.output_names)
    index_of = {id(node): index for index, node in zip(part.nodes, graph.nodes)}
    for node in graph.nodes:
        if all(name in constant_inputs and name not in leaving for name in node.outputs if name):
            continue  # probed with its readers
        chosen: dict[int, Any] = {}
        stack = [node]
        while stack:
            current = stack.pop()
            if id(current) not in chosen:
                chosen[id(current)] = current
                stack.extend(constant_inputs[name] for name in current.inputs if name in constant_inputs)
        sub = graph.subgraph(chosen.values(), name=f"probe_{node.name or node.outputs[0]}")
        own = [value for value in sub.outputs if value.name in node.outputs]
        if own and len(own) < len(sub.outputs):
            sub = sub.replace(outputs=own)
        yield [index_of[id(n)] for n in sub.nodes], sub
