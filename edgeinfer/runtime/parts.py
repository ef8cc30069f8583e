"""Compiled parts: the runtime's one call of ``Backend.compile`` and what holds its result.

- ``engine_compile``: the one call of ``Backend.compile``, so a compile policy (threads, what a
  failure becomes, caching) is one edit. Parts, their extra copies, the re-partition's probes
  and the stream planner's per-node profile all compile through it.
- ``CompiledPart``: a part compiled on its backend, with the copies a non-thread-safe engine
  needs (``call`` is the executable's own ``run`` where one copy serves every thread).
"""

from __future__ import annotations

import threading
import weakref
from typing import TYPE_CHECKING, Any

import numpy as np

from edgeinfer.backend import Backend, CompileOptions, Executable
from edgeinfer.errors import BackendError, SchedulerError, first_line
from edgeinfer.ir import Graph
from edgeinfer.log import get_logger

if TYPE_CHECKING:
    from edgeinfer.runtime.partition import Part

log = get_logger("edgeinfer.runtime.parts")


def engine_compile(backend: Backend, graph: Graph, options: CompileOptions) -> Executable:
    """``backend`` compiles ``graph``: the runtime's only call of ``Backend.compile``. An
    ahead-of-time artifact that fails to build is said once and the graph compiled from the IR."""
    if options.artifact is not None and graph.nodes:  # a node-less stand-in (aot.build_lean) has no IR to fall to
        try:
            return backend.compile(graph, options)
        except Exception as exc:  # noqa: BLE001 - any failure of a stored artifact: the IR is the truth
            log.warning("%s: the ahead-of-time artifact of graph %r failed (%s); compiled from the IR instead",
                        backend.name, graph.name, first_line(exc, 300))
            options = options.replace(artifact=None)
    return backend.compile(graph, options)


def close_executable(executable: Any) -> None:
    close = getattr(executable, "close", None)
    if close is not None:
        close()


class PartCompileError(BackendError):
    """A part's backend could not compile it (``part``: the part, ``cause``: the engine's error)."""

    def __init__(self, part: Part, cause: BaseException):
        super().__init__(f"{part.backend} could not compile {len(part.nodes)} node(s) of "
                         f"{part.graph.name!r}: {first_line(cause) if str(cause) else type(cause).__name__}")
        self.part = part
        self.cause = cause


class CompiledPart:
    """A part compiled on its backend; ``call(feeds)`` runs it (host arrays in and out) and
    ``call_resident(feeds)`` with values left on its device (``Executable.resident``).

    A thread-safe executable serves every thread: ``call`` is its own ``run``, no layer between.
    One that is not runs one call at a time: if it may move between threads
    (``thread_affine=False``) the part lends idle copies to callers and compiles another only
    when all are busy, so streams that come and go reuse them; if it is bound to the thread
    that compiled it, each calling thread compiles its own, freed when the thread ends."""

    def __init__(self, part: Part, backend: Backend, options: CompileOptions):
        self.part = part
        self.backend = backend
        self.options = options
        try:
            first = engine_compile(backend, part.graph, options)
        except Exception as exc:  # noqa: BLE001 - ``compile`` re-partitions or raises it
            raise PartCompileError(part, exc) from exc
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
        if self.thread_safe:
            self.call, self.call_resident = first.run, first.run_resident
        elif self.thread_affine:
            self.call, self.call_resident = self._bound_run, self._bound_run_resident
        else:
            self.call, self.call_resident = self._lent_run, self._lent_run_resident

    def executable(self) -> Executable:
        """The executable this thread would run now (thread safe: the shared one)."""
        if not self.thread_affine:  # thread safe, or lent to any thread
            return self.first
        return self._bound()

    def run(self, env: dict[str, Any]) -> dict[str, Any]:
        """Run on the part's inputs picked from ``env``: numpy in, numpy out."""
        inputs = self.inputs
        return self.call(dict(zip(inputs, map(env.__getitem__, inputs))))

    def from_host(self, value: Any) -> Any:
        """A host array as a value of this part's family on its device (``Executable.from_host``)."""
        return self.first.from_host(value)

    def to_host(self, value: Any) -> Any:
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
            close_executable(executable)
        self.call = self.call_resident = self._closed_run
        self.first = None
        self._local = threading.local()

    def _closed_run(self, feeds: dict[str, Any]) -> dict[str, Any]:
        raise SchedulerError(f"part {self.part.graph.name!r} is closed: its session or plan was closed")

    def _bound(self) -> Executable:
        executable = getattr(self._local, "executable", None)
        if executable is None:
            executable = self._another()
            self._local.executable = executable
        return executable

    def _another(self) -> Executable:
        if self.closed:
            self._closed_run({})
        executable = engine_compile(self.backend, self.part.graph, self.options)
        with self._lock:
            self.compiled += 1
            self._all.add(executable)
        return executable

    def _bound_run(self, feeds: dict[str, Any]) -> dict[str, Any]:
        return self._bound().run(feeds)

    def _bound_run_resident(self, feeds: dict[str, Any]) -> dict[str, Any]:
        return self._bound().run_resident(feeds)

    def _lent_run(self, feeds: dict[str, Any], resident: bool = False) -> dict[str, Any]:
        with self._lock:
            executable = self._idle.pop() if self._idle else None
        if executable is None:
            executable = self._another()
        try:
            return executable.run_resident(feeds) if resident else executable.run(feeds)
        finally:
            with self._lock:
                self._idle.append(executable)

    def _lent_run_resident(self, feeds: dict[str, Any]) -> dict[str, Any]:
        return self._lent_run(feeds, resident=True)
