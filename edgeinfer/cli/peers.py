"""The engines a user would otherwise run directly, driven raw, for side-by-side measurements.

``edgeinfer bench --peers`` and the scripts in ``benchmarks/`` time edgeinfer against them in
the same process. Each peer is registered by decorator with the format it reads::

    @peer("onnxruntime", reads="onnx", module="onnxruntime")
    def raw_onnxruntime(model_bytes, threads) -> Runner: ...

A peer reads the user's own file when it is in its format (raw onnxruntime on the ``.onnx``
the user gave), and otherwise the file edgeinfer exports (``ei.export``) from the model, so
every peer runs the same graph. A peer whose engine is not installed, or whose format the
model cannot be written in, is skipped with the reason (``PeerUnavailable``).
"""

from __future__ import annotations

import importlib.util
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgeinfer.errors import EdgeInferError
from edgeinfer.model import Model

Runner = Callable[[dict[str, np.ndarray]], Any]


class PeerUnavailable(EdgeInferError):
    """A peer engine cannot run here: not installed, or the model does not export to its format."""


@dataclass(frozen=True)
class Peer:
    name: str
    reads: str  # the file format it runs: "onnx" or "tflite"
    module: str  # the Python module of its engine, checked before use
    make: Callable[[bytes, int | None], Runner]

    def installed(self) -> bool:
        try:
            return importlib.util.find_spec(self.module) is not None
        except (ImportError, ValueError):
            return False


PEERS: dict[str, Peer] = {}


def peer(name: str, *, reads: str, module: str):
    """Register a raw-engine peer: a function ``(model_bytes, threads) -> Runner``."""

    def register(make: Callable[[bytes, int | None], Runner]):
        if name in PEERS:
            raise ValueError(f"peer {name!r} is already registered")
        PEERS[name] = Peer(name, reads, module, make)
        return make

    return register


def _as_bytes(model: Any) -> bytes:
    return model if isinstance(model, bytes) else model.SerializeToString()


@peer("onnxruntime", reads="onnx", module="onnxruntime")
def raw_onnxruntime(model: Any, threads: int | None) -> Runner:
    """One onnxruntime ``InferenceSession`` on the CPU provider (``model``: bytes or a ModelProto)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
    session = ort.InferenceSession(_as_bytes(model), options, providers=["CPUExecutionProvider"])
    return lambda feeds: session.run(None, feeds)


@peer("openvino", reads="onnx", module="openvino")
def raw_openvino(model: Any, threads: int | None) -> Runner:
    """The ONNX model through OpenVINO alone: read_model, compile_model (latency hint, fp32),
    one InferRequest."""
    import openvino

    core = openvino.Core()
    properties: dict[str, Any] = {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": "f32"}
    if threads:
        properties["INFERENCE_NUM_THREADS"] = threads
    compiled = core.compile_model(core.read_model(_as_bytes(model)), "CPU", properties)
    request = compiled.create_infer_request()
    names = [port.get_any_name() for port in compiled.outputs]

    def run(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        results = request.infer(feeds, share_inputs=True, share_outputs=False)
        return {name: results[port] for name, port in zip(names, compiled.outputs, strict=True)}

    return run


@peer("litert", reads="tflite", module="ai_edge_litert")
def raw_litert_bytes(model: bytes, threads: int | None) -> Runner:
    """LiteRT's interpreter (XNNPACK) on a ``.tflite`` flatbuffer."""
    from ai_edge_litert import interpreter as litert

    from edgeinfer.engine_logs import native_info_quiet

    with native_info_quiet():
        engine = litert.Interpreter(model_content=model, num_threads=threads or os.cpu_count() or 1)
        engine.allocate_tensors()
    inputs = {d["name"]: d["index"] for d in engine.get_input_details()}
    shapes = {d["name"]: tuple(d["shape"]) for d in engine.get_input_details()}
    outputs = [d["index"] for d in engine.get_output_details()]

    def run(feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        if any(shapes[name] != array.shape for name, array in feeds.items()):  # a symbolic dim bound anew
            for name, array in feeds.items():
                engine.resize_tensor_input(inputs[name], array.shape)
                shapes[name] = array.shape
            engine.allocate_tensors()
        for name, array in feeds.items():
            engine.set_tensor(inputs[name], array)
        engine.invoke()
        return [engine.get_tensor(i) for i in outputs]

    return run


def raw_litert(model: Model, threads: int | None) -> Runner | None:
    """LiteRT's interpreter on the ``.tflite`` edgeinfer writes; None if it is not installed or
    the model does not export."""
    try:
        return raw_litert_bytes(model_bytes(model, "tflite"), threads)
    except (PeerUnavailable, ImportError):
        return None


def model_bytes(model: Model, fmt: str, source: str | os.PathLike | None = None) -> bytes:
    """``model`` as a file of format ``fmt``: the ``source`` file itself when it is one,
    else what ``ei.export`` writes. ``PeerUnavailable`` if the model does not export."""
    from edgeinfer.api import export

    suffix = f".{fmt}"
    if source is not None and Path(source).suffix.lower() == suffix and Path(source).is_file():
        return Path(source).read_bytes()
    with tempfile.TemporaryDirectory(prefix="edgeinfer-peer-") as folder:
        path = Path(folder) / f"model{suffix}"
        try:
            export(model, path)
        except EdgeInferError as exc:
            raise PeerUnavailable(f"the model does not export to {fmt}: {exc}") from exc
        return path.read_bytes()


def prepare(name: str, model: Model, threads: int | None, *,
            source: str | os.PathLike | None = None) -> tuple[Runner, str]:
    """A ready runner of peer ``name`` and what it runs (``"models/x.onnx"`` or ``"exported .tflite"``)."""
    if name not in PEERS:
        raise PeerUnavailable(f"unknown peer {name!r}: expected one of {', '.join(PEERS)}")
    entry = PEERS[name]
    if not entry.installed():
        raise PeerUnavailable(f"{name}: module {entry.module!r} is not installed")
    data = model_bytes(model, entry.reads, source)
    own = source is not None and Path(source).suffix.lower() == f".{entry.reads}"
    return entry.make(data, threads), (os.fspath(source) if own else f"exported .{entry.reads}")


__all__ = ["PEERS", "Peer", "PeerUnavailable", "Runner", "model_bytes", "peer", "prepare", "raw_litert",
           "raw_onnxruntime", "raw_openvino"]
