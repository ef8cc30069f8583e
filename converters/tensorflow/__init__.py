"""TensorFlow front end: in-memory ``keras.Model`` objects, ``.keras`` files and SavedModel
directories into the IR.

Route: TensorFlow's own converter (``tf.lite.TFLiteConverter``) lowers the model to a float
``.tflite`` flatbuffer in memory, and the TFLite importer (``edgeinfer.converters.tflite``)
takes it from there. Why this route rather than reading Keras layers or TF GraphDefs directly:

- coverage: every Keras layer and every TF op that TFLite supports is lowered by the people
  who define its semantics, including layers with non-trivial graphs (LSTM/GRU become a
  WHILE loop, MultiHeadAttention a handful of BATCH_MATMULs, BatchNormalization is folded
  into the convolution), so edgeinfer maps ~100 TFLite builtins instead of ~1,000 TF ops;
- one importer to maintain and test: float, fp16 and INT8 ``.tflite`` files from any source
  and Keras/SavedModel models share the same op rules, layout handling and verification;
- no custom TensorFlow ops are allowed (``TFLITE_BUILTINS`` only), so what converts runs
  without TensorFlow.

TensorFlow is imported only inside ``convert``; ``accepts`` looks at type names and paths.
"""

from __future__ import annotations

import json
import os
import tempfile
import zipfile
import zlib
from pathlib import Path
from typing import Any

from edgeinfer.errors import ConversionError, ModelFormatError
from edgeinfer.ir import Graph
from edgeinfer.limits import MAX_TEXT_BYTES

KERAS_SUFFIXES = (".keras",)
SAVED_MODEL_FILE = "saved_model.pb"
_FRAMEWORK_MODULES = ("keras", "tensorflow", "tf_keras")


def accepts(source: Any) -> bool:
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        return path.suffix.lower() in KERAS_SUFFIXES or (path.is_dir() and (path / SAVED_MODEL_FILE).is_file())
    return any(cls.__module__.split(".")[0] in _FRAMEWORK_MODULES and cls.__name__ in ("Model", "Functional",
                                                                                       "Sequential")
               for cls in type(source).__mro__)


def convert(source: Any, *, batch_size: int | None = None, dynamic_batch: bool = True,
            representative_data=None) -> Graph:
    """Convert a Keras model (object or ``.keras`` file) or a SavedModel directory.

    ``representative_data`` (an iterable of inputs, each an array or a list of arrays) makes
    TensorFlow's converter calibrate a full-integer INT8 model with int8 inputs and outputs
    (recurrent layers are unrolled first, see ``unroll_recurrent_layers``).

    ``batch_size`` fixes the batch dim before conversion. With None the model's own (usually
    dynamic) batch is kept; if TensorFlow's converter cannot lower the model with a dynamic
    batch (Keras RNN layers need a static one), it is converted again with batch 1 and the
    graph's metadata records ``tensorflow_fixed_batch``.
    """
    from edgeinfer.converters import tflite

    flatbuffer, fixed = to_tflite(source, batch_size=batch_size, representative_data=representative_data)
    graph = tflite.convert(flatbuffer, dynamic_batch=dynamic_batch)
    graph.metadata["tflite_route"] = "tf.lite.TFLiteConverter"
    if fixed is not None:
        graph.metadata["tensorflow_fixed_batch"] = str(fixed)
    return graph


def to_tflite(source: Any, *, batch_size: int | None = None, representative_data=None) -> tuple[bytes, int | None]:
    """Lower ``source`` to a ``.tflite`` flatbuffer with TensorFlow's converter.

    Returns (flatbuffer, the batch size that had to be fixed or None). With
    ``representative_data`` (an iterable of input lists) the result is a full-integer INT8
    model with int8 inputs and outputs.
    """
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        if path.is_dir():
            return _convert_saved_model(path, batch_size, representative_data)
        source = load_keras_file(path)
    if representative_data is not None:
        source = unroll_recurrent_layers(source)
    if batch_size is not None:
        return _run(_keras_fixed_batch(source, batch_size), representative_data, str(type(source).__name__)), batch_size
    try:
        return _run(_keras_converter(source), representative_data, type(source).__name__), None
    except ConversionError as exc:
        if "static" not in str(exc) and "TensorList" not in str(exc):
            raise
    return _run(_keras_fixed_batch(source, 1), representative_data, type(source).__name__), 1


