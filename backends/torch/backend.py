"""The torch backend: compile a graph to a ``torch.fx.GraphModule`` on a torch device.

``compile`` builds the GraphModule (``compiler.build_module``), moves its weights to the device
once, and wraps it in a ``TorchExecutable``:

- ``run(feeds)``: numpy in, numpy out (the ``Executable`` contract);
- ``run_tensors(feeds)``: numpy arrays or torch tensors in, torch tensors on the device out, so
  two parts on the same device pass activations without a host round trip. A numpy feed for a
  CUDA device is staged through pinned memory and copied asynchronously, once;
- ``precision="fp16" | "bf16"``: float32 weights and inputs compute in half precision, float32
  outputs come back as float32;
- ``cuda_graphs=True`` (CUDA devices only: on any other device it is a ``BackendError`` at
  backend creation, since a silently ignored option would report eager figures as graph
  figures): one CUDA graph captured per shape signature (input shapes and dtypes) on its first
  request, replayed on every later one with that signature; at most ``cuda_graph_cache``
  signatures are kept (least recently used evicted);
- ``torch_compile=True`` (or a dict of ``torch.compile`` keyword arguments): the GraphModule is
  compiled with ``torch.compile`` when the executable is built.

The executable is thread safe: eager torch modules hold no per-run state, and a CUDA graph's
static buffers are used under a lock.
"""

from __future__ import annotations

import collections
import logging
import re
import threading
import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from edgeinfer.backend import Backend, CompileOptions, Executable, check_option_names
from edgeinfer.backends.common import first_line, merged_options, missing_device, refuse_unsupported
from edgeinfer.errors import BackendError
from edgeinfer.ir import Graph, Node

from .compiler import NodeFailure, build_module, find_lowering
from .tensors import NAMES, PRECISIONS, to_numpy, to_torch, torch_dtype

ENGINE_OPTIONS = ("precision", "fp32_nodes", "cuda_graphs", "cuda_graph_cache", "torch_compile")
log = logging.getLogger("edgeinfer.backends.torch")
_CUDA_INDEX = re.compile(r"cuda:(\d+)$")
CONTAINER_OPS = frozenset({"If", "Loop", "Scan", "SequenceMap"})


def available_devices() -> list[str]:
    """The torch devices this machine has: ``"cpu"``, then ``"cuda:N"`` for every CUDA (or
    ROCm) device, then ``"mps"`` where Apple's Metal backend is available."""
    found = ["cpu"]
    if torch.cuda.is_available():
        found += [f"cuda:{index}" for index in range(torch.cuda.device_count())]
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        found.append("mps")
    return found


def accepts_device(device: str) -> bool:
    """Device names this backend understands (whether present or not)."""
    return device in ("cpu", "gpu", "npu", "mps") or _CUDA_INDEX.match(device) is not None


def resolve_device(device: str, fallback: bool = False) -> torch.device:
    """``"cpu" | "gpu" | "cuda:N" | "mps"`` -> the torch device, or ``BackendError`` naming what
    this machine has (with ``fallback=True``: a warning and the CPU)."""
    present = available_devices()
    if device == "gpu":
        accelerators = [d for d in present if d != "cpu"]
        chosen = accelerators[0] if accelerators else None
    elif device in present:
        chosen = device
    else:
        chosen = None
    if chosen is None:
        message = (f"torch backend: device {device!r} is not available in this torch build "
                   f"({torch.__version__}); available: {present}")
        if not accepts_device(device):
            message = f"torch backend: device {device!r}: expected 'cpu', 'gpu', 'cuda:N' or 'mps'"
        missing_device(message, fallback, log, "running on the CPU")
        chosen = "cpu"
    return torch.device(chosen)


LINK_PROBE_BYTES = 16 << 20  # what the copy-bandwidth probe moves each way
_LINKS: dict[str, dict[tuple[str, str], float]] = {}
_LINKS_LOCK = threading.Lock()


def link_bytes_per_second(device: torch.device) -> dict[tuple[str, str], float]:
    """Host <-> ``device`` copy bandwidth, measured once per device and process (16 MiB each
    way, best of three; from pinned host memory on CUDA, as the backend copies); ``{}`` for
    the CPU, where nothing is copied."""
    if device.type == "cpu":
        return {}
    with _LINKS_LOCK:
        if str(device) not in _LINKS:
            _LINKS[str(device)] = _measure_links(device)
        return dict(_LINKS[str(device)])


