"""The pipeline executor for streams of requests (``Session.stream``).

Stages are actors with bounded buffers (OneFlow): each stage's workers take a request's
values from the stage's input queue, run the stage's subgraph (its parts on their backends),
and put the values later stages need on the next queue. All stages work at once on
different requests (GPipe's micro-batches are here the requests themselves; nothing is
batched together).

Intake runs on its own thread: it pulls a request from the iterable only while fewer than
``max_in_flight`` are admitted and not yet handed to the consumer, so memory stays bounded
whatever the stream's length and a consumer that stops reading stops the intake. The
consumer gets each result as soon as it and every earlier one are done, whether or not the
next request has arrived: a live source (a camera) gets each frame's result back before it
yields the next frame. Queues block (no polling); close puts one sentinel per worker. A
``timeout`` raises as soon as the request at the head has run for that long; a stuck worker
is detached (its result dropped) and joined only when its session closes.

The plan (how many stages, where the cuts go, replicas per stage) comes from ``plan_stages``:
profile every node on its backend, split by dynamic programming, measure the compiled stages,
recalibrate once, and, with ``stages="auto"``, run a short burst of each candidate and keep
the one with the best measured throughput. Planning never stalls a stream: with
``stages="auto"`` a stream starts at once on replicas of the whole graph (one worker per core
sharing one single-threaded copy, compiled from the session's proven plan: one compile, no
warm-up run) and switches to the measured plan when the planner (on a thread of its own,
within ``plan_budget`` seconds) has it. A session's first request runs on its own compiled
plan, which it proves, and is the first result. Plans take a ``CompiledPlan`` (one
signature's backends and partition), never a Session.
"""

from __future__ import annotations

import itertools
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from edgeinfer.errors import BackendError, EdgeInferError, RequestTimeoutError, SchedulerError
from edgeinfer.runtime.compile import compile
from edgeinfer.runtime.executors import SequentialExecutor, settle
from edgeinfer.runtime.placement import make_plan
from edgeinfer.runtime.stream.planner import (
    best_time,
    cut_seconds,
    profile_nodes,
    replicate,
    split,
    throughput,
)

if TYPE_CHECKING:
    from edgeinfer.backend import Backend
    from edgeinfer.runtime.plans import CompiledPlan

log = logging.getLogger("edgeinfer.runtime.stream.pipeline")
_STOP = None  # one per worker: the worker that takes it exits
_END = object()  # the intake's last word: how many requests it admitted
_ADMITTED = object()  # a request entered the pipeline (its timeout clock runs)
_CLOSED = object()  # close() wakes a consumer waiting for a result
DETACH_WAIT_S = 0.01  # how long close() waits for a busy worker before detaching it
PLAN_DELAY_S = 0.5  # a stream serves on the default plan this long before the planner starts
_SEQUENTIAL = object()  # a planner candidate: the compiled plan's own runner, one worker


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
                         f"{candidate['predicted']:.1f}/s" + (f", measured {measured:.1f}/s" if measured else ""))
        return "\n".join(lines)

    def close(self) -> None:
        """Close every stage's compiled copies (the replicas too)."""
        for stage in self.stages:
            stage.close()


def check_choice(stages: int | str | None, replicas: int | Sequence[int] | str | None) -> None:
    if not (stages in (None, "auto") or (isinstance(stages, int) and stages >= 1)):
        raise BackendError(f"stages {stages!r}: expected a positive integer or 'auto'")
    if replicas in (None, "auto") or (isinstance(replicas, int) and replicas >= 1):
        return
    if isinstance(replicas, Sequence) and not isinstance(replicas, str) and \
            all(isinstance(r, int) and r >= 1 for r in replicas):
        if isinstance(stages, int) and len(replicas) != stages:
            raise BackendError(f"replicas {list(replicas)}: expected one count per stage ({stages})")
        return
    raise BackendError(f"replicas {replicas!r}: expected a positive integer, a list of them, or 'auto'")


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


