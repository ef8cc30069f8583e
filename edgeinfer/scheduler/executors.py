"""Executors for single requests: sequential, and DAG-parallel over a thread pool.

Both take compiled parts (``CompiledPart``: a subgraph and its backend's executable) in a
topological order. Values crossing parts live in a per-request dict; nothing is shared
between requests, so ``run`` may be called from many threads at once.

The DAG executor is a dependency engine (MXNet's threaded engine, TBB's flow graph): each
part counts the parts it waits for; a finished part decrements its consumers' counts and the
ones reaching zero are handed to the pool; the worker keeps one of them for itself, so a chain
of parts does not bounce between threads. A part never waits inside a worker.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import Future, InvalidStateError, ThreadPoolExecutor
from typing import Any

import numpy as np

from edgeinfer.backend import Backend, CompileOptions, Executable
from edgeinfer.errors import SchedulerError
from edgeinfer.ir import Graph
from edgeinfer.scheduler.partition import Part


def settle(future: Future, *, result: Any = None, error: BaseException | None = None) -> None:
    """Complete ``future`` unless it is already done (closing and finishing may race)."""
    try:
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)
    except InvalidStateError:
        pass


class CompiledPart:
    """A part compiled on its backend. An executable that is not thread safe (a TFLite
    interpreter) is compiled once per calling thread, lazily; a thread-safe one is shared."""

    def __init__(self, part: Part, backend: Backend, options: CompileOptions):
        self.part = part
        self.backend = backend
        self.options = options
        first = backend.compile(part.graph, options)
        self.thread_safe = first.thread_safe
        self.executables: list[Executable] = [first]
        self._lock = threading.Lock()
        self._local = threading.local()
        self._local.executable = first
        self.inputs = part.inputs
        self.outputs = part.outputs

    def executable(self) -> Executable:
        if self.thread_safe:
            return self.executables[0]
        executable = getattr(self._local, "executable", None)
        if executable is None:
            executable = self.backend.compile(self.part.graph, self.options)
            with self._lock:
                self.executables.append(executable)
            self._local.executable = executable
        return executable

    def run(self, env: dict[str, Any]) -> dict[str, np.ndarray]:
        return self.executable().run({name: env[name] for name in self.inputs})


class PlanRunner:
    """What both executors share: the graph's boundary and the constants it outputs."""

    def __init__(self, graph: Graph, parts: Sequence[CompiledPart]):
        self.graph = graph
        self.parts = list(parts)
        self.output_names = graph.output_names
        produced = {o for p in self.parts for o in p.outputs}
        inits = graph.initializers
        # an output that no part produces is a graph input or a constant
        self.constant_outputs = {n: inits[n] for n in self.output_names if n not in produced and n in inits}

    def _results(self, env: dict[str, Any]) -> dict[str, np.ndarray]:
        return {name: env[name] if name in env else self.constant_outputs[name] for name in self.output_names}

    def close(self) -> None:
        """Release worker threads (none for the sequential executor)."""


class SequentialExecutor(PlanRunner):
    """Parts one after the other; each value is dropped after its last reader."""

    def __init__(self, graph: Graph, parts: Sequence[CompiledPart]):
        super().__init__(graph, parts)
        keep = set(self.output_names)
        last_reader: dict[str, int] = {}
        for index, part in enumerate(self.parts):
            for name in part.inputs:
                last_reader[name] = index
        self._free: list[list[str]] = [[] for _ in self.parts]
        for name, index in last_reader.items():
            if name not in keep:
                self._free[index].append(name)
        single = self.parts[0] if len(self.parts) == 1 else None
        self._direct = single is not None and set(single.outputs) == set(self.output_names) and \
            set(single.inputs) == set(graph.input_names) and not self.constant_outputs

    def run(self, feeds: dict[str, Any]) -> dict[str, np.ndarray]:
        if self._direct:  # one part that is the whole graph: no bookkeeping at all
            results = self.parts[0].run(feeds)
            return {name: results[name] for name in self.output_names}
        env = dict(feeds)
        for part, free in zip(self.parts, self._free):
            env.update(part.run(env))
            for name in free:
                env.pop(name, None)
        return self._results(env)


class _Request:
    __slots__ = ("env", "pending", "remaining", "lock", "future", "failed")

    def __init__(self, feeds: dict[str, Any], counts: list[int]):
        self.env = dict(feeds)
        self.pending = list(counts)
        self.remaining = len(counts)
        self.lock = threading.Lock()
        self.future: Future = Future()
        self.failed = False


class DagExecutor(PlanRunner):
    """Independent parts run at the same time on ``workers`` threads."""

    def __init__(self, graph: Graph, parts: Sequence[CompiledPart], workers: int):
        super().__init__(graph, parts)
        producer = {name: index for index, part in enumerate(self.parts) for name in part.outputs}
        self._waits_for = [sorted({producer[n] for n in part.inputs if n in producer}) for part in self.parts]
        self._consumers: list[list[int]] = [[] for _ in self.parts]
        for index, deps in enumerate(self._waits_for):
            for dep in deps:
                self._consumers[dep].append(index)
        self._counts = [len(deps) for deps in self._waits_for]
        self._roots = [i for i, count in enumerate(self._counts) if count == 0]
        self.workers = workers
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="edgeinfer-dag")
        self._closed = False
        self._inflight: set[_Request] = set()
        self._inflight_lock = threading.Lock()

    def submit(self, feeds: dict[str, Any]) -> Future:
        if self._closed:
            raise SchedulerError("DAG executor: submit after close(); create a new Session")
        request = _Request(feeds, self._counts)
        if not self.parts:
            request.future.set_result(self._results(request.env))
            return request.future
        with self._inflight_lock:
            self._inflight.add(request)
        request.future.add_done_callback(lambda _: self._forget(request))
        for index in self._roots:
            self._pool.submit(self._work, request, index)
        return request.future

    def run(self, feeds: dict[str, Any]) -> dict[str, np.ndarray]:
        return self.submit(feeds).result()

    def _work(self, request: _Request, index: int) -> None:
        while index is not None:
            if request.failed:
                return
            try:
                results = self.parts[index].run(request.env)
            except BaseException as exc:  # reaches the caller through the future
                with request.lock:
                    if request.failed:
                        return
                    request.failed = True
                settle(request.future, error=exc)
                return
            ready = []
            with request.lock:
                request.env.update(results)
                request.remaining -= 1
                finished = request.remaining == 0
                for consumer in self._consumers[index]:
                    request.pending[consumer] -= 1
                    if request.pending[consumer] == 0:
                        ready.append(consumer)
            if finished:
                settle(request.future, result=self._results(request.env))
                return
            index = ready.pop(0) if ready else None
            for other in ready:  # the rest go to idle workers; this one continues the chain
                self._pool.submit(self._work, request, other)

    def _forget(self, request: _Request) -> None:
        with self._inflight_lock:
            self._inflight.discard(request)

    def close(self) -> None:
        """Stop the workers; requests still in flight fail with ``SchedulerError``."""
        if self._closed:
            return
        self._closed = True
        self._pool.shutdown(wait=True, cancel_futures=True)
        with self._inflight_lock:
            left = list(self._inflight)
        for request in left:
            request.failed = True
            settle(request.future, error=SchedulerError("DAG executor closed while the request ran"))
