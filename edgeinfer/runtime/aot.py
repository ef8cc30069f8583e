"""Ahead of time: decide and build before deployment what a Session does before its first result.

``aot_compile.compile_model`` (``ei.compile``, ``edgeinfer compile``) writes the model, opens a Session on it
(``backend="auto"`` measured here), and stores in the ``.eim`` the plan it chose (the backend of
every node) and, for each part, the engine-ready artifact its backend makes
(``Executable.artifact``: onnxruntime's model bytes with the weights left in the file, a TFLite
flatbuffer). ``build_compiled`` is the other end: a Session on such a file (``backend`` left
out) partitions by the stored plan without asking any backend's claim, creates only the
engines the plan names (numpy's reference only if a part needs it), and builds each part from
its artifact. An artifact is used only where the section is bound to this IR (its digest,
checked at load), the engine's version and the CPU are the ones it was made for, and its bytes
have their recorded SHA-256; otherwise that part compiles from the IR, with one warning line.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

from edgeinfer.backend import Artifact, Backend
from edgeinfer.errors import EdgeInferError, ModelFormatError
from edgeinfer.log import get_logger
from edgeinfer.machine import machine_key
from edgeinfer.model import Model, TensorInfo
from edgeinfer.runtime.write_back import DEFERRED_KEY, deferred_spec, write_back  # noqa: F401 - the Session's

log = get_logger("edgeinfer.runtime.aot")


def section_for(backend: Any, executor: str, model: Any) -> Any:
    """The model's compiled section if a Session asking for ``backend`` and ``executor`` runs it:
    ``backend`` left out (None), ``"auto"`` on a section auto decided, or the same backends."""
    section = getattr(model, "compiled", None)
    if section is None or executor not in ("sequential", section.executor):
        return None
    if backend is None or (backend == "auto" and section.auto is not None):
        return section
    names = [backend] if isinstance(backend, str) else list(backend) if isinstance(backend, (list, tuple)) else None
    if names is not None and all(isinstance(n, str) for n in names):
        wanted = [n for n in names if n != "numpy"]
        if wanted == [n for n in section.backends if n != "numpy"]:
            return section
    return None


class OnDemand(Backend):
    """A backend created the first time it is asked anything: the numpy reference of a compiled
    plan, needed only if a part must move (its module imports every kernel, and onnx)."""

    def __init__(self, name: str, make: Callable[[], Backend]):
        self.name = name
        self._make = make
        self._backend: Backend | None = None

    def _get(self) -> Backend:
        if self._backend is None:
            self._backend = self._make()
        return self._backend

    def supports(self, node: Any, graph: Any) -> str | None:
        return self._get().supports(node, graph)

    def claim(self, graph: Any) -> dict[int, str]:
        return self._get().claim(graph)

    def compile(self, graph: Any, options: Any) -> Any:
        return self._get().compile(graph, options)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._get(), name)


class LazyModel(Model):
    """A compiled ``.eim``'s model, read without its graph (``format.lean``): inputs, outputs,
    metadata and the compiled section are there at once; ``graph`` is loaded the first time
    something asks for it (a describe, a stream, a part that must compile from the IR)."""

    def __init__(self, file: Any):
        self.file = file
        self.metadata = dict(file.metadata)
        self.compiled = file.section
        self._graph = None
        self._lock = threading.Lock()

    @property
    def loaded(self) -> bool:
        return self._graph is not None

    @property
    def graph(self) -> Any:
        if self._graph is None:
            with self._lock:
                if self._graph is None:
                    from edgeinfer.format.eim import load_model

                    full = load_model(self.file.source)
                    if full.compiled is None or full.compiled.digest != self.compiled.digest:
                        raise ModelFormatError(f"{self.file.source}: the file changed since it was opened: expected "
                                               "the compiled model it held")
                    self._graph = full.graph
        return self._graph

    @property
    def inputs(self) -> list[TensorInfo]:
        return [TensorInfo(v.name, v.dtype, v.shape) for v in self.file.inputs]

    @property
    def outputs(self) -> list[TensorInfo]:
        return [TensorInfo(v.name, v.dtype, v.shape) for v in self.file.outputs]


def resolve(model: Any, backend: Any, executor: str, threads: int | None) -> tuple[Model, Any, Any, str, int | None]:
    """What a Session asking for ``backend``, ``executor`` and ``threads`` runs: (model, the compiled
    section it runs or None, backend, executor, threads). ``backend=None``: a compiled file's own plan,
    a file left to be compiled on the device its deferred backend (``write_back``), else numpy."""
    path = None if isinstance(model, Model) else model
    if path is not None:
        model = open_model(path, backend, executor)
    if backend is None and DEFERRED_KEY in model.metadata:  # decided here; its plan written back to ``path``
        spec = deferred_spec(model)
        backend, threads = spec["backend"], spec["threads"] if threads is None else threads
        model.on_device = None if path is None else os.fspath(path)
    section = section_for(backend, executor, model)
    if section is not None:
        return model, section, section.backends, section.executor, threads
    return model, None, "numpy" if backend is None else backend, executor, threads


def open_model(path: str | os.PathLike, backend: Any, executor: str) -> Model:
    """The model at ``path`` for a Session asking for ``backend``: a compiled ``.eim`` whose plan
    it runs is read without its graph (``LazyModel``); anything else is loaded or converted."""
    if executor == "sequential" and (backend is None or isinstance(backend, str)):
        from edgeinfer.format.lean import read_compiled

        file = read_compiled(path)  # None for any other file
        if file is not None:
            model = LazyModel(file)
            if section_for(backend, executor, model) is not None:
                return model
    from edgeinfer.api import load_any

    return load_any(path)


def build_compiled(model: Any, settings: Any) -> tuple[list[Backend], Any, Any, list[str], dict[int, dict[str, str]]]:
    """The backends, plan and runner of ``settings.compiled`` (the model's compiled section),
    with the re-partition's notes and exclusions (``plans.build_plan`` makes the CompiledPlan)."""
    from edgeinfer.runtime.compile import compile
    from edgeinfer.runtime.placement import REFERENCE, make_backends

    section = settings.compiled
    used = set(section.assignment)
    names = [name for name in section.backends if name in used and name != REFERENCE]
    options = settings.options
    backends: list[Backend] = make_backends(names, device=settings.device, fallback=settings.fallback,
                                            options={k: v for k, v in options.items() if k in names})
    if REFERENCE in used:
        backends += make_backends([REFERENCE], options={k: v for k, v in options.items() if k == REFERENCE})
    else:
        backends.append(OnDemand(REFERENCE, lambda: make_backends([REFERENCE])[0]))
    notes: list[str] = []
    excluded: dict[int, dict[str, str]] = {}
    plan, runner = compile(model.graph, backends, executor=section.executor, threads=settings.threads,
                           debug=settings.debug, prior=section.assignment, artifacts=_lookup(section),
                           excluded=excluded, notes=notes)
    return backends, plan, runner, notes, excluded


def _lookup(section: Any) -> Callable[[Any, Backend], Artifact | None]:
    """part, backend -> the part's usable artifact, or None (one warning per cause)."""
    stored = {(p["backend"], tuple(p["nodes"])): p["artifact"] for p in section.parts if p["artifact"] is not None}
    said = section.said
    machine: list[str] = []

    def find(part: Any, backend: Backend) -> Artifact | None:
        index = stored.get((part.backend, tuple(part.nodes)))
        if index is None:
            return None
        version = backend.engine_version()
        if not machine:
            machine.append(machine_key())
        why = None
        if version is None or section.engines.get(backend.name) != version:
            why = (f"its {backend.name} artifacts were made for {backend.name} "
                   f"{section.engines.get(backend.name)}, this is {version}")
        elif section.machine != machine[0]:
            why = f"its artifacts were made on a {section.machine} CPU, this is {machine[0]}"
        if why is None:
            try:
                found = section.artifact(index)
            except EdgeInferError as exc:
                why = str(exc)
            else:
                if found.facts.get("part") == {"inputs": list(part.inputs), "outputs": list(part.outputs)}:
                    return Artifact(found.kind, found.data, found.facts)
                why = (f"the artifact stored for the {part.backend} part of {len(part.nodes)} node(s) reading "
                       f"{list(part.inputs)[:3]} was made for another part")
        if why not in said:
            said.add(why)
            log.warning("%s: %s; those parts compile from the IR (run `edgeinfer compile` again here)",
                        section.source or "compiled model", why)
        return None

    return find


def describe(section: Any) -> list[str]:
    """Lines saying what a compiled section holds (for ``describe`` and ``inspect``)."""
    made = sum(1 for p in section.parts if p["artifact"] is not None)
    engines = ", ".join(f"{k} {v}" for k, v in section.engines.items())
    return [f"compiled ahead of time for {section.machine} ({engines}), executor {section.executor}, "
            f"threads {section.threads}: {len(section.parts)} part(s), {made} with an engine artifact"]
