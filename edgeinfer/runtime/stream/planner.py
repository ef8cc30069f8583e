"""The stream planner (PipeDream's profile -> partition -> measure): which pipeline serves a
stream of one signature best on this machine.

``plan_stages`` profiles every node on its backend (``measure.profile_nodes``), splits the
graph into K stages for each K the workers allow (``split.split``: dynamic programming on the
profile, with the cost of each cut), compiles and measures the stages, recalibrates the
profile once from the measured stages, gives spare workers to the bottleneck stage, and with
``stages="auto"`` also considers the compiled plan's own runner with every thread (intra-op
parallelism instead of replicas), the default plan (replicas of the whole graph, one thread
each) and, for a ``backend="auto"`` plan, the other engines that take the whole graph alone.
The candidates are then measured as pipelines, in alternating rounds (``measure.best_rates``),
and the one with the best measured throughput is kept. All timing is in ``runtime.measure``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from edgeinfer.errors import BackendError, EdgeInferError
from edgeinfer.runtime.measure import best_rates, best_time, profile_nodes
from edgeinfer.runtime.options import check_choice
from edgeinfer.runtime.placement import make_plan
from edgeinfer.runtime.stream.pipeline import Pipeline
from edgeinfer.runtime.stream.split import cut_seconds, replicate, split, throughput
from edgeinfer.runtime.stream.stages import (
    PlanningCancelled,
    Stage,
    StagePlan,
    borrowed_stage,
    build_stages,
    close_stages,
    workers_for,
)

if TYPE_CHECKING:
    from edgeinfer.backend import Backend
    from edgeinfer.runtime.plans import CompiledPlan

log = logging.getLogger("edgeinfer.runtime.stream.planner")
_SEQUENTIAL = object()  # a planner candidate: the compiled plan's own runner, one worker
SAME_RATE = 0.03  # measured throughputs this close are one (noise); the simpler candidate is kept


def stage_seconds(stages: Sequence[Stage], feeds: Mapping[str, Any], repeats: int = 3) -> list[float]:
    seconds = []
    message = dict(feeds)
    for stage in stages:
        out = stage.run(message)  # warm-up
        seconds.append(best_time(lambda s=stage, m=message: s.run(m), repeats))
        message = out
    return seconds


def _split_measured(compiled: CompiledPlan, costs: list[float], cross: list[float], k: int,
                    feeds: Mapping[str, Any]) -> tuple[list[Stage], list[float]]:
    """Split on the profile, measure the compiled stages, rescale each node's cost by its
    stage's measured/profiled ratio (fusion inside an engine makes a stage cheaper than the
    sum of its nodes), split again, and keep whichever split measured better."""
    ranges = split(costs, k, cross)
    stages = build_stages(compiled, ranges, threads=1)
    seconds = stage_seconds(stages, feeds)
    if len(ranges) > 1:
        scaled = list(costs)
        for (start, end), measured in zip(ranges, seconds):
            profiled = sum(costs[start:end]) or 1e-9
            for i in range(start, end):
                scaled[i] = costs[i] * measured / profiled
        again = split(scaled, k, cross)
        if again != ranges:
            stages2 = build_stages(compiled, again, threads=1)
            seconds2 = stage_seconds(stages2, feeds)
            if max(seconds2) < max(seconds):
                close_stages(stages)
                return stages2, seconds2
            close_stages(stages2)
    return stages, seconds


@dataclass
class _Candidate:
    """A pipeline the planner considers: its stages (compiled), measured stage seconds, replicas,
    the engines it runs on (None: the plan's; ``_SEQUENTIAL``: the compiled plan's own runner;
    or (backends, backend per node)) and what ``StagePlan.describe`` shows of it."""

    stages: list[Stage]
    seconds: list[float]
    replicas: list[int]
    engines: Any
    facts: dict[str, Any] = field(default_factory=dict)


class _Clock:
    """The planner's budget (seconds, None: unbounded) and its cancellation."""

    def __init__(self, budget: float | None, cancelled: Callable[[], bool] | None):
        self.deadline = None if budget is None else time.perf_counter() + budget
        self.cancelled = cancelled

    def check(self) -> None:
        if self.cancelled is not None and self.cancelled():
            raise PlanningCancelled("the stream was closed before its plan was ready")

    def out_of_time(self, built: Sequence[Any]) -> bool:
        return self.deadline is not None and time.perf_counter() > self.deadline and bool(built)


