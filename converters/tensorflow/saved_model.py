"""SavedModel directories into a ``.tflite`` flatbuffer.

TensorFlow has two SavedModel loaders. The object loader (``tf.saved_model.load``, under
``tf.lite.TFLiteConverter.from_saved_model``) rebuilds every saved Python object; it cannot
rebuild objects whose type nobody registered, the classic case being a SavedModel that Keras 2
wrote with an optimizer (``OptimizerV2``) holding slot variables: without Keras 2 (``tf_keras``)
installed the optimizer comes back as a bare ``_UserObject`` and loading fails on
``'_UserObject' object has no attribute 'add_slot'``. The session-based loader
(``tf.compat.v1.lite.TFLiteConverter.from_saved_model``) reads the graph and variables only,
so such a model is converted that way, with a warning that says so.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from edgeinfer.converters.tensorflow.lowering import run_converter
from edgeinfer.errors import ConversionError, ModelFormatError, first_line
from edgeinfer.limits import MAX_FILE_BYTES

SAVED_MODEL_FILE = "saved_model.pb"
SERVING_SIGNATURE = "serving_default"
OBJECT_ROUTE = "tf.lite.TFLiteConverter.from_saved_model"
SESSION_ROUTE = "tf.compat.v1.lite.TFLiteConverter.from_saved_model (session-based SavedModel loader)"

log = logging.getLogger("edgeinfer.converters.tensorflow")


def convert_saved_model(path: Path, batch_size: int | None, representative_data) -> tuple[bytes, str]:
    """(flatbuffer, the route taken: ``OBJECT_ROUTE`` or ``SESSION_ROUTE``)."""
    if not (path / SAVED_MODEL_FILE).is_file():
        raise ModelFormatError(f"{path}: expected a SavedModel directory containing {SAVED_MODEL_FILE}")
    try:
        converter, route = _object_converter(path, batch_size), OBJECT_ROUTE
    except ConversionError:
        raise
    except Exception as exc:
        if not unrevivable_object(exc):
            raise ModelFormatError(f"{path}: TensorFlow cannot read the SavedModel: {first_line(exc, 300)}") from exc
        log.warning("%s: TensorFlow's object loader cannot rebuild this SavedModel (%s: an object of a type "
                    "not registered here, typically a Keras 2 optimizer with slot variables when tf_keras is "
                    "not installed); converting it with TensorFlow's session-based SavedModel loader instead",
                    path, first_line(exc, 300))
        converter, route = _session_converter(path, batch_size), SESSION_ROUTE
    return run_converter(converter, representative_data, os.fspath(path)), route


def unrevivable_object(exc: BaseException) -> bool:
    """Whether the object loader failed on a saved object it rebuilt as a bare ``_UserObject``
    (its type is not registered in this process), which the session-based loader never rebuilds."""
    return isinstance(exc, AttributeError) and "_UserObject" in str(exc)


def _object_converter(path: Path, batch_size: int | None):
    import tensorflow as tf

    if batch_size is None:
        return tf.lite.TFLiteConverter.from_saved_model(os.fspath(path))
    loaded = tf.saved_model.load(os.fspath(path))
    signature = loaded.signatures.get(SERVING_SIGNATURE)
    if signature is None:
        raise ConversionError(f"{path}: expected a {SERVING_SIGNATURE!r} signature to fix the batch size")
    specs = {name: tf.TensorSpec((batch_size,) + tuple(spec.shape[1:]), spec.dtype, name=name)
             for name, spec in signature.structured_input_signature[1].items()}
    function = tf.function(lambda **kw: signature(**kw)).get_concrete_function(**specs)
    return tf.lite.TFLiteConverter.from_concrete_functions([function], loaded)


def _session_converter(path: Path, batch_size: int | None):
    import tensorflow as tf

    shapes = None
    if batch_size is not None:
        shapes = {name: [batch_size, *dims[1:]] for name, dims in signature_input_shapes(path).items()}
    try:
        return tf.compat.v1.lite.TFLiteConverter.from_saved_model(os.fspath(path), input_shapes=shapes)
    except Exception as exc:
        raise ModelFormatError(f"{path}: TensorFlow cannot read the SavedModel with its object loader nor with "
                               f"its session-based loader: {first_line(exc, 300)}") from exc


def signature_input_shapes(path: Path) -> dict[str, list[int]]:
    """{graph tensor name without ``:0``: dims (-1 where unknown)} of the ``serving_default``
    signature's inputs, read from ``saved_model.pb`` (protobuf only; no object is rebuilt)."""
    signature = _serving_signature(path)
    if signature is None:
        raise ConversionError(f"{path}: expected a {SERVING_SIGNATURE!r} signature with the 'serve' tag to fix "
                              "the batch size")
    if any(info.tensor_shape.unknown_rank for info in signature.inputs.values()):
        raise ConversionError(f"{path}: an input of {SERVING_SIGNATURE!r} has unknown rank; the batch "
                              "size cannot be fixed")
    return {info.name.split(":")[0]: [dim.size for dim in info.tensor_shape.dim]
            for info in signature.inputs.values()}


def signature_output_names(path: Path) -> dict[str, str]:
    """{output key: graph tensor name} of the ``serving_default`` signature, read from
    ``saved_model.pb``; empty when it has no such signature."""
    signature = _serving_signature(path)
    return {} if signature is None else {key: info.name for key, info in signature.outputs.items()}


def _serving_signature(path: Path):
    """The ``serving_default`` SignatureDef (protobuf) of the 'serve' meta graph, or None."""
    from tensorflow.core.protobuf import saved_model_pb2

    file = path / SAVED_MODEL_FILE
    if file.stat().st_size > MAX_FILE_BYTES:
        raise ModelFormatError(f"{file}: {file.stat().st_size} bytes, expected at most {MAX_FILE_BYTES}")
    proto = saved_model_pb2.SavedModel()
    try:
        proto.ParseFromString(file.read_bytes())
    except Exception as exc:  # google.protobuf.message.DecodeError
        raise ModelFormatError(f"{file}: not a SavedModel protobuf ({first_line(exc, 300)})") from None
    for meta_graph in proto.meta_graphs:
        if "serve" in meta_graph.meta_info_def.tags and SERVING_SIGNATURE in meta_graph.signature_def:
            return meta_graph.signature_def[SERVING_SIGNATURE]
    return None
