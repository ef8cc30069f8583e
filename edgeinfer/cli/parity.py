"""``edgeinfer convert --verify``: does the converted model compute what the source computes?

1. Outputs: the source framework itself (an *oracle*, registered per front end by decorator:
   onnxruntime for ONNX, torch for ``.pt2``/``.pt``, TensorFlow/Keras, the LiteRT interpreter
   for ``.tflite``, OpenCV DNN for Caffe) and edgeinfer run the same random inputs; the
   maximum error of each output is reported, absolute and relative to the reference's
   largest magnitude, and an output is a mismatch when its error exceeds ``tolerance`` times
   that magnitude plus ``ABSOLUTE_FLOOR`` (the rule of the real-model corpus: outputs that are
   themselves tiny are not judged on relative error alone). Real inputs (``feeds``, the
   CLI's ``-i``) replace the random ones, which a model with dynamic dims may not accept.
2. Intermediates, on a mismatch: every value edgeinfer's graph computes is compared with a
   reference of the same name, in graph order. The reference is the source model in
   onnxruntime with every intermediate exposed (ONNX sources: this finds conversion and
   optimization errors), or else edgeinfer's own graph exported to ONNX in onnxruntime (this
   finds kernel errors). The first node in graph order whose output diverges is named: the
   nodes before it agree, so the error starts there.
3. Reproducer: that node alone (``graph.subgraph([node])``), written as ONNX with its
   reference inputs and outputs (``.npz``), so the bug can be filed and replayed in isolation.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgeinfer.cli.progress import NoProgress, Progress
from edgeinfer.errors import EdgeInferError, InputError
from edgeinfer.ir import Graph, Node
from edgeinfer.model import Model

DEFAULT_TOLERANCE = 1e-4
ABSOLUTE_FLOOR = 1e-5  # tests/real/checks.py's ATOL: an error this small is no mismatch
Feeds = dict[str, np.ndarray]
Oracle = Callable[[Any, Model, Feeds, Mapping[str, Any]], list[np.ndarray]]


@dataclass(frozen=True)
class OracleEntry:
    frontend: str
    engine: str  # what runs the source: "onnxruntime", "torch", ...
    run: Oracle


ORACLES: dict[str, OracleEntry] = {}


def oracle(frontend: str, *, engine: str):
    """Register the reference run of a front end's source files: a function
    ``(source, model, feeds, options) -> outputs in the model's output order``."""

    def register(run: Oracle) -> Oracle:
        if frontend in ORACLES:
            raise ValueError(f"an oracle for {frontend!r} is already registered")
        ORACLES[frontend] = OracleEntry(frontend, engine, run)
        return run

    return register


class VerificationError(EdgeInferError):
    """The source framework could not run the model to give reference outputs."""


@dataclass
class OutputError:
    name: str
    max_abs: float
    max_rel: float  # max_abs over the reference's largest magnitude
    ok: bool


@dataclass
class Divergence:
    node: str  # the node's label
    op: str
    output: str  # the first of its outputs that diverges
    max_abs: float
    max_rel: float
    compared: int  # intermediate values compared before and at it
    reference: str  # what produced the reference intermediates
    repro: str | None = None  # the reproducer's .onnx path


@dataclass
class Verification:
    frontend: str
    engine: str
    backend: str
    tolerance: float
    outputs: list[OutputError]
    divergence: Divergence | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(o.ok for o in self.outputs)


def compare(got: np.ndarray, ref: np.ndarray, tolerance: float) -> tuple[float, float, bool]:
    """(max absolute error, max error relative to the reference's largest magnitude, within tolerance)."""
    got, ref = np.asarray(got), np.asarray(ref)
    if got.shape != ref.shape:
        if got.size != ref.size:
            return float("inf"), float("inf"), False
        got = got.reshape(ref.shape)  # e.g. a framework that drops a unit dim
    if ref.dtype.kind not in "fc" or got.dtype.kind not in "fc":
        equal = np.array_equal(got, ref)
        return (0.0, 0.0, True) if equal else (float("inf"), float("inf"), False)
    diff = np.abs(got.astype(np.float64) - ref.astype(np.float64))
    nan_mismatch = bool(np.any(np.isnan(got) != np.isnan(ref)))
    max_abs = float(np.nanmax(diff)) if diff.size else 0.0
    scale = float(np.nanmax(np.abs(ref))) if ref.size else 0.0
    max_rel = max_abs / scale if scale > 0 else max_abs
    return max_abs, max_rel, not nan_mismatch and max_abs <= tolerance * scale + ABSOLUTE_FLOOR


