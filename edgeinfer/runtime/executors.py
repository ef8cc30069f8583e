"""Executors for single requests: sequential, and DAG-parallel over a thread pool.

Both take compiled parts (``CompiledPart``: a subgraph and its backend's executable) in a
topological order. Values crossing parts live in a per-request dict; nothing is shared
between requests, so ``run`` may be called from many threads at once. Between two parts
whose executables keep values on their device (``Executable.resident``: the torch backend)
the values stay there; a value read on the host is copied once (``PlanRunner``).

The DAG executor is a dependency engine (MXNet's threaded engine, TBB's flow graph): each
part counts the parts it waits for; a finished part decrements its consumers' counts and the
ones reaching zero become ready. The calling thread works through its own request (as a TBB
task arena's master thread does) and helpers join in at forks; a thread that finishes a part
keeps one of the parts it made ready, so a chain of parts does not bounce between threads.
"""

from __future__ import annotations

import queue
import threading
import weakref
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future, InvalidStateError, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import numpy as np

from edgeinfer.backend import Backend, CompileOptions, Executable
from edgeinfer.errors import BackendError, SchedulerError
from edgeinfer.ir import Graph

if TYPE_CHECKING:
    from edgeinfer.runtime.partition import Part


class PartCompileError(BackendError):
    """A part's backend could not compile it (``part``: the part, ``cause``: the engine's error)."""

    def __init__(self, part: Part, cause: BaseException):
        super().__init__(f"{part.backend} could not compile {len(part.nodes)} node(s) of "
                         f"{part.graph.name!r}: {str(cause).splitlines()[0] if str(cause) else type(cause).__name__}")
        self.part = part
        self.cause = cause


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
    """A part compiled on its backend. A thread-safe executable is shared. One that is not runs
    one call at a time: if it may move between threads (``thread_affine=False``, a TFLite
    interpreter on the CPU) the part lends idle copies to callers and compiles another only
    when all are busy, so streams that come and go reuse them; if it is bound to the thread
    that compiled it, each calling thread compiles its own, freed when the thread ends."""

    def __init__(self, part: Part, backend: Backend, options: CompileOptions):
        self.part = part
        self.backend = backend
        self.options = options
        try:
            first = backend.compile(part.graph, options)
        except Exception as exc:  # noqa: BLE001 - the owner re-partitions or raises it
            raise PartCompileError(part, exc) from exc
        self.proven = False  # a run has succeeded: later failures belong to their request
        self.failure: tuple[BaseException, dict[str, Any]] | None = None  # the first run's error, feeds
        self._all: weakref.WeakSet[Executable] = weakref.WeakSet()  # every copy alive, to close
        self._all.add(first)
        self.closed = False
        self.thread_safe = first.thread_safe
        self.thread_affine = not first.thread_safe and first.thread_affine
        self.first = first
        self.compiled = 1  # executables compiled so far (the idle pool and thread-bound ones)
        self._lock = threading.Lock()
        self._idle: list[Executable] = [first]
        self._local = threading.local()
        self._local.executable = first
        self.inputs = part.inputs
        self.outputs = part.outputs
        self.resident: str | None = getattr(first, "resident", None)  # see Executable.resident

    def executable(self) -> Executable:
        """The executable this thread would run now (thread safe: the shared one)."""
        if not self.thread_affine:  # thread safe, or lent to any thread
            return self.first
        return self._bound()

    def _bound(self) -> Executable:
        executable = getattr(self._local, "executable", None)
        if executable is None:
            executable = self._compile()
            self._local.executable = executable
        return executable

    def _compile(self) -> Executable:
        if self.closed:
            raise SchedulerError(f"part {self.part.graph.name!r} is closed: its session or plan was closed")
        executable = self.backend.compile(self.part.graph, self.options)
        with self._lock:
            self.compiled += 1
            self._all.add(executable)
        return executable

    def run(self, env: dict[str, Any]) -> dict[str, np.ndarray]:
        """Run on the part's inputs picked from ``env``: numpy in, numpy out."""
        return self.call({name: env[name] for name in self.inputs})

    def call(self, feeds: dict[str, Any], resident: bool = False) -> dict[str, Any]:
        """Run on ``feeds``; with ``resident`` through ``Executable.run_resident`` (values of
        this part's family in and out, left on its device)."""
        if self.proven:
            return self._run(feeds, resident)
        try:
            results = self._run(feeds, resident)
        except Exception as exc:
            if not self.proven and self.failure is None:  # kept for the re-partition's probes: on the host
                self.failure = (exc, {name: self.to_host(value) for name, value in feeds.items()})
            raise
        self.proven = True
        return results

    def from_host(self, value: Any) -> Any:
        """A host array as a value of this part's family on its device (``Executable.from_host``)."""
        return self.first.from_host(value)

    def to_host(self, value: Any) -> np.ndarray:
        """One of this part's device-resident values (or a host array) as a numpy array."""
        if self.resident is None or isinstance(value, (np.ndarray, np.generic)):
            return value
        return self.first.to_host(value)

    def close(self) -> None:
        """Close every compiled copy (the shared one, idle ones, thread-bound ones still alive)."""
        with self._lock:
            self.closed = True
            copies = list(self._all)
            self._all = weakref.WeakSet()
            self._idle = []
        for executable in copies:
            close = getattr(executable, "close", None)
            if close is not None:
                close()
        self.first = None
        self._local = threading.local()

    def _run(self, feeds: dict[str, Any], resident: bool = False) -> dict[str, Any]:
        if self.closed:
            raise SchedulerError(f"part {self.part.graph.name!r} is closed: its session or plan was closed")
        if self.thread_safe:
            executable = self.first
            return executable.run_resident(feeds) if resident else executable.run(feeds)
        if self.thread_affine:
            executable = self._bound()
            return executable.run_resident(feeds) if resident else executable.run(feeds)
        with self._lock:
            executable = self._idle.pop() if self._idle else None
        if executable is None:
            executable = self._compile()
        try:
            return executable.run_resident(feeds) if resident else executable.run(feeds)
        finally:
            with self._lock:
                self._idle.append(executable)