def load_keras_file(path: Path):
    """``keras.saving.load_model`` with ``safe_mode=True``; unsafe content is refused."""
    if not path.is_file():
        raise ModelFormatError(f"{path}: expected a .keras file, found no such file")
    check_keras_config(path)
    if path.suffix.lower() not in KERAS_SUFFIXES:  # recognised by content; Keras goes by the name
        with tempfile.TemporaryDirectory(prefix="edgeinfer_keras_") as folder:
            link = Path(folder) / "model.keras"
            link.symlink_to(path.resolve())
            return _load_keras(link, path)
    return _load_keras(path, path)


def _load_keras(path: Path, where: Path):
    import keras

    try:
        return keras.saving.load_model(os.fspath(path), safe_mode=True, compile=False)
    except ValueError as exc:
        message = str(exc)
        if "safe_mode" in message or "Lambda" in message or "arbitrary code" in message:
            raise ModelFormatError(
                f"{where}: refused to load: the model contains Python code (a Lambda layer or another "
                "unsafe object) that Keras will only deserialize with safe_mode=False, which would "
                "run code from the file. Replace the Lambda with a registered custom layer, or load "
                "the model yourself if you trust the file and pass the keras.Model object") from exc
        raise ModelFormatError(f"{where}: Keras cannot load the file: {message.splitlines()[0][:300]}") from exc
    except (OSError, KeyError, TypeError, EOFError) as exc:
        raise ModelFormatError(f"{where}: not a readable .keras archive ({type(exc).__name__}: "
                               f"{str(exc).splitlines()[0][:200] if str(exc) else ''})") from exc
    except Exception as exc:  # zipfile.BadZipFile and Keras' own errors on damaged archives
        raise ModelFormatError(f"{where}: not a readable .keras archive ({type(exc).__name__}: "
                               f"{str(exc).splitlines()[0][:200] if str(exc) else ''})") from exc


def check_keras_config(path: Path) -> None:
    """Refuse a ``.keras`` archive whose config names code outside Keras, before Keras reads it.

    Keras resolves every ``{"module": ..., "class_name": ...}`` object of ``config.json`` by
    importing the module; ``safe_mode`` stops lambdas, and recent Keras releases also restrict
    modules, but this check does not depend on the Keras version: an object must come from
    ``keras`` itself or be a custom object registered in this process, and no ``__lambda__``
    may appear anywhere.
    """
    import keras

    try:
        with zipfile.ZipFile(path) as archive:
            info = archive.getinfo("config.json")
            if info.file_size > MAX_TEXT_BYTES:
                raise ModelFormatError(f"{path}: config.json inflates to {info.file_size} bytes, expected at most "
                                       f"{MAX_TEXT_BYTES}")
            config = json.loads(archive.read(info))
    except ModelFormatError:
        raise
    except (zipfile.BadZipFile, KeyError, ValueError, RecursionError, OSError, EOFError, NotImplementedError,
            RuntimeError, zlib.error) as exc:  # RuntimeError: a member flagged as encrypted (found by fuzzing)
        raise ModelFormatError(f"{path}: expected a .keras archive with a JSON config.json, cannot read it "
                               f"({type(exc).__name__}: {str(exc)[:200]})") from None
    stack = [config]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(item)
            continue
        if not isinstance(item, dict):
            continue
        stack.extend(item.values())
        if item.get("class_name") == "__lambda__":
            raise ModelFormatError(f"{path}: refused to load: the model contains a Lambda layer (Python bytecode "
                                   "that Keras runs only with safe_mode=False); replace it with a registered custom layer, or load "
                                   "the model yourself if you trust the file and pass the keras.Model object")
        module = item.get("module")
        if module is None or (isinstance(module, str) and (module == "keras" or module.startswith("keras."))):
            continue
        registered = item.get("registered_name")
        if isinstance(registered, str) and keras.saving.get_registered_object(registered) is not None:
            continue
        raise ModelFormatError(f"{path}: refused to load: config.json names {item.get('class_name')!r} from module "
                               f"{module!r}; expected objects from keras or custom objects registered in this "
                               "process (loading would import and call that module's code)")