def verify(source: Any, model: Model, *, backend: str = "numpy", tolerance: float = DEFAULT_TOLERANCE,
           feeds: Feeds | None = None, repro_dir: str | os.PathLike | None = None, seed: int = 0,
           progress: Progress | None = None, **source_options: Any) -> Verification:
    """Compare ``model`` (converted from ``source``) with the source framework on random inputs
    (or ``feeds``); on a mismatch, find the first diverging node and, with ``repro_dir``, save it."""
    from edgeinfer.api import detect_frontend
    from edgeinfer.runtime.session import Session

    progress = progress or NoProgress()
    frontend = detect_frontend(source)
    if frontend not in ORACLES:
        raise VerificationError(f"no oracle registered for the {frontend} front end: expected one of "
                                f"{', '.join(ORACLES)}")
    entry = ORACLES[frontend]
    feeds = dict(feeds) if feeds is not None else model.random_feeds(seed=seed)
    shapes = {name: tuple(np.shape(array)) for name, array in feeds.items()}
    progress.describe(f"running the source in {entry.engine}")
    try:
        reference = entry.run(source, model, feeds, source_options)
    except ImportError as exc:
        raise VerificationError(f"--verify of a {frontend} model needs {entry.engine}: {exc}") from exc
    except EdgeInferError:
        raise
    except Exception as exc:  # the engine refuses these inputs (a dynamic dim bound to 1, ...)
        raise VerificationError(f"{entry.engine} could not run the source model on inputs of shapes {shapes}: "
                                f"{' '.join(str(exc).split())[:300]}; give real inputs (-i NAME=FILE.npy) "
                                "or fix the shapes (--input-shape)") from exc
    progress.advance()
    names = [info.name for info in model.outputs]
    if len(reference) != len(names):
        raise VerificationError(f"{entry.engine} gave {len(reference)} output(s), the converted model has "
                                f"{len(names)} ({names})")
    progress.describe(f"running edgeinfer on {backend}")
    with Session(model, backend=backend) as session:
        ours = session.run(feeds)
    progress.advance()
    errors = [OutputError(name, *compare(ours[name], ref, tolerance)) for name, ref in zip(names, reference)]
    result = Verification(frontend, entry.engine, backend, tolerance, errors)
    if not result.ok:
        progress.describe("comparing intermediates")
        result.divergence = first_divergence(source if frontend == "onnx" else None, model, feeds, backend=backend,
                                             tolerance=tolerance, notes=result.notes)
        if result.divergence is not None and repro_dir is not None:
            result.divergence.repro = os.fspath(save_reproducer(model, result.divergence, feeds, repro_dir,
                                                                source if frontend == "onnx" else None))
    progress.advance()
    return result


