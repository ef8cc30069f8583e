"""``Session.stream``: a stream of requests served through a pipeline of stages.

A stream takes a ``StreamContext``, what its session lends every stream: the feed check, the
signature, the lease of a signature's compiled plan, the planner's budget, and the registry of
what streams start (pipelines, planner threads, workers a timeout detached) that the session
closes. The stream never sees the Session.

With ``stages="auto"`` planning never stalls a stream: it starts at once on the default plan
(``stages.default_plan``: replicas of the whole graph, one thread each, one worker per core,
compiled from the session's proven plan: one compile, no warm-up run), and a planner thread
measures the candidates (``planner.plan_stages``). The planner measures on a quiet machine:
it waits until no stream of the session runs, or none has had a request in flight for
``QUIET_S`` (a slow live source between frames); measurements taken beside a saturated stream, and the stream
beside the planner's candidates, were what made planned streams slower than the default
one), up to ``PLAN_WAIT_S``; past that it measures anyway. A stream still running switches
to the plan it finds (``Pipeline.switch``); the next streams start on it.
A session's first request runs on its own compiled plan, which it proves, and is the first
result.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Any

import numpy as np

from edgeinfer.errors import RequestTimeoutError, SchedulerError
from edgeinfer.runtime.feeds import select_outputs
from edgeinfer.runtime.futures import settle
from edgeinfer.runtime.stream.pipeline import Pipeline
from edgeinfer.runtime.stream.planner import plan_stages
from edgeinfer.runtime.stream.stages import PlanningCancelled, default_plan

if TYPE_CHECKING:
    from edgeinfer.runtime.plans import CompiledPlan

log = logging.getLogger("edgeinfer.runtime.stream.serve")
PLAN_WAIT_S = 10.0  # how long the planner waits for the session's streams to go quiet before it measures anyway
QUIET_S = 0.2  # a running stream this long without a request in flight counts as quiet
QUIET_POLL_S = 0.02
JOIN_DETACHED_S = 60.0  # how long close() waits for a worker a timeout detached


class StreamContext:
    """What a session lends its streams. ``check(feeds)`` checks a request, ``signature(checked)``
    names its shape signature, ``lease(checked)`` holds the compiled plan of that signature
    open (a context manager); ``plan_budget`` bounds the planner. The context keeps the
    pipelines and threads streams start; ``close()`` stops them (the session's close)."""

    def __init__(self, check: Callable[[Any], dict], signature: Callable[[dict], Any],
                 lease: Callable[[dict], AbstractContextManager], plan_budget: float | None = None):
        self.check, self.signature, self.lease, self.plan_budget = check, signature, lease, plan_budget
        self.closed = threading.Event()
        self._lock = threading.Condition()
        self._pipelines: list[Pipeline] = []
        self._threads: list[threading.Thread] = []
        self._running = 0  # streams being served now

    def register(self, pipeline: Pipeline) -> None:
        with self._lock:
            if self.closed.is_set():
                pipeline.close()
                raise SchedulerError("session is closed: expected an open Session, create a new one")
            self._pipelines = [p for p in self._pipelines if not p.closed.is_set()] + [pipeline]
        pipeline.on_detach = self.adopt

    def adopt(self, threads: list[threading.Thread]) -> None:
        """Workers a stream detached (stuck past its timeout) and planner threads, which outlive
        their stream: joined before close() frees what they run."""
        with self._lock:
            self._threads = [t for t in self._threads if t.is_alive()] + list(threads)

    @contextmanager
    def running(self) -> Iterator[None]:
        """Held while a stream serves (the planner waits for none to be running)."""
        with self._lock:
            self._running += 1
        try:
            yield
        finally:
            with self._lock:
                self._running -= 1
                self._lock.notify_all()

    def pipelines(self) -> list[Pipeline]:
        """The pipelines of the streams being served now."""
        with self._lock:
            return [p for p in self._pipelines if not p.closed.is_set()]

    def wait_quiet(self, seconds: float) -> bool:
        """Wait until no stream of the session runs, or none has had a request in flight for
        ``QUIET_S`` (a live source between frames): True; False when ``seconds`` pass first or
        the session closes."""
        deadline = time.monotonic() + seconds
        idle_since = None
        with self._lock:
            while not self.closed.is_set():
                now = time.monotonic()
                if not self._running:
                    return True
                if any(p.busy() for p in self._pipelines if not p.closed.is_set()):
                    idle_since = None
                elif idle_since is None:
                    idle_since = now
                elif now - idle_since >= QUIET_S:
                    return True
                if now >= deadline:
                    return False
                self._lock.wait(min(deadline - now, QUIET_POLL_S))
        return False

    def close(self) -> None:
        """Close every stream's pipeline, then join the threads streams left behind."""
        with self._lock:
            self.closed.set()
            pipelines, self._pipelines = self._pipelines, []
            self._lock.notify_all()
        for pipeline in pipelines:
            pipeline.close()
        deadline = time.monotonic() + JOIN_DETACHED_S
        with self._lock:
            threads, self._threads = self._threads, []
        for thread in threads:  # a worker still inside a backend call: let it finish first
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                log.warning("worker %s still busy %.0f s after close(); its plan is closed anyway",
                            thread.name, JOIN_DETACHED_S)


def plan_key(stages: Any, replicas: Any, signature: Any) -> tuple:
    """How a compiled plan files its stream plans: by the choice and the signature."""
    listed = isinstance(replicas, Sequence) and not isinstance(replicas, str)
    return stages, tuple(replicas) if listed else replicas, str(signature)


def plans_in_background(stages: Any, replicas: Any) -> bool:
    """Whether the planner has anything to choose (then a stream starts on the default)."""
    return stages in (None, "auto") and replicas in (None, "auto")


def first_run(compiled: CompiledPlan, feeds: dict[str, Any], timeout: float | None,
              context: StreamContext) -> dict[str, Any]:
    """Run a stream's first request on the compiled plan's own runner: it proves the placement
    (a part failing its first run is re-partitioned) before stages copy it, and its result is
    the stream's first. With ``timeout`` it runs on a thread of its own, detached (adopted by
    the context) if it takes longer."""
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
        context.adopt([worker])
        raise RequestTimeoutError(f"stream request 0 did not finish within {timeout} s") from None


def _start_planner(context: StreamContext, compiled: CompiledPlan, pipeline: Pipeline, key: tuple,
                   sample: dict[str, Any], stages: Any, replicas: Any, budget: float | None) -> None:
    """Plan ``key`` on a thread of the session's: once no stream runs (or ``PLAN_WAIT_S``
    passed), then switch ``pipeline`` to it if it still serves."""
    cancelled = context.closed.is_set

    def plan_then_switch() -> None:
        try:
            context.wait_quiet(PLAN_WAIT_S)
            if cancelled():
                return
            plan = compiled.stage_plan(key, lambda: plan_stages(compiled, sample, stages=stages, replicas=replicas,
                                                                budget=budget, cancelled=cancelled))
            if not pipeline.closed.is_set():
                pipeline.switch(plan)
        except PlanningCancelled:
            pass
        except Exception as exc:  # noqa: BLE001 - streams go on with the default plan
            if not cancelled():
                log.warning("stream planner failed (%s); serving on the default plan", exc)
        finally:
            compiled.release()

    compiled.acquire()  # held open for the planner, which outlives the stream's lease
    planner = threading.Thread(target=plan_then_switch, name="edgeinfer-stage-planner", daemon=True)
    context.adopt([planner])
    planner.start()


def stream(context: StreamContext, requests: Iterable[Mapping[str, Any]], *, stages: int | str | None,
           replicas: int | Sequence[int] | str | None, max_in_flight: int | None = None,
           timeout: float | None = None, outputs: Sequence[str] | None = None,
           background: bool = True, plan_budget: float | None = None) -> Iterator[dict[str, np.ndarray]]:
    """The compiled plan of the first request's signature (leased for the stream), its stage
    plan for this choice (planned once and kept), served through a new pipeline. While the
    compiled plan has not run yet, the first request runs on it first (``first_run``), and its
    result is delivered before anything is compiled for the stream (a live source gets it at
    once; the copy compiles while the source readies its next request). With
    ``stages="auto"`` and no measured plan yet the stream serves on the default plan and a
    planner thread measures for the next streams (module doc); ``background=False`` plans
    first. ``plan_budget``: the planner's seconds for this stream (default the context's)."""
    source = iter(requests)
    try:
        first = next(source)
    except StopIteration:
        return
    sample = context.check(first)
    signature = context.signature(sample)
    budget = plan_budget if plan_budget is not None else context.plan_budget
    with context.lease(sample) as compiled, context.running():
        start = 0
        if not compiled.proven:  # delivered before any stage is compiled from the plan it proved
            served = first_run(compiled, sample, timeout, context)
            yield select_outputs({name: served[name] for name in compiled.graph.output_names}, outputs)
            if context.closed.is_set():
                raise SchedulerError("session is closed: expected an open Session, create a new one")
            start = 1
        key = plan_key(stages, replicas, signature)
        plan = compiled.stage_plans.peek(key)
        pending = plan is None and background and plans_in_background(stages, replicas)
        if pending:
            plan = compiled.stage_plan(("default", str(signature)), lambda: default_plan(compiled, sample))
        elif plan is None:
            plan = compiled.stage_plan(key, lambda: plan_stages(compiled, sample, stages=stages, replicas=replicas,
                                                                budget=budget))
        pipeline = Pipeline(plan, max_in_flight=max_in_flight, timeout=timeout)
        context.register(pipeline)
        if pending:
            _start_planner(context, compiled, pipeline, key, sample, stages, replicas, budget)
        rest = source if start else itertools.chain([first], source)
        yield from pipeline.serve(rest, check=context.check, select=lambda r: select_outputs(r, outputs),
                                  start=start)
