"""The public entry points: ``convert``, ``load``, ``export`` and the front-end dispatch."""

from __future__ import annotations

import importlib
import os
import warnings
from pathlib import Path
from typing import Any

from edgeinfer.errors import InputError, ModelFormatError, ModelValidationError, UnsupportedOpError
from edgeinfer.ir import Graph, Value
from edgeinfer.model import Model
from edgeinfer.progress import Steps, steps

# name -> module in edgeinfer.converters; each exposes accepts(source) and convert(source, **kw)
# accepts() must be cheap and must not import the framework itself.
FRONTENDS: dict[str, str] = {
    "onnx": "edgeinfer.converters.onnx",
    "pytorch": "edgeinfer.converters.pytorch",
    "tflite": "edgeinfer.converters.tflite",
    "tensorflow": "edgeinfer.converters.tensorflow",
    "caffe": "edgeinfer.converters.caffe",
}
EIM_SUFFIX = ".eim"
EXPORT_SUFFIXES = (".onnx", ".tflite")


def _frontend(name: str):
    return importlib.import_module(FRONTENDS[name])


EIM_MAGIC = b"EIM\x00"
TFLITE_IDENTIFIER = b"TFL3"  # bytes 4..8 of a TFLite flatbuffer
ZIP_MAGIC = b"PK\x03\x04"
HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"  # a legacy Keras .h5/.hdf5 model
KERAS_MEMBERS = {"config.json", "metadata.json"}