# -- intermediates ------------------------------------------------------------------------------
def first_divergence(onnx_source: Any, model: Model, feeds: Feeds, *, backend: str, tolerance: float,
                     notes: list[str] | None = None) -> Divergence | None:
    """The first node of ``model`` (graph order) whose output differs from the reference's value
    of the same name by more than ``tolerance``; None if every compared value agrees."""
    notes = notes if notes is not None else []
    graph = model.graph
    wanted = [o for node in graph.nodes for o in node.outputs if o]
    if onnx_source is not None:
        what = "the source model in onnxruntime"
        reference = onnxruntime_intermediates(_onnx_proto(onnx_source), wanted, feeds)
    else:
        what = "edgeinfer's graph exported to ONNX, in onnxruntime"
        try:
            reference = onnxruntime_intermediates(_exported_proto(graph), wanted, feeds)
        except EdgeInferError as exc:
            notes.append(f"intermediates not compared: {exc}")
            return None
    ours = edgeinfer_intermediates(model, [n for n in wanted if n in reference], feeds, backend)
    compared = 0
    for node in graph.nodes:
        for name in node.outputs:
            if not name or name not in reference or name not in ours:
                continue
            compared += 1
            max_abs, max_rel, ok = compare(ours[name], reference[name], tolerance)
            if not ok:
                op = f"{node.domain}::{node.op_type}" if node.domain else node.op_type
                return Divergence(node.label, op, name, max_abs, max_rel, compared, what)
    notes.append(f"all {compared} intermediate values shared with {what} agree: the difference comes from "
                 "conversion (values the source computes under other names, or outputs only)")
    return None


def edgeinfer_intermediates(model: Model, names: list[str], feeds: Feeds, backend: str) -> dict[str, np.ndarray]:
    """Every value in ``names`` as edgeinfer's ``backend`` computes it (the graph with them as outputs)."""
    from edgeinfer.quantize.calibrate import observing_graph
    from edgeinfer.runtime.session import Session

    with Session(Model(observing_graph(model.graph, names)), backend=backend) as session:
        return session.run(feeds)


def onnxruntime_intermediates(proto: Any, names: list[str], feeds: Feeds) -> dict[str, np.ndarray]:
    """The values in ``names`` that ``proto``'s main graph computes, by onnxruntime."""
    import onnx
    import onnxruntime as ort

    proto_copy = onnx.ModelProto()
    proto_copy.CopyFrom(proto)
    produced = {o for node in proto_copy.graph.node for o in node.output if o}
    existing = {o.name for o in proto_copy.graph.output}
    extra = [n for n in names if n in produced and n not in existing]
    proto_copy.graph.output.extend(onnx.ValueInfoProto(name=n) for n in extra)
    try:
        session = ort.InferenceSession(proto_copy.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises its own exception types
        raise VerificationError(f"onnxruntime cannot load the model for intermediates: {exc}") from exc
    inputs = {i.name for i in session.get_inputs()}
    results = session.run(None, {k: v for k, v in feeds.items() if k in inputs})
    return {o.name: r for o, r in zip(session.get_outputs(), results)}


def _onnx_proto(source: Any):
    import onnx

    if isinstance(source, onnx.ModelProto):
        return source
    from edgeinfer.converters.onnx import read_model

    return read_model(source)


def _exported_proto(graph: Graph):
    import tempfile

    import onnx

    from edgeinfer.api import export

    with tempfile.TemporaryDirectory(prefix="edgeinfer-verify-") as folder:
        path = Path(folder) / "model.onnx"
        export(graph, path)
        return onnx.load(path)


def save_reproducer(model: Model, divergence: Divergence, feeds: Feeds, folder: str | os.PathLike,
                    onnx_source: Any = None) -> Path:
    """The diverging node alone as ``<folder>/<node>.onnx``, with ``<node>.npz`` holding its
    inputs (as edgeinfer received them) and the reference outputs."""
    from edgeinfer.api import export
    from edgeinfer.format.atomic import atomic_write

    graph = model.graph
    node = next(n for n in graph.nodes if n.label == divergence.node)
    sub = graph.subgraph([node], name=f"repro_{_safe(node)}")
    names = [*sub.input_names, *sub.output_names]
    ours = edgeinfer_intermediates(model, [n for n in names if n not in feeds], feeds, "numpy")
    values = {**feeds, **ours}
    reference: dict[str, np.ndarray] = {}
    if onnx_source is not None:
        reference = onnxruntime_intermediates(_onnx_proto(onnx_source), sub.output_names, feeds)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{_safe(node)}.onnx"
    export(sub, path)
    arrays = {f"input:{n}": values[n] for n in sub.input_names}
    arrays.update({f"edgeinfer:{n}": values[n] for n in sub.output_names if n in values})
    arrays.update({f"reference:{n}": reference[n] for n in sub.output_names if n in reference})
    atomic_write(path.with_suffix(".npz"), lambda handle: np.savez(handle, **arrays))
    return path


def _safe(node: Node) -> str:
    name = node.name or (node.outputs[0] if node.outputs else node.op_type)
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:80] or "node"


