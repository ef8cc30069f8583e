"""The onnxruntime backend: export a graph to ONNX once, keep one ``InferenceSession``.

Compile lowers ``edgeinfer``-domain ops that have a lowering (see ``lowerings.py``), exports
the graph with ``graph_to_model`` and builds the session from the serialized bytes. Large
initializers are not serialized: the model carries an external-data placeholder for each,
and the numpy array itself is handed to onnxruntime (``add_external_initializers``), which
uses the buffer in place. That avoids a copy of the weights (an ``.eim`` file's weights are
memory-mapped) and protobuf's 2 GiB limit.

``InferenceSession.run`` may be called from several threads at once, so the executable is
thread safe.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx

from edgeinfer.backend import Backend, CompileOptions, Executable, check_option_names
from edgeinfer.errors import BackendError
from edgeinfer.ir import Graph, Node
from edgeinfer.ir.onnx_io import (
    array_to_tensor,
    external_placeholder,
    graph_to_model,
    name_exported_nodes,
    schema_reason,
)

from .int8 import EXACT_REWRITE, exact_weights, graph_integer_path
from .lowerings import find_lowering, lower_graph

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
# onnxruntime prepacks MatMul/Conv weights into copies of its own and, since edgeinfer hands
# the weights over in memory (external initializers, possibly mapped from a .eim), cannot free
# the originals: resident memory doubles. prepack="auto" (the default) turns prepacking off for
# a part holding this many bytes of weights: at batch 1 such models are matrix-vector products,
# which onnxruntime runs at the same speed unpacked (bench_big.py; at batch 8 a 256 MiB MatMul
# took 2.8x longer unpacked, so pass prepack=True to trade memory for that).
PREPACK_AUTO_LIMIT = 1 << 30
_SHAREABLE_KINDS = "fiub"  # numpy's own types; ml_dtypes (bfloat16, float8, int4) are serialized
log = logging.getLogger("edgeinfer.backends.onnxruntime")
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


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:600]


class OnnxRuntimeExecutable(Executable):
    thread_safe = True  # InferenceSession.run is documented as safe to call concurrently

    def __init__(self, graph: Graph, session: Any, node_names: Mapping[str, Node],
                 external: Sequence[Any], integer_path: str | None = None):
        super().__init__(graph)
        self.session = session
        self._node_names = dict(node_names)
        self._external = list(external)  # keep the buffers onnxruntime reads in place alive
        self.integer_path = integer_path  # how its int8 products are computed here (see int8.py)

    @property
    def session_options(self) -> Any:
        """The ``onnxruntime.SessionOptions`` the session was built with."""
        return self.session.get_session_options()

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        try:
            results = self.session.run(None, feeds)
        except Exception as exc:  # onnxruntime raises its own pybind exception classes
            shapes = {name: getattr(array, "shape", None) for name, array in feeds.items()}
            raise BackendError(f"onnxruntime failed to run graph {self.graph.name!r}"
                               f"{_where(exc, self._node_names)} with inputs {shapes}: "
                               f"{_first_line(exc)}") from exc
        return dict(zip(self.output_names, results, strict=True))

    def close(self) -> None:
        self.session = None  # the InferenceSession and its arena go with the last reference
        self._external = []

    def stats(self) -> dict[str, Any]:
        options = self.session_options
        return {"providers": self.session.get_providers(),
                "intra_op_num_threads": options.intra_op_num_threads,
                "graph_optimization_level": str(options.graph_optimization_level).rsplit(".", 1)[-1],
                "integer_path": self.integer_path}


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
        if find_lowering(node, graph) is not None or (node.domain, node.op_type) in _CONTRIB_OPS:
            return None
        if node.domain not in _STANDARD_DOMAINS:
            return (f"op {node.domain}::{node.op_type} is outside the standard ONNX domains and has no "
                    "onnxruntime lowering")
        return schema_reason(node, graph)

    def compile(self, graph: Graph, options: CompileOptions | None = None) -> OnnxRuntimeExecutable:
        options = options or CompileOptions()
        engine = {**self.engine_options, **_check_engine_options(options.engine_options)}
        unsupported = self.unsupported(graph)
        if unsupported:
            listed = "; ".join(f"{label}: {reason}" for label, reason in list(unsupported.items())[:5])
            raise BackendError(f"onnxruntime cannot run {len(unsupported)} node(s) of graph {graph.name!r}: "
                               f"{listed}")
        graph = lower_graph(graph)
        # the probe measures the CPU provider's kernels; an accelerator's are its own
        integer_path = graph_integer_path(graph) if self.device == "cpu" else None
        if integer_path == EXACT_REWRITE:  # this CPU's u8 x s8 kernels saturate: compute exactly
            graph, rewritten = exact_weights(graph)
            log.debug("onnxruntime: int8 weights of %d node(s) of graph %r as uint8 (zero point + 128)",
                      len(rewritten), graph.name)
        model, node_names, names, values = _export(graph)
        ort = _ort()
        session_options = _session_options(ort, options, engine)
        if not _prepacks(engine.get("prepack", "auto"), sum(a.nbytes for a in values)):
            session_options.add_session_config_entry("session.disable_prepacking", "1")
            log.info("onnxruntime: prepacking off for graph %r (%.1f GiB of weights handed over in memory)",
                     graph.name, sum(a.nbytes for a in values) / 2**30)
        external = [ort.OrtValue.ortvalue_from_numpy(array) for array in values]
        if names:
            session_options.add_external_initializers(names, external)
        providers, provider_options = _providers(ort, engine)
        try:
            session = ort.InferenceSession(model.SerializeToString(), session_options,
                                           providers=providers, provider_options=provider_options)
        except Exception as exc:
            raise BackendError(f"onnxruntime could not compile graph {graph.name!r}"
                               f"{_where(exc, node_names)}: {_first_line(exc)}") from exc
        return OnnxRuntimeExecutable(graph, session, node_names, [*values, *external], integer_path)


def _export(graph: Graph) -> tuple[onnx.ModelProto, dict[str, Node], list[str], list[np.ndarray]]:
    """The model to hand to onnxruntime, node name -> IR node, and the external initializers
    (names and C-contiguous arrays) that onnxruntime will read in place."""
    model = graph_to_model(graph, include_initializers=False, value_info=False)
    node_names = name_exported_nodes(model, graph)
    names: list[str] = []
    values: list[np.ndarray] = []
    for name, array in graph.initializers.items():
        if array.dtype.kind in _SHAREABLE_KINDS and array.nbytes >= EXTERNAL_MIN_BYTES:
            model.graph.initializer.append(_external_placeholder(name, array))
            names.append(name)
            values.append(np.ascontiguousarray(array))
        else:
            model.graph.initializer.append(array_to_tensor(array, name))
    return model, node_names, names, values


def _external_placeholder(name: str, array: np.ndarray) -> onnx.TensorProto:
    # never read: the array itself is supplied at session build (add_external_initializers)
    return external_placeholder(name, array, {"location": "edgeinfer-in-memory"})


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
        if not fallback:
            raise BackendError(message + " (fallback=True runs on the CPU instead)")
        log.warning("%s; falling back to CPUExecutionProvider", message)
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


def _where(exc: BaseException, node_names: Mapping[str, Node]) -> str:
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
            return f" at {node.label}"
        op = match.groupdict().get("op")
        return f" at node {name!r}" + (f" ({op})" if op else "")
    return ""