def sniff_format(path: str | os.PathLike) -> str | None:
    """The format of the file at ``path`` from its content where the content says it: ``"eim"``
    (magic), ``"tflite"`` (flatbuffer identifier), ``"tensorflow"`` (a Keras v3 zip or an HDF5 file),
    ``"pytorch"`` (another zip, or a pickle, which that front end refuses); None for formats
    without a signature (ONNX and caffemodel protobufs, prototxt text), left to the suffix."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(8)
    except (OSError, ValueError):  # missing, a directory, unreadable: the loader says which
        return None
    if head[:4] == EIM_MAGIC:
        return "eim"
    if head[4:8] == TFLITE_IDENTIFIER:
        return "tflite"
    if head == HDF5_MAGIC:
        return "tensorflow"
    if head[:1] == b"\x80" and head[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05"):  # pickle protocol 2-5
        return "pytorch"
    if head[:4] == ZIP_MAGIC:
        import zipfile

        try:
            with zipfile.ZipFile(path) as archive:
                names = set(archive.namelist())
        except Exception:  # a damaged archive: the front end of the suffix reports it
            return None
        return "tensorflow" if KERAS_MEMBERS <= names else "pytorch"
    return None


def detect_frontend(source: Any) -> str:
    """Which front end converts ``source`` (a path or an in-memory model).

    A file is recognised by its content first (``sniff_format``: a TFLite file named
    ``.onnx`` is converted as TFLite), then by its suffix; an ``.eim`` file is refused (it is
    loaded, not converted)."""
    if isinstance(source, (str, os.PathLike)) and Path(source).is_file():
        by_content = sniff_format(source)
        if by_content == "eim":
            raise ModelFormatError(f"{os.fspath(source)}: an edgeinfer .eim model, not a source model to convert: "
                                   "load it with edgeinfer.load() (the CLI's run/inspect/export read it)")
        if by_content is not None and _available(FRONTENDS[by_content]):
            return by_content
    for name, module_name in FRONTENDS.items():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name == module_name:  # that front end is not part of this build
                continue
            raise
        if module.accepts(source):
            return name
    what = f"file {os.fspath(source)!r}" if isinstance(source, (str, os.PathLike)) else type(source).__name__
    raise ModelFormatError(f"cannot convert {what}: expected one of the formats of "
                           f"{', '.join(FRONTENDS)} (by file suffix or object type)")


def _available(module_name: str) -> bool:
    try:
        importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name == module_name:
            return False
        raise
    return True


def convert(source: Any, *, optimize: int = 1, input_shapes: dict[str, tuple] | None = None,
            dynamic_batch: bool = False, pass_report: list | None = None, strict: bool = False,
            progress: Steps | None = None, **options: Any) -> Model:
    """Convert a model (file path or in-memory object) into an edgeinfer ``Model``.

    ``options`` are front-end specific (e.g. ``weights=`` for Caffe, ``example_inputs=`` for
    PyTorch). ``input_shapes`` ({name: shape}) and ``dynamic_batch`` (first dim becomes the
    symbol ``N``) go to front ends that need shapes to trace a model; for the others they
    re-declare the converted graph's input shapes. The graph is type-inferred, optimized at
    level ``optimize`` (``pass_report`` collects what each pass did) and verified. Weights
    holding NaN (or infinities in a weight op) give a ``NonFiniteWeightsWarning``, or with
    ``strict`` a ``ModelValidationError``. ``progress`` (``edgeinfer.progress.Steps``) is told
    the steps as they go, with sizes: the read of external data (ONNX), each round of passes,
    the weight check.
    """
    from edgeinfer.ir.infer import infer_types

    name = detect_frontend(source)
    frontend = _frontend(name)
    import inspect  # here: loading a model for a device converts nothing

    parameters = inspect.signature(frontend.convert).parameters
    takes_any = any(p.kind == p.VAR_KEYWORD for p in parameters.values())
    unknown = sorted(k for k in options if k not in parameters and not takes_any)
    if unknown:
        accepted = sorted(k for k, p in parameters.items() if p.kind == p.KEYWORD_ONLY)
        raise InputError(f"the {name} front end does not take option(s) {', '.join(unknown)}; "
                         f"it takes {', '.join(accepted) or 'no options'}")
    takes_shapes = "input_shapes" in parameters
    if takes_shapes:
        options.update(input_shapes=input_shapes, dynamic_batch=dynamic_batch)
    if progress is not None and "progress" in parameters:
        options["progress"] = progress
    graph = frontend.convert(source, **options)
    if not takes_shapes and (input_shapes or dynamic_batch):
        graph = redeclare_inputs(graph, input_shapes or {}, dynamic_batch)
    graph = infer_types(graph.sorted())
    if optimize:
        from edgeinfer.passes import optimize as run_passes

        graph = run_passes(graph, level=optimize, report=pass_report, progress=progress)
        if any(v.shape is None or None in v.shape for v in graph.outputs):
            graph = infer_types(graph)  # folding may have made shape subgraphs constant
    graph.verify()
    check_weights(graph, strict=strict, where=_describe(source), progress=progress)
    metadata = {"source_format": name}
    if "source_route" in graph.metadata:  # how the front end got there, where it has several ways
        metadata["source_route"] = graph.metadata["source_route"]
    if isinstance(source, (str, os.PathLike)):
        metadata["source_file"] = Path(source).name
    return Model(graph, metadata)


def _describe(source: Any) -> str:
    return os.fspath(source) if isinstance(source, (str, os.PathLike)) else f"<{type(source).__name__}>"


def check_weights(graph: Graph, *, strict: bool = False, where: str = "model", progress: Steps | None = None) -> None:
    """Warn about (or, ``strict``, refuse) weights that hold NaN or infinities."""
    from edgeinfer.ir.verify import NonFiniteWeightsWarning, checked_weight_bytes, nonfinite_weights

    with steps(progress).step("check weights (NaN, infinity)", checked_weight_bytes(graph)) as step:
        names = nonfinite_weights(graph, step.advance)
    if not names:
        return
    listed = ", ".join(map(repr, names[:5])) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    message = f"{where}: weights {listed} hold NaN or infinite values; outputs will be NaN or infinite"
    if strict:
        raise ModelValidationError(message + " (refused: strict=True)")
    warnings.warn(message + " (pass strict=True to refuse such models)", NonFiniteWeightsWarning, stacklevel=3)


def redeclare_inputs(graph: Graph, input_shapes: dict[str, tuple], dynamic_batch: bool) -> Graph:
    """A copy of ``graph`` whose inputs have the given shapes (and/or a symbolic batch ``N``).

    Types of intermediate values are dropped so that inference recomputes them. The declared
    outputs keep their dtype and rank, with each symbol an input dim bound (``"batch"`` -> 1)
    substituted and other dims left for inference: an output that inference cannot reach
    (through an ``If``, a data-dependent shape) keeps what the file said rather than nothing.
    """
    unknown = sorted(set(input_shapes) - set(graph.input_names))
    if unknown:
        raise InputError(f"input shapes given for {unknown}: expected names among {graph.input_names}")
    inputs = []
    for value in graph.inputs:
        shape = input_shapes.get(value.name, value.shape)
        if shape is not None and value.shape is not None and len(shape) != len(value.shape):
            raise InputError(f"input {value.name!r}: shape {tuple(shape)} has rank {len(shape)}, the model "
                             f"declares rank {len(value.shape)} {value.shape}")
        if dynamic_batch and shape:
            shape = ("N", *tuple(shape)[1:])
        inputs.append(Value(value.name, value.dtype, shape))
    bound: dict[str, Any] = {}
    for old, new in zip(graph.inputs, inputs):
        for declared, given in zip(old.shape or (), new.shape or ()):
            if isinstance(declared, str):
                bound[declared] = given if bound.get(declared, given) == given else None
    outputs = [Value(v.name, v.dtype, None if v.shape is None else tuple(
        bound.get(d) if isinstance(d, str) else None if dynamic_batch and i == 0 else d
        for i, d in enumerate(v.shape))) for v in graph.outputs]
    return graph.replace(inputs=inputs, outputs=outputs, keep_types=False)


def load(path: str | os.PathLike) -> Model:
    """Load an ``.eim`` file (weights are memory-mapped, not copied)."""
    from edgeinfer.format import load_model

    return load_model(path)


def load_any(path: str | os.PathLike) -> Model:
    """An ``.eim`` file is loaded, any other model file converted; the content decides where it
    has a signature (``sniff_format``), the suffix otherwise."""
    by_content = sniff_format(path)
    if by_content == "eim" or (by_content is None and Path(path).suffix.lower() == EIM_SUFFIX):
        return load(path)
    return convert(path)


def export(model: Model | Graph | str | os.PathLike, path: str | os.PathLike, *,
           external_data: bool | None = None) -> Path:
    """Write ``model`` (a ``Model``, a ``Graph``, or a model file to load or convert) in the
    format its suffix names: ``.onnx`` (checked with the ONNX checker) or ``.tflite`` (float or
    full-integer INT8 from a quantized model, written without TensorFlow). The file is written
    atomically; an op the format cannot express raises ``UnsupportedOpError`` naming the node.
    ``external_data`` (ONNX; default: past 1 GiB of weights) puts the weights in ``<file>.data``
    beside it, as models past protobuf's 2 GB need."""
    target = Path(path)
    suffix = target.suffix.lower()
    if suffix not in EXPORT_SUFFIXES:
        raise InputError(f"export to {os.fspath(path)!r}: expected a path ending in one of {', '.join(EXPORT_SUFFIXES)}")
    if isinstance(model, (str, os.PathLike)):
        model = load_any(model)
    graph = model.graph if isinstance(model, Model) else model
    if not isinstance(graph, Graph):
        raise InputError(f"export: expected an edgeinfer Model, Graph or model path, got {type(model).__name__}")
    if suffix == ".onnx":
        from edgeinfer.converters.onnx import export as export_onnx

        export_onnx(graph, target, external_data=external_data)
    else:
        from edgeinfer.format.tflite import save_tflite
        from edgeinfer.format.tflite.writer import MAX_FLATBUFFER_BYTES

        weights = sum(a.nbytes for a in graph.initializers.values() if a.dtype.kind in "fiub")
        if weights > MAX_FLATBUFFER_BYTES:  # refused before any weight is copied into a buffer
            raise UnsupportedOpError(f"export to {os.fspath(path)!r}: the model holds {weights} bytes of weights; a "
                                     f".tflite flatbuffer holds at most {MAX_FLATBUFFER_BYTES} (32-bit offsets). "
                                     "Export .onnx (weights go to external data), or quantize the weights first")
        save_tflite(graph, target)
    return target