def unroll_recurrent_layers(model):
    """``model`` with every Keras RNN layer (LSTM, GRU, SimpleRNN, ...) rebuilt with
    ``unroll=True`` and the same weights; ``model`` itself if it has none.

    Why: a rolled RNN lowers to a WHILE loop with float state, and quantizing that loop
    crashes TF 2.21's converter (a segfault, not an exception). Unrolled, the recurrence is
    ``sequence length`` copies of plain FULLY_CONNECTED/ADD/MUL/LOGISTIC/TANH ops, which the
    converter quantizes like any feed-forward graph. Limits: the sequence length must be
    static, and the graph grows linearly with it.
    """
    import keras

    def rolled(layer) -> bool:
        return isinstance(layer, keras.layers.RNN) and not layer.get_config().get("unroll", False)

    def walk(layer):
        yield layer
        for inner in getattr(layer, "layers", ()):
            yield from walk(inner)

    if not any(rolled(layer) for layer in walk(model)):
        return model

    def clone(layer):
        config = layer.get_config()
        if rolled(layer):
            config["unroll"] = True
        return layer.__class__.from_config(config)

    try:
        unrolled = keras.models.clone_model(model, clone_function=clone)
        unrolled.set_weights(model.get_weights())
    except (ValueError, TypeError) as exc:
        raise ConversionError(
            f"{type(model).__name__}: full-integer conversion needs its recurrent layers unrolled "
            "(TensorFlow's converter cannot quantize the WHILE loop of a rolled RNN), and "
            f"unrolling failed: {str(exc).splitlines()[0][:300]}. Build the layers with unroll=True "
            "and a static sequence length") from exc
    return unrolled


def _keras_converter(model):
    import tensorflow as tf

    return tf.lite.TFLiteConverter.from_keras_model(model)


def _specs(model, batch: int):
    import tensorflow as tf

    inputs = getattr(model, "inputs", None)
    if not inputs:
        raise ConversionError(f"{type(model).__name__}: the model has no defined inputs; call it once or "
                              "build it with keras.Input so its input shapes are known")
    return [tf.TensorSpec((batch,) + tuple(t.shape[1:]), t.dtype) for t in inputs]


def _keras_fixed_batch(model, batch: int):
    import tensorflow as tf

    specs = _specs(model, batch)
    function = tf.function(lambda *args: model(args[0] if len(args) == 1 else list(args), training=False),
                           input_signature=specs)
    return tf.lite.TFLiteConverter.from_concrete_functions([function.get_concrete_function()])


def _convert_saved_model(path: Path, batch_size: int | None, representative_data) -> tuple[bytes, int | None]:
    import tensorflow as tf

    if not (path / SAVED_MODEL_FILE).is_file():
        raise ModelFormatError(f"{path}: expected a SavedModel directory containing {SAVED_MODEL_FILE}")
    if batch_size is None:
        try:
            converter = tf.lite.TFLiteConverter.from_saved_model(os.fspath(path))
        except Exception as exc:
            raise ModelFormatError(f"{path}: TensorFlow cannot read the SavedModel: "
                                   f"{str(exc).splitlines()[0][:300]}") from exc
        return _run(converter, representative_data, os.fspath(path)), None
    loaded = tf.saved_model.load(os.fspath(path))
    signature = loaded.signatures.get("serving_default")
    if signature is None:
        raise ConversionError(f"{path}: expected a 'serving_default' signature to fix the batch size")
    specs = {name: tf.TensorSpec((batch_size,) + tuple(spec.shape[1:]), spec.dtype, name=name)
             for name, spec in signature.structured_input_signature[1].items()}
    function = tf.function(lambda **kw: signature(**kw)).get_concrete_function(**specs)
    converter = tf.lite.TFLiteConverter.from_concrete_functions([function], loaded)
    return _run(converter, representative_data, os.fspath(path)), batch_size


def _run(converter, representative_data, where: str) -> bytes:
    import tensorflow as tf

    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
    if representative_data is not None:
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.representative_dataset = lambda: ([list(x) if isinstance(x, (list, tuple)) else [x]][0]
                                                    for x in representative_data)
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
        converter.inference_input_type = tf.int8
        converter.inference_output_type = tf.int8
    try:
        return bytes(converter.convert())
    except Exception as exc:
        lines = [line for line in str(exc).splitlines() if "error" in line.lower()] or str(exc).splitlines() or [""]
        raise ConversionError(f"{where}: TensorFlow's TFLite converter failed: {lines[0][:400]}") from exc


__all__ = ["accepts", "convert", "to_tflite", "load_keras_file", "unroll_recurrent_layers"]
