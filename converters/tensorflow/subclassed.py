"""Subclassed Keras models (``class Net(keras.Model)`` with a ``call()``) as functional models.

TensorFlow's converter traces a Keras model through its input signature. A functional or
Sequential model has one (``model.inputs``); a subclassed model has only what its first call
recorded, which is missing for a model that was never called, and incomplete for a ``call()``
taking several tensors ("cannot be saved because the input shapes have not been set"). Calling
the model on ``keras.Input`` tensors gives a functional model with the same layers and weights,
whose signature is explicit: ``keras.Model(keras.Input(shape), net(x))``.

The input shapes come from, in this order: ``input_shapes`` ({name: shape with batch}), an
example input (array or list of arrays), or the shape the model was built or first called
with (its batch becomes dynamic). Without any, the model is refused with a ``ConversionError``
that says what to pass.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from edgeinfer.errors import ConversionError, InputError, first_line

_NOT_TENSOR_ARGUMENTS = frozenset({"training", "mask"})


class InputSpec(NamedTuple):
    name: str
    shape: tuple  # with the batch dim; None where dynamic
    dtype: str


def has_functional_inputs(model) -> bool:
    """Whether ``model`` declares its inputs (functional, or a built Sequential)."""
    try:
        inputs = model.inputs
    except (AttributeError, ValueError):  # subclassed models have no such attribute
        return False
    return bool(inputs)


def as_functional(model, *, input_shapes: Mapping[str, Sequence] | None = None, example_inputs: Any = None,
                  dynamic_batch: bool = False):
    """``model`` wrapped as ``keras.Model(inputs, model(inputs))``; see the module docstring."""
    specs = input_specs(model, input_shapes, example_inputs, dynamic_batch)
    framework = importlib.import_module(framework_name(model))
    inputs = [framework.Input(batch_shape=spec.shape, dtype=spec.dtype, name=spec.name) for spec in specs]
    described = ", ".join(f"{spec.name}: {spec.shape}" for spec in specs)
    try:
        outputs = _call(model, inputs)
        return framework.Model(inputs[0] if len(inputs) == 1 else inputs, outputs, name=model.name)
    except Exception as exc:
        raise ConversionError(f"{type(model).__name__}: calling the subclassed Keras model on symbolic inputs "
                              f"({described}) to trace it failed: {first_line(exc, 300)}. Check input_shapes") from exc


def input_specs(model, input_shapes, example_inputs, dynamic_batch: bool) -> list[InputSpec]:
    """The inputs to trace ``model`` with; a ``ConversionError`` when nothing says them."""
    names = tensor_arguments(model)
    if input_shapes:
        specs = [InputSpec(str(name), _dims(name, shape, dynamic_batch), "float32")
                 for name, shape in input_shapes.items()]
        if set(names) >= {spec.name for spec in specs}:  # named after call()'s arguments: call order
            specs.sort(key=lambda spec: names.index(spec.name))
    elif example_inputs is not None:
        import numpy as np

        arrays = list(example_inputs) if isinstance(example_inputs, (list, tuple)) else [example_inputs]
        arrays = [np.asarray(array) for array in arrays]
        specs = [InputSpec(_name(names, i), _dims(_name(names, i), array.shape, dynamic_batch), str(array.dtype))
                 for i, array in enumerate(arrays)]
    else:
        specs = _built_specs(model, names)
    required = [name for name in names if _required(model, name)]
    if not specs or len(specs) < len(required):
        raise ConversionError(
            f"{type(model).__name__}: a subclassed Keras model (no functional inputs) whose input shapes are "
            f"unknown{_known(specs)}; its call() takes {', '.join(required) or 'one tensor'}. Pass "
            f"input_shapes={{{', '.join(repr(n) + ': (1, ...)' for n in required or ['input'])}}} "
            "(CLI: --input-shape NAME:1x...) or example_inputs=; a model with one input may instead be built "
            "or called once")
    return specs


def tensor_arguments(model) -> list[str]:
    """The names of ``call()``'s positional arguments that take tensors."""
    try:
        parameters = inspect.signature(model.call).parameters.values()
    except (TypeError, ValueError):
        return []
    return [p.name for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
            and p.name not in _NOT_TENSOR_ARGUMENTS]


def _required(model, name: str) -> bool:
    return inspect.signature(model.call).parameters[name].default is inspect.Parameter.empty


def _built_specs(model, names: list[str]) -> list[InputSpec]:
    """From the shapes Keras recorded when the model was built or first called (what TensorFlow's
    own converter reads), batch made dynamic; a list or dict of shapes is several inputs."""
    recorded = (getattr(model, "_build_shapes_dict", None) or {}).get("input_shape")
    dtype = str(getattr(model, "input_dtype", None) or "float32")
    if _is_shape(recorded):
        return [InputSpec(_name(names, 0), _dims(_name(names, 0), recorded, True), dtype)]
    if isinstance(recorded, Mapping) and all(_is_shape(s) for s in recorded.values()):
        return [InputSpec(str(k), _dims(k, s, True), dtype) for k, s in recorded.items()]
    if isinstance(recorded, (list, tuple)) and recorded and all(_is_shape(s) for s in recorded):
        return [InputSpec(_name(names, i), _dims(_name(names, i), s, True), dtype) for i, s in enumerate(recorded)]
    return []


def _call(model, inputs: list):
    """One tensor is passed as itself; several as separate arguments where ``call()`` takes them
    so, else as one list (the functional convention)."""
    if len(inputs) == 1:
        return model(inputs[0])
    if len(tensor_arguments(model)) >= len(inputs):
        return model(*inputs)
    return model(list(inputs))


def _dims(name: Any, shape: Any, dynamic_batch: bool) -> tuple:
    try:
        dims = tuple(None if d is None or (isinstance(d, int) and d < 0) else int(d) for d in shape)
    except (TypeError, ValueError):
        raise InputError(f"input {name!r}: expected a shape (a sequence of ints, with the batch), "
                         f"got {shape!r}") from None
    if not dims or any(d is not None and d < 1 for d in dims):
        raise InputError(f"input {name!r}: expected a shape with the batch dim and positive dims, got {shape!r}")
    return (None,) + dims[1:] if dynamic_batch else dims


def _is_shape(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and bool(value) and all(d is None or isinstance(d, int) for d in value)


def _name(names: list[str], index: int) -> str:
    return names[index] if index < len(names) else f"input_{index}"


def _known(specs: list[InputSpec]) -> str:
    return f" (known: {', '.join(s.name for s in specs)})" if specs else ""


def framework_name(model) -> str:
    """``keras`` or ``tf_keras``: the package whose ``Model`` the model subclasses."""
    for cls in type(model).__mro__:
        root = cls.__module__.split(".")[0]
        if cls.__name__ == "Model" and root in ("keras", "tf_keras"):
            return root
    return "keras"
