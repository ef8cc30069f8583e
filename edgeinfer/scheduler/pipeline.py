"""The pipeline executor for streams of requests (``Session.stream``).

Stages are actors with bounded buffers (OneFlow): each stage's workers take a request's
values from the stage's input queue, run the stage's subgraph (its parts on their backends),
and put the values later stages need on the next queue. All stages work at once on
different requests (GPipe's micro-batches are here the requests themselves; nothing is
batched together). The caller's thread admits requests from the iterable only while fewer
than ``max_in_flight`` are inside the pipeline, so memory stays bounded whatever the stream's
length and a consumer that stops reading stops the intake; results are reordered and yielded
in input order.

The plan (how many stages, where the cuts go, replicas per stage) comes from ``plan_stages``:
profile every node on its backend, split by dynamic programming, measure the compiled stages,
recalibrate once, and, with ``stages="auto"``, run a short burst of each candidate and keep
the one with the best measured throughput.
"""

from __future__ import annotations

import itertools
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from edgeinfer.errors import BackendError, EdgeInferError, RequestTimeoutError, SchedulerError
from edgeinfer.scheduler import compile_parts, make_plan
from edgeinfer.scheduler.executors import CompiledPart, SequentialExecutor
from edgeinfer.scheduler.planner import (
    HANDOFF_SECONDS,
    best_time,
    crossing_bytes,
    profile_nodes,
    replicate,
    split,
    throughput,
)

if TYPE_CHECKING:
    from edgeinfer.backend import Backend
    from edgeinfer.session import Session

log = logging.getLogger("edgeinfer.scheduler.pipeline")
_POLL = 0.05  # seconds between checks of the stop flag while a worker waits on a full queue
_WAKE = None  # put on a stage's queue by close(): the worker that takes it exits at once


@dataclass
class Stage:
    nodes: range  # positions in the graph's topological order
    runners: list[SequentialExecutor]  # one compiled copy per replica: workers share no engine state
    keep: frozenset[str]  # values handed on: read by later stages or graph outputs

    @property
    def runner(self) -> SequentialExecutor:
        return self.runners[0]

    def run(self, message: dict[str, Any], replica: int = 0) -> dict[str, Any]:
        runner = self.runners[replica]
        results = runner.run({name: message[name] for name in runner.graph.input_names})
        merged = {**message, **results}
        return {name: merged[name] for name in self.keep if name in merged}

    def replicate(self, count: int) -> None:
        """Compile copies until there is one per replica (an engine session per worker thread
        avoids contention inside a shared one, e.g. onnxruntime's memory arena)."""
        first = self.runner
        while len(self.runners) < count:
            parts = [CompiledPart(p.part, p.backend, p.options) for p in first.parts]
            self.runners.append(SequentialExecutor(first.graph, parts))


@dataclass
class StagePlan:
    """Stages (contiguous node ranges), workers per stage, and the measured figures."""

    stages: list[Stage]
    replicas: list[int]
    stage_seconds: list[float]  # one request through each stage alone, one thread, measured
    threads_per_worker: int
    output_names: list[str]
    candidates: list[dict[str, Any]] = field(default_factory=list)  # what the planner considered

    @property
    def predicted_throughput(self) -> float:
        return throughput(self.stage_seconds, self.replicas)

    def describe(self) -> str:
        lines = [f"{len(self.stages)} stage(s), replicas {self.replicas}, {self.threads_per_worker} thread(s) per "
                 f"worker; predicted {self.predicted_throughput:.1f} requests/s"]
        for number, (stage, seconds, replicas) in enumerate(zip(self.stages, self.stage_seconds, self.replicas)):
            backends = sorted({p.part.backend for p in stage.runner.parts})
            lines.append(f"  stage {number}: nodes {stage.nodes.start}..{stage.nodes.stop - 1} "
                         f"({len(stage.nodes)}) on {','.join(backends)}: {seconds * 1000:.3f} ms x{replicas}")
        for candidate in self.candidates:
            measured = candidate.get("measured")
            on = f" on {candidate['on']}" if "on" in candidate else ""
            lines.append(f"  considered {candidate['stages']} stage(s) x {candidate['replicas']}{on}: predicted "
                         f"{candidate['predicted']:.1f}/s" + (f", measured {measured:.1f}/s" if measured else ""))
        return "\n".join(lines)


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


