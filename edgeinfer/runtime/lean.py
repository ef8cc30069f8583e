"""A compiled ``.eim``'s plan (``edgeinfer compile``): built from the stored artifacts alone where
it can be, without reading the graph (``build_lean``), else from the graph and the stored
placement (``aot.build_compiled``). ``Session`` asks ``compiled_plan`` for the one plan of such
a file."""

from __future__ import annotations

from typing import Any

from edgeinfer.backend import CompileOptions
from edgeinfer.errors import InputError, first_line
from edgeinfer.ir import Graph
from edgeinfer.log import get_logger
from edgeinfer.runtime.aot import LazyModel, _lookup, build_compiled
from edgeinfer.runtime.executors import SequentialExecutor
from edgeinfer.runtime.partition import Assignment, Part
from edgeinfer.runtime.parts import CompiledPart, PartCompileError
from edgeinfer.runtime.placement import REFERENCE, Plan, make_backends
from edgeinfer.runtime.plans import CompiledPlan

log = get_logger("edgeinfer.runtime.lean")


def compiled_plan(model: Any, settings: Any) -> CompiledPlan:
    """The plan of ``settings.compiled`` (the model's compiled section)."""
    lean = build_lean(model, settings)
    if lean is not None:
        return lean
    backends, plan, runner, notes, excluded = build_compiled(model, settings)
    compiled = CompiledPlan(None, settings, model.graph, backends, plan, runner, settings.compiled.executor)
    compiled.repartitions.extend(notes)
    compiled.excluded, compiled.section = excluded, settings.compiled
    return compiled


class _GraphOnDemand:
    """The graph of a lean plan: read from the file when first used (its describe, a stream)."""

    def __init__(self, model: LazyModel):
        self._model = model

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model.graph, name)


def build_lean(model: Any, settings: Any) -> Any:
    """The plan of a ``LazyModel`` built from its artifacts alone (no graph read), or None where
    a part has no usable artifact or runs on numpy (``build_compiled`` then reads the graph)."""
    if not isinstance(model, LazyModel):
        return None
    section, file = model.compiled, model.file
    if settings.debug or section.executor != "sequential" or \
            any(p["artifact"] is None or p["backend"] == REFERENCE for p in section.parts):
        return None
    names = [name for name in section.backends if name in set(section.assignment)]
    backends = make_backends(names, device=settings.device, fallback=settings.fallback,
                             options={k: v for k, v in settings.options.items() if k in names})
    by_name, find, compiled = {b.name: b for b in backends}, _lookup(section), []
    try:
        for number, entry in enumerate(section.parts):
            reads = section.artifacts[entry["artifact"]].facts.get("reads", [])
            graph = Graph([], entry["inputs"], entry["outputs"], file.weights(list(reads)),
                          name=f"{file.name}_part{number}_{entry['backend']}")
            part = Part(entry["backend"], list(entry["nodes"]), graph)
            artifact = find(part, by_name[part.backend])
            if artifact is None:
                raise PartCompileError(part, ValueError("no usable artifact"))
            compiled.append(CompiledPart(part, by_name[part.backend],
                                         CompileOptions(threads=settings.threads, artifact=artifact)))
    except PartCompileError as exc:
        for done in compiled:
            done.close()
        log.info("%s: not built from its artifacts alone (%s); reading its graph", file.source, exc)
        return None
    whole = Graph([], file.inputs, file.outputs, name=file.name)
    runner = SequentialExecutor(whole, compiled)
    graph = _GraphOnDemand(model)
    plan = Plan(graph, Assignment(list(section.assignment)), [c.part for c in compiled])
    lean = LeanCompiledPlan(None, settings, graph, backends, plan, runner, "sequential")
    lean.section, lean.model = section, model
    return lean



class LeanCompiledPlan(CompiledPlan):
    """A compiled ``.eim``'s plan built from its artifacts without reading its graph
    (``aot.build_lean``). Should its first run fail, the plan is built again from the graph
    (``aot.build_compiled``), where the re-partition can probe nodes, and the request runs there."""

    model: Any = None

    def _first_run(self, feeds: dict[str, Any]) -> dict[str, Any]:
        with self.proving:
            if self.proven:
                return self.runner.run(feeds)
            try:
                results = self.runner.prove(feeds)
            except InputError:
                raise
            except Exception as exc:  # noqa: BLE001 - the graph's plan is the safety net
                log.warning("%s: the first run from the stored artifacts failed (%s); compiling from the IR",
                            self.section.source, first_line(exc, 300))
                self._from_graph()
            else:
                self.proved()
                return results
        from edgeinfer.runtime.fallback import run_proving

        return run_proving(self, feeds)

    def _from_graph(self) -> None:
        old = self.runner
        self.backends, self.plan, self.runner, notes, self.excluded = build_compiled(self.model, self.settings)
        self.graph = self.model.graph
        self.repartitions.extend(notes)
        old.close()
