"""The OpenVINO backend: lower, export to ONNX in memory, ``compile_model`` once.

``compile`` rewrites ``edgeinfer``-domain ops into standard ONNX ops (``lower_graph``),
exports the graph (``convert.export``: weights handed over by address, not serialized), reads
it with OpenVINO's ONNX frontend and compiles it for the device. Symbolic dims (``"N"``) stay
dynamic dims in OpenVINO.

Thread safety: an ``InferRequest`` must not be shared by threads, so the executable keeps one
per calling thread (``threading.local``) and is thread safe. Concurrent requests run in
parallel when the compiled model has several streams (``performance_hint="THROUGHPUT"``);
with the default ``LATENCY`` hint the CPU plugin has one stream and runs them one at a time.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any

import numpy as np

from edgeinfer.backend import Artifact, Backend, CompileOptions, Executable, check_option_names
from edgeinfer.backends.common import merged_options, missing_device, refuse_unsupported
from edgeinfer.errors import BackendError
from edgeinfer.ir import Graph, Node
from edgeinfer.ir.graph import EDGEINFER_DOMAIN

DEVICE_NAMES = {"cpu": "CPU", "gpu": "GPU", "npu": "NPU"}
PERFORMANCE_HINTS = ("LATENCY", "THROUGHPUT", "CUMULATIVE_THROUGHPUT")
PRECISIONS = ("f32", "bf16", "f16")
ENGINE_OPTIONS = ("performance_hint", "precision", "fp32_nodes", "device_name", "config")
ARTIFACT_KIND = "openvino"  # the ahead-of-time form: the compiled model as ``export_model`` writes it
_COMPOSITE_DEVICES = ("AUTO", "HETERO", "MULTI", "BATCH")
_STANDARD_DOMAINS = ("", "ai.onnx.ml")
log = logging.getLogger("edgeinfer.backends.openvino")
_core: Any = None
_core_lock = threading.Lock()


def core() -> Any:
    """The process's ``openvino.Core`` (creating one loads plugins: do it once)."""
    global _core
    with _core_lock:
        if _core is None:
            import openvino

            _core = openvino.Core()
        return _core


class OpenVinoExecutable(Executable):
    thread_safe = True  # one InferRequest per calling thread

    def __init__(self, graph: Graph, compiled: Any, device_name: str, names: Mapping[str, Node],
                 buffers: list[np.ndarray] | None = None, integer_path: str | None = None):
        super().__init__(graph)
        self._buffers = list(buffers or [])  # weights whose addresses the exported model carried
        self._names = dict(names)  # OpenVINO's names (node and output names) -> IR node
        self.compiled = compiled
        self.device_name = device_name
        self.integer_path = integer_path  # how its int8 products are computed here (see int8.py)
        self._ports = list(compiled.outputs)
        self._inputs = {name for port in compiled.inputs for name in port.get_names()}
        self._local = threading.local()

    def _request(self) -> Any:
        request = getattr(self._local, "request", None)
        if request is None:
            request = self._local.request = self.compiled.create_infer_request()
        return request

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        # An input no node reads has no Parameter in the compiled model: nothing to feed.
        used = {name: array for name, array in feeds.items() if name in self._inputs}
        if any(getattr(array, "size", 1) == 0 for array in used.values()):
            # OpenVINO 2026.4's CPU plugin crashes the process on an empty tensor through a Conv
            raise BackendError(f"openvino cannot run graph {self.graph.name!r} on zero-size input(s) "
                               f"{ {n: tuple(a.shape) for n, a in used.items() if a.size == 0} }: expected every "
                               "dim >= 1 (the runtime moves such a request's nodes to another backend)")
        try:
            results = self._request().infer(used, share_inputs=True, share_outputs=False)
        except Exception as exc:  # OpenVINO raises RuntimeError and its own pybind types
            from .convert import backend_error

            shapes = {name: getattr(array, "shape", None) for name, array in feeds.items()}
            raise backend_error("failed to run", self.graph, exc, self._names,
                                f" with inputs {shapes}") from exc
        return {name: results[port] for name, port in zip(self.output_names, self._ports, strict=True)}

    def close(self) -> None:
        self.compiled = None  # the compiled model, with the infer requests below
        self._local = threading.local()
        self._ports = []
        self._buffers = []

    def artifact(self, source: Graph) -> Artifact | None:
        """The compiled model (``export_model``): imported at load with no conversion and no
        onnx import; CPU only (a GPU or NPU blob is its driver's)."""
        if self.compiled is None or self.device_name != "CPU":
            return None
        labels = {name: getattr(node, "label", str(node)) for name, node in self._names.items()}
        return Artifact(ARTIFACT_KIND, self.compiled.export_model().getvalue(),
                        {"nodes": labels, "integer_path": self.integer_path})

    def property(self, name: str) -> Any:
        """A property of the compiled model (``INFERENCE_NUM_THREADS``, ``NUM_STREAMS`` ...)."""
        return self.compiled.get_property(name)

    def stats(self) -> dict[str, Any]:
        from .convert import memory_external_data_supported

        facts: dict[str, Any] = {"device": self.device_name, "in_memory_weights": memory_external_data_supported(),
                                 "integer_path": self.integer_path}
        for key, name in (("execution_devices", "EXECUTION_DEVICES"), ("inference_num_threads", "INFERENCE_NUM_THREADS"),
                          ("performance_hint", "PERFORMANCE_HINT"), ("inference_precision", "INFERENCE_PRECISION_HINT"),
                          ("num_streams", "NUM_STREAMS"),
                          ("optimal_number_of_infer_requests", "OPTIMAL_NUMBER_OF_INFER_REQUESTS")):
            try:
                value = self.compiled.get_property(name)
            except Exception:  # a property this device does not report
                continue
            facts[key] = _plain(value)
        request = getattr(self._local, "request", None)
        if request is not None and _profiling(self.compiled):
            facts["profile"] = _profile(request)
        return facts


