"""The engines a user would otherwise run directly, driven raw, for side-by-side measurements.

``edgeinfer bench --peers`` and the scripts in ``benchmarks/`` time edgeinfer against them in
the same process. Each peer is registered by decorator with the format it reads::

    @peer("onnxruntime", reads="onnx", module="onnxruntime")
    def raw_onnxruntime(model_bytes, threads) -> Runner: ...

A peer reads the user's own file when it is in its format (raw onnxruntime on the ``.onnx``
the user gave), and otherwise the file edgeinfer exports (``ei.export``) from the model, so
every peer runs the same graph. A peer whose engine is not installed, or whose format the
model cannot be written in, is skipped with the reason (``PeerUnavailable``).

The original file on its native engine (``original_file``, ``prepare_native``) is the baseline a
user compares with: LiteRT for a ``.tflite``, onnxruntime for an ``.onnx``, torch for
TorchScript (``.pt``, ``.pth``, ``.jit``) and ExportedProgram (``.pt2``). For an ``.eim`` it is
the file the model was converted from (``metadata["source_file"]``) when that file lies next to
the ``.eim`` (a bare file name, so nothing outside the model's folder is read); otherwise there
is none (``NoOriginalFile``, with the reason).
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


@dataclass(frozen=True)
class NativeRun:
    """A ready engine: ``run`` takes feeds by the engine's ``inputs`` names and returns its
    outputs (a list in ``outputs`` order; ``outputs`` is empty where the engine names none)."""

    run: Runner
    inputs: list[str]
    outputs: list[str]


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
    return _onnxruntime(model, threads).run


def _onnxruntime(model: Any, threads: int | None) -> NativeRun:
    import onnxruntime as ort

    options = ort.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
    session = ort.InferenceSession(_as_bytes(model), options, providers=["CPUExecutionProvider"])
    return NativeRun(lambda feeds: session.run(None, feeds), [i.name for i in session.get_inputs()],
                     [o.name for o in session.get_outputs()])


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
    return _litert(model, threads).run


def _litert(model: bytes, threads: int | None) -> NativeRun:
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

    return NativeRun(run, list(inputs), [d["name"] for d in engine.get_output_details()])


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


# -- the original file on its native engine -----------------------------------------------------
ORIGINAL = "original file"  # the key of its reason in ``skipped`` when there is none


class NoOriginalFile(PeerUnavailable):
    """No original file to time on its own engine: an ``.eim`` without its source next to it, or
    a format none of ``NATIVES`` reads."""


@dataclass(frozen=True)
class Native:
    """The engine a file of ``suffixes`` runs on without edgeinfer."""

    engine: str  # as its users call it: "LiteRT", "onnxruntime", "torch"
    module: str
    suffixes: tuple[str, ...]
    make: Callable[[Path, Model, int | None], NativeRun]
    peer: str | None = None  # the entry of PEERS that is this engine on the same file

    @property
    def label(self) -> str:
        return f"raw {self.engine} ({ORIGINAL})"


@dataclass(frozen=True)
class OriginalFile:
    native: Native
    path: Path


def _torch(path: Path, model: Model, threads: int | None) -> NativeRun:
    """TorchScript through ``torch.jit.load`` (its restricted unpickler), an ExportedProgram
    through ``torch.export.load``, after ``edgeinfer.converters.pytorch.files.classify`` has refused any
    other pickle without running it. Inputs are positional, in the model's order."""
    import torch

    from edgeinfer.converters.pytorch.files import EXPORTED_PROGRAM, classify

    if classify(path) == EXPORTED_PROGRAM:
        module = torch.export.load(os.fspath(path)).module()
    else:
        module = torch.jit.load(os.fspath(path), map_location="cpu").eval()
    if threads:
        torch.set_num_threads(threads)  # process-wide: torch has no per-module thread count
    names = [info.name for info in model.inputs]

    def run(feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        with torch.inference_mode():
            result = module(*(torch.from_numpy(feeds[name]) for name in names))
        return [t.detach().numpy() for t in _leaves(result)]

    return NativeRun(run, names, [])


def _leaves(result: Any) -> list[Any]:
    if isinstance(result, (tuple, list)):
        return [leaf for item in result for leaf in _leaves(item)]
    if isinstance(result, dict):
        return [leaf for item in result.values() for leaf in _leaves(item)]
    return [result]


NATIVES = (
    Native("LiteRT", "ai_edge_litert", (".tflite",), lambda path, model, threads: _litert(path.read_bytes(), threads),
           peer="litert"),
    Native("onnxruntime", "onnxruntime", (".onnx",),
           lambda path, model, threads: _onnxruntime(path.read_bytes(), threads), peer="onnxruntime"),
    Native("torch", "torch", (".pt", ".pth", ".jit", ".pt2"), _torch),
)


def original_file(source: str | os.PathLike | None, model: Model) -> OriginalFile:
    """The user's own file and the engine it runs on natively; ``NoOriginalFile`` with the reason
    where there is none."""
    if source is None:
        raise NoOriginalFile("no original file to compare with: the model was not read from a file")
    path = Path(source)
    if path.suffix.lower() == ".eim":
        name = model.metadata.get("source_file")
        if not isinstance(name, str) or not name:
            raise NoOriginalFile(f"no original file to compare with: {path} records no source file")
        if Path(name).name != name or name in (".", ".."):  # only a file next to the .eim is read
            raise NoOriginalFile(f"no original file to compare with: {path} records source file {name!r}, "
                                 "which is not a bare file name")
        if not (path.parent / name).is_file():
            raise NoOriginalFile(f"no original file to compare with: {path} was converted from {name}, "
                                 f"which is not next to it")
        path = path.parent / name
    native = next((n for n in NATIVES if path.suffix.lower() in n.suffixes), None)
    if native is None:
        known = "; ".join(f"{n.engine} for {', '.join(n.suffixes)}" for n in NATIVES)
        raise NoOriginalFile(f"no original file to compare with: bench runs no native engine for "
                             f"{path.suffix or path.name} files ({known})")
    return OriginalFile(native, path)


def prepare_native(original: OriginalFile, model: Model, threads: int | None) -> NativeRun:
    """The original file loaded in its engine, taking feeds by the model's input names;
    ``PeerUnavailable`` if the engine is not installed or its inputs are not the model's. The
    engine's own errors (it cannot read or compile the file) are raised as they are."""
    native = original.native
    if importlib.util.find_spec(native.module) is None:
        raise PeerUnavailable(f"{native.engine}: module {native.module!r} is not installed")
    engine = native.make(original.path, model, threads)
    ours = [info.name for info in model.inputs]
    if set(engine.inputs) == set(ours):
        return engine
    if len(engine.inputs) != len(ours):
        raise PeerUnavailable(f"{original.path.name} has inputs {engine.inputs}, the model {ours}")
    names = dict(zip(ours, engine.inputs, strict=True))  # by position
    inner = engine.run
    return NativeRun(lambda feeds: inner({names[k]: v for k, v in feeds.items()}), ours, engine.outputs)


def ordered_outputs(model: Model, engine: NativeRun, produced: list[Any]) -> list[np.ndarray]:
    """``produced`` (an engine's outputs) in the model's output order: by name where the engine
    names them all, else by position."""
    ours = [info.name for info in model.outputs]
    if engine.outputs and set(ours) <= set(engine.outputs):
        by_name = dict(zip(engine.outputs, produced, strict=True))
        return [np.asarray(by_name[name]) for name in ours]
    return [np.asarray(array) for array in produced]


__all__ = ["NATIVES", "ORIGINAL", "PEERS", "Native", "NativeRun", "NoOriginalFile", "OriginalFile", "Peer",
           "PeerUnavailable", "Runner", "model_bytes", "ordered_outputs", "original_file", "peer", "prepare",
           "prepare_native", "raw_litert", "raw_onnxruntime", "raw_openvino"]
