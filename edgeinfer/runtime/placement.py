"""Placement: which backend runs each node.

    backends = make_backends(["onnxruntime", "numpy"])
    plan = make_plan(graph, backends)            # capability partition (see partition.py)
    print(plan.describe())                      # which subgraph runs where, and why
    plan, runner = compile(graph, backends, threads=2, executor="dag")   # runtime/compile.py
    outputs = runner.run(feeds)

``Session`` (``runtime/session.py``) is the public face of all of this.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from edgeinfer.backend import Backend, get_backend, installed_backends
from edgeinfer.errors import BackendError
from edgeinfer.ir import Graph
from edgeinfer.runtime.partition import Assignment, Part, assign, describe, group, split_branches

EXECUTORS = ("sequential", "dag")
REFERENCE = "numpy"  # runs every ONNX op: the last resort of every placement


class Plan:
    """Where every node of ``graph`` runs: parts in a topological order."""

    __slots__ = ("graph", "assignment", "parts")

    def __init__(self, graph: Graph, assignment: Assignment, parts: list[Part]) -> None:
        self.graph = graph
        self.assignment = assignment
        self.parts = parts

    def describe(self) -> str:
        return describe(self.parts, self.assignment, self.graph)

    @property
    def backend_names(self) -> list[str]:
        return list(dict.fromkeys(part.backend for part in self.parts))

    def node_counts(self) -> dict[str, int]:
        return dict(Counter(self.assignment.backends))


BackendSpec = str | Backend


def _spec_name(spec: BackendSpec) -> str:
    """The backend's name: ``"torch@cuda:0"`` (a backend on a device of its own) is ``"torch"``."""
    return spec.name if isinstance(spec, Backend) else spec.partition("@")[0]


def spec_device(spec: BackendSpec, device: str, options: Mapping[str, Any]) -> str:
    """The device a backend spec runs on: ``name@device``, else the backend's ``device`` engine
    option (``backend_options={"torch": {"device": "cuda:0"}}``), else the session's ``device``.
    So one plan mixes devices: torch on the GPU, onnxruntime on the CPU."""
    name, _, own = spec.partition("@")
    option = options.get("device")
    if own and option is not None and option != own:
        raise BackendError(f"backend {spec!r} and backend_options[{name!r}]['device']={option!r} name two devices")
    return own or option or device


def backend_priority(backend: BackendSpec | Sequence[BackendSpec]) -> list[BackendSpec]:
    """A backend (name or ``Backend`` object) or a list of them in priority order -> the list,
    with the numpy reference last. Objects let a caller plug in an engine of its own."""
    specs = [backend] if isinstance(backend, (str, Backend)) else list(backend)
    if not specs or not all(isinstance(s, (str, Backend)) for s in specs):
        raise BackendError(f"backend: expected a name, a Backend or a list of them, got {backend!r}")
    names = [_spec_name(s) for s in specs]
    if "auto" in names and len(names) > 1:
        raise BackendError("backend 'auto' cannot be part of a list: give 'auto' alone or a list of "
                           f"backends among {installed_backends()}")
    duplicates = sorted(n for n, c in Counter(names).items() if c > 1)
    if duplicates:
        raise BackendError(f"backend list {names} names {duplicates} more than once")
    return specs if REFERENCE in names else [*specs, REFERENCE]


def spec_options(specs: Sequence[BackendSpec], options: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """``options`` with each ``name@device`` spec's device as that backend's ``device`` option:
    what travels to where backends are made by name alone (Ray's stage actors)."""
    merged = {name: dict(found) for name, found in options.items()}
    for spec in specs:
        if isinstance(spec, str) and "@" in spec:
            name = _spec_name(spec)
            merged[name] = {**merged.get(name, {}), "device": spec_device(spec, "cpu", merged.get(name, {}))}
    return merged


def make_backends(specs: Sequence[BackendSpec], *, device: str = "cpu", fallback: bool = False,
                  options: Mapping[str, Mapping[str, Any]] | None = None) -> list[Backend]:
    """Instantiate backends by name (objects are used as they are). ``options`` maps a backend
    name to its engine options (``"device"`` among them places that backend, as ``name@device``
    does; see ``spec_device``). The numpy reference runs on the CPU whatever the session's
    device (it is the fallback of last resort)."""
    options = dict(options or {})
    names = [_spec_name(s) for s in specs]
    unknown = sorted(set(options) - set(names))
    if unknown:
        raise BackendError(f"engine options given for backend(s) {unknown} that are not used: {names}")
    backends = []
    for spec in specs:
        if isinstance(spec, Backend):
            backends.append(spec)
            continue
        name = _spec_name(spec)
        engine_options = dict(options.get(name, {}))
        on = spec_device(spec, device, engine_options)
        engine_options.pop("device", None)
        if name == REFERENCE and len(specs) > 1 and "@" not in spec and "device" not in options.get(name, {}):
            on = "cpu"
        backends.append(get_backend(name, device=on, fallback=fallback, **engine_options))
    return backends


def make_plan(graph: Graph, backends: Sequence[Backend], *, pinned: Mapping[int, str] | None = None,
              branches: bool = False, excluded: Mapping[int, Mapping[str, str]] | None = None,
              prior: Sequence[str] | None = None) -> Plan:
    """Partition ``graph`` over ``backends`` (priority order). ``branches`` also cuts at forks
    and joins, so the DAG executor can run independent branches at once. ``excluded`` and
    ``prior``: see ``partition.assign``."""
    assignment = assign(graph, backends, pinned=pinned, excluded=excluded, prior=prior)
    parts = group(graph, assignment)
    if branches:
        parts = split_branches(graph, parts)
    return Plan(graph, assignment, parts)


def concurrency(parts: Sequence[Part]) -> list[int]:
    """For each part, how many other parts may run at the same time as it (neither its
    ancestor nor its descendant). Ancestor and descendant sets are bitmasks (Python ints), so
    the work is parts x edges / 64 word operations instead of parts squared set lookups."""
    producer = {name: index for index, part in enumerate(parts) for name in part.outputs}
    readers: list[set[int]] = [set() for _ in parts]
    ancestors = [0] * len(parts)
    for index, part in enumerate(parts):
        mask = 0
        for name in part.inputs:
            source = producer.get(name)
            if source is not None and source != index:
                mask |= ancestors[source] | (1 << source)
                readers[source].add(index)
        ancestors[index] = mask
    descendants = [0] * len(parts)
    for index in reversed(range(len(parts))):
        mask = 0
        for reader in readers[index]:
            mask |= descendants[reader] | (1 << reader)
        descendants[index] = mask
    return [len(parts) - 1 - (ancestors[i] | descendants[i]).bit_count() for i in range(len(parts))]


__all__ = [
    "EXECUTORS",
    "Plan",
    "backend_priority",
    "concurrency",
    "make_backends",
    "make_plan",
    "spec_options",
]
