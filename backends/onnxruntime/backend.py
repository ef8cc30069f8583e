"""The onnxruntime backend: export a graph to ONNX once, keep one ``InferenceSession``.

Compile lowers ``edgeinfer``-domain ops that have a lowering (see ``lowerings.py``), exports
the graph with ``graph_to_model`` and builds the session from the serialized bytes. Large
initializers are not serialized (protobuf's 2 GiB limit), and reach onnxruntime one of two ways:

- ``file``: a weight that is a plain view into a memory-mapped file (an ``.eim`` file's weights,
  ``edgeinfer.ir.mapped``) and whose bytes there are exactly the initializer's (raw,
  little-endian, C order) becomes an external-data reference to that file (its base name,
  offset, length), and the session is told the file's folder
  (``session.model_external_initializers_file_folder_path``). onnxruntime maps the file itself
  and computes on the mapping: no copy, whatever the alignment (it maps from the page below).
  Only that one file, which edgeinfer has already opened, is read. If the file is no longer the
  one that was mapped (saved over), the weight goes the second way.
- ``memory``: any other numeric array (a pass's result, a widened float16-stored weight) is
  handed over as an ``OrtValue`` (``add_external_initializers``). onnxruntime copies those.

``Executable.stats()["weights"]`` says how many tensors and bytes went each way.

``InferenceSession.run`` may be called from several threads at once, so the executable is
thread safe.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from edgeinfer.backend import Artifact, Backend, CompileOptions, Executable, check_option_names
from edgeinfer.backends.common import first_line, merged_options, missing_device, refuse_unsupported
from edgeinfer.errors import BackendError
from edgeinfer.ir import Graph, Node
from edgeinfer.ir.mapped import FileSpan, file_span
from edgeinfer.log import get_logger

from .int8 import EXACT_REWRITE

DEFAULT_PROVIDERS = ("CPUExecutionProvider",)
# Accelerator providers per device, in order of preference (names from onnxruntime's docs).
DEVICE_PROVIDERS = {
    "cpu": (),
    "gpu": ("TensorrtExecutionProvider", "CUDAExecutionProvider", "ROCMExecutionProvider",
            "MIGraphXExecutionProvider", "DmlExecutionProvider", "CoreMLExecutionProvider",
            "OpenVINOExecutionProvider", "WebGpuExecutionProvider"),
    "npu": ("QNNExecutionProvider", "NnapiExecutionProvider", "CoreMLExecutionProvider",
            "VitisAIExecutionProvider", "OpenVINOExecutionProvider"),
}
# OpenVINO's provider serves several device kinds; it is told which by its device_type option.
_OPENVINO_DEVICE_TYPE = {"gpu": "GPU", "npu": "NPU"}
EXTERNAL_MIN_BYTES = 16 * 1024  # smaller initializers stay in the protobuf (shape tensors, biases)
OPTIMIZATION_LEVELS = {
    "disable": "ORT_DISABLE_ALL",
    "basic": "ORT_ENABLE_BASIC",
    "extended": "ORT_ENABLE_EXTENDED",
    "all": "ORT_ENABLE_ALL",
}
ENGINE_OPTIONS = ("providers", "provider_options", "optimization_level", "session_config", "log_severity",
                  "prepack")
# onnxruntime prepacks MatMul/Conv weights into copies of its own. Weights handed over in memory
# cannot be freed then (resident memory doubles); weights it maps from a file by reference it
# unmaps once packed, but the packed copies are anonymous memory and the peak is the weights plus
# the packing (bench_big.py, 3 GiB: 4.1 GiB with prepacking, as onnxruntime alone on the .onnx,
# 3.1 GiB without). prepack="auto" (the default) turns prepacking off for a part holding this
# many bytes of weights: at batch 1 such models are matrix-vector products, which onnxruntime
# runs at the same speed unpacked (at batch 8 a 256 MiB MatMul took 2.8x longer unpacked, so
# pass prepack=True to trade memory for that).
PREPACK_AUTO_LIMIT = 1 << 30
_SHAREABLE_KINDS = "fiub"  # numpy's own types; ml_dtypes (bfloat16, float8, int4) are serialized
FOLDER_CONFIG = "session.model_external_initializers_file_folder_path"
ARTIFACT_KIND = "onnx"  # the ahead-of-time form (artifact.py)
log = get_logger("edgeinfer.backends.onnxruntime")
_STANDARD_DOMAINS = ("", "ai.onnx.ml")  # the domains onnx.defs (and onnxruntime) implement
_CONTRIB_OPS = {("com.microsoft", "MatMulNBits")}  # onnxruntime's own ops that edgeinfer writes
_NODE_PATTERNS = (
    re.compile(r"Name:'(?P<name>[^']*)'"),  # run time: "... running Conv node. Name:'conv1' ..."
    re.compile(r'In Node, \("(?P<name>[^"]*)", (?P<op>[\w.]+)'),  # graph resolve errors
    re.compile(r"Node \((?P<name>[^)]*)\) Op \((?P<op>[\w.]+)\)"),  # shape inference errors
    re.compile(r"in node \((?P<name>[^)]*)\)"),  # type errors
)


def _ort():
    import onnxruntime

    return onnxruntime


def _engine_run(session: Any) -> Callable[..., list]:
    """What runs ``session`` per request: its compiled session's own ``run``. The public
    ``InferenceSession.run`` checks in Python, on every call, what edgeinfer's feed check has
    already checked (every input present, no OrtValue from another session) and rebuilds the
    list of output names: 2-3 us, 3% of a 0.08 ms model such as silero VAD
    (``benchmarks/bench_real.py --threads 1 --cpu-time --only silero-vad/silero_vad``). An
    execution provider's failure still reaches the public ``run`` and its fallback (``run``).
    onnxruntime versions without the attribute get the public method."""
    engine = getattr(session, "_sess", None)
    run = getattr(engine, "run", None)
    return run if callable(run) else session.run


def _closed_run(*_: Any) -> list:
    raise BackendError("this onnxruntime executable is closed")


class OnnxRuntimeExecutable(Executable):
    thread_safe = True  # InferenceSession.run is documented as safe to call concurrently

    def __init__(self, graph: Graph, session: Any, node_names: Mapping[str, str],
                 external: Sequence[Any], integer_path: str | None = None, weights: WeightRoutes | None = None):
        super().__init__(graph)
        self.session = session
        self._node_names = dict(node_names)  # onnxruntime's node name -> the IR node's label
        self._external = list(external)  # keep the buffers onnxruntime reads in place alive
        self.integer_path = integer_path  # how its int8 products are computed here (see int8.py)
        self.weights = weights or WeightRoutes()
        self._session_outputs = [o.name for o in session.get_outputs()]
        self._run = _engine_run(session)


    @property
    def session_options(self) -> Any:
        """The ``onnxruntime.SessionOptions`` the session was built with."""
        return self.session.get_session_options()

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        try:
            results = self._run(self._session_outputs, feeds, None)
        except Exception as exc:  # onnxruntime raises its own pybind exception classes
            if self.session is not None and type(exc).__name__ == "EPFail":
                return self._run_with_fallback(feeds, exc)
            shapes = {name: getattr(array, "shape", None) for name, array in feeds.items()}
            raise BackendError(f"onnxruntime failed to run graph {self.graph.name!r}"
                               f"{_where(exc, self._node_names)} with inputs {shapes}: "
                               f"{first_line(exc)}") from exc
        return dict(zip(self.output_names, results, strict=True))

    def _run_with_fallback(self, feeds: dict[str, np.ndarray], first: Exception) -> dict[str, np.ndarray]:
        """An execution provider failed: the public ``run``, whose fallback (where the session
        enables it) moves the session to its fallback providers and runs again."""
        try:
            results = self.session.run(None, feeds)
        except Exception as exc:
            raise BackendError(f"onnxruntime failed to run graph {self.graph.name!r}"
                               f"{_where(exc, self._node_names)}: {first_line(exc)}") from first
        return dict(zip(self.output_names, results, strict=True))

    def close(self) -> None:
        self.session = None  # the InferenceSession and its arena go with the last reference
        self._run = _closed_run
        self._external = []

    def artifact(self, source: Graph) -> Artifact | None:
        """The exported model, its weights left in the ``.eim`` (``artifact.py``)."""
        if self.session is None or self.session.get_providers() != list(DEFAULT_PROVIDERS):
            return None  # an accelerator's session: compiled from the IR on the device
        from .artifact import make_artifact

        return make_artifact(source, self)

    def stats(self) -> dict[str, Any]:
        options = self.session_options
        return {"providers": self.session.get_providers(),
                "intra_op_num_threads": options.intra_op_num_threads,
                "graph_optimization_level": str(options.graph_optimization_level).rsplit(".", 1)[-1],
                "integer_path": self.integer_path, "weights": self.weights.summary()}


class OnnxRuntimeBackend(Backend):
    name = "onnxruntime"

    def __init__(self, *, device: str = "cpu", fallback: bool = False, **engine_options: Any):
        self.engine_options = _check_engine_options(engine_options)
        available = _ort().get_available_providers()
        if self.engine_options.get("providers"):
            self.engine_options.update(_drop_missing(self.engine_options, available, fallback))
        else:
            self.engine_options["providers"] = device_providers(available, device, fallback)
        first = self.engine_options["providers"][0]
        self.device = "cpu" if _provider_name(first) == "CPUExecutionProvider" else device
        _providers(_ort(), self.engine_options)  # fail at creation on an unavailable provider

    def supports(self, node: Node, graph: Graph) -> str | None:
        from edgeinfer.ir.onnx_io import schema_reason

        from .kernels import kernel_reason
        from .lowerings import find_lowering

        if find_lowering(node, graph) is not None or (node.domain, node.op_type) in _CONTRIB_OPS:
            return None
        if node.domain not in _STANDARD_DOMAINS:
            return (f"op {node.domain}::{node.op_type} is outside the standard ONNX domains and has no "
                    "onnxruntime lowering")
        # every node an execution provider does not take runs on the CPU provider: its kernels decide
        return schema_reason(node, graph) or kernel_reason(node, graph)

    def engine_version(self) -> str:
        return _ort().__version__

    def compile(self, graph: Graph, options: CompileOptions | None = None) -> OnnxRuntimeExecutable:
        options = options or CompileOptions()
        engine = merged_options(self.engine_options, options.engine_options, _check_engine_options)
        artifact = options.artifact
        if artifact is not None and artifact.kind == ARTIFACT_KIND and self.device == "cpu":
            return self._from_artifact(graph, artifact, options, engine)
        from .int8 import exact_weights, graph_integer_path
        from .lowerings import lower_graph

        refuse_unsupported("onnxruntime", graph.name, self.unsupported(graph))
        graph = lower_graph(graph)
        # the probe measures the CPU provider's kernels; an accelerator's are its own
        integer_path = graph_integer_path(graph) if self.device == "cpu" else None
        if integer_path == EXACT_REWRITE:  # this CPU's u8 x s8 kernels saturate: compute exactly
            graph, rewritten = exact_weights(graph)
            log.debug("onnxruntime: int8 weights of %d node(s) of graph %r as uint8 (zero point + 128)",
                      len(rewritten), graph.name)
        return self._build(graph, lambda files: _export(graph, files), options, engine, integer_path)

    def _from_artifact(self, graph: Graph, artifact: Artifact, options: CompileOptions,
                       engine: Mapping[str, Any]) -> OnnxRuntimeExecutable:
        """Build from the stored model bytes: no export, no onnx import (``artifact.py``)."""
        from .artifact import assemble

        labels = dict(artifact.facts["nodes"])
        executable = self._build(graph, lambda files: (*assemble(artifact, graph, files), labels), options, engine,
                                 artifact.facts.get("integer_path"))
        inputs = sorted(i.name for i in executable.session.get_inputs())
        if inputs != sorted(graph.input_names) or executable._session_outputs != list(graph.output_names):
            executable.close()
            raise BackendError(f"the artifact of graph {graph.name!r} takes {inputs} and gives "
                               f"{executable._session_outputs}: expected {sorted(graph.input_names)} and "
                               f"{list(graph.output_names)} (an artifact of another part)")
        return executable

    def _build(self, graph: Graph, export: Callable[[bool | str], tuple[bytes, WeightRoutes, dict[str, str]]],
               options: CompileOptions, engine: Mapping[str, Any], integer_path: str | None) -> OnnxRuntimeExecutable:
        """The executable of the model ``export(files)`` gives (its bytes, weight routes and node
        labels; ``files``: True to reference mapped files, else why not)."""
        try:
            session, node_names, external, routes = self._session(graph, export(True), options, engine)
        except BackendError as exc:
            if "xternal" not in str(exc):  # not about reading external data: the same without files
                raise
            log.warning("onnxruntime: %s; graph %r's weights are handed over in memory instead", exc, graph.name)
            session, node_names, external, routes = self._session(
                graph, export("onnxruntime refused the file references"), options, engine)
        if routes.files and not all(span.unchanged() for span in routes.files):
            # the file was replaced while onnxruntime read it: its bytes may not be these weights
            log.warning("onnxruntime: %s changed while graph %r was compiled; its weights are handed over in "
                        "memory instead", routes.folder, graph.name)
            session = None
            session, node_names, external, routes = self._session(
                graph, export("the file changed while compiling"), options, engine)
        return OnnxRuntimeExecutable(graph, session, node_names, external, integer_path, routes)

    def _session(self, graph: Graph, exported: tuple[bytes, WeightRoutes, dict[str, str]], options: CompileOptions,
                 engine: Mapping[str, Any]) -> tuple[Any, dict[str, str], list[Any], WeightRoutes]:
        model_bytes, routes, node_names = exported
        ort = _ort()
        session_options = _session_options(ort, options, engine)
        handed = routes.bytes("file") + routes.bytes("memory")
        if not _prepacks(engine.get("prepack", "auto"), handed):
            session_options.add_session_config_entry("session.disable_prepacking", "1")
            log.info("onnxruntime: prepacking off for graph %r (%.1f GiB of weights)", graph.name, handed / 2**30)
        if routes.folder is not None:
            session_options.add_session_config_entry(FOLDER_CONFIG, routes.folder)
        external = [ort.OrtValue.ortvalue_from_numpy(array) for array in routes.arrays]
        if routes.names:
            session_options.add_external_initializers(routes.names, external)
        if routes.bytes("memory") >= PREPACK_AUTO_LIMIT:
            log.info("onnxruntime: %.1f GiB of graph %r's weights are handed over in memory (onnxruntime copies "
                     "them): %s", routes.bytes("memory") / 2**30, graph.name, routes.why_memory())
        providers, provider_options = _providers(ort, engine)
        try:
            session = ort.InferenceSession(model_bytes, session_options,
                                           providers=providers, provider_options=provider_options)
        except Exception as exc:
            raise BackendError(f"onnxruntime could not compile graph {graph.name!r}"
                               f"{_where(exc, node_names)}: {first_line(exc)}") from exc
        return session, node_names, [*routes.arrays, *external], routes


class WeightRoutes:
    """How a graph's initializers reach onnxruntime: ``file`` (external-data references into
    the memory-mapped file they are views of, read by onnxruntime from ``folder``), ``memory``
    (OrtValues over ``arrays``, named ``names``) or ``protobuf`` (serialized in the model).
    A plain class: a device's cold start imports this module and no ``dataclasses``."""

    def __init__(self, folder: str | None = None) -> None:
        self.folder = folder
        self.files: list[FileSpan] = []
        self.names: list[str] = []
        self.arrays: list[np.ndarray] = []
        self.counts: dict[str, list[int]] = {k: [0, 0] for k in ("file", "memory", "protobuf")}
        self.reasons: dict[str, int] = {}  # why big weights went to memory -> bytes

    def add(self, route: str, nbytes: int) -> None:
        self.counts[route][0] += 1
        self.counts[route][1] += int(nbytes)

    def bytes(self, route: str) -> int:
        return self.counts[route][1]

    def why_memory(self) -> str:
        return "; ".join(f"{reason} ({nbytes / 2**20:.0f} MiB)" for reason, nbytes in self.reasons.items())

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {route: {"tensors": n, "bytes": b} for route, (n, b) in self.counts.items()}
        out["file_folder"] = self.folder
        if self.reasons:
            out["memory_because"] = dict(self.reasons)
        return out


