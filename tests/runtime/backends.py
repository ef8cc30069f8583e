"""Backends for scheduler tests: engines as if a device existed, and engines that misbehave on
purpose. They implement the public ``Backend`` interface, as a user's own engine would."""

from __future__ import annotations

import threading
import time

import numpy as np

from edgeinfer.backend import Backend, CompileOptions, Executable, get_backend
from edgeinfer.errors import BackendError
from edgeinfer.ir import Graph, Node

FAIL_MARK = 999.0  # a feed whose first element is this makes FaultyBackend raise
SLOW_MARK = 555.0  # ... or sleep for ``FaultyBackend.sleep`` seconds


class RestrictedBackend(Backend):
    """An accelerator that takes only ``ops`` (as an NPU would), running them on ``inner``."""

    def __init__(self, name: str, ops: set[str], inner: str = "onnxruntime", device: str = "npu"):
        self.name, self.ops, self.device = name, set(ops), device
        self.inner = get_backend(inner)

    def supports(self, node: Node, graph: Graph) -> str | None:
        if node.op_type not in self.ops:
            return f"op {node.op_type} is not among the ops this {self.device.upper()} runs"
        return self.inner.supports(node, graph)

    def compile(self, graph: Graph, options: CompileOptions) -> Executable:
        return self.inner.compile(graph, options)


class _FaultyExecutable(Executable):
    def __init__(self, graph: Graph, inner: Executable, owner: FaultyBackend):
        super().__init__(graph)
        self.inner, self.owner = inner, owner
        self.thread_safe = owner.thread_safe
        self.thread_affine = owner.thread_affine
        self.compiled_on = threading.get_ident()
        self.busy = False

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if not self.thread_safe:
            with self.owner._lock:
                if self.busy or (self.thread_affine and threading.get_ident() != self.compiled_on):
                    self.owner.violations += 1  # run twice at once, or off the thread it is bound to
                self.busy = True
        try:
            first = next(iter(feeds.values())).reshape(-1)[:1]
            if first.size and first[0] == FAIL_MARK:
                raise BackendError(f"faulty backend: refusing {self.graph.name!r} on purpose")
            if first.size and first[0] == SLOW_MARK:
                time.sleep(self.owner.sleep)
            elif not self.thread_safe:
                time.sleep(0.001)  # long enough for other callers to arrive while this one runs
            return self.inner.run(feeds)
        finally:
            self.busy = False


class FaultyBackend(Backend):
    """The numpy backend, plus faults on marked feeds, and optionally not thread safe (one call
    at a time, as a TFLite interpreter) and bound to the thread that compiled it (as a GPU
    delegate). Counts compiles and misuse."""

    def __init__(self, name: str = "faulty", *, thread_safe: bool = True, thread_affine: bool = True,
                 ops: set[str] | None = None, sleep: float = 2.0):
        self.name, self.thread_safe, self.ops, self.sleep = name, thread_safe, ops, sleep
        self.thread_affine = thread_affine
        self.inner = get_backend("numpy")
        self.compiles = 0
        self.violations = 0
        self._lock = threading.Lock()

    def supports(self, node: Node, graph: Graph) -> str | None:
        if self.ops is not None and node.op_type not in self.ops:
            return f"op {node.op_type} not taken by the faulty backend"
        return self.inner.supports(node, graph)

    def compile(self, graph: Graph, options: CompileOptions) -> Executable:
        with self._lock:
            self.compiles += 1
        return _FaultyExecutable(graph, self.inner.compile(graph, options), self)


class _RecordingExecutable(Executable):
    def __init__(self, graph: Graph, inner: Executable, owner: RecordingBackend):
        super().__init__(graph)
        self.inner, self.owner = inner, owner
        self.thread_safe = inner.thread_safe

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        start = time.perf_counter()
        time.sleep(self.owner.sleep)  # stands for a kernel that releases the GIL
        results = self.inner.run(feeds)
        with self.owner.lock:
            self.owner.intervals.append((self.graph.name, threading.get_ident(), start, time.perf_counter()))
        return results


class RecordingBackend(Backend):
    """The numpy backend that sleeps ``sleep`` seconds per call and records when each compiled
    graph ran and on which thread: evidence of what overlapped with what."""

    def __init__(self, name: str = "recording", sleep: float = 0.02):
        self.name, self.sleep = name, sleep
        self.inner = get_backend("numpy")
        self.intervals: list[tuple[str, int, float, float]] = []
        self.lock = threading.Lock()

    def supports(self, node: Node, graph: Graph) -> str | None:
        return self.inner.supports(node, graph)

    def compile(self, graph: Graph, options: CompileOptions) -> Executable:
        return _RecordingExecutable(graph, self.inner.compile(graph, options), self)


class _BrokenAtRunExecutable(Executable):
    def __init__(self, graph: Graph, inner: Executable, ops: set[str]):
        super().__init__(graph)
        self.inner, self.ops = inner, ops
        self.thread_safe = inner.thread_safe

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        broken = sorted({n.op_type for n in self.graph.nodes} & self.ops)
        if broken:
            raise BackendError(f"broken engine: no kernel for {broken} at run time")
        return self.inner.run(feeds)


class BrokenAtRunBackend(Backend):
    """Says it supports every op and compiles everything, then fails to run graphs holding any
    of ``ops`` (as an engine whose schema check is looser than its kernels)."""

    def __init__(self, name: str = "broken", ops: set[str] | None = None):
        self.name, self.ops = name, set(ops or ())
        self.inner = get_backend("numpy")

    def supports(self, node: Node, graph: Graph) -> str | None:
        return self.inner.supports(node, graph)

    def compile(self, graph: Graph, options: CompileOptions) -> Executable:
        return _BrokenAtRunExecutable(graph, self.inner.compile(graph, options), self.ops)