class OpenVinoBackend(Backend):
    name = "openvino"

    def __init__(self, *, device: str = "cpu", fallback: bool = False, **engine_options: Any):
        if device not in DEVICE_NAMES:
            raise BackendError(f"openvino backend: device {device!r}: expected one of {list(DEVICE_NAMES)}")
        self.engine_options = _check_engine_options(engine_options)
        self.fallback = fallback
        requested = self.engine_options.get("device_name") or DEVICE_NAMES[device]
        # the CPU plugin ships with every OpenVINO build; listing devices loads every plugin (57 ms)
        self.device_name = "CPU" if requested == "CPU" else resolve_device(requested, core().available_devices,
                                                                            fallback)
        kind = self.device_name.split(":")[0].split(".")[0]  # "GPU.1" -> GPU; "AUTO:GPU,CPU" -> AUTO
        self.device = {name: key for key, name in DEVICE_NAMES.items()}.get(kind, device)

    def engine_version(self) -> str:
        import openvino

        return openvino.__version__

    def supports(self, node: Node, graph: Graph) -> str | None:
        from .support import node_reason

        reason = _static_reason(node, graph) or _float64_reason(node, graph) or _rank_reason(node, graph)
        if reason is not None or node.domain == EDGEINFER_DOMAIN:  # lowered ops are standard ONNX
            return reason
        return node_reason(node, graph, self.device_name, core().query_model)

    def compile(self, graph: Graph, options: CompileOptions | None = None) -> OpenVinoExecutable:
        options = options or CompileOptions()
        engine = merged_options(self.engine_options, options.engine_options, _check_engine_options)
        device_name = self.device_name
        if options.engine_options.get("device_name"):
            device_name = resolve_device(engine["device_name"], core().available_devices, self.fallback)
        threads = _check_threads(options.threads)
        if options.artifact is not None and options.artifact.kind == ARTIFACT_KIND and device_name == "CPU":
            return _imported(graph, options.artifact, compile_config(device_name, engine, threads, options.debug,
                                                                     shared_cores=not options.busy_wait))
        from edgeinfer.ir.lowering import lower_graph

        from .convert import backend_error, export, read_onnx
        from .int8 import exact_graph, float_transposed_conv_weights, own_quantization_parameters

        refuse_unsupported("openvino", graph.name,
                           [(n.label, r) for n in graph.nodes if (r := _static_reason(n, graph)) is not None])
        lowered = lower_graph(graph)
        integer_path = None
        if "CPU" in device_name:  # the probe measures the CPU plugin's kernels; a GPU's are its own
            lowered, integer_path = exact_graph(lowered)  # int8 weights as uint8 where they saturate here
        lowered = float_transposed_conv_weights(lowered)  # its INT8 ConvTranspose is wrong (PP-OCRv4 det)
        lowered = own_quantization_parameters(lowered)  # its transformations edit shared constants in place
        model_bytes, names, buffers = export(lowered)
        try:
            model = read_onnx(model_bytes)
        except Exception as exc:
            raise backend_error("could not convert", lowered, exc, names) from exc
        if engine.get("fp32_nodes"):
            from .precision import keep_fp32

            model, _ = keep_fp32(model, engine["fp32_nodes"])
        config = compile_config(device_name, engine, threads, options.debug, shared_cores=not options.busy_wait)
        try:
            compiled = core().compile_model(model, device_name, config)
        except Exception as exc:
            raise backend_error(f"could not compile for {device_name}", lowered, exc, names) from exc
        if len(compiled.outputs) != len(lowered.outputs):
            raise BackendError(f"openvino compiled graph {graph.name!r} with {len(compiled.outputs)} outputs, "
                               f"expected {len(lowered.outputs)} ({lowered.output_names})")
        # OpenVINO 2026 copies the buffers while reading; an engine that kept their addresses
        # (its constants referring to them in place) must find them alive: they live as long as
        # the executable (mostly the graph's own arrays, so this costs nothing).
        return OpenVinoExecutable(lowered, compiled, device_name, names, buffers, integer_path)