# -- oracles ------------------------------------------------------------------------------------
def _by_name_or_position(model: Model, feeds: Feeds, names: list[str]) -> list[tuple[str, np.ndarray]]:
    """Feeds keyed by the framework's input ``names``: by name where they match, else by position."""
    ours = [info.name for info in model.inputs]
    if set(names) == set(ours):
        return [(name, feeds[name]) for name in names]
    if len(names) != len(ours):
        raise VerificationError(f"the source has inputs {names}, the converted model {ours}")
    return [(name, feeds[mine]) for name, mine in zip(names, ours)]


def _ordered_outputs(model: Model, produced: Mapping[str, np.ndarray] | list[np.ndarray]) -> list[np.ndarray]:
    if isinstance(produced, Mapping):
        names = [info.name for info in model.outputs]
        if set(names) <= set(produced):
            return [np.asarray(produced[n]) for n in names]
        produced = list(produced.values())
    return [np.asarray(p) for p in produced]


@oracle("onnx", engine="onnxruntime")
def _onnxruntime(source: Any, model: Model, feeds: Feeds, options: Mapping[str, Any]) -> list[np.ndarray]:
    import onnxruntime as ort

    proto = _onnx_proto(source)
    quiet = ort.SessionOptions()
    quiet.log_severity_level = 3  # a failure is reported as a VerificationError, not a log line
    session = ort.InferenceSession(proto.SerializeToString(), quiet, providers=["CPUExecutionProvider"])
    pairs = _by_name_or_position(model, feeds, [i.name for i in session.get_inputs()])
    results = session.run(None, dict(pairs))
    return _ordered_outputs(model, {o.name: r for o, r in zip(session.get_outputs(), results)})


@oracle("pytorch", engine="torch")
def _torch(source: Any, model: Model, feeds: Feeds, options: Mapping[str, Any]) -> list[np.ndarray]:
    import torch

    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        module = torch.export.load(path).module() if path.suffix.lower() == ".pt2" else torch.jit.load(path)
    else:
        module = source.module() if hasattr(source, "module") and hasattr(source, "graph_signature") else source
    if hasattr(module, "eval") and not isinstance(module, torch.fx.GraphModule):
        module.eval()
    args = [torch.from_numpy(np.ascontiguousarray(feeds[info.name])) for info in model.inputs]
    with torch.no_grad():
        result = module(*args)
    flat = result if isinstance(result, (tuple, list)) else [result]
    return [t.detach().cpu().numpy() for t in flat]


@oracle("tensorflow", engine="tensorflow")
def _tensorflow(source: Any, model: Model, feeds: Feeds, options: Mapping[str, Any]) -> list[np.ndarray]:
    """The source run by TensorFlow itself: a SavedModel's ``serving_default`` signature (through
    the session-based loader where the object loader cannot revive it, as the converter does), a
    Keras file loaded as the converter loads it (safe mode, no Lambda code), or the Keras model
    object; inputs matched by name, else by position."""
    import tensorflow as tf

    if isinstance(source, (str, os.PathLike)) and Path(source).is_dir():
        return _ordered_outputs(model, _saved_model_outputs(Path(source), model, feeds))
    if isinstance(source, (str, os.PathLike)):
        from edgeinfer.converters.tensorflow import load_keras_file

        source = load_keras_file(Path(source))
    names = [getattr(t, "name", "").split(":")[0] for t in getattr(source, "inputs", None) or []]
    ours = {_tf_input_name(info.name): info.name for info in model.inputs}
    if names and set(names) <= set(ours):
        arrays = [feeds[ours[name]] for name in names]
    else:
        arrays = [feeds[info.name] for info in model.inputs]
    result = source(arrays if len(arrays) > 1 else arrays[0], training=False)
    flat = result if isinstance(result, (tuple, list)) else list(result.values()) if isinstance(result, dict) \
        else [result]
    return [np.asarray(tf.convert_to_tensor(t)) for t in flat]


