"""The backend interface the runtime and ``Session`` program against.

A backend claims the nodes of a graph it takes (``claim``: node index -> the reason for each
node it does not take; by default ``supports`` asked node by node, as onnxruntime's
GetCapability answers for a whole graph), compiles a self-contained graph once (``compile``)
and returns an ``Executable`` that runs it many times. A claim is authoritative: a part made
of claimed nodes must compile; the runtime re-partitions one that does not as a safety net,
says so, and ``tests/backends/test_claims.py`` treats it as a bug of that backend. ``Executable.thread_safe`` tells the scheduler whether one executable may be
called from several threads at once (onnxruntime: yes; a TFLite interpreter: no, so the
scheduler compiles one per worker thread).

Backends live in ``edgeinfer.backends.<name>`` and are imported only when asked for. Each
module has ``create_backend(*, device="cpu", fallback=False, **engine_options)``: ``device``
is ``"cpu"``, ``"gpu"`` or ``"npu"``; a device the engine cannot reach here raises
``BackendError``, or, with ``fallback=True``, logs a warning and uses the CPU.
"""

from __future__ import annotations

import importlib
import re
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from edgeinfer.errors import BackendError
from edgeinfer.log import get_logger

if TYPE_CHECKING:  # annotations only: the CLI lists backends without importing the IR (onnx)
    import numpy as np

    from edgeinfer.ir import Graph, Node


class CompileOptions:
    """How a backend compiles a graph. A plain class (a device's cold start imports this module and
    no ``dataclasses``); ``replace`` returns a changed copy."""

    __slots__ = ("threads", "debug", "busy_wait", "engine_options", "artifact")

    def __init__(self, threads: int | None = None, debug: bool = False, busy_wait: bool = True,
                 engine_options: dict[str, Any] | None = None, artifact: Artifact | None = None) -> None:
        self.threads = threads  # None: the engine's default
        self.debug = debug  # per-node timing and shapes
        # False when other executables run on the same cores at the same time (DAG and pipeline
        # executors): an engine's idle worker threads must then sleep rather than spin.
        self.busy_wait = busy_wait
        self.engine_options: dict[str, Any] = {} if engine_options is None else engine_options  # backend-specific
        # the engine-ready form of this very graph made ahead of time (``edgeinfer compile``): a
        # backend that knows the kind builds from it instead of exporting the graph again
        self.artifact = artifact

    def replace(self, **changes: Any) -> CompileOptions:
        return CompileOptions(**{**{name: getattr(self, name) for name in self.__slots__}, **changes})

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CompileOptions) and all(getattr(self, n) == getattr(other, n) for n in self.__slots__)

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        return "CompileOptions(" + ", ".join(f"{n}={getattr(self, n)!r}" for n in self.__slots__) + ")"


class Artifact:
    """An engine-ready form of a compiled part, stored in a compiled ``.eim``
    (``edgeinfer.runtime.aot``): ``kind`` names the form (``"onnx"``: onnxruntime's model bytes,
    ``"tflite"``: a flatbuffer), ``data`` its bytes (a read-only view into the mapped file),
    ``facts`` what the engine needs beside them (JSON values)."""

    __slots__ = ("kind", "data", "facts")

    def __init__(self, kind: str, data: Any, facts: dict[str, Any] | None = None) -> None:
        self.kind = kind
        self.data = data
        self.facts: dict[str, Any] = {} if facts is None else facts

    def __repr__(self) -> str:
        return f"Artifact(kind={self.kind!r}, {len(self.data)} bytes, facts={self.facts!r})"