def plan_stages(compiled: CompiledPlan, feeds: Mapping[str, Any], *, stages: int | str | None = "auto",
                replicas: int | Sequence[int] | str | None = "auto", measure: bool = True,
                transfer_bytes_per_second: float | None = None, workers: int | None = None,
                compile_stages: bool = True, budget: float | None = None,
                cancelled: Callable[[], bool] | None = None) -> StagePlan:
    """Plan a pipeline for ``compiled`` over ``workers`` (default its threads, else all cores),
    profiling with ``feeds`` (real feeds of the plan's signature).

    A cut costs a hand-off between threads, the host <-> device copies it adds
    (``split.device_cut_seconds``) and, with ``transfer_bytes_per_second`` (stages on other
    machines), the bytes crossing it, so cuts go where activations are small. Local stages on
    the host pass arrays by reference, so bytes cost nothing there. ``compile_stages=False`` (Ray) splits
    on the profile alone and compiles no stage. ``budget``: seconds after which no further
    candidate is tried (the best one so far is kept). ``cancelled()`` true: stop
    (``PlanningCancelled``)."""
    check_choice(stages, replicas)
    feeds = dict(feeds)
    graph = compiled.graph
    workers = workers_for(compiled, workers)
    if not graph.nodes:
        raise BackendError("stream: the model has no nodes to pipeline")
    by_name = {b.name: b for b in compiled.backends}
    costs, _ = profile_nodes(graph, compiled.plan.assignment.backends, by_name, feeds)
    cross = cut_seconds(graph, [by_name[name] for name in compiled.plan.assignment.backends], transfer_bytes_per_second)
    fixed = None if replicas in (None, "auto") else replicas
    if isinstance(stages, int):
        counts = [stages]
    elif isinstance(fixed, Sequence):  # a replica count per stage says how many stages
        counts = [len(fixed)]
    else:
        counts = list(range(1, min(workers, len(graph.nodes)) + 1))
    if not compile_stages:
        return _profiled(compiled, costs, cross, counts[0] if len(counts) == 1 else workers, workers, fixed)
    clock = _Clock(budget, cancelled)
    built: list[_Candidate] = []
    try:
        for k in counts:
            clock.check()
            if clock.out_of_time(built):
                break
            stage_list, seconds = _split_measured(compiled, costs, cross, k, feeds)
            built.append(_Candidate(stage_list, seconds, replicate(seconds, workers, fixed), None))
        if measure and stages == "auto" and fixed is None:
            _whole_graph_candidates(compiled, feeds, workers, built, clock)
        for candidate in built:
            candidate.facts.update(stages=len(candidate.stages), replicas=candidate.replicas,
                                   predicted=throughput(candidate.seconds, candidate.replicas))
        best = _measured_best(built, feeds, clock, graph.output_names) if measure else \
            max(range(len(built)), key=lambda i: built[i].facts["predicted"])
    except BaseException:
        for candidate in built:
            close_stages(candidate.stages)
        raise
    for index, candidate in enumerate(built):
        if index != best:
            close_stages(candidate.stages)
    built[best].facts["served"] = True
    return _final(compiled, built[best], workers, [c.facts for c in built])