def _export(graph: Graph, files: bool | str = True) -> tuple[bytes, WeightRoutes, dict[str, str]]:
    """The model bytes to hand to onnxruntime, how each initializer gets there (see
    ``WeightRoutes``; ``files`` not True: none by file reference, and why not), and exported
    node name -> IR node label."""
    from edgeinfer.ir.onnx_io import (
        array_to_tensor,
        external_placeholder,
        graph_to_model,
        name_exported_nodes,
    )

    model = graph_to_model(graph, include_initializers=False, value_info=False)
    node_names = {name: node.label for name, node in name_exported_nodes(model, graph).items()}
    routes = WeightRoutes()
    big = {name: array for name, array in graph.initializers.items()
           if array.dtype.kind in _SHAREABLE_KINDS and array.nbytes >= EXTERNAL_MIN_BYTES}
    spans = {name: span for name, array in big.items() if files is True and (span := _raw_span(array)) is not None}
    routes.folder = _main_folder(spans.values())
    for name, array in graph.initializers.items():
        span = spans.get(name)
        if span is not None and os.path.dirname(span.path) == routes.folder:
            model.graph.initializer.append(external_placeholder(
                name, array, {"location": os.path.basename(span.path), "offset": str(span.offset),
                              "length": str(span.nbytes)}))
            routes.files.append(span)
            routes.add("file", span.nbytes)
        elif name in big:
            # never read: the array itself is supplied at session build (add_external_initializers)
            model.graph.initializer.append(external_placeholder(name, array, {"location": "edgeinfer-in-memory"}))
            routes.names.append(name)
            routes.arrays.append(np.ascontiguousarray(array))
            routes.add("memory", array.nbytes)
            reason = _memory_reason(array, span, files)
            routes.reasons[reason] = routes.reasons.get(reason, 0) + int(array.nbytes)
        else:
            model.graph.initializer.append(array_to_tensor(array, name))
            routes.add("protobuf", array.nbytes)
    return model.SerializeToString(), routes, node_names