def _tf_input_name(name: str) -> str:
    """A converted input's name as TensorFlow's signature knows it (``serving_default_x:0`` -> ``x``)."""
    return name.split(":")[0].removeprefix("serving_default_")


def _saved_model_outputs(path: Path, model: Model, feeds: Feeds) -> dict[str, np.ndarray]:
    import tensorflow as tf

    from edgeinfer.converters.tensorflow.saved_model import unrevivable_object

    try:
        function = tf.saved_model.load(os.fspath(path)).signatures["serving_default"]
    except Exception as exc:  # a Keras 2 SavedModel whose optimizer the object loader cannot revive
        if not unrevivable_object(exc):
            raise
        return _saved_model_session_outputs(path, model, feeds)
    names = list(function.structured_input_signature[1])
    produced = function(**{name: tf.constant(a) for name, a in _by_name_or_position(model, feeds, names)})
    return {k: v.numpy() for k, v in sorted(produced.items())}


def _saved_model_session_outputs(path: Path, model: Model, feeds: Feeds) -> dict[str, np.ndarray]:
    """``serving_default`` run through TensorFlow's session-based (TF1) loader."""
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default(), tf.compat.v1.Session(graph=graph) as session:
        meta = tf.compat.v1.saved_model.loader.load(session, ["serve"], os.fspath(path))
        signature = meta.signature_def["serving_default"]
        ours = {_tf_input_name(info.name): info.name for info in model.inputs}
        keys = list(signature.inputs)
        by_tensor = {_tf_input_name(signature.inputs[k].name): k for k in keys}
        if set(by_tensor) <= set(ours):
            fed = {signature.inputs[by_tensor[t]].name: feeds[ours[t]] for t in by_tensor}
        else:
            fed = {signature.inputs[k].name: a for k, a in _by_name_or_position(model, feeds, keys)}
        outputs = sorted(signature.outputs)
        values = session.run([signature.outputs[k].name for k in outputs], feed_dict=fed)
    return dict(zip(outputs, values))


@oracle("tflite", engine="LiteRT interpreter")
def _litert(source: Any, model: Model, feeds: Feeds, options: Mapping[str, Any]) -> list[np.ndarray]:
    from ai_edge_litert import interpreter as litert

    from edgeinfer.engine_logs import native_info_quiet

    data = Path(source).read_bytes() if isinstance(source, (str, os.PathLike)) else bytes(source)
    with native_info_quiet():
        engine = litert.Interpreter(model_content=data)
    details = engine.get_input_details()
    pairs = _by_name_or_position(model, feeds, [d["name"] for d in details])
    for detail, (_, array) in zip(details, pairs):
        if tuple(detail["shape"]) != array.shape:
            engine.resize_tensor_input(detail["index"], array.shape)
    engine.allocate_tensors()
    for detail, (_, array) in zip(details, pairs):
        engine.set_tensor(detail["index"], array)
    engine.invoke()
    outputs = engine.get_output_details()
    return _ordered_outputs(model, {d["name"]: engine.get_tensor(d["index"]) for d in outputs})


@oracle("caffe", engine="OpenCV DNN")
def _opencv(source: Any, model: Model, feeds: Feeds, options: Mapping[str, Any]) -> list[np.ndarray]:
    import cv2

    weights = options.get("weights")
    if weights is None:
        raise InputError("--verify of a Caffe model needs its weights: --weights net.caffemodel")
    net = cv2.dnn.readNetFromCaffe(os.fspath(source), os.fspath(weights))
    for name, array in feeds.items():
        net.setInput(array, name)
    names = [info.name for info in model.outputs]
    return [np.asarray(a) for a in net.forward(names)]


__all__ = ["DEFAULT_TOLERANCE", "ORACLES", "Divergence", "OutputError", "Verification", "VerificationError",
           "compare", "first_divergence", "oracle", "save_reproducer", "verify"]