def _measure_links(device: torch.device) -> dict[tuple[str, str], float]:
    cuda = device.type == "cuda"
    host = torch.empty(LINK_PROBE_BYTES, dtype=torch.uint8, pin_memory=cuda)
    on_device = torch.empty(LINK_PROBE_BYTES, dtype=torch.uint8, device=device)

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)
        else:
            torch.mps.synchronize()

    def best(copy) -> float:
        copy()
        sync()
        fastest = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            copy()
            sync()
            fastest = min(fastest, time.perf_counter() - start)
        return fastest

    to_device = best(lambda: on_device.copy_(host, non_blocking=cuda))
    to_host = best(lambda: host.copy_(on_device, non_blocking=cuda))
    name = str(device)
    found = {("cpu", name): LINK_PROBE_BYTES / to_device, (name, "cpu"): LINK_PROBE_BYTES / to_host}
    log.info("torch backend: host <-> %s copies %s", name, {k: f"{v / 1e9:.1f} GB/s" for k, v in found.items()})
    return found


def tf32_enabled() -> bool:
    """Whether torch lets CUDA compute float32 convolutions or matrix products in TF32 (10
    mantissa bits): cuDNN convolutions do by default (``torch.backends.cudnn.allow_tf32``),
    and ``NVIDIA_TF32_OVERRIDE=0`` turns it off for the whole process."""
    import os

    if os.environ.get("NVIDIA_TF32_OVERRIDE") == "0":
        return False
    return bool(torch.backends.cudnn.allow_tf32 or torch.backends.cuda.matmul.allow_tf32)


_TF32_WARNED = threading.Event()


def _warn_if_tf32() -> None:
    """One warning per process: ``precision="fp32"`` on CUDA follows torch's process-wide TF32
    switches, which this library does not change behind the user's back; with them on, deep
    networks differ from a float32 reference by about 1e-3 to 1e-2 of the output scale
    (ResNet-50 on an H200: 5e-3)."""
    if tf32_enabled() and not _TF32_WARNED.is_set():
        _TF32_WARNED.set()
        log.warning("torch backend: precision 'fp32' on CUDA computes convolutions in TF32 under torch's "
                    "current settings (about 1e-3 relative error a layer); set "
                    "torch.backends.cudnn.allow_tf32 = False (or NVIDIA_TF32_OVERRIDE=0) for IEEE float32")


def _check_engine_options(options: Mapping[str, Any]) -> dict[str, Any]:
    options = check_option_names("torch", options, ENGINE_OPTIONS)
    precision = options.get("precision", "fp32")
    if precision not in PRECISIONS:
        raise BackendError(f"torch backend: precision {precision!r}: expected one of {list(PRECISIONS)}")
    kept = options.get("fp32_nodes", [])
    if not isinstance(kept, (list, tuple)) or not all(isinstance(name, str) for name in kept):
        raise BackendError(f"torch backend: fp32_nodes must be a list of node output names, got {kept!r}")
    compile_option = options.get("torch_compile", False)
    if not isinstance(compile_option, (bool, dict)):
        raise BackendError(f"torch backend: torch_compile must be True/False or a dict of torch.compile "
                           f"arguments, got {compile_option!r}")
    cache = options.get("cuda_graph_cache", 8)
    if not isinstance(cache, int) or cache < 1:
        raise BackendError(f"torch backend: cuda_graph_cache must be a positive integer, got {cache!r}")
    return options


