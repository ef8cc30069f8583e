"""TensorFlow front end: in-memory ``keras.Model`` objects (functional, Sequential or
subclassed), ``.keras`` and legacy ``.h5``/``.hdf5`` files, and SavedModel directories into the IR.

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

Where a model needs another way in, the module that takes it says why: ``keras_files``
(safe loading of ``.keras`` and HDF5 files), ``subclassed`` (tracing a subclassed model from
its input shapes), ``saved_model`` (the session-based loader for SavedModels that TensorFlow's
object loader cannot rebuild). ``output_order`` puts the converted outputs back in the source's
order (TensorFlow's converter writes them in its own).

TensorFlow is imported only inside ``convert``; ``accepts`` looks at type names and paths.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from edgeinfer.converters.tensorflow.keras_files import (
    ARCHIVE_SUFFIXES,
    HDF5_SUFFIXES,
    check_hdf5_config,
    check_keras_config,
    load_keras_file,
)
from edgeinfer.converters.tensorflow.lowering import run_converter
from edgeinfer.converters.tensorflow.output_order import (
    SourceOutputs,
    in_source_order,
    keras_outputs,
    saved_model_outputs,
)
from edgeinfer.converters.tensorflow.saved_model import (
    SAVED_MODEL_FILE,
    convert_saved_model,
    signature_output_names,
)
from edgeinfer.converters.tensorflow.subclassed import as_functional, framework_name, has_functional_inputs
from edgeinfer.errors import ConversionError
from edgeinfer.ir import Graph

KERAS_SUFFIXES = ARCHIVE_SUFFIXES + HDF5_SUFFIXES
_FRAMEWORK_MODULES = ("keras", "tensorflow", "tf_keras")
KERAS_ROUTE = "tf.lite.TFLiteConverter"


def accepts(source: Any) -> bool:
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        return path.suffix.lower() in KERAS_SUFFIXES or (path.is_dir() and (path / SAVED_MODEL_FILE).is_file())
    return any(cls.__module__.split(".")[0] in _FRAMEWORK_MODULES and cls.__name__ in ("Model", "Functional",
                                                                                       "Sequential")
               for cls in type(source).__mro__)


class Lowered(NamedTuple):
    flatbuffer: bytes
    fixed_batch: int | None  # the batch size that had to be fixed, or None
    route: str  # how TensorFlow got there
    traced_shapes: bool  # the inputs were declared here from input_shapes/example_inputs/built shapes
    outputs: SourceOutputs | None  # the source's outputs in its own order (see ``output_order``)


def convert(source: Any, *, input_shapes: Mapping[str, Sequence[int]] | None = None, dynamic_batch: bool = False,
            example_inputs: Any = None, batch_size: int | None = None, representative_data=None) -> Graph:
    """Convert a Keras model (object, ``.keras`` or ``.h5``/``.hdf5`` file) or a SavedModel directory.

    Inputs keep the model's own shapes, a Keras ``None`` dim becoming a symbol (the batch ``N``).
    A subclassed Keras model, which declares no inputs, is traced from ``input_shapes``
    ({name: shape with batch}; the Keras inputs take those names, which TensorFlow's converter
    turns into ``serving_default_<name>:0``), else ``example_inputs`` (an
    array or a list of arrays), else the shape it was built or first called with (see
    ``subclassed``). For any other model ``input_shapes`` re-declares the converted inputs'
    shapes. ``dynamic_batch`` makes dim 0 of every input the symbol ``N``.

    Outputs come in the source's order: for a Keras model the order calling it returns them
    (list/tuple order; a dict output in the dict's order), for a SavedModel its
    ``serving_default`` signature's output keys sorted (see ``output_order``).

    ``representative_data`` (an iterable of inputs, each an array or a list of arrays) makes
    TensorFlow's converter calibrate a full-integer INT8 model with int8 inputs and outputs
    (recurrent layers are unrolled first, see ``unroll_recurrent_layers``).

    ``batch_size`` fixes the batch dim before conversion. With None the model's own (usually
    dynamic) batch is kept; if TensorFlow's converter cannot lower the model with a dynamic
    batch (Keras RNN layers need a static one), it is converted again with batch 1 and the
    graph's metadata records ``tensorflow_fixed_batch``.
    """
    from edgeinfer.converters import tflite

    lowered = _lower(source, batch_size=batch_size, representative_data=representative_data,
                     input_shapes=input_shapes, example_inputs=example_inputs, dynamic_batch=dynamic_batch)
    model = tflite.read_model(lowered.flatbuffer, "<tflite bytes>")
    where = os.fspath(source) if isinstance(source, (str, os.PathLike)) else type(source).__name__
    graph = in_source_order(tflite.import_model(model, signature_shapes=True), model, lowered.outputs, where)
    if not lowered.traced_shapes and (input_shapes or dynamic_batch):
        # The same re-declaration the API applies for front ends that take no shapes: this one
        # takes them only to trace subclassed models.
        from edgeinfer.api import redeclare_inputs

        graph = redeclare_inputs(graph, dict(input_shapes or {}), dynamic_batch)
    graph.metadata["tflite_route"] = KERAS_ROUTE
    if lowered.route != KERAS_ROUTE:
        graph.metadata["source_route"] = lowered.route
    if lowered.fixed_batch is not None:
        graph.metadata["tensorflow_fixed_batch"] = str(lowered.fixed_batch)
    return graph


def to_tflite(source: Any, *, batch_size: int | None = None, representative_data=None,
              input_shapes: Mapping[str, Sequence[int]] | None = None,
              example_inputs: Any = None) -> tuple[bytes, int | None]:
    """Lower ``source`` to a ``.tflite`` flatbuffer with TensorFlow's converter.

    Returns (flatbuffer, the batch size that had to be fixed or None). With
    ``representative_data`` (an iterable of input lists) the result is a full-integer INT8
    model with int8 inputs and outputs. ``input_shapes``/``example_inputs`` trace a subclassed
    Keras model (see ``convert``).
    """
    lowered = _lower(source, batch_size=batch_size, representative_data=representative_data,
                     input_shapes=input_shapes, example_inputs=example_inputs)
    return lowered.flatbuffer, lowered.fixed_batch


def _lower(source: Any, *, batch_size: int | None, representative_data, input_shapes=None, example_inputs=None,
           dynamic_batch: bool = False) -> Lowered:
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        if path.is_dir():
            flatbuffer, route = convert_saved_model(path, batch_size, representative_data)
            return Lowered(flatbuffer, batch_size, route, False, saved_model_outputs(signature_output_names(path)))
        source = load_keras_file(path)
    name = type(source).__name__
    traced = not has_functional_inputs(source)
    route = KERAS_ROUTE
    if traced:
        source = as_functional(source, input_shapes=input_shapes, example_inputs=example_inputs,
                               dynamic_batch=dynamic_batch)
        route = f"{KERAS_ROUTE} (subclassed {name} traced as keras.Model(keras.Input, {name}(...)))"
    if representative_data is not None:
        source = unroll_recurrent_layers(source)
    if batch_size is not None:
        converter, outputs = _keras_fixed_batch(source, batch_size)
        return Lowered(run_converter(converter, representative_data, name), batch_size, route, traced, outputs)
    try:
        # from_keras_model's signature names a Keras 3 model's outputs output_<i>, a Keras 2
        # (tf_keras) model's by its output_names.
        return Lowered(run_converter(_keras_converter(source), representative_data, name), None, route, traced,
                       keras_outputs(source, named_by_output_names=framework_name(source) == "tf_keras"))
    except ConversionError as exc:
        if "static" not in str(exc) and "TensorList" not in str(exc):
            raise
    converter, outputs = _keras_fixed_batch(source, 1)
    return Lowered(run_converter(converter, representative_data, name), 1, route, traced, outputs)


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


def _keras_fixed_batch(model, batch: int) -> tuple[Any, SourceOutputs | None]:
    """A converter of ``model`` with batch ``batch``, and the model's outputs."""
    import tensorflow as tf

    specs = _specs(model, batch)
    function = tf.function(lambda *args: model(args[0] if len(args) == 1 else list(args), training=False),
                           input_signature=specs)
    concrete = function.get_concrete_function()
    # Without a trackable object the converter freezes the variables and writes no signature; the
    # flatbuffer's outputs keep the function's output tensor names (``Identity_<i>``).
    converter = tf.lite.TFLiteConverter.from_concrete_functions([concrete])
    return converter, keras_outputs(model, named_by_output_names=False,
                                    flat_tensor_names=[t.name for t in concrete.outputs])


__all__ = ["accepts", "convert", "to_tflite", "load_keras_file", "check_keras_config", "check_hdf5_config",
           "unroll_recurrent_layers"]