def _raw_span(array: np.ndarray) -> FileSpan | None:
    """Where in a mapped file ``array``'s bytes are, if they are what onnxruntime reads there:
    raw little-endian C-order elements of the initializer's own type."""
    if array.dtype.str[0] not in "<|":
        return None
    span = file_span(array)
    if span is None or not _utf8(span.path):  # onnxruntime's paths and protobuf strings are UTF-8
        return None
    return span


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a file name of undecodable bytes (surrogate escapes)
        return False
    return True


def _main_folder(spans: Any) -> str | None:
    """The folder holding the most bytes of mapped weights (onnxruntime reads from one)."""
    by_folder: dict[str, int] = {}
    for span in spans:
        folder = os.path.dirname(span.path)
        by_folder[folder] = by_folder.get(folder, 0) + span.nbytes
    return max(by_folder, key=by_folder.get) if by_folder else None


def _memory_reason(array: np.ndarray, span: FileSpan | None, files: bool | str) -> str:
    if files is not True:
        return str(files)
    if span is not None:
        return "mapped from a second folder"
    if array.dtype.str[0] not in "<|":
        return "big-endian array"
    if file_span(array) is not None:
        return "file path not UTF-8"
    if not array.flags.c_contiguous:
        return "strided view"
    return "not a view of a mapped file (computed or widened at load)"


