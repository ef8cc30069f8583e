"""Re-partition when a backend accepted a part and compiled it but cannot run it.

A part that fails to compile is re-partitioned by ``compile.compile``. One may still fail on
its first run. Then, if the numpy reference runs the part on the same values (else the request
is at fault and its error reaches the caller), its nodes are probed one at a time on that
backend to find the culprits (if none fails alone, the whole part is the culprit); they are
barred from that backend, the graph is partitioned and compiled again so they go to the next
backend in priority (numpy last), the plan records why (``Assignment.declined`` and
``CompiledPlan.repartitions``), and the request runs again. A plan is proven by its first
success; from then on its runs go straight to its runner.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from edgeinfer.backend import Backend, CompileOptions
from edgeinfer.errors import InputError, first_line
from edgeinfer.log import get_logger
from edgeinfer.runtime.compile import bar, compile, probe_units
from edgeinfer.runtime.parts import close_executable, engine_compile

log = get_logger("edgeinfer.runtime.fallback")
REFERENCE = "numpy"


def probe_run(part: Any, backend: Backend, reference: Backend, feeds: Mapping[str, Any]) -> dict[int, str]:
    """Node index -> why ``backend`` cannot run that node alone on the values the part saw (the
    values come from the reference where the backend fails, so later nodes are probed too).
    Raises ``RequestFault`` when the reference fails on a node too (nothing to move)."""
    culprits: dict[int, str] = {}
    options = CompileOptions(threads=1)
    env: dict[str, Any] = {**part.graph.initializers, **feeds}
    for indices, sub in probe_units(part):
        node_feeds = {name: env[name] for name in sub.input_names}
        executable = None
        try:
            executable = engine_compile(backend, sub, options)
            outputs = executable.run(node_feeds)
        except Exception as exc:  # noqa: BLE001 - the culprit's reason, if the reference runs it
            fallback = engine_compile(reference, sub, options)
            try:
                outputs = fallback.run(node_feeds)
            except Exception:  # noqa: BLE001 - the reference fails too: the request is at fault
                raise RequestFault from exc
            finally:
                close_executable(fallback)
            for index in indices:
                culprits.setdefault(index, f"failed to run: {first_line(exc, 300)}")
        finally:
            if executable is not None:
                close_executable(executable)
        env.update(outputs)
    return culprits


class RequestFault(Exception):
    """The reference fails on the same values: the request, not the backend, is at fault."""


def _reference_runs(part: Any, reference: Backend, feeds: Mapping[str, Any]) -> None:
    """``RequestFault`` unless the reference runs the whole part on these values."""
    executable = engine_compile(reference, part.graph, CompileOptions(threads=1))
    try:
        executable.run(dict(feeds))
    except Exception as exc:  # noqa: BLE001 - the request is at fault, not the backend
        raise RequestFault from exc
    finally:
        close_executable(executable)


def run_proving(compiled: Any, feeds: dict[str, Any]) -> dict[str, Any]:
    """Run ``compiled``'s first requests (one at a time: a re-partition replaces the runner): a
    part that fails moves its culprit nodes to the next backend and the request runs again on
    the new plan. The first success proves the plan: ``compiled.run`` becomes its runner's."""
    with compiled.proving:
        if compiled.proven:
            return compiled.runner.run(feeds)
        by_name = {b.name: b for b in compiled.backends}
        while True:
            runner = compiled.runner
            try:
                results = runner.prove(feeds)
            except InputError:
                raise
            except Exception as exc:
                _repartition(compiled, runner, by_name, exc)
                continue
            compiled.proved()
            return results


def _repartition(compiled: Any, runner: Any, by_name: Mapping[str, Backend], exc: Exception) -> None:
    """Move the failed part's culprits off its backend and compile the plan again (else raise)."""
    if runner.failure is None:
        raise exc
    index, _, part_feeds = runner.failure
    runner.failure = None
    part = runner.parts[index].part
    if part.backend == REFERENCE or part.backend not in by_name:
        raise exc
    try:
        _reference_runs(part, by_name[REFERENCE], part_feeds)
        culprits = probe_run(part, by_name[part.backend], by_name[REFERENCE], part_feeds)
    except RequestFault:
        raise exc from None
    if not culprits:
        culprits = {i: f"failed to run: {first_line(exc, 300)}" for i in part.nodes}
    note = bar(compiled.excluded, compiled.graph, part.backend, culprits)
    log.warning("re-partitioned after a failed first run: %s", note)
    compiled.repartitions.append(note)
    settings = compiled.settings
    local = "sequential" if compiled.executor == "ray" else compiled.executor
    compiled.plan, compiled.runner = compile(compiled.graph, compiled.backends, executor=local,
                                             threads=settings.threads, debug=settings.debug,
                                             excluded=compiled.excluded, notes=compiled.repartitions)
    runner.close()
