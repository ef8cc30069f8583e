"""Pipeline stages and stage plans: what a stream's workers run.

A ``Stage`` is a contiguous run of the graph's nodes (in topological order) compiled as one
subgraph, with one compiled copy per replica or fewer (a thread-safe copy serves several
workers); a ``StagePlan`` is the stages, the workers per stage and the figures the planner
measured. ``default_plan`` is what a stream serves on before the planner has measured
anything: replicas of the whole graph, one thread each, compiled from the proven placement.
Every stage compiles through ``runtime.compile``, so a part that fails to compile is
re-partitioned there as anywhere else.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from edgeinfer.errors import SchedulerError
from edgeinfer.runtime.compile import compile
from edgeinfer.runtime.executors import SequentialExecutor
from edgeinfer.runtime.stream.split import throughput

if TYPE_CHECKING:
    from edgeinfer.backend import Backend
    from edgeinfer.runtime.plans import CompiledPlan


class PlanningCancelled(SchedulerError):
    """The stream that asked for a plan was closed before the plan was ready."""


class _Borrowed:
    """The compiled plan's own runner serving as a stage (the whole graph, all its threads; the
    planner's sequential candidate): the compiled plan owns it, so closing the stage leaves it
    open, and it follows the runner a re-partition puts in place."""

    def __init__(self, compiled: CompiledPlan):
        self._compiled = compiled
        self.graph = compiled.graph

    @property
    def parts(self) -> list:
        return self._compiled.runner.parts

    def run(self, feeds: dict[str, Any]) -> dict[str, np.ndarray]:
        return self._compiled.runner.run(feeds)

    def close(self) -> None:
        pass


@dataclass
class Stage:
    nodes: range  # positions in the graph's topological order
    # one compiled copy per replica (workers share no engine state), or fewer: replica r runs
    # on runners[r % len(runners)] (a thread-safe copy serving several workers)
    runners: list[SequentialExecutor]
    keep: frozenset[str]  # values handed on: read by later stages or graph outputs
    graph: Any = None  # the stage's subgraph
    backends: list[str] = field(default_factory=list)  # the backend of each of its nodes

    @property
    def runner(self) -> SequentialExecutor:
        return self.runners[0]

    def run(self, message: dict[str, Any], replica: int = 0) -> dict[str, Any]:
        runners = self.runners
        runner = runners[replica % len(runners)]
        results = runner.run({name: message[name] for name in runner.graph.input_names})
        merged = {**message, **results}
        return {name: merged[name] for name in self.keep if name in merged}

    def replicate(self, count: int) -> None:
        """Compile copies until there is one per replica (an engine session per worker thread
        avoids contention inside a shared one, e.g. onnxruntime's memory arena): the first copy's
        placement, on its backends, with its threads."""
        first = self.runner
        backends = list({id(p.backend): p.backend for p in first.parts}.values())
        threads = first.parts[0].options.threads if first.parts else None
        pinned = dict(enumerate(self.backends))
        while len(self.runners) < count:
            self.runners.append(compile(first.graph, backends, threads=threads, pinned=pinned, busy_wait=False)[1])

    def close(self) -> None:
        for runner in self.runners:
            runner.close()
        self.runners = []


@dataclass
class StagePlan:
    """Stages (contiguous node ranges), workers per stage, and the measured figures."""

    stages: list[Stage]
    replicas: list[int]
    stage_seconds: list[float]  # one request through each stage alone, one thread, measured
    threads_per_worker: int
    output_names: list[str]
    candidates: list[dict[str, Any]] = field(default_factory=list)  # what the planner considered
    kind: str = "measured"  # or "default": replicas of the whole graph, served while planning

    @property
    def predicted_throughput(self) -> float:
        return throughput(self.stage_seconds, self.replicas)

    def describe(self) -> str:
        lines = [f"{len(self.stages)} stage(s), replicas {self.replicas}, {self.threads_per_worker} thread(s) per "
                 f"worker; predicted {self.predicted_throughput:.1f} requests/s"
                 + (" (the default served while the planner measures)" if self.kind == "default" else "")]
        for number, (stage, seconds, replicas) in enumerate(zip(self.stages, self.stage_seconds, self.replicas)):
            backends = sorted(set(stage.backends))
            lines.append(f"  stage {number}: nodes {stage.nodes.start}..{stage.nodes.stop - 1} "
                         f"({len(stage.nodes)}) on {','.join(backends)}: {seconds * 1000:.3f} ms x{replicas}")
        for candidate in self.candidates:
            measured = candidate.get("measured")
            on = f" on {candidate['on']}" if "on" in candidate else ""
            if "threads" in candidate:
                on += f" (the compiled plan, {candidate['threads']} threads)"
            lines.append(f"  considered {candidate['stages']} stage(s) x {candidate['replicas']}{on}: predicted "
                         f"{candidate['predicted']:.1f}/s" + (f", measured {measured:.1f}/s" if measured else "")
                         + (" (served)" if candidate.get("served") else ""))
        return "\n".join(lines)

    def close(self) -> None:
        """Close every stage's compiled copies (the replicas too)."""
        for stage in self.stages:
            stage.close()


def stage_layout(graph: Any, ranges: Sequence[tuple[int, int]]) -> list[tuple[Any, frozenset[str]]]:
    """Each stage's subgraph and the values it hands on (read later, or graph outputs)."""
    later_reads: list[set[str]] = []
    reads_after: set[str] = set(graph.output_names)
    for start, end in reversed(ranges):
        later_reads.append(set(reads_after))
        for node in graph.nodes[start:end]:
            reads_after.update(i for i in node.inputs if i)
            for sub in node.subgraphs():
                reads_after |= sub.outer_names()
    later_reads.reverse()
    return [(graph.subgraph(graph.nodes[start:end], name=f"{graph.name}_stage{number}"), frozenset(keep))
            for number, ((start, end), keep) in enumerate(zip(ranges, later_reads))]


def build_stages(compiled: CompiledPlan, ranges: Sequence[tuple[int, int]], threads: int,
                  engines: tuple[Sequence[Backend], Sequence[str]] | None = None, *,
                  compile_stages: bool = True) -> list[Stage]:
    """The stages ``ranges`` of the plan's graph, each node on the backend the plan gave it, or
    with ``engines`` = (backends, backend name per node) on those. ``compile_stages=False``
    (Ray: the actors compile them) lays the stages out without compiling anything."""
    graph = compiled.graph
    backends, placed = engines if engines is not None else (compiled.backends, compiled.plan.assignment.backends)
    stages: list[Stage] = []
    try:
        for (start, end), (sub, keep) in zip(ranges, stage_layout(graph, ranges)):
            pinned = {i: placed[start + i] for i in range(end - start)}
            runners = []
            if compile_stages:
                runners.append(compile(sub, backends, threads=threads, pinned=pinned, busy_wait=False)[1])
            stages.append(Stage(range(start, end), runners, keep, sub, [placed[i] for i in range(start, end)]))
    except BaseException:
        for stage in stages:
            stage.close()
        raise
    return stages


def close_stages(stages: Iterable[Stage]) -> None:
    for stage in stages:
        stage.close()


def workers_for(compiled: CompiledPlan, workers: int | None) -> int:
    return workers or compiled.threads or os.cpu_count() or 1


def whole_graph_stage(compiled: CompiledPlan, runner: Any) -> Stage:
    """The whole graph as one stage run by ``runner``."""
    graph = compiled.graph
    return Stage(range(0, len(graph.nodes)), [runner], frozenset(graph.output_names), graph,
                 list(compiled.plan.assignment.backends))


def borrowed_stage(compiled: CompiledPlan) -> Stage:
    """The whole graph on the compiled plan's own runner (borrowed, with all its threads)."""
    return whole_graph_stage(compiled, _Borrowed(compiled))


def replica_plan(compiled: CompiledPlan, *, workers: int | None = None) -> StagePlan:
    """Replicas of the whole graph, one thread each (as one 1-thread onnxruntime session per
    core would serve): the compiled plan's own parts compiled again single-threaded (no
    re-partition of a copy of the graph). One copy serves every worker: a part whose executable
    is thread safe (onnxruntime) takes several callers at once, and one that is not lends a copy
    per caller, compiling another only when all are busy (``CompiledPart``). Nothing is run here:
    the first requests warm the copy."""
    graph = compiled.graph
    count = workers_for(compiled, workers)
    _, runner = compile(graph, compiled.backends, threads=1, pinned=dict(enumerate(compiled.plan.assignment.backends)),
                        busy_wait=False)
    return StagePlan([whole_graph_stage(compiled, runner)], [count], [0.0], 1, graph.output_names, kind="default")


def default_plan(compiled: CompiledPlan, feeds: Mapping[str, Any], *, workers: int | None = None) -> StagePlan:
    """What a stream serves on while the planner measures: ``replica_plan`` of the proven
    placement (proven here on ``feeds`` if no request has run yet; a copy of a placement that a
    concurrent first run re-partitioned is compiled again from the new one). A plan compiled
    single-threaded already is that copy: one worker serves on it, and nothing is compiled."""
    while True:
        if not compiled.proven:
            compiled.run(dict(feeds))
        if compiled.threads == 1 and workers_for(compiled, workers) == 1:
            graph = compiled.graph
            return StagePlan([borrowed_stage(compiled)], [1], [0.0], 1, graph.output_names, kind="default")
        placement = compiled.plan
        plan = replica_plan(compiled, workers=workers)
        if compiled.plan is placement:
            return plan
        plan.close()