def device_providers(available: Sequence[str], device: str, fallback: bool = False) -> list[Any]:
    """The providers list for ``device`` given the providers this onnxruntime build has: the
    device's accelerators first, the CPU provider last (it runs the nodes they do not take)."""
    if device == "cpu":
        return list(DEFAULT_PROVIDERS)
    wanted = DEVICE_PROVIDERS[device]
    found = [name for name in wanted if name in available]
    if not found:
        message = (f"onnxruntime backend: no {device.upper()} execution provider in this onnxruntime build: "
                   f"expected one of {list(wanted)}, found {list(available)}")
        missing_device(message, fallback, log, "falling back to CPUExecutionProvider")
        return list(DEFAULT_PROVIDERS)
    chosen: list[Any] = [(name, {"device_type": _OPENVINO_DEVICE_TYPE[device]})
                         if name == "OpenVINOExecutionProvider" else name for name in found]
    return [*chosen, *DEFAULT_PROVIDERS]


def _provider_name(entry: Any) -> str:
    return entry[0] if isinstance(entry, (tuple, list)) else entry


def _drop_missing(engine: Mapping[str, Any], available: Sequence[str], fallback: bool) -> dict[str, Any]:
    """With ``fallback``, requested providers this build lacks are dropped (with a warning) and
    the CPU provider is kept last; without it they stay, and ``_providers`` refuses them."""
    providers = list(engine["providers"])
    missing = [_provider_name(p) for p in providers if _provider_name(p) not in available]
    if not missing or not fallback:
        return {}
    log.warning("onnxruntime backend: provider(s) %s are not available in this build (available: %s); "
                "falling back to the others", missing, list(available))
    kept = [i for i, p in enumerate(providers) if _provider_name(p) in available]
    options = engine.get("provider_options")
    chosen = {"providers": [providers[i] for i in kept]}
    if options is not None:
        chosen["provider_options"] = [options[i] for i in kept]
    if "CPUExecutionProvider" not in [_provider_name(p) for p in chosen["providers"]]:
        chosen["providers"].append("CPUExecutionProvider")
        if options is not None:
            chosen["provider_options"].append({})
    return chosen


