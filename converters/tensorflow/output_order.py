"""The converted graph's outputs in the source model's order, not TensorFlow's converter's.

TensorFlow's TFLite converter lists a subgraph's outputs in an order of its own (for a Keras
model with outputs 0, 1, 2 it may write 1, 0, 2), but it also writes a SignatureDef mapping
each output key of the source's serving signature to its tensor. The key of each output is
known from the source, so the graph's outputs are put in the source's order by key:

- a Keras model (functional, Sequential, subclassed traced by ``subclassed``, ``.keras`` and
  ``.h5`` files): the order calling the model returns them, list/tuple order, and for a dict
  output the dict's own order. TensorFlow names the outputs ``output_<i>`` in flattened order
  (Keras 3, and every model lowered from a concrete function), or by ``model.output_names``
  (a Keras 2 ``tf_keras`` model given to ``from_keras_model``); a dict output keeps its keys.
- a SavedModel: its ``serving_default`` signature's output keys, sorted. TensorFlow's own
  ``signatures['serving_default']`` returns a dict whose key order varies from one process to
  the next; sorted is deterministic, it is the order of the signature function's flat outputs
  (``tf.nest.flatten`` sorts a dict by key: ``StatefulPartitionedCall:<i>``), and ``edgeinfer
  parity`` compares in it too. A flatbuffer without a SignatureDef (the session-based loader
  writes none) is matched through the signature's tensor names instead.

Where a key cannot be matched, the converter's order is kept and a warning says why; an
output is never placed by guess.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from edgeinfer.converters.tensorflow.saved_model import SERVING_SIGNATURE
from edgeinfer.converters.tflite.reader import ModelDef, SignatureDef
from edgeinfer.ir import Graph

log = logging.getLogger("edgeinfer.converters.tensorflow")


@dataclass(frozen=True)
class SourceOutputs:
    """The source's outputs in its own order: their signature keys (None: the signature's keys
    sorted, a SavedModel's order), and for a SavedModel the TensorFlow tensor each key names
    (``StatefulPartitionedCall:1``)."""

    keys: tuple[str, ...] | None
    tensor_names: Mapping[str, str] = field(default_factory=dict)


def saved_model_outputs(tensor_names: Mapping[str, str]) -> SourceOutputs:
    """A SavedModel's outputs: its serving signature's keys sorted, ``tensor_names`` being
    {key: TensorFlow tensor name} from ``saved_model.pb`` (empty where it has none)."""
    return SourceOutputs(None, dict(tensor_names))


def keras_outputs(model, *, named_by_output_names: bool,
                  flat_tensor_names: Sequence[str] | None = None) -> SourceOutputs | None:
    """The signature keys TensorFlow's converter gives ``model``'s outputs, in the order calling
    the model returns them; None for a model whose output structure is unknown.

    ``named_by_output_names``: the keys of a non-dict output are ``model.output_names`` (a
    ``tf_keras`` model lowered by ``from_keras_model``) rather than ``output_<i>``.
    ``flat_tensor_names``: the TensorFlow tensor of each output in flattened order, for a
    flatbuffer without a signature (a frozen concrete function).
    """
    try:
        structure = model.output
    except (AttributeError, ValueError, RuntimeError):  # never called on symbolic inputs
        return None
    import tensorflow as tf

    count = len(tf.nest.flatten(structure))
    if named_by_output_names:
        flat_keys = [str(name) for name in getattr(model, "output_names", None) or []]
    elif isinstance(structure, Mapping):
        flat_keys = [str(key) for key in sorted(structure)]  # nest.flatten's order
    else:
        flat_keys = [f"output_{i}" for i in range(count)]
    if len(flat_keys) != count:
        return None
    tensor_names = {}
    if flat_tensor_names is not None and len(flat_tensor_names) == count:
        tensor_names = dict(zip(flat_keys, flat_tensor_names, strict=True))
    if isinstance(structure, Mapping):  # call order is the dict's order; nest.flatten sorts it
        flat = sorted(structure)
        return SourceOutputs(tuple(flat_keys[flat.index(key)] for key in structure), tensor_names)
    return SourceOutputs(tuple(flat_keys), tensor_names)


def in_source_order(graph: Graph, model: ModelDef, source: SourceOutputs | None, where: str) -> Graph:
    """``graph`` (imported from ``model``'s main subgraph) with its outputs in ``source``'s order;
    unchanged, with a warning, when the keys cannot all be matched to outputs."""
    if len(graph.outputs) < 2:
        return graph
    positions = "the source's output structure is unknown" if source is None else _positions(model, source)
    if isinstance(positions, str):
        log.warning("%s: the converted model's outputs keep the order of TensorFlow's TFLite converter, "
                    "which may differ from the source's: %s", where, positions)
        return graph
    if positions == list(range(len(graph.outputs))):
        return graph
    return graph.replace(outputs=[graph.outputs[p] for p in positions])


def _positions(model: ModelDef, source: SourceOutputs) -> list[int] | str:
    """The position among the main subgraph's outputs of each of ``source.keys``, or why not."""
    outputs = model.subgraphs[0].outputs
    signature = _main_signature(model)
    if signature is not None:
        tensor_of = dict(signature.outputs)
        found = f"the flatbuffer's {signature.key!r} signature has outputs {sorted(tensor_of)}"
    elif source.tensor_names:
        tensor_of = _tensors_by_name(model, source.tensor_names)
        found = (f"the flatbuffer has no signature, and its outputs {_names(model)} match the source's "
                 f"tensors {dict(source.tensor_names)} for {sorted(tensor_of)} only")
    else:
        return "the flatbuffer has no signature naming its outputs"
    keys = list(source.keys) if source.keys is not None else sorted(source.tensor_names or tensor_of)
    if sorted(tensor_of) != sorted(keys):
        return f"expected outputs {keys}, {found}"
    tensors = [tensor_of[key] for key in keys]
    if sorted(tensors) != sorted(outputs) or len(set(tensors)) != len(tensors):
        return f"the outputs {keys} are tensors {tensors}, the subgraph's outputs are {list(outputs)}"
    return [outputs.index(tensor) for tensor in tensors]


def _main_signature(model: ModelDef) -> SignatureDef | None:
    """The ``serving_default`` signature of subgraph 0, or its only signature."""
    mains = [s for s in model.signatures if s.subgraph == 0]
    serving = [s for s in mains if s.key == SERVING_SIGNATURE]
    return serving[0] if serving else mains[0] if len(mains) == 1 else None


def _tensors_by_name(model: ModelDef, tensor_names: Mapping[str, str]) -> dict[str, int]:
    """{key: output tensor index} for the keys whose TensorFlow tensor names one output; the
    converter writes a graph tensor ``name:0`` as ``name``."""
    main = model.subgraphs[0]
    by_name: dict[str, list[int]] = {}
    for index in main.outputs:
        by_name.setdefault(_tensor_name(main.tensors[index].name), []).append(index)
    return {key: by_name[_tensor_name(name)][0] for key, name in tensor_names.items()
            if len(by_name.get(_tensor_name(name), ())) == 1}


def _tensor_name(name: str) -> str:
    return name.removesuffix(":0")


def _names(model: ModelDef) -> list[str]:
    main = model.subgraphs[0]
    return [main.tensors[index].name for index in main.outputs]