def host_key(name: str) -> tuple[str, str]:
    """Where a request's values keep the host copy of a device-resident value ``name`` that
    parts of its own family read too (they read the device value under ``name``)."""
    return ("host", name)


class PlanRunner:
    """What both executors share: the graph's boundary, the constants it outputs, and how
    values pass between parts.

    Values of parts whose executables are ``resident`` (torch) stay on their device while the
    parts reading them are of the same family; a value that a part of another family (numpy,
    onnxruntime) or the caller reads is copied to the host once, right after the part that
    made it ran (``host_copies``), whoever reads it after. A host value (a graph input, a host
    part's output) that several parts of one resident backend read is copied to that device
    once, by the first of them to run (``Executable.from_host``; pinned memory on CUDA), and
    the others read that copy."""

    def __init__(self, graph: Graph, parts: Sequence[CompiledPart]):
        self.graph = graph
        self.parts = list(parts)
        self.output_names = graph.output_names
        produced = {o for p in self.parts for o in p.outputs}
        inits = graph.initializers
        # an output that no part produces is a graph input or a constant
        self.constant_outputs = {n: inits[n] for n in self.output_names if n not in produced and n in inits}
        self._plan_handoffs()

    def _plan_handoffs(self) -> None:
        families = [part.resident for part in self.parts]
        self.resident = any(family is not None for family in families)
        self.host_copies: list[list[str]] = [[] for _ in self.parts]  # per part: outputs copied to the host
        self._both: set[str] = set()  # values kept on the device and on the host
        self._feed_keys: list[list[tuple[str, Any]]] = [[(n, n) for n in part.inputs] for part in self.parts]
        self._output_keys = {name: name for name in self.output_names}
        self._extra_keys: dict[str, list[Any]] = {}  # value -> the keys of its other copies in a request
        self._device_copies: list[list[tuple[str, Any]]] = [[] for _ in self.parts]  # (value, key) per part
        if not self.resident:
            return
        readers: dict[str, set[str | None]] = {name: {None} for name in self.output_names}  # None: the host
        for part, family in zip(self.parts, families):
            for name in part.inputs:
                readers.setdefault(name, set()).add(family)
        producer_family: dict[str, str | None] = {}
        for index, (part, family) in enumerate(zip(self.parts, families)):
            for name in part.outputs:
                producer_family[name] = family
                read_by = readers.get(name, set())
                if family is None or read_by <= {family}:
                    continue
                self.host_copies[index].append(name)
                if family in read_by:
                    self._both.add(name)
        for part, family, keys in zip(self.parts, families, self._feed_keys):
            keys[:] = [(n, host_key(n) if n in self._both and producer_family[n] != family else n)
                       for n in part.inputs]
        self._output_keys = {n: host_key(n) if n in self._both else n for n in self.output_names}
        for name in self._both:
            self._extra_keys[name] = [host_key(name)]
        self._share_device_copies(families, producer_family)

    def _share_device_copies(self, families: list[str | None], producer_family: dict[str, str | None]) -> None:
        """Host values read by several parts of one resident backend: one device copy for all."""
        groups: dict[tuple[str, str], list[int]] = {}
        for index, (part, family) in enumerate(zip(self.parts, families)):
            if family is None:
                continue
            for name in part.inputs:
                if producer_family.get(name) is None:
                    groups.setdefault((name, part.part.backend), []).append(index)
        for (name, backend), readers in groups.items():
            if len(readers) < 2:
                continue
            key = ("device", backend, name)
            self._extra_keys.setdefault(name, []).append(key)
            for index in readers:
                self._device_copies[index].append((name, key))
                self._feed_keys[index] = [(n, key if n == name else k) for n, k in self._feed_keys[index]]

    def _run_part(self, index: int, env: dict[Any, Any]) -> dict[Any, Any]:
        """Run part ``index`` on its inputs in ``env``; the values to add to ``env``."""
        part = self.parts[index]
        if not self.resident:
            return part.run(env)
        for name, key in self._device_copies[index]:
            if key not in env:  # the first reader to run copies it (two DAG branches at once: both may)
                env[key] = part.from_host(env[name])
        results = part.call({name: env[key] for name, key in self._feed_keys[index]}, resident=part.resident is not None)
        for name in self.host_copies[index]:
            host = part.to_host(results[name])
            if name in self._both:
                results[host_key(name)] = host
            else:
                results[name] = host
        return results

    def _results(self, env: dict[Any, Any]) -> dict[str, np.ndarray]:
        keys = self._output_keys
        return {name: env[keys[name]] if keys[name] in env else self.constant_outputs[name]
                for name in self.output_names}

    def close(self) -> None:
        """Close every part's compiled executables (and, for the DAG executor, stop its threads)."""
        self._close_parts()

    def _close_parts(self) -> None:
        for part in self.parts:
            part.close()


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
        self._same_order = self._direct and list(single.outputs) == list(self.output_names)

    def direct_call(self) -> Any:
        """The executable's own ``run`` when it alone serves checked feeds as this runner would:
        one part that is the whole graph, outputs in graph order (no duplicates), a thread-safe
        host executable that has run once. None otherwise (or before its first run)."""
        if not self._same_order or len(set(self.output_names)) != len(self.output_names):
            return None
        part = self.parts[0]
        if not (part.proven and part.thread_safe) or part.resident is not None or part.closed:
            return None
        return part.first.run

    def run(self, feeds: dict[str, Any]) -> dict[str, np.ndarray]:
        if self._direct:  # one part that is the whole graph: no bookkeeping at all
            part = self.parts[0]
            if len(feeds) == len(part.inputs):  # exactly its inputs (checked feeds): no copy
                results = part.call(feeds)
            else:
                results = part.run(feeds)
            if self._same_order and len(results) == len(self.output_names):
                return results
            return {name: results[name] for name in self.output_names}
        env = dict(feeds)
        if not self.resident:
            for part, free in zip(self.parts, self._free):
                env.update(part.run(env))
                for name in free:
                    env.pop(name, None)
            return self._results(env)
        for index, free in enumerate(self._free):
            env.update(self._run_part(index, env))
            for name in free:
                env.pop(name, None)
                for key in self._extra_keys.get(name, ()):
                    env.pop(key, None)
        return self._results(env)