def _prepacks(option: Any, weight_bytes: int) -> bool:
    if option == "auto":
        return weight_bytes < PREPACK_AUTO_LIMIT
    return bool(option)


def _check_engine_options(engine_options: Mapping[str, Any]) -> dict[str, Any]:
    engine_options = check_option_names("onnxruntime", engine_options, ENGINE_OPTIONS)
    if engine_options.get("prepack", "auto") not in ("auto", True, False):
        raise BackendError(f"onnxruntime backend: prepack {engine_options['prepack']!r}: expected True, False or 'auto'")
    level = engine_options.get("optimization_level")
    if level is not None and level not in OPTIMIZATION_LEVELS:
        raise BackendError(f"onnxruntime backend: optimization_level {level!r}: expected one of "
                           f"{list(OPTIMIZATION_LEVELS)}")
    return dict(engine_options)


def _session_options(ort: Any, options: CompileOptions, engine: Mapping[str, Any]) -> Any:
    session_options = ort.SessionOptions()
    if options.threads is not None:
        if not isinstance(options.threads, int) or options.threads < 1:
            raise BackendError(f"onnxruntime backend: threads must be a positive integer, got {options.threads!r}")
        session_options.intra_op_num_threads = options.threads
    session_options.inter_op_num_threads = 1
    session_options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    level = OPTIMIZATION_LEVELS[engine.get("optimization_level", "all")]
    session_options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    # Errors reach the caller as BackendError; onnxruntime's own log would repeat them.
    session_options.log_severity_level = int(engine.get("log_severity", 4))
    if not options.busy_wait:
        session_options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    for key, value in dict(engine.get("session_config") or {}).items():
        session_options.add_session_config_entry(str(key), str(value))
    return session_options


