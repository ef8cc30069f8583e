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
is detached (its result dropped) and joined only when its session closes. ``switch`` moves
a running stream to another stage plan (the planner's) between requests.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import numpy as np

from edgeinfer.errors import BackendError, RequestTimeoutError, SchedulerError
from edgeinfer.runtime.stream.stages import StagePlan

_STOP = None  # one per worker: the worker that takes it exits
_END = object()  # the intake's last word: how many requests it admitted
_ADMITTED = object()  # a request entered the pipeline (its timeout clock runs)
_CLOSED = object()  # close() wakes a consumer waiting for a result
DETACH_WAIT_S = 0.01  # how long close() waits for a busy worker before detaching it


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

    def busy(self) -> bool:
        """Whether a request is admitted and not yet delivered."""
        return bool(self._started)

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