def _profiled(compiled: CompiledPlan, costs: list[float], cross: list[float], k: int, workers: int,
              fixed: Any) -> StagePlan:
    """A plan split on the profile alone, nothing compiled (Ray's actors compile their stages)."""
    graph = compiled.graph
    ranges = split(costs, min(k, len(graph.nodes)), cross)
    seconds = [sum(costs[a:b]) + (cross[a] if a else 0.0) for a, b in ranges]
    stage_list = build_stages(compiled, ranges, 1, compile_stages=False)
    reps = replicate(seconds, workers, fixed)
    per_worker = max(1, workers // sum(reps))
    return StagePlan(stage_list, reps, seconds, per_worker, graph.output_names,
                     [{"stages": len(ranges), "replicas": reps, "predicted": throughput(seconds, reps)}])


def _whole_graph_candidates(compiled: CompiledPlan, feeds: dict[str, Any], workers: int,
                            built: list[_Candidate], clock: _Clock) -> None:
    """Add the compiled plan's own runner with every thread (intra-op parallelism instead of
    replicas: onnxruntime sequential is often on par with one 1-thread copy per core) and, for
    a ``backend="auto"`` plan, replicas of each other engine that takes the whole graph."""
    if compiled.runner is not None and workers > 1 and not clock.out_of_time(built):
        stage_list = [borrowed_stage(compiled)]
        seconds = stage_seconds(stage_list, feeds)
        built.append(_Candidate(stage_list, seconds, [1], _SEQUENTIAL, {"threads": workers}))
    for label, engines in _other_engines(compiled):  # backend="auto": engines fare differently in streams
        clock.check()
        if clock.out_of_time(built):
            break
        stage_list = build_stages(compiled, [(0, len(compiled.graph.nodes))], 1, engines)
        seconds = stage_seconds(stage_list, feeds)
        built.append(_Candidate(stage_list, seconds, replicate(seconds, workers, None), engines, {"on": label}))


def _measured_best(built: list[_Candidate], feeds: dict[str, Any], clock: _Clock, output_names: list[str]) -> int:
    """The candidate with the best measured throughput, as pipelines with their replicas, in
    alternating rounds. Candidates within ``SAME_RATE`` of the best count as equal, and the
    first of them (the fewest stages, the default's shape first) is kept."""
    if len(built) == 1 or clock.out_of_time(built):
        return max(range(len(built)), key=lambda i: built[i].facts["predicted"])
    trials = [StagePlan(c.stages, c.replicas, c.seconds, 1, output_names) for c in built]
    for trial in trials:
        for stage, count in zip(trial.stages, trial.replicas):
            stage.replicate(count)
    rates = best_rates([lambda t=trial: measure_throughput(t, feeds) for trial in trials], cancelled=clock.check)
    for candidate, rate in zip(built, rates):
        candidate.facts["measured"] = rate
    clock.check()
    top = max(rates)
    return next(i for i, rate in enumerate(rates) if rate >= top * (1 - SAME_RATE))


def _final(compiled: CompiledPlan, chosen: _Candidate, workers: int, candidates: list[dict[str, Any]]) -> StagePlan:
    """The chosen candidate as the stream's plan: spare cores become intra-op threads of each
    worker (its stages compiled again with them), and every stage gets its replicas."""
    graph = compiled.graph
    stage_list, seconds, reps = chosen.stages, chosen.seconds, chosen.replicas
    if chosen.engines is _SEQUENTIAL:
        return StagePlan(stage_list, reps, seconds, workers, graph.output_names, candidates)
    per_worker = max(1, workers // sum(reps))
    if per_worker > 1:  # spare cores: give each worker several intra-op threads
        rebuilt = build_stages(compiled, [(s.nodes.start, s.nodes.stop) for s in stage_list], per_worker,
                               chosen.engines)
        close_stages(stage_list)
        stage_list = rebuilt
    for stage, count in zip(stage_list, reps):
        stage.replicate(count)
    return StagePlan(stage_list, reps, seconds, per_worker, graph.output_names, candidates)


def _other_engines(compiled: CompiledPlan) -> list[tuple[str, tuple[list[Backend], list[str]]]]:
    """For a plan whose backends ``backend="auto"`` chose by latency: every other installed
    engine that takes the whole graph alone, as (name, (backends, backend per node)). One
    request at a time on all cores and several at once on one core each rank engines
    differently (intra-op scaling), so a stream measures them again."""
    if compiled.auto_choice is None:
        return []
    from edgeinfer.backend import installed_backends
    from edgeinfer.runtime.placement import make_backends

    settings = compiled.settings
    chosen = {b.name for b in compiled.backends}
    found = []
    for name in installed_backends():
        if name in chosen or name == "numpy":
            continue
        try:
            backends = make_backends([name, "numpy"], device=settings.device, fallback=settings.fallback,
                                     options={k: v for k, v in settings.options.items() if k == name})
            plan = make_plan(compiled.graph, backends)
        except EdgeInferError as exc:
            log.debug("stream planner: %s not considered: %s", name, exc)
            continue
        if [p.backend for p in plan.parts] == [name]:  # the whole graph on it: replicas of one engine
            found.append((name, (backends, plan.assignment.backends)))
    return found


def measure_throughput(plan: StagePlan, feeds: Mapping[str, Any], seconds: float = 0.4) -> float:
    """Requests per second of ``plan`` on a short burst of copies of ``feeds``."""
    count = int(min(400, max(4 * sum(plan.replicas) + 4, plan.predicted_throughput * seconds)))
    pipeline = Pipeline(plan)
    start = time.perf_counter()
    for _ in pipeline.serve(feeds for _ in range(count)):
        pass
    return count / (time.perf_counter() - start)