class _CudaGraph:
    """One captured CUDA graph: static inputs, the outputs it writes, replayed per request."""

    def __init__(self, module: torch.nn.Module, example: list[torch.Tensor]):
        self.inputs = [t.clone() for t in example]
        stream = torch.cuda.Stream(device=self.inputs[0].device if self.inputs else None)
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream), torch.inference_mode():
            for _ in range(2):  # warm-up: cuDNN picks algorithms, allocator settles
                module(*self.inputs)
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph), torch.inference_mode():
            self.outputs = module(*self.inputs)

    def replay(self, inputs: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        for static, given in zip(self.inputs, inputs, strict=True):
            static.copy_(given, non_blocking=True)
        self.graph.replay()
        # the next replay overwrites the static outputs: the caller gets its own copies
        return tuple(t.clone() for t in self.outputs)


class TorchExecutable(Executable):
    thread_safe = True

    def __init__(self, graph: Graph, module: torch.nn.Module, device: torch.device, options: Mapping[str, Any],
                 placements: Mapping[str, str]):
        super().__init__(graph)
        self.module = module
        self.device = device
        self.precision = options.get("precision", "fp32")
        self.float_dtype = PRECISIONS[self.precision]
        self.placements = dict(placements)
        self._input_dtypes = [torch_dtype(graph.values[n].dtype) for n in self.input_names]
        self._output_dtypes = [torch_dtype(graph.values[n].dtype) for n in self.output_names]
        self._cuda_graphs = bool(options.get("cuda_graphs")) and device.type == "cuda"
        self._graphs: collections.OrderedDict[tuple, _CudaGraph] = collections.OrderedDict()
        self._graph_cache = options.get("cuda_graph_cache", 8)
        self._lock = threading.Lock()
        self._local = threading.local()  # pinned staging buffers, per thread
        self._call = module
        self.captures = 0
        compile_option = options.get("torch_compile", False)
        if compile_option:
            kwargs = compile_option if isinstance(compile_option, dict) else {}
            self._call = torch.compile(module, **kwargs)
        self._closed = False

    # -- feeds and results ------------------------------------------------------------------
    def _device_input(self, value: Any, index: int) -> torch.Tensor:
        tensor = value if isinstance(value, torch.Tensor) else to_torch(value)
        if tensor.device != self.device:
            if self.device.type == "cuda" and tensor.device.type == "cpu":
                tensor = self._pinned(index, tensor)  # a host value crossing to the GPU: pinned, once
            else:
                tensor = tensor.to(self.device, non_blocking=self.device.type == "cuda")  # into device memory
        if tensor.dtype == torch.float32 and self.float_dtype != torch.float32:
            tensor = tensor.to(self.float_dtype)
        return tensor

    def _pinned(self, index: int, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` on the device, copied through this thread's pinned staging buffer for
        input ``index`` asynchronously. The buffer is refilled only once the previous request's
        copy out of it is done (its event): a device-resident result does not wait for the
        host, so the next request may arrive while that copy is still in flight."""
        staging = self._local.__dict__.setdefault("staging", {})
        buffer, copied = staging.get(index, (None, None))
        if buffer is None or buffer.shape != tensor.shape or buffer.dtype != tensor.dtype:
            buffer, copied = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True), None
        elif copied is not None:
            copied.synchronize()
        buffer.copy_(tensor)
        on_device = buffer.to(self.device, non_blocking=True)
        copied = torch.cuda.Event()
        copied.record(torch.cuda.current_stream(self.device))
        staging[index] = (buffer, copied)
        return on_device

    def _signature(self, tensors: list[torch.Tensor]) -> tuple:
        return tuple((tuple(t.shape), t.dtype) for t in tensors)

    def _forward(self, tensors: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        if self._cuda_graphs:
            return self._replay(tensors)
        with torch.inference_mode():
            return self._call(*tensors)

    def _replay(self, tensors: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        key = self._signature(tensors)
        with self._lock:  # the static buffers of a graph serve one request at a time
            captured = self._graphs.get(key)
            if captured is None:
                captured = _CudaGraph(self._call, tensors)
                self.captures += 1
                self._graphs[key] = captured
                while len(self._graphs) > self._graph_cache:
                    self._graphs.popitem(last=False)
            self._graphs.move_to_end(key)
            return captured.replay(tensors)

    def run_tensors(self, feeds: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        """Run on the device: ``feeds`` are numpy arrays or torch tensors (any device); the
        results are torch tensors on this executable's device, in the graph's dtypes."""
        if self._closed:
            raise BackendError(f"torch backend: graph {self.graph.name!r} was run after close()")
        tensors = [self._device_input(feeds[name], i) for i, name in enumerate(self.input_names)]
        try:
            results = self._forward(tensors)
        except NodeFailure as exc:
            shapes = {name: tuple(t.shape) for name, t in zip(self.input_names, tensors)}
            raise BackendError(f"torch backend failed to run graph {self.graph.name!r} on {self.device} "
                               f"with inputs {shapes}: {exc}") from exc
        except RuntimeError as exc:  # CUDA graph capture, torch.compile
            raise BackendError(f"torch backend failed to run graph {self.graph.name!r} on {self.device}: "
                               f"{type(exc).__name__}: {first_line(exc)}") from exc
        outputs = {}
        for name, tensor, dtype in zip(self.output_names, results, self._output_dtypes, strict=True):
            if dtype is not None and tensor.dtype != dtype:
                tensor = tensor.to(dtype)  # float32 outputs of an fp16/bf16 computation
            outputs[name] = tensor
        return outputs

    def run(self, feeds: dict[str, Any]) -> dict[str, np.ndarray]:
        return {name: to_numpy(tensor) for name, tensor in self.run_tensors(feeds).items()}

    resident = "torch"  # the executors hand torch tensors between torch parts as they are

    def run_resident(self, feeds: dict[str, Any]) -> dict[str, torch.Tensor]:
        return self.run_tensors(feeds)

    def to_host(self, value: torch.Tensor) -> np.ndarray:
        return to_numpy(value)

    def from_host(self, value: np.ndarray) -> torch.Tensor:
        """``value`` on the device in its own dtype (each reader applies its precision)."""
        tensor = to_torch(value)
        if self.device.type == "cuda":
            return self._pinned(("from_host", tuple(tensor.shape), tensor.dtype), tensor)
        return tensor if self.device.type == "cpu" else tensor.to(self.device)

    def stats(self) -> dict[str, Any]:
        placements = collections.Counter(self.placements.values())
        return {"device": str(self.device), "precision": self.precision, "cuda_graphs": self._cuda_graphs,
                "tf32": self.device.type == "cuda" and self.precision == "fp32" and tf32_enabled(),
                "cuda_graph_captures": self.captures, "torch_compile": self._call is not self.module,
                "placements": dict(placements)}

    def close(self) -> None:
        """Drop the captured graphs and the device copy of the weights."""
        with self._lock:
            self._graphs.clear()
            self._closed = True
        self._call = self.module = None
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


class TorchBackend(Backend):
    name = "torch"

    def __init__(self, *, device: str = "cpu", fallback: bool = False, **engine_options: Any):
        self.engine_options = _check_engine_options(engine_options)
        self.torch_device = resolve_device(device, fallback)
        self.device = "cpu" if self.torch_device.type == "cpu" else str(self.torch_device)
        if self.engine_options.get("cuda_graphs") and self.torch_device.type != "cuda":
            raise BackendError(f"torch backend: cuda_graphs=True needs a CUDA device, the backend runs on "
                               f"{self.torch_device} (available: {available_devices()})")

    def value_device(self) -> str:
        return self.device  # executables are resident: values stay on the device between parts

    def link_bytes_per_second(self) -> dict[tuple[str, str], float]:
        return link_bytes_per_second(self.torch_device)

    def supports(self, node: Node, graph: Graph) -> str | None:
        if node.op_type in CONTAINER_OPS or node.subgraphs():
            return f"{node.op_type} has graph attributes; the torch backend lowers no control flow"
        lowering = find_lowering(node, graph)
        if lowering is None:
            opset = graph.opset.get(node.domain, 1)
            op = f"{node.domain}::{node.op_type}" if node.domain else node.op_type
            return f"no torch lowering for {op} at opset {opset}"
        for name in (*node.inputs, *node.outputs):
            value = graph.values.get(name) if name else None
            if value is not None and value.dtype is not None and value.dtype not in NAMES.values():
                return f"value {name!r} has element type {value.dtype}, which torch does not compute with"
        if not lowering.var_keywords:
            unknown = sorted(set(node.attrs) - lowering.keywords)
            if unknown:
                return f"attribute(s) {unknown} not implemented by the torch lowering"
        if lowering.check is not None:
            return lowering.check(node, graph)
        return None

    def compile(self, graph: Graph, options: CompileOptions | None = None) -> TorchExecutable:
        options = options or CompileOptions()
        engine = merged_options(self.engine_options, options.engine_options, _check_engine_options)
        refuse_unsupported("torch backend", graph.name, self.unsupported(graph))
        if options.threads and self.torch_device.type == "cpu":
            torch.set_num_threads(options.threads)  # process-wide, as torch's thread pool is
        if self.torch_device.type == "cuda" and engine.get("precision", "fp32") == "fp32":
            _warn_if_tf32()
        built = build_module(graph, self.torch_device, PRECISIONS[engine.get("precision", "fp32")],
                             frozenset(engine.get("fp32_nodes", ())))
        module = built.module.to(self.torch_device).eval()
        return TorchExecutable(graph, module, self.torch_device, engine, built.placements)