class _Run:
    """One request through the DAG: its values, what each part still waits for, how many parts
    still read each value, the parts ready to run, and the first error. ``cond`` guards all of it."""

    __slots__ = ("env", "pending", "readers", "remaining", "ready", "cond", "error")

    def __init__(self, feeds: dict[str, Any], counts: list[int], roots: list[int], readers: dict[str, int]):
        self.env = dict(feeds)
        self.pending = list(counts)
        self.readers = dict(readers)
        self.remaining = len(counts)
        self.ready: deque[int] = deque(roots)
        self.cond = threading.Condition(threading.Lock())
        self.error: BaseException | None = None


class DagExecutor(PlanRunner):
    """Independent parts run at the same time: the calling thread and ``workers - 1`` helpers.

    The caller drives its own request: it runs ready parts itself and sleeps only while every
    ready part is taken and the ones it waits for are still running. When a finished part makes
    more than one part ready, the extra ones are offered to the helpers (one wake-up each);
    a helper runs ready parts of that request until there are none, then goes back to waiting.
    So a chain of parts never changes thread, a request with no branches costs no hand-off,
    and a fork costs one wake-up. ``submit`` drives the request from a thread of its own."""

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
        # values dropped once the last part reading them is done (graph outputs are kept), so a
        # request holds no more activations than the parts in flight need, as in SequentialExecutor
        keep = set(self.output_names)
        self._readers: dict[str, int] = {}
        for part in self.parts:
            for name in part.inputs:
                if name not in keep:
                    self._readers[name] = self._readers.get(name, 0) + 1
        self.workers = workers
        self._offers: queue.SimpleQueue[_Run | None] = queue.SimpleQueue()
        self._helpers = [threading.Thread(target=self._serve, name=f"edgeinfer-dag-{i}", daemon=True)
                         for i in range(workers - 1)]
        for helper in self._helpers:
            helper.start()
        self._async: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._closed = False
        self._inflight: set[Future] = set()

    def run(self, feeds: dict[str, Any]) -> dict[str, np.ndarray]:
        if self._closed:
            raise SchedulerError("DAG executor: run after close(); create a new Session")
        run = _Run(feeds, self._counts, self._roots, self._readers)
        self._offer(run, len(run.ready) - 1)
        self._drive(run, owner=True)
        if run.error is not None:
            raise run.error
        return self._results(run.env)

    def submit(self, feeds: dict[str, Any]) -> Future:
        with self._lock:
            if self._closed:
                raise SchedulerError("DAG executor: submit after close(); create a new Session")
            if self._async is None:
                self._async = ThreadPoolExecutor(max_workers=max(1, self.workers - 1),
                                                 thread_name_prefix="edgeinfer-dag-async")
            future: Future = Future()
            self._inflight.add(future)
        future.add_done_callback(self._forget)
        self._async.submit(self._run_into, future, feeds)
        return future

    def _run_into(self, future: Future, feeds: dict[str, Any]) -> None:
        if not future.set_running_or_notify_cancel():
            return
        try:
            settle(future, result=self.run(feeds))
        except BaseException as exc:  # reaches the caller through the future
            settle(future, error=exc)

    def _forget(self, future: Future) -> None:
        with self._lock:
            self._inflight.discard(future)

    def _offer(self, run: _Run, count: int) -> None:
        """Wake up to ``count`` helpers for ``run`` (a helper that finds nothing left returns)."""
        for _ in range(min(count, len(self._helpers))):
            self._offers.put(run)

    def _serve(self) -> None:
        while True:
            run = self._offers.get()
            if run is None:
                return
            self._drive(run, owner=False)

    def _drive(self, run: _Run, *, owner: bool) -> None:
        """Run ready parts of ``run`` until it is finished (the owner) or none is ready (a helper)."""
        cond = run.cond
        while True:
            with cond:
                while not run.ready:
                    if not owner or run.remaining == 0 or run.error is not None:
                        return
                    cond.wait()
                if run.error is not None:
                    return
                index = run.ready.popleft()
            try:
                results = self._run_part(index, run.env)
            except BaseException as exc:  # the owner raises it
                with cond:
                    if run.error is None:
                        run.error = exc
                    run.ready.clear()
                    cond.notify_all()
                return
            with cond:
                run.env.update(results)
                for name in self.parts[index].inputs:
                    left = run.readers.get(name)
                    if left is not None:
                        if left == 1:
                            del run.readers[name]
                            run.env.pop(name, None)
                            for key in self._extra_keys.get(name, ()):
                                run.env.pop(key, None)
                        else:
                            run.readers[name] = left - 1
                run.remaining -= 1
                newly = 0
                for consumer in self._consumers[index]:
                    run.pending[consumer] -= 1
                    if run.pending[consumer] == 0:
                        run.ready.append(consumer)
                        newly += 1
                if newly or run.remaining == 0:
                    cond.notify_all()  # the owner may be waiting for these
                extra = len(run.ready) - 1  # this thread takes one of them next
            if extra > 0:
                self._offer(run, extra)

    def close(self) -> None:
        """Stop the helpers once their current part is done. A run in progress finishes on its
        caller's thread; async requests not started yet fail with ``SchedulerError``."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            pool = self._async
        for _ in self._helpers:
            self._offers.put(None)
        for helper in self._helpers:
            helper.join()
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            left = list(self._inflight)
        for future in left:
            settle(future, error=SchedulerError("DAG executor closed before the request ran"))
        self._close_parts()