def _imported(graph: Graph, artifact: Artifact, config: dict[str, Any]) -> OpenVinoExecutable:
    """The executable of a compiled model stored ahead of time, if it is the one of ``graph``."""
    import io

    compiled = core().import_model(io.BytesIO(artifact.data), "CPU", config)
    inputs = {name for port in compiled.inputs for name in port.get_names()}
    outputs = [sorted(port.get_names()) for port in compiled.outputs]
    if not inputs <= set(graph.input_names) or len(outputs) != len(graph.outputs) or \
            any(name not in names for name, names in zip(graph.output_names, outputs)):
        raise BackendError(f"the compiled model stored for graph {graph.name!r} takes {sorted(inputs)} and gives "
                           f"{outputs}: expected {graph.input_names} and {graph.output_names} "
                           "(a compiled model of another part)")
    return OpenVinoExecutable(graph, compiled, "CPU", dict(artifact.facts.get("nodes", {})),
                              integer_path=artifact.facts.get("integer_path"))


def resolve_device(requested: str, available: list[str], fallback: bool) -> str:
    """``requested`` if this machine has it (``"GPU"`` matches ``"GPU.0"``; ``"AUTO:GPU,CPU"``
    needs each listed device), else ``"CPU"`` with ``fallback``, else a BackendError."""
    kind, _, listed = requested.partition(":")
    wanted = [d for d in listed.split(",") if d] if kind in _COMPOSITE_DEVICES else [requested]
    missing = [d for d in wanted if not any(a == d or a.startswith(d + ".") for a in available)]
    if not missing:
        return requested
    message = (f"openvino backend: no {', '.join(missing)} device on this machine: expected one of "
               f"{list(available)}")
    missing_device(message, fallback, log, "falling back to CPU")
    return "CPU"


def compile_config(device_name: str, engine: Mapping[str, Any], threads: int | None, debug: bool, *,
                   shared_cores: bool = False) -> dict[str, Any]:
    """``compile_model`` properties: performance hint, threads and precision where the device
    takes them, profiling in debug mode, then the user's ``config`` on top.

    ``shared_cores`` (``CompileOptions.busy_wait=False``: other executables run on the same
    cores at the same time, as pipeline replicas and DAG parts do) turns off OpenVINO's CPU
    pinning. Pinned, every compiled model's threads land on the same first cores: two 1-thread
    encoder models in two Python threads served 549 requests/s together against 452 for one,
    and 1,127 unpinned (``python benchmarks/bench_timing_effects.py --only pinning``)."""
    supported = _supported_properties(device_name)
    config: dict[str, Any] = {"PERFORMANCE_HINT": engine.get("performance_hint", "LATENCY").upper()}
    if threads is not None:
        if "INFERENCE_NUM_THREADS" in supported:
            config["INFERENCE_NUM_THREADS"] = threads
        else:
            log.debug("openvino: %s takes no thread count; threads=%d ignored", device_name, threads)
    if shared_cores and "ENABLE_CPU_PINNING" in supported:
        config["ENABLE_CPU_PINNING"] = False
    precision = engine.get("precision")
    if precision is None and "NPU" not in device_name:  # an NPU computes in f16: leave it its own default
        precision = "f32"
    if precision is not None:
        config["INFERENCE_PRECISION_HINT"] = precision
    if engine.get("fp32_nodes") and device_name == "CPU":  # (a hidden property: not in SUPPORTED_PROPERTIES) its snippets' fused subgraphs ignore nodes kept in f32 (precision.py)
        config["SNIPPETS_MODE"] = "DISABLE"
    if debug:
        config["PERF_COUNT"] = True
    config.update(dict(engine.get("config") or {}))
    return config


def _supported_properties(device_name: str) -> set[str]:
    try:
        return set(core().get_property(device_name.split(":")[0], "SUPPORTED_PROPERTIES"))
    except Exception:  # a composite device that does not list them
        return set()


