"""Re-partition when a backend accepted a part but cannot compile or run it.

A backend's ``supports`` is checked node by node against what it claims (onnxruntime: the ONNX
schema); a part may still fail when the engine compiles it (no kernel for Erf on double) or on
its first run. Then its nodes are probed one at a time on that backend, as the openvino backend
does, to find the culprits (if none fails alone, the whole part is the culprit); the culprits
are barred from that backend, the graph is partitioned again so they go to the next backend in
priority (numpy, the reference, last), and the plan records why
(``Assignment.declined`` and ``CompiledPlan.repartitions``). A part that fails on numpy has
nowhere to go: its error reaches the caller.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from edgeinfer.backend import Backend, CompileOptions
from edgeinfer.errors import InputError, first_line
from edgeinfer.ir import Graph
from edgeinfer.runtime.executors import PartCompileError

log = logging.getLogger("edgeinfer.runtime.fallback")
REFERENCE = "numpy"


def _close(executable: Any) -> None:
    close = getattr(executable, "close", None)
    if close is not None:
        close()


def probe_compile(part: Any, backend: Backend) -> dict[int, str]:
    """Node index -> why ``backend`` cannot compile that node alone (every node of the part if
    none fails alone: then only their combination fails). Nodes are probed as ``_probe_units``
    groups them: a node with the nodes that compute its constant inputs."""
    culprits: dict[int, str] = {}
    options = CompileOptions(threads=1)
    for indices, sub in _probe_units(part):
        try:
            _close(backend.compile(sub, options))
        except Exception as exc:  # noqa: BLE001 - the culprit's reason
            for index in indices:
                culprits.setdefault(index, f"failed to compile: {first_line(exc, 300)}")
    return culprits


def _probe_units(part: Any) -> Iterator[tuple[list[int], Graph]]:
    """(node indices, probe graph) per node of ``part``: the node with the nodes computing its
    constant inputs (a weight's DequantizeLinear), whose outputs are the node's own. Such
    constant nodes are judged with their readers, not alone, where a constant output or a
    computed weight would fail though the part does not; one whose output leaves the part is
    probed alone too."""
    graph = part.graph
    constant_inputs = graph.computed_from_constants()
    leaving = set(graph.output_names)
    index_of = {id(node): index for index, node in zip(part.nodes, graph.nodes)}
    for node in graph.nodes:
        if all(name in constant_inputs and name not in leaving for name in node.outputs if name):
            continue  # probed with its readers
        chosen: dict[int, Any] = {}
        stack = [node]
        while stack:
            current = stack.pop()
            if id(current) not in chosen:
                chosen[id(current)] = current
                stack.extend(constant_inputs[name] for name in current.inputs if name in constant_inputs)
        sub = graph.subgraph(chosen.values(), name=f"probe_{node.name or node.outputs[0]}")
        own = [value for value in sub.outputs if value.name in node.outputs]
        if own and len(own) < len(sub.outputs):
            sub = sub.replace(outputs=own)
        yield [index_of[id(n)] for n in sub.nodes], sub


def probe_run(part: Any, backend: Backend, reference: Backend, feeds: Mapping[str, Any]) -> dict[int, str]:
    """Node index -> why ``backend`` cannot run that node alone on the values the part saw (the
    values come from the reference where the backend fails, so later nodes are probed too).
    Raises ``RequestFault`` when the reference fails on a node too (nothing to move)."""
    culprits: dict[int, str] = {}
    options = CompileOptions(threads=1)
    env: dict[str, Any] = {**part.graph.initializers, **feeds}
    for indices, sub in _probe_units(part):
        node_feeds = {name: env[name] for name in sub.input_names}
        executable = None
        try:
            executable = backend.compile(sub, options)
            outputs = executable.run(node_feeds)
        except Exception as exc:  # noqa: BLE001 - the culprit's reason, if the reference runs it
            fallback = reference.compile(sub, options)
            try:
                outputs = fallback.run(node_feeds)
            except Exception:  # noqa: BLE001 - the reference fails too: the request is at fault
                raise RequestFault from exc
            finally:
                _close(fallback)
            for index in indices:
                culprits.setdefault(index, f"failed to run: {first_line(exc, 300)}")
        finally:
            if executable is not None:
                _close(executable)
        env.update(outputs)
    return culprits


class RequestFault(Exception):
    """The reference fails on the same values: the request, not the backend, is at fault."""


def _reference_runs(part: Any, reference: Backend, feeds: Mapping[str, Any]) -> None:
    """``RequestFault`` unless the reference runs the whole part on these values."""
    executable = reference.compile(part.graph, CompileOptions(threads=1))
    try:
        executable.run(dict(feeds))
    except Exception as exc:  # noqa: BLE001 - the request is at fault, not the backend
        raise RequestFault from exc
    finally:
        _close(executable)


def _bar(excluded: dict[int, dict[str, str]], backend: str, culprits: Mapping[int, str]) -> None:
    for index, reason in culprits.items():
        excluded.setdefault(index, {})[backend] = reason


def _note(graph: Graph, backend: str, culprits: Mapping[int, str]) -> str:
    labels = [graph.nodes[i].label for i in list(culprits)[:4]]
    more = f" and {len(culprits) - 4} more" if len(culprits) > 4 else ""
    first = next(iter(culprits.values()))
    return f"{len(culprits)} node(s) moved off {backend} ({', '.join(labels)}{more}): {first}"


def compile_runner(graph: Graph, backends: Sequence[Backend], *, executor: str, threads: int | None,
                   debug: bool = False, excluded: dict[int, dict[str, str]] | None = None,
                   notes: list[str] | None = None) -> tuple[Any, Any]:
    """Partition and compile ``graph``; a part that fails to compile is probed and its culprits
    go to the next backend. Returns (plan, runner); ``notes`` collects what moved and why."""
    from edgeinfer.runtime.placement import build_executor, make_plan

    excluded = excluded if excluded is not None else {}
    by_name = {b.name: b for b in backends}
    while True:
        plan = make_plan(graph, backends, branches=executor == "dag", excluded=excluded)
        try:
            return plan, build_executor(plan, backends, threads=threads, executor=executor, debug=debug)
        except PartCompileError as failure:
            part = failure.part
            if part.backend == REFERENCE or part.backend not in by_name:
                raise failure.cause from None
            culprits = probe_compile(part, by_name[part.backend]) or {
                i: f"failed to compile: {first_line(failure.cause, 300)}" for i in part.nodes}
            _bar(excluded, part.backend, culprits)
            note = _note(graph, part.backend, culprits)
            log.warning("re-partitioned: %s", note)
            if notes is not None:
                notes.append(note)


def run_proving(compiled: Any, feeds: dict[str, Any]) -> dict[str, Any]:
    """Run ``compiled``; while some part has not yet run once, a part that fails moves its
    culprit nodes to the next backend and the request runs again on the new plan."""
    if compiled.proven:
        return compiled.runner.run(feeds)
    with compiled.proving:  # first runs one at a time: a re-partition replaces the runner
        if compiled.proven:
            return compiled.runner.run(feeds)
        return _prove(compiled, feeds)


def _prove(compiled: Any, feeds: dict[str, Any]) -> dict[str, Any]:
    by_name = {b.name: b for b in compiled.backends}
    excluded = compiled.excluded
    while True:
        runner = compiled.runner
        try:
            results = runner.run(feeds)
        except InputError:
            raise
        except Exception as exc:
            failed = next((p for p in runner.parts if p.failure is not None and not p.proven), None)
            if failed is None or failed.part.backend == REFERENCE or failed.part.backend not in by_name:
                raise
            part_feeds = failed.failure[1]
            failed.failure = None
            try:
                _reference_runs(failed.part, by_name[REFERENCE], part_feeds)
                culprits = probe_run(failed.part, by_name[failed.part.backend], by_name[REFERENCE], part_feeds)
            except RequestFault:
                raise exc from None
            if not culprits:
                culprits = {i: f"failed to run: {first_line(exc, 300)}" for i in failed.part.nodes}
            _bar(excluded, failed.part.backend, culprits)
            note = _note(compiled.graph, failed.part.backend, culprits)
            log.warning("re-partitioned after a failed first run: %s", note)
            compiled.repartitions.append(note)
            settings = compiled.settings
            local = "sequential" if compiled.executor == "ray" else compiled.executor
            plan, new_runner = compile_runner(compiled.graph, compiled.backends, executor=local,
                                              threads=settings.threads, debug=settings.debug,
                                              excluded=excluded, notes=compiled.repartitions)
            compiled.plan, compiled.runner = plan, new_runner
            runner.close()
            continue
        if all(p.proven for p in runner.parts):
            compiled.proven = True
        return results