def _providers(ort: Any, engine: Mapping[str, Any]) -> tuple[list[Any], list[dict] | None]:
    providers = list(engine.get("providers") or DEFAULT_PROVIDERS)
    provider_options = engine.get("provider_options")
    if provider_options is not None and any(isinstance(p, (tuple, list)) for p in providers):
        raise BackendError("onnxruntime backend: give provider options either in providers as "
                           "(name, options) pairs or in provider_options, not both")
    available = ort.get_available_providers()
    names = [_provider_name(p) for p in providers]
    missing = [n for n in names if n not in available]
    if missing:
        raise BackendError(f"onnxruntime backend: provider(s) {missing} are not available in this "
                           f"onnxruntime build; available: {available}")
    if provider_options is not None:
        provider_options = [dict(o or {}) for o in provider_options]
        if len(provider_options) != len(providers):
            raise BackendError(f"onnxruntime backend: provider_options has {len(provider_options)} entries, "
                               f"expected one per provider ({len(providers)}: {names})")
    return providers, provider_options


def _where(exc: BaseException, node_names: Mapping[str, str]) -> str:
    """`` at node 'conv1' (Conv)`` when onnxruntime's message names a node, else ``""``."""
    text = str(exc)
    for pattern in _NODE_PATTERNS:
        match = pattern.search(text)
        if match is None:
            continue
        name = match.group("name")
        node = node_names.get(name)
        if node is None:  # a node onnxruntime made by fusing ours keeps our name as a part
            parts = [known for known in node_names if known and known in name]
            node = node_names[max(parts, key=len)] if parts else None
        if node is not None:
            return f" at {node}"
        op = match.groupdict().get("op")
        return f" at node {name!r}" + (f" ({op})" if op else "")
    return ""