def _check_engine_options(engine_options: Mapping[str, Any]) -> dict[str, Any]:
    engine_options = check_option_names("openvino", engine_options, ENGINE_OPTIONS)
    hint = engine_options.get("performance_hint")
    if hint is not None and (not isinstance(hint, str) or hint.upper() not in PERFORMANCE_HINTS):
        raise BackendError(f"openvino backend: performance_hint {hint!r}: expected one of {list(PERFORMANCE_HINTS)}")
    precision = engine_options.get("precision")
    if precision is not None and precision not in PRECISIONS:
        raise BackendError(f"openvino backend: precision {precision!r}: expected one of {list(PRECISIONS)}")
    kept = engine_options.get("fp32_nodes")
    if kept is not None and (isinstance(kept, str) or not all(isinstance(n, str) for n in kept)):
        raise BackendError(f"openvino backend: fp32_nodes {kept!r}: expected a list of tensor names (the outputs "
                           "of the nodes kept in f32)")
    device_name = engine_options.get("device_name")
    if device_name is not None and (not isinstance(device_name, str) or not device_name):
        raise BackendError(f"openvino backend: device_name {device_name!r}: expected an OpenVINO device "
                           "string such as 'CPU', 'GPU.1' or 'AUTO:GPU,CPU'")
    config = engine_options.get("config")
    if config is not None and not isinstance(config, Mapping):
        raise BackendError(f"openvino backend: config: expected a mapping of property -> value, "
                           f"got {type(config).__name__}")
    return dict(engine_options)


def _check_threads(threads: Any) -> int | None:
    if threads is None:
        return None
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise BackendError(f"openvino backend: threads must be a positive integer, got {threads!r}")
    return threads


def _schema_reason(node: Node, graph: Graph) -> str | None:
    """The cheap check first: an op outside ONNX, or not defined at the graph's opset."""
    if node.domain not in _STANDARD_DOMAINS:
        return None  # OpenVINO's frontend also knows some vendor domains: the probe decides
    from edgeinfer.ir.onnx_io import schema_reason

    return schema_reason(node, graph)


def _float64_reason(node: Node, graph: Graph) -> str | None:
    """OpenVINO's plugins compute float64 in float32: such a node belongs on a backend with
    float64 kernels (``compile`` still runs a float64 graph it is given, at float32 precision)."""
    for name in (*node.inputs, *node.outputs):
        value = graph.values.get(name) if name else None
        if value is not None and value.dtype == "float64":
            return f"value {name!r} is float64, which OpenVINO computes in float32"
        if value is not None and value.dtype == "str":
            return f"value {name!r} holds strings, which OpenVINO's CPU plugin does not compute with"
    return None


def _static_reason(node: Node, graph: Graph) -> str | None:
    if node.domain == EDGEINFER_DOMAIN:
        from edgeinfer.ir.lowering import find_lowering

        return None if find_lowering(node, graph) is not None else (
            f"op {node.domain}::{node.op_type} has no lowering to standard ONNX ops for OpenVINO")
    return _schema_reason(node, graph)


def _rank_reason(node: Node, graph: Graph) -> str | None:
    """OpenVINO's plugins compile no value of unknown rank ("doesn't support Parameter operation
    with dynamic rank"), though ``query_model`` of the node alone takes it."""
    for name in (*node.inputs, *node.outputs):
        value = graph.values.get(name) if name else None
        if value is not None and value.const is None and value.shape is None:
            return f"value {name!r} has no known rank (OpenVINO compiles only values of known rank)"
    if (node.op_type in ("Squeeze", "Unsqueeze") or node.op_type.startswith("Reduce")) and len(node.inputs) > 1 \
            and node.inputs[1] and graph.values[node.inputs[1]].const is None:
        return f"{node.op_type} axes computed at run time: OpenVINO cannot tell the output's rank"
    return None


def _plain(value: Any) -> Any:
    """An OpenVINO property value as a plain python value (``f32``, ``LATENCY``, 2, [...])."""
    if isinstance(value, (bool, int, float, list)):
        return value
    if hasattr(value, "to_string"):  # openvino.Type
        return value.to_string()
    return str(value).rsplit(".", 1)[-1]  # enums print as PerformanceMode.LATENCY


def _profiling(compiled: Any) -> bool:
    try:
        value = compiled.get_property("PERF_COUNT")
    except Exception:
        return False
    return value is True or str(value).upper() in ("YES", "TRUE")


def _profile(request: Any, top: int = 20) -> list[dict[str, Any]]:
    """The slowest executed nodes of the calling thread's last run (``debug=True``)."""
    rows = [{"node": info.node_name, "type": info.node_type, "exec_type": info.exec_type,
             "ms": info.real_time.total_seconds() * 1e3}
            for info in request.profiling_info if str(info.status).endswith("EXECUTED")]
    return sorted(rows, key=lambda row: row["ms"], reverse=True)[:top]