def _build_stages(compiled: CompiledPlan, ranges: Sequence[tuple[int, int]], threads: int,
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


def _measure_stages(stages: Sequence[Stage], feeds: Mapping[str, Any], repeats: int = 3) -> list[float]:
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
    stages = _build_stages(compiled, ranges, threads=1)
    seconds = _measure_stages(stages, feeds)
    if len(ranges) > 1:
        scaled = list(costs)
        for (start, end), measured in zip(ranges, seconds):
            profiled = sum(costs[start:end]) or 1e-9
            for i in range(start, end):
                scaled[i] = costs[i] * measured / profiled
        again = split(scaled, k, cross)
        if again != ranges:
            stages2 = _build_stages(compiled, again, threads=1)
            seconds2 = _measure_stages(stages2, feeds)
            if max(seconds2) < max(seconds):
                _close_stages(stages)
                return stages2, seconds2
            _close_stages(stages2)
    return stages, seconds


def _close_stages(stages: Iterable[Stage]) -> None:
    for stage in stages:
        stage.close()


def _workers(compiled: CompiledPlan, workers: int | None) -> int:
    return workers or compiled.threads or os.cpu_count() or 1


def _whole_graph(compiled: CompiledPlan, runner: Any) -> Stage:
    """The whole graph as one stage run by ``runner``."""
    graph = compiled.graph
    return Stage(range(0, len(graph.nodes)), [runner], frozenset(graph.output_names), graph,
                 list(compiled.plan.assignment.backends))


def _sequential(compiled: CompiledPlan) -> Stage:
    """The whole graph on the compiled plan's own runner (borrowed, with all its threads)."""
    return _whole_graph(compiled, _Borrowed(compiled))


def replica_plan(compiled: CompiledPlan, *, workers: int | None = None) -> StagePlan:
    """Replicas of the whole graph, one thread each (as one 1-thread onnxruntime session per
    core would serve): the compiled plan's own parts compiled again single-threaded (no
    re-partition of a copy of the graph). One copy serves every worker: a part whose executable
    is thread safe (onnxruntime) takes several callers at once, and one that is not lends a copy
    per caller, compiling another only when all are busy (``CompiledPart``). Nothing is run here:
    the first requests warm the copy."""
    graph = compiled.graph
    count = _workers(compiled, workers)
    _, runner = compile(graph, compiled.backends, threads=1, pinned=dict(enumerate(compiled.plan.assignment.backends)),
                        busy_wait=False)
    return StagePlan([_whole_graph(compiled, runner)], [count], [0.0], 1, graph.output_names, kind="default")


def default_plan(compiled: CompiledPlan, feeds: Mapping[str, Any], *, workers: int | None = None) -> StagePlan:
    """What a stream serves on while the planner measures: ``replica_plan`` of the proven
    placement (proven here on ``feeds`` if no request has run yet; a copy of a placement that a
    concurrent first run re-partitioned is compiled again from the new one). A plan compiled
    single-threaded already is that copy: one worker serves on it, and nothing is compiled."""
    while True:
        if not compiled.proven:
            compiled.run(dict(feeds))
        if compiled.threads == 1 and _workers(compiled, workers) == 1:
            graph = compiled.graph
            return StagePlan([_sequential(compiled)], [1], [0.0], 1, graph.output_names, kind="default")
        placement = compiled.plan
        plan = replica_plan(compiled, workers=workers)
        if compiled.plan is placement:
            return plan
        plan.close()


def plan_stages(compiled: CompiledPlan, feeds: Mapping[str, Any], *, stages: int | str | None = "auto",
                replicas: int | Sequence[int] | str | None = "auto", measure: bool = True,
                transfer_bytes_per_second: float | None = None, workers: int | None = None,
                compile_stages: bool = True, budget: float | None = None,
                cancelled: Callable[[], bool] | None = None) -> StagePlan:
    """Plan a pipeline for ``compiled`` over ``workers`` (default its threads, else all cores),
    profiling with ``feeds`` (real feeds of the plan's signature).

    A cut costs a hand-off between threads, the host <-> device copies it adds
    (``planner.device_cut_seconds``) and, with ``transfer_bytes_per_second`` (stages on other
    machines), the bytes crossing it, so cuts go where activations are small. Local stages on
    the host pass arrays by reference, so bytes cost nothing there. ``compile_stages=False`` (Ray) splits
    on the profile alone and compiles no stage. ``budget``: seconds after which no further
    candidate is tried (the best one so far is kept). ``cancelled()`` true: stop
    (``PlanningCancelled``)."""
    check_choice(stages, replicas)
    feeds = dict(feeds)
    graph = compiled.graph
    workers = _workers(compiled, workers)
    if not graph.nodes:
        raise BackendError("stream: the model has no nodes to pipeline")
    deadline = None if budget is None else time.perf_counter() + budget
    built: list[tuple[list[Stage], list[float], list[int], Any]] = []  # (stages, seconds, replicas, engines)

    def check_cancelled() -> None:
        if cancelled is not None and cancelled():
            for entry in built:
                _close_stages(entry[0])
            raise PlanningCancelled("the stream was closed before its plan was ready")

    def out_of_time() -> bool:
        return deadline is not None and time.perf_counter() > deadline and bool(built)

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
        k = counts[0] if len(counts) == 1 else workers
        ranges = split(costs, min(k, len(graph.nodes)), cross)
        seconds = [sum(costs[a:b]) + (cross[a] if a else 0.0) for a, b in ranges]
        stage_list = _build_stages(compiled, ranges, 1, compile_stages=False)
        reps = replicate(seconds, workers, fixed)
        per_worker = max(1, workers // sum(reps))
        return StagePlan(stage_list, reps, seconds, per_worker, graph.output_names,
                         [{"stages": len(ranges), "replicas": reps, "predicted": throughput(seconds, reps)}])
    try:
        for k in counts:
            check_cancelled()
            if out_of_time():
                break
            stage_list, seconds = _split_measured(compiled, costs, cross, k, feeds)
            built.append((stage_list, seconds, replicate(seconds, workers, fixed), None))
        candidates = [{"stages": len(s), "replicas": r, "predicted": throughput(t, r)} for s, t, r, _ in built]
        if measure and stages == "auto" and replicas in (None, "auto") and compiled.runner is not None \
                and workers > 1 and not out_of_time():
            # one worker on the compiled runner with every thread: intra-op parallelism instead
            # of replicas (onnxruntime sequential is often on par with one 1-thread copy per core)
            stage_list = [_sequential(compiled)]
            seconds = _measure_stages(stage_list, feeds)
            built.append((stage_list, seconds, [1], _SEQUENTIAL))
            candidates.append({"stages": 1, "replicas": [1], "predicted": throughput(seconds, [1]),
                               "threads": workers})
        if measure and stages == "auto" and replicas in (None, "auto"):
            for label, engines in _other_engines(compiled):  # backend="auto": engines fare differently in streams
                check_cancelled()
                if out_of_time():
                    break
                stage_list = _build_stages(compiled, [(0, len(graph.nodes))], 1, engines)
                seconds = _measure_stages(stage_list, feeds)
                reps = replicate(seconds, workers, None)
                built.append((stage_list, seconds, reps, engines))
                candidates.append({"stages": 1, "replicas": reps, "predicted": throughput(seconds, reps),
                                   "on": label})
        best = max(range(len(built)), key=lambda i: candidates[i]["predicted"])
        if measure and len(built) > 1 and not out_of_time():
            trials = [StagePlan(s, r, t, 1, graph.output_names) for s, t, r, _ in built]
            for trial in trials:
                for stage, count in zip(trial.stages, trial.replicas):
                    stage.replicate(count)
            for round_ in range(2):  # alternating rounds, so machine noise hits every candidate alike
                order = range(len(trials)) if round_ == 0 else reversed(range(len(trials)))
                for i in order:
                    check_cancelled()
                    rate = measure_throughput(trials[i], feeds)
                    candidates[i]["measured"] = max(candidates[i].get("measured", 0.0), rate)
            best = max(range(len(built)), key=lambda i: candidates[i].get("measured", 0.0))
        check_cancelled()
    except BaseException:
        for entry in built:
            _close_stages(entry[0])
        raise
    for index, entry in enumerate(built):
        if index != best:
            _close_stages(entry[0])
    stage_list, seconds, reps, engines = built[best]
    if engines is _SEQUENTIAL:
        return StagePlan(stage_list, reps, seconds, workers, graph.output_names, candidates)
    per_worker = max(1, workers // sum(reps))
    if per_worker > 1:  # spare cores: give each worker several intra-op threads
        rebuilt = _build_stages(compiled, [(s.nodes.start, s.nodes.stop) for s in stage_list], per_worker, engines)
        _close_stages(stage_list)
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


class _Lane:
    """One stage plan's queues and worker threads inside a pipeline. A pipeline switching to a
    better plan starts a new lane and drains the old one; both deliver to the same results."""

    def __init__(self, pipeline: Pipeline, plan: StagePlan, number: int):
        self.pipeline = pipeline
        self.plan = plan
        self.queues: list[queue.SimpleQueue] = [queue.SimpleQueue() for _ in plan.stages]
        self._exited = [0] * len(plan.stages)
        self._lock = threading.Lock()
        self.threads = [threading.Thread(target=self._work, args=(stage_number, replica),
                                         name=f"edgeinfer-stage{stage_number}-{replica}"
                                              + (f"-lane{number}" if number else ""), daemon=True)
                        for stage_number, count in enumerate(plan.replicas) for replica in range(count)]

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def _work(self, number: int, replica: int) -> None:
        stage = self.plan.stages[number]
        source = self.queues[number]
        last = number + 1 == len(self.queues)
        target = self.pipeline._results if last else self.queues[number + 1]
        stopped = self.pipeline._stop
        while True:
            item = source.get()
            if item is _STOP:
                with self._lock:
                    self._exited[number] += 1
                    everyone = self._exited[number] == self.plan.replicas[number]
                if everyone and not last:  # all earlier items are on the next queue: pass the word on
                    for _ in range(self.plan.replicas[number + 1]):
                        target.put(_STOP)
                return
            if stopped.is_set():
                continue  # closing: drop the work, look for the sentinel
            sequence, message, error = item
            if error is None:
                try:
                    message = stage.run(message, replica)
                except BaseException as exc:  # noqa: BLE001 - delivered to the caller in order
                    message, error = None, exc
            target.put((sequence, message, error))

    def drain(self) -> None:
        """No more requests for this lane: its workers exit once the ones inside are done."""
        for _ in range(self.plan.replicas[0]):
            self.queues[0].put(_STOP)

    def stop(self) -> None:
        """Every worker exits after its current request."""
        for stage_queue, count in zip(self.queues, self.plan.replicas):
            for _ in range(count):
                stage_queue.put(_STOP)


class Pipeline:
    """Worker threads for one stream; ``serve`` yields results in order, ``close`` stops them.
    ``switch(plan)`` moves the requests not yet admitted onto another stage plan."""

    def __init__(self, plan: StagePlan, *, max_in_flight: int | None = None, timeout: float | None = None):
        self.plan = plan
        workers = sum(plan.replicas)
        self.max_in_flight = max_in_flight or 2 * workers + 2
        if self.max_in_flight < 1:
            raise BackendError(f"max_in_flight {max_in_flight!r}: expected a positive integer")
        if timeout is not None and timeout <= 0:
            raise BackendError(f"timeout {timeout!r}: expected a positive number of seconds")
        self.timeout = timeout
        self._results: queue.SimpleQueue = queue.SimpleQueue()
        self._slots: queue.SimpleQueue = queue.SimpleQueue()  # one token per request that may be admitted
        for _ in range(self.max_in_flight):  # (a C queue: threading.Semaphore costs a Python Condition per call)
            self._slots.put(None)
        self._stop = threading.Event()
        self.closed = threading.Event()  # set once close() has stopped every thread it waits for
        self._lock = threading.Lock()
        self._lanes: list[_Lane] = []
        self._next_plan: StagePlan | None = None
        self._intake: threading.Thread | None = None
        self._started: dict[int, float] = {}
        self._served = False
        self.detached: list[threading.Thread] = []  # busy workers close() did not wait for
        self.on_detach: Callable[[list[threading.Thread]], None] | None = None
        self.helpers: list[threading.Thread] = []  # e.g. the planner thread, joined like workers
        self.max_depth_seen = 0  # most requests inside the pipeline at once
        self.switched_at: int | None = None  # the first request served on the switched-to plan

    @property
    def plans(self) -> list[StagePlan]:
        """The stage plans this pipeline has served on so far, in order (one lane each)."""
        with self._lock:
            return [lane.plan for lane in self._lanes]

    def switch(self, plan: StagePlan) -> None:
        """Serve the requests admitted from now on with ``plan`` (called from any thread)."""
        with self._lock:
            self._next_plan = plan

    def _lane(self, plan: StagePlan) -> _Lane:
        with self._lock:
            if self._stop.is_set():
                raise SchedulerError("stream was closed while requests were in flight")
            lane = _Lane(self, plan, len(self._lanes))
            self._lanes.append(lane)
        lane.start()
        return lane

    def _admit(self, source: Iterator[Any], check: Callable[[Any], dict] | None, sequence: int) -> None:
        """The intake thread: pull, check and admit requests (numbered from ``sequence``) while
        slots are free."""
        lane = self._lanes[0]
        try:
            while True:
                self._slots.get()
                if self._stop.is_set():
                    return
                try:
                    feeds = next(source)
                except StopIteration:
                    break
                if self._stop.is_set():
                    return
                if self._next_plan is not None:
                    with self._lock:
                        plan, self._next_plan = self._next_plan, None
                    old, lane = lane, self._lane(plan)
                    old.drain()
                    self.switched_at = sequence
                try:
                    message = check(feeds) if check is not None else dict(feeds)
                except BaseException as exc:  # noqa: BLE001 - raised at this request's turn
                    self._results.put((sequence, None, exc))
                else:
                    self._started[sequence] = time.monotonic()
                    lane.queues[0].put((sequence, message, None))
                    if self.timeout is not None:
                        self._results.put((sequence, _ADMITTED, None))
                sequence += 1
        except BaseException as exc:  # noqa: BLE001 - the source itself failed: raised at its turn
            self._results.put((sequence, None, exc))
            sequence += 1
        self._results.put((sequence, _END, None))

    def serve(self, requests: Iterable[Mapping[str, Any]], *, check: Callable[[Any], dict] | None = None,
              select: Callable[[dict], dict] | None = None, start: int = 0) -> Iterator[dict[str, np.ndarray]]:
        """Yield the outputs of every request in input order. A failing request raises its error
        at its turn (earlier results are all delivered) and stops the pipeline. ``start``: the
        number of the first request (requests served before this pipeline, for error messages)."""
        if self._served or self._stop.is_set():
            raise SchedulerError("stream was closed while requests were in flight: a pipeline serves once")
        self._served = True
        source = iter(requests)
        finished: dict[int, tuple[Any, BaseException | None]] = {}
        delivered = start
        total: int | None = None
        try:
            self._lane(self.plan)
            self._intake = threading.Thread(target=self._admit, args=(source, check, start),
                                            name="edgeinfer-stage-intake", daemon=True)
            self._intake.start()
            while True:
                while delivered not in finished:
                    if total is not None and delivered >= total:
                        return
                    item = self._next_result(delivered)
                    sequence, message, error = item
                    if message is _CLOSED:
                        raise SchedulerError("stream was closed while requests were in flight")
                    if message is _END:
                        total = sequence
                    elif message is not _ADMITTED:
                        finished[sequence] = (message, error)
                message, error = finished.pop(delivered)
                self._started.pop(delivered, None)
                delivered += 1
                self.max_depth_seen = max(self.max_depth_seen, len(self._started) + 1)
                if error is not None:
                    raise error
                results = {name: message[name] for name in self.plan.output_names}
                yield select(results) if select is not None else results
                self._slots.put(None)  # the consumer is back for more: room for one more request
        finally:
            self.close()

    def _next_result(self, sequence: int) -> tuple:
        if self._stop.is_set():
            raise SchedulerError("stream was closed while requests were in flight")
        wait = None
        if self.timeout is not None:
            started = self._started.get(sequence)
            if started is not None:
                wait = started + self.timeout - time.monotonic()
                if wait <= 0:
                    raise RequestTimeoutError(f"stream request {sequence} did not finish within {self.timeout} s")
        try:
            return self._results.get(timeout=wait)
        except queue.Empty:
            raise RequestTimeoutError(f"stream request {sequence} did not finish within {self.timeout} s") from None

    def close(self) -> None:
        """Stop the intake and the workers. A worker inside a backend call is given
        ``DETACH_WAIT_S``, then detached: it finishes on its own, its result is dropped, and the
        session that owns the plan joins it before closing what it runs."""
        with self._lock:
            if self._stop.is_set():
                return
            self._stop.set()
            lanes = list(self._lanes)
        for lane in lanes:
            lane.stop()
        self._results.put((-1, _CLOSED, None))
        for _ in range(self.max_in_flight + 1):  # wake an intake waiting for a slot
            self._slots.put(None)
        threads = [t for lane in lanes for t in lane.threads] + self.helpers
        if self._intake is not None:
            threads.append(self._intake)
        deadline = time.monotonic() + DETACH_WAIT_S
        for thread in threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        self.detached = [t for t in threads if t.is_alive()]
        self.closed.set()
        if self.detached and self.on_detach is not None:
            self.on_detach(self.detached)


def plan_key(stages: Any, replicas: Any, signature: Any) -> tuple:
    """How a compiled plan files its stream plans: by the choice and the signature."""
    listed = isinstance(replicas, Sequence) and not isinstance(replicas, str)
    return stages, tuple(replicas) if listed else replicas, str(signature)


def plans_in_background(stages: Any, replicas: Any) -> bool:
    """Whether the planner has anything to choose (then a stream starts on the default)."""
    return stages in (None, "auto") and replicas in (None, "auto")


def first_run(compiled: CompiledPlan, feeds: dict[str, Any], timeout: float | None,
              adopt: Callable[[list[threading.Thread]], None] | None) -> dict[str, Any]:
    """Run a stream's first request on the compiled plan's own runner: it proves the placement
    (a part failing its first run is re-partitioned) before stages copy it, and its result is
    the stream's first. With ``timeout`` it runs on a thread of its own, detached (``adopt``)
    if it takes longer."""
    if timeout is None:
        return compiled.run(feeds)
    done: Future = Future()

    def run() -> None:
        try:
            settle(done, result=compiled.run(feeds))
        except BaseException as exc:  # noqa: BLE001 - raised to the consumer below
            settle(done, error=exc)
        finally:
            compiled.release()

    compiled.acquire()  # held open while it runs, however long after the stream gave up on it
    worker = threading.Thread(target=run, name="edgeinfer-stage-first", daemon=True)
    worker.start()
    try:
        return done.result(timeout=timeout)
    except FutureTimeout:
        if adopt is not None:
            adopt([worker])
        raise RequestTimeoutError(f"stream request 0 did not finish within {timeout} s") from None


def stream(lease: Callable[[dict], AbstractContextManager], signature_of: Callable[[dict], Any],
           requests: Iterable[Mapping[str, Any]], *, stages: int | str | None,
           replicas: int | Sequence[int] | str | None, max_in_flight: int | None, timeout: float | None,
           check: Callable[[Any], dict], select: Callable[[dict], dict], register: Callable[[Pipeline], None],
           plan_budget: float | None = None, background: bool = True,
           closed: Callable[[], bool] | None = None,
           adopt: Callable[[list[threading.Thread]], None] | None = None) -> Iterator[dict[str, np.ndarray]]:
    """``Session.stream``: the compiled plan of the first request's signature (``lease`` keeps it
    open for the stream), its stage plan for this choice (planned once and kept), served through
    a new pipeline. While the compiled plan has not run yet, the first request runs on it first
    (``first_run``): it proves the placement, and its result is delivered before anything is
    compiled for the stream (a live source gets it at once; the copy compiles while the source
    readies its next request).

    With ``stages="auto"`` and no measured plan yet, planning never stalls the stream: it is
    served at once on the default plan (``default_plan``: one single-threaded copy of the whole
    graph, one worker per core; compiled once per signature), and a planner thread measures the
    candidates (``background``: from ``PLAN_DELAY_S`` into the stream, or when it ends if sooner;
    within ``plan_budget``) and switches the stream to the measured plan. The planner goes on
    after the stream ends, so the next stream finds the plan; it is the session's (``adopt``:
    joined when the session closes; ``closed()`` stops it). ``background=False`` plans first."""
    source = iter(requests)
    try:
        first = next(source)
    except StopIteration:
        return
    sample = check(first)
    signature = signature_of(sample)
    with lease(sample) as compiled:
        start = 0
        if not compiled.proven:  # delivered before any stage is compiled from the plan it proved
            served = first_run(compiled, sample, timeout, adopt)
            yield select({name: served[name] for name in compiled.graph.output_names})
            if closed is not None and closed():
                raise SchedulerError("session is closed: expected an open Session, create a new one")
            start = 1
        key = plan_key(stages, replicas, signature)
        plan = compiled.stage_plans.peek(key)
        pending = None
        if plan is None and background and plans_in_background(stages, replicas):
            plan = compiled.stage_plan(("default", str(signature)), lambda: default_plan(compiled, sample))
            pending = key
        elif plan is None:
            plan = compiled.stage_plan(key, lambda: plan_stages(compiled, sample, stages=stages, replicas=replicas,
                                                                budget=plan_budget))
        pipeline = Pipeline(plan, max_in_flight=max_in_flight, timeout=timeout)
        register(pipeline)
        if pending is not None:
            cancelled = closed if closed is not None else (lambda: False)

            def plan_then_switch() -> None:
                try:
                    pipeline.closed.wait(PLAN_DELAY_S)  # a short stream is served alone; a long one switches later
                    if not cancelled():
                        pipeline.switch(compiled.stage_plan(pending, lambda: plan_stages(
                            compiled, sample, stages=stages, replicas=replicas, budget=plan_budget,
                            cancelled=cancelled)))
                except PlanningCancelled:
                    pass
                except Exception as exc:  # noqa: BLE001 - the stream goes on with the default plan
                    if not cancelled():
                        log.warning("stream planner failed (%s); serving on the default plan", exc)
                finally:
                    compiled.release()

            compiled.acquire()  # held open for the planner, which outlives the stream's lease
            planner = threading.Thread(target=plan_then_switch, name="edgeinfer-stage-planner", daemon=True)
            planner.start()
            if adopt is not None:
                adopt([planner])
            else:
                pipeline.helpers.append(planner)
        rest = source if start else itertools.chain([first], source)
        yield from pipeline.serve(rest, check=check, select=select, start=start)