def _build_stages(session: Session, ranges: Sequence[tuple[int, int]], threads: int,
                  engines: tuple[Sequence[Backend], Sequence[str]] | None = None) -> list[Stage]:
    """Compile the stages ``ranges`` of the session's graph, each node on the backend the
    session's plan gave it, or with ``engines`` = (backends, backend name per node) on those."""
    graph = session.model.graph
    backends, placed = engines if engines is not None else (session.backends, session.plan.assignment.backends)
    later_reads: list[set[str]] = []
    reads_after: set[str] = set(graph.output_names)
    for start, end in reversed(ranges):
        later_reads.append(set(reads_after))
        for node in graph.nodes[start:end]:
            reads_after.update(i for i in node.inputs if i)
            for sub in node.subgraphs():
                reads_after |= sub.outer_names()
    later_reads.reverse()
    stages = []
    for (start, end), keep in zip(ranges, later_reads):
        sub = graph.subgraph(graph.nodes[start:end], name=f"{graph.name}_stage{len(stages)}")
        pinned = {i: placed[start + i] for i in range(end - start)}
        plan = make_plan(sub, backends, pinned=pinned)
        parts = compile_parts(plan, backends, threads=threads, busy_wait=False)
        stages.append(Stage(range(start, end), [SequentialExecutor(sub, parts)], frozenset(keep)))
    return stages


def _measure_stages(stages: Sequence[Stage], feeds: Mapping[str, Any], repeats: int = 3) -> list[float]:
    seconds = []
    message = dict(feeds)
    for stage in stages:
        out = stage.run(message)  # warm-up
        seconds.append(best_time(lambda s=stage, m=message: s.run(m), repeats))
        message = out
    return seconds


def _split_measured(session: Session, costs: list[float], cross: list[float], k: int,
                    feeds: Mapping[str, Any]) -> tuple[list[Stage], list[float]]:
    """Split on the profile, measure the compiled stages, rescale each node's cost by its
    stage's measured/profiled ratio (fusion inside an engine makes a stage cheaper than the
    sum of its nodes), split again, and keep whichever split measured better."""
    ranges = split(costs, k, cross)
    stages = _build_stages(session, ranges, threads=1)
    seconds = _measure_stages(stages, feeds)
    if len(ranges) > 1:
        scaled = list(costs)
        for (start, end), measured in zip(ranges, seconds):
            profiled = sum(costs[start:end]) or 1e-9
            for i in range(start, end):
                scaled[i] = costs[i] * measured / profiled
        again = split(scaled, k, cross)
        if again != ranges:
            stages2 = _build_stages(session, again, threads=1)
            seconds2 = _measure_stages(stages2, feeds)
            if max(seconds2) < max(seconds):
                return stages2, seconds2
    return stages, seconds


