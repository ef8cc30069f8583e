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

import threading
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from edgeinfer.errors import InputError, SchedulerError
from edgeinfer.ir import Graph
from edgeinfer.runtime.futures import settle

if TYPE_CHECKING:
    from concurrent.futures import Future, ThreadPoolExecutor

    from edgeinfer.runtime.parts import CompiledPart


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
        # an output that no part produces is a graph input or a constant
        unproduced = [n for n in self.output_names if n not in produced]
        inits = graph.initializers if unproduced else {}
        self.constant_outputs = {n: inits[n] for n in unproduced if n in inits}
        self.failure: tuple[int, BaseException, dict[str, Any]] | None = None  # see prove()
        keep = set(self.output_names)
        last_reader: dict[str, int] = {}
        for index, part in enumerate(self.parts):
            for name in part.inputs:
                last_reader[name] = index
        self._free: list[list[str]] = [[] for _ in self.parts]  # per part: values no later part reads
        for name, index in last_reader.items():
            if name not in keep:
                self._free[index].append(name)
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
        feeds = {name: env[key] for name, key in self._feed_keys[index]}
        results = part.call_resident(feeds) if part.resident is not None else part.call(feeds)
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

    def prove(self, feeds: dict[str, Any]) -> dict[str, np.ndarray]:
        """A first run: the parts one at a time in order; where one fails, ``failure`` keeps
        (part index, error, its feeds on the host) for the re-partition's probes, and the error
        is raised. Later runs go through ``run``, which keeps nothing of the sort."""
        env = dict(feeds)
        for index, part in enumerate(self.parts):
            try:
                env.update(self._run_part(index, env))
            except InputError:
                raise
            except Exception as exc:
                host = {name: part.to_host(env[key]) for name, key in self._feed_keys[index]}
                self.failure = (index, exc, host)
                raise
            self._drop(env, index)
        return self._results(env)

    def _drop(self, env: dict[Any, Any], index: int) -> None:
        """Drop the values no part after part ``index`` reads (and their other copies)."""
        for name in self._free[index]:
            env.pop(name, None)
            for key in self._extra_keys.get(name, ()):
                env.pop(key, None)

    def close(self) -> None:
        """Close every part's compiled executables (and, for the DAG executor, stop its threads)."""
        self._close_parts()

    def _close_parts(self) -> None:
        self.run = self._closed_run
        for part in self.parts:
            part.close()

    def _closed_run(self, feeds: dict[str, Any]) -> dict[str, Any]:
        raise SchedulerError(f"the runner of {self.graph.name!r} is closed: its session or plan was closed")


class SequentialExecutor(PlanRunner):
    """Parts one after the other; each value is dropped after its last reader.

    ``run`` is chosen once, at construction: where one part is the whole graph and returns its
    outputs in the graph's order, it is that part's ``call`` (a thread-safe executable's own
    ``run``: nothing of the runtime between the caller and the engine); else a loop over the
    parts that picks each part's inputs and frees values after their last reader."""

    def __init__(self, graph: Graph, parts: Sequence[CompiledPart]):
        super().__init__(graph, parts)
        self._steps = [(part, part.inputs, free) for part, free in zip(self.parts, self._free)]
        single = self.parts[0] if len(self.parts) == 1 else None
        whole = single is not None and list(single.outputs) == list(self.output_names) and \
            len(set(self.output_names)) == len(self.output_names) and \
            set(single.inputs) == set(graph.input_names) and single.resident is None
        if whole:
            self.run = single.call  # checked feeds are exactly its inputs
        elif self.resident:
            self.run = self._run_resident
        else:
            self.run = self._run_host

    def _run_host(self, feeds: dict[str, Any]) -> dict[str, np.ndarray]:
        env = {**self.constant_outputs, **feeds}
        for part, inputs, free in self._steps:
            env.update(part.call(dict(zip(inputs, map(env.__getitem__, inputs)))))
            for name in free:
                env.pop(name, None)
        names = self.output_names
        return dict(zip(names, map(env.__getitem__, names)))

    def _run_resident(self, feeds: dict[str, Any]) -> dict[str, np.ndarray]:
        env = dict(feeds)
        for index in range(len(self.parts)):
            env.update(self._run_part(index, env))
            self._drop(env, index)
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
        import queue  # here: a model loaded to answer once runs no DAG

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
            from concurrent.futures import Future, ThreadPoolExecutor

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