class Executable(ABC):
    thread_safe: bool = False  # may run from several threads at once
    # Not thread safe: must it stay on the thread that compiled it (a GPU delegate's GL context),
    # or may any thread run it, one at a time (a TFLite interpreter on the CPU)?
    thread_affine: bool = True

    def __init__(self, graph: Graph):
        self.graph = graph
        self.input_names = graph.input_names
        self.output_names = graph.output_names

    # Device-resident values: an executable whose ``resident`` names a family of values (the
    # torch backend: "torch") also has ``run_resident``, which takes host arrays or values of
    # that family (on any device) and returns values of that family left on its device, and
    # ``to_host`` turning one into a numpy array. The executors hand such values from one part
    # to the next part of the same family as they are (no host round trip inside a plan) and
    # copy a value to the host once where a part of another family, or the caller, reads it.
    resident: str | None = None

    @abstractmethod
    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run once; ``feeds`` are already validated. Returns outputs in graph order."""

    def run_resident(self, feeds: dict[str, Any]) -> dict[str, Any]:
        """``run`` with device-resident values in and out (see ``resident``)."""
        return self.run(feeds)

    def to_host(self, value: Any) -> np.ndarray:
        """A value ``run_resident`` returned, as a numpy array on the host."""
        return value

    def from_host(self, value: np.ndarray) -> Any:
        """A host array as a value ``run_resident`` takes without copying it again (on the
        device), so that several parts read one copy of it."""
        return value

    def stats(self) -> dict[str, Any]:
        """Backend-specific facts about the last run (peak memory, fallback ops, timings)."""
        return {}

    def close(self) -> None:
        """Release the engine's compiled state (idempotent); the executable cannot run after.
        The scheduler calls it on every executable it compiled once it is done with it."""
        return None  # an engine holding nothing outside Python objects has nothing to release

    def artifact(self, source: Graph) -> Artifact | None:
        """What to store ahead of time so that ``compile`` of ``source`` (the graph this was
        compiled from) with ``CompileOptions(artifact=...)`` skips the export; None where the
        engine has no such form (it compiles from the IR at load)."""
        return None


class Backend(ABC):
    name: str = "?"
    device: str = "cpu"  # the device compiled graphs run on (after any fallback)

    @abstractmethod
    def supports(self, node: Node, graph: Graph) -> str | None:
        """None if this backend can run ``node`` of ``graph``, else the reason it cannot."""

    @abstractmethod
    def compile(self, graph: Graph, options: CompileOptions) -> Executable:
        """Prepare ``graph`` (self-contained, typed) for repeated runs."""

    def engine_version(self) -> str | None:
        """The engine's version, which an artifact must match to be used (None: no artifacts)."""
        return None

    def value_device(self) -> str:
        """Where the values its executables hand on live: ``"cpu"`` (the host) for an engine
        that takes and returns numpy arrays (its own copies to and from its device are part of
        its run time), its device for one whose executables are ``resident`` (torch)."""
        return "cpu"

    def link_bytes_per_second(self) -> dict[tuple[str, str], float]:
        """Copy bandwidth between the host and ``value_device()``, by (source, destination)
        device, where the backend measured it; the planner uses a documented default elsewhere."""
        return {}

    def claim(self, graph: Graph) -> dict[int, str]:
        """What this backend does not take of ``graph``: node index -> why (the rest it takes,
        and must compile). Asked once per graph by the partitioner; the default asks
        ``supports`` node by node. A backend that judges nodes together (fusions, shapes known
        only across nodes) overrides it."""
        refused = {}
        for index, node in enumerate(graph.nodes):
            reason = self.supports(node, graph)
            if reason is not None:
                refused[index] = reason
        return refused

    def unsupported(self, graph: Graph) -> dict[str, str]:
        """node label -> reason, for every node this backend cannot run (its ``claim``, by label)."""
        return {graph.nodes[index].label: reason for index, reason in self.claim(graph).items()}


# In the order ``backend="auto"`` and the partitioner prefer them; numpy, the reference that
# runs everything, comes last.
_BACKEND_MODULES = {
    "onnxruntime": "edgeinfer.backends.onnxruntime",
    "openvino": "edgeinfer.backends.openvino",
    "tflite": "edgeinfer.backends.tflite",
    "torch": "edgeinfer.backends.torch",
    "numpy": "edgeinfer.backends.numpy",
}
DEVICES = ("cpu", "gpu", "npu")
# Named torch devices (``cuda:N``, ``mps``): only a backend whose module says it
# ``accepts_device`` them is created for one (the torch backend).
_NAMED_DEVICE = re.compile(r"cuda:\d+|mps")
log = get_logger("edgeinfer.backend")


def check_option_names(backend: str, engine_options: Mapping[str, Any], allowed: Sequence[str]) -> dict[str, Any]:
    """A backend's engine options as a dict, or ``BackendError`` naming the unknown ones."""
    unknown = sorted(set(engine_options) - set(allowed))
    if unknown:
        raise BackendError(f"{backend} backend: unknown engine option(s) {unknown}; expected some of {list(allowed)}")
    return dict(engine_options)


def available_backends() -> list[str]:
    """Every backend name edgeinfer knows (installed or not)."""
    return list(_BACKEND_MODULES)


def installed_backends() -> list[str]:
    """The backends whose engine can be imported here, in order of preference."""
    installed = []
    for name in _BACKEND_MODULES:
        try:
            _backend_module(name)
        except BackendError:
            continue
        installed.append(name)
    return installed


def backend_module(name: str):
    """The module of backend ``name`` (its optional hooks: ``describe_part``, ``reduced_precisions``...)."""
    return _backend_module(name)


def _backend_module(name: str):
    module_name = _BACKEND_MODULES.get(name)
    if module_name is None:
        raise BackendError(f"unknown backend {name!r}: expected one of {', '.join(available_backends())}")
    try:
        return importlib.import_module(module_name)
    except ImportError as exc:
        raise BackendError(f"backend {name!r} cannot be imported ({exc}); install its engine, e.g. "
                           f"pip install 'edgeinfer[{name}]'") from exc


def part_note(name: str, graph: Graph) -> str | None:
    """What backend ``name`` says of running ``graph`` (its module's optional
    ``describe_part(graph)``, e.g. onnxruntime's integer path), for plans; None if nothing."""
    try:
        describe = getattr(_backend_module(name), "describe_part", None)
    except BackendError:  # a backend object of the caller's own, under a name edgeinfer does not know
        return None
    return None if describe is None else describe(graph)


def check_device(device: str) -> str:
    if device not in DEVICES and not (isinstance(device, str) and _NAMED_DEVICE.fullmatch(device)):
        raise BackendError(f"device {device!r}: expected one of {', '.join(DEVICES)}, 'cuda:N' or 'mps'")
    return device


def get_backend(name: str, *, device: str = "cpu", fallback: bool = False, **engine_options: Any) -> Backend:
    """Instantiate a backend by name (``numpy``, ``onnxruntime``, ...) for ``device``."""
    module = _backend_module(name)
    device = check_device(device)
    if device not in DEVICES and not getattr(module, "accepts_device", lambda _: False)(device):
        raise BackendError(f"backend {name!r} does not address device {device!r} by name: expected one of "
                           f"{', '.join(DEVICES)} (the torch backend takes 'cuda:N' and 'mps')")
    return module.create_backend(device=device, fallback=fallback, **engine_options)