def plan_stages(session: Session, feeds: Mapping[str, Any] | None = None, *, stages: int | str | None = "auto",
                replicas: int | Sequence[int] | str | None = "auto", measure: bool = True,
                transfer_bytes_per_second: float | None = None, workers: int | None = None) -> StagePlan:
    """Plan a pipeline for ``session`` over ``workers`` (default ``session.threads``, else all
    cores), profiling with ``feeds`` (default: the model's random feeds at batch 1).

    A cut costs a hand-off between threads; with ``transfer_bytes_per_second`` (stages on other
    machines) also the bytes crossing it, so cuts go where activations are small. Local stages
    pass arrays by reference, so bytes cost nothing there."""
    check_choice(stages, replicas)
    feeds = dict(feeds) if feeds is not None else session.model.random_feeds()
    graph = session.model.graph
    workers = workers or session.threads or os.cpu_count() or 1
    if not graph.nodes:
        raise BackendError("stream: the model has no nodes to pipeline")
    by_name = {b.name: b for b in session.backends}
    costs, _ = profile_nodes(graph, session.plan.assignment.backends, by_name, feeds)
    cross = [HANDOFF_SECONDS + (size / transfer_bytes_per_second if transfer_bytes_per_second else 0.0)
             for size in crossing_bytes(graph)]
    fixed = None if replicas in (None, "auto") else replicas
    if isinstance(stages, int):
        counts = [stages]
    elif isinstance(fixed, Sequence):  # a replica count per stage says how many stages
        counts = [len(fixed)]
    else:
        counts = list(range(1, min(workers, len(graph.nodes)) + 1))
    built = []  # (stages, seconds, replicas, engines: None for the session's own placement)
    for k in counts:
        stage_list, seconds = _split_measured(session, costs, cross, k, feeds)
        built.append((stage_list, seconds, replicate(seconds, workers, fixed), None))
    candidates = [{"stages": len(s), "replicas": r, "predicted": throughput(t, r)} for s, t, r, _ in built]
    if measure and stages == "auto" and replicas in (None, "auto"):
        for label, engines in _other_engines(session):  # backend="auto": engines fare differently in streams
            stage_list = _build_stages(session, [(0, len(graph.nodes))], 1, engines)
            seconds = _measure_stages(stage_list, feeds)
            reps = replicate(seconds, workers, None)
            built.append((stage_list, seconds, reps, engines))
            candidates.append({"stages": 1, "replicas": reps, "predicted": throughput(seconds, reps), "on": label})
    best = max(range(len(built)), key=lambda i: candidates[i]["predicted"])
    if measure and len(built) > 1:
        trials = [StagePlan(s, r, t, 1, graph.output_names) for s, t, r, _ in built]
        for trial in trials:
            for stage, count in zip(trial.stages, trial.replicas):
                stage.replicate(count)
        for round_ in range(2):  # alternating rounds, so machine noise hits every candidate alike
            order = range(len(trials)) if round_ == 0 else reversed(range(len(trials)))
            for i in order:
                rate = measure_throughput(trials[i], feeds)
                candidates[i]["measured"] = max(candidates[i].get("measured", 0.0), rate)
        best = max(range(len(built)), key=lambda i: candidates[i]["measured"])
    stage_list, seconds, reps, engines = built[best]
    per_worker = max(1, workers // sum(reps))
    if per_worker > 1:  # spare cores: give each worker several intra-op threads
        stage_list = _build_stages(session, [(s.nodes.start, s.nodes.stop) for s in stage_list], per_worker, engines)
    for stage, count in zip(stage_list, reps):
        stage.replicate(count)
    return StagePlan(stage_list, reps, seconds, per_worker, graph.output_names, candidates)


def _other_engines(session: Session) -> list[tuple[str, tuple[list[Backend], list[str]]]]:
    """For a session whose backends ``backend="auto"`` chose by latency: every other installed
    engine that takes the whole graph alone, as (name, (backends, backend per node)). One
    request at a time on all cores and several at once on one core each rank engines
    differently (intra-op scaling), so a stream measures them again."""
    if session.auto_choice is None:
        return []
    from edgeinfer.backend import installed_backends
    from edgeinfer.scheduler import make_backends

    graph = session.model.graph
    chosen = {b.name for b in session.backends}
    found = []
    for name in installed_backends():
        if name in chosen or name == "numpy":
            continue
        try:
            backends = make_backends([name, "numpy"], device=session.device, fallback=session.fallback,
                                     options={k: v for k, v in session.backend_options.items() if k == name})
            plan = make_plan(graph, backends)
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


class Pipeline:
    """Worker threads for one stream; ``serve`` yields results in order, ``close`` stops them."""

    def __init__(self, plan: StagePlan, *, max_in_flight: int | None = None, timeout: float | None = None):
        self.plan = plan
        workers = sum(plan.replicas)
        self.max_in_flight = max_in_flight or 2 * workers + 2
        if self.max_in_flight < 1:
            raise BackendError(f"max_in_flight {max_in_flight!r}: expected a positive integer")
        if timeout is not None and timeout <= 0:
            raise BackendError(f"timeout {timeout!r}: expected a positive number of seconds")
        self.timeout = timeout
        size = self.max_in_flight
        self._queues: list[queue.Queue] = [queue.Queue(maxsize=size) for _ in range(len(plan.stages) + 1)]
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self.max_depth_seen = 0  # most requests inside the pipeline at once

    def _start(self) -> None:
        for number, (stage, replicas) in enumerate(zip(self.plan.stages, self.plan.replicas)):
            for replica in range(replicas):
                thread = threading.Thread(target=self._work, args=(stage, number, replica),
                                          name=f"edgeinfer-stage{number}-{replica}", daemon=True)
                thread.start()
                self._threads.append(thread)

    def _put(self, target: queue.Queue, item: Any) -> bool:
        while not self._stop.is_set():
            try:
                target.put(item, timeout=_POLL)
                return True
            except queue.Full:
                continue
        return False

    def _work(self, stage: Stage, number: int, replica: int) -> None:
        source, target = self._queues[number], self._queues[number + 1]
        while not self._stop.is_set():
            item = source.get()  # close() wakes idle workers with _WAKE
            if item is _WAKE:
                try:
                    source.put_nowait(_WAKE)  # for the next idle worker of this stage
                except queue.Full:
                    pass
                return
            sequence, message, error = item
            if error is None:
                try:
                    message = stage.run(message, replica)
                except BaseException as exc:  # noqa: BLE001 - delivered to the caller in order
                    message, error = None, exc
            if not self._put(target, (sequence, message, error)):
                return

    def serve(self, requests: Iterable[Mapping[str, Any]], *, check: Callable[[Any], dict] | None = None,
              select: Callable[[dict], dict] | None = None) -> Iterator[dict[str, np.ndarray]]:
        """Yield the outputs of every request in input order. A failing request raises its error
        at its turn (earlier results are all delivered) and stops the pipeline."""
        source = iter(requests)
        admitted = delivered = 0
        exhausted = False
        finished: dict[int, tuple[Any, BaseException | None]] = {}
        started: dict[int, float] = {}
        self._start()
        try:
            while True:
                while not exhausted and admitted - delivered < self.max_in_flight:
                    try:
                        feeds = next(source)
                    except StopIteration:
                        exhausted = True
                        break
                    try:
                        message = check(feeds) if check is not None else dict(feeds)
                    except BaseException as exc:  # noqa: BLE001 - raised at this request's turn
                        finished[admitted] = (None, exc)
                    else:
                        started[admitted] = time.monotonic()
                        if not self._put(self._queues[0], (admitted, message, None)):  # closed meanwhile
                            raise SchedulerError("stream was closed while requests were in flight")
                    admitted += 1
                    self.max_depth_seen = max(self.max_depth_seen, admitted - delivered)
                if exhausted and delivered == admitted:
                    return
                while delivered not in finished:
                    self._collect(finished, started.get(delivered), delivered)
                message, error = finished.pop(delivered)
                started.pop(delivered, None)
                delivered += 1
                if error is not None:
                    raise error
                results = {name: message[name] for name in self.plan.output_names}
                yield select(results) if select is not None else results
        finally:
            self.close()

    def _collect(self, finished: dict, started_at: float | None, sequence: int) -> None:
        wait = _POLL
        if self.timeout is not None and started_at is not None:
            left = started_at + self.timeout - time.monotonic()
            if left <= 0:
                raise RequestTimeoutError(f"stream request {sequence} did not finish within {self.timeout} s")
            wait = min(wait, left)
        try:
            item_sequence, message, error = self._queues[-1].get(timeout=wait)
        except queue.Empty:
            if self._stop.is_set():
                raise SchedulerError("stream was closed while requests were in flight") from None
            return
        finished[item_sequence] = (message, error)

    def close(self) -> None:
        """Stop the workers and wait for them (a worker inside a backend call finishes it first)."""
        with self._lock:
            if self._stop.is_set() and not self._threads:
                return
            self._stop.set()
            threads, self._threads = self._threads, []
        for stage_queue in self._queues[:-1]:  # idle workers pass the wake-up on to each other;
            try:                                # a full queue has no idle worker: busy ones see the stop flag
                stage_queue.put_nowait(_WAKE)
            except queue.Full:
                pass
        for thread in threads:
            thread.join(timeout=60)
            if thread.is_alive():
                log.warning("pipeline worker %s still busy after 60 s; left to finish on its own", thread.name)


def plan_key(stages: Any, replicas: Any, feeds: Mapping[str, Any]) -> tuple:
    """How a session files its stream plans: by the choice and the feeds' shapes."""
    shapes = tuple(sorted((name, getattr(array, "shape", None)) for name, array in feeds.items()))
    listed = isinstance(replicas, Sequence) and not isinstance(replicas, str)
    return stages, tuple(replicas) if listed else replicas, shapes


def stream(session: Session, requests: Iterable[Mapping[str, Any]], *, stages: int | str | None,
           replicas: int | Sequence[int] | str | None, max_in_flight: int | None, timeout: float | None,
           check: Callable[[Any], dict], select: Callable[[dict], dict],
           register: Callable[[Pipeline], None]) -> Iterator[dict[str, np.ndarray]]:
    """``Session.stream``: plan on the first request (once per input shapes and choice; the
    session keeps the plan), then serve the whole stream through a new pipeline."""
    source = iter(requests)
    try:
        first = next(source)
    except StopIteration:
        return
    sample = check(first)
    key = plan_key(stages, replicas, sample)
    plan = session.stage_plans.get(key)
    if plan is None:
        plan = session.stage_plans[key] = plan_stages(session, sample, stages=stages, replicas=replicas)
    pipeline = Pipeline(plan, max_in_flight=max_in_flight, timeout=timeout)
    register(pipeline)
    yield from pipeline.serve(itertools.chain([first], source), check=check, select=select)
