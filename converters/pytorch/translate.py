"""ExportedProgram -> ONNX ``ModelProto`` with PyTorch's exporter, then into the IR.

``torch.onnx.export(program, dynamo=True)`` decomposes the program to the ops onnxscript's
torchlib implements, translates each to ONNX, and runs the onnxscript optimizer (constant
folding, removal of the exporter's CastLike/Expand scaffolding, BatchNorm folded into the
preceding Conv). The resulting model goes through edgeinfer's ONNX front end
(``edgeinfer.converters.onnx.import_model``) like any other ONNX file.

Weights of 1 MiB and more never enter the protobuf: they are copied one at a time from the
exporter's in-memory model (which shares the module's tensors) into numpy and handed to the
importer beside a weightless model (as for ONNX external data), so a module past protobuf's
2 GB converts, at one copy of the weights (the converted model does not change when the
module is trained further).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from edgeinfer.errors import ConversionError, EdgeInferError

from .capture import BATCH_SYMBOL, _first_line


def default_output_names(count: int) -> list[str]:
    return ["output"] if count == 1 else [f"output_{i}" for i in range(count)]


def user_input_count(program: Any) -> int:
    return len(program.graph_signature.user_inputs)


def user_output_count(program: Any) -> int:
    return len(program.graph_signature.user_outputs)


def to_onnx(program: Any, input_names: Sequence[str] | None, output_names: Sequence[str] | None,
            where: str) -> tuple[Any, dict]:
    """Translate an (already checked) ExportedProgram into a weightless ``onnx.ModelProto``
    and its large weights (name -> numpy array, declared in the model as typed inputs)."""
    inputs, outputs = user_input_count(program), user_output_count(program)
    if input_names is not None and len(input_names) != inputs:
        raise ConversionError(f"{where}: input_names has {len(input_names)} names {list(input_names)}, but the model "
                              f"takes {inputs} tensor input(s)")
    if output_names is not None and len(output_names) != outputs:
        raise ConversionError(f"{where}: output_names has {len(output_names)} names {list(output_names)}, but the "
                              f"model returns {outputs} tensor(s)")
    output_names = list(output_names) if output_names is not None else default_output_names(outputs)
    try:
        model, weights = _export(program, list(input_names or []) or None, output_names)
    except EdgeInferError:
        raise
    except Exception as exc:
        raise ConversionError(f"{where}: the PyTorch ONNX exporter failed: {type(exc).__name__}: "
                              f"{_first_line(exc)}") from exc
    name_batch_symbol(model)
    _check_types(model, where)
    return model, weights


def _check_types(model: Any, where: str) -> None:
    """Strict ONNX shape inference: catches exporter output that no runtime would load."""
    import onnx

    try:
        onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError) as exc:
        raise ConversionError(f"{where}: the PyTorch ONNX exporter produced an invalid model "
                              f"({_first_line(exc)}); this is an exporter bug for one of the model's ops") from exc


@functools.lru_cache(maxsize=1)
def _torchlib_registry() -> Any:
    from torch.onnx._internal.exporter import _registration

    return _registration.ONNXRegistry.from_torchlib()


def _export(program: Any, input_names: list[str] | None, output_names: list[str]) -> Any:
    """``torch.onnx.export(program, dynamo=True)``, reusing one torchlib registry.

    The public function rebuilds the registry of several thousand torchlib functions on every
    call (about a second); its private body ``_core.export`` takes a prebuilt one and is what
    the public function calls with it. torch is pinned, but if that body ever moves the public
    function is used instead.
    """
    import torch

    options = {"input_names": input_names, "output_names": output_names, "optimize": True, "verbose": False}
    try:
        from torch.onnx._internal.exporter import _core
        registry = _torchlib_registry()
    except (ImportError, AttributeError):
        exported = torch.onnx.export(program, (), dynamo=True, external_data=False, **options)
    else:
        exported = _core.export(program, registry=registry, **options)
    weights = _take_large_weights(exported.model)
    return exported.model_proto, weights


def _take_large_weights(model: Any) -> dict:
    """Move the main graph's initializers of ``MAP_MIN_BYTES`` or more out of the exporter's
    ``onnx_ir`` model: each becomes a typed graph input, its data a numpy copy returned by name."""
    from edgeinfer.converters.onnx.external import MAP_MIN_BYTES

    weights = {}
    graph = model.graph
    for name, value in list(graph.initializers.items()):
        tensor = value.const_value
        if tensor is None or tensor.nbytes < MAP_MIN_BYTES or value in graph.inputs:
            continue
        try:
            array = np.array(tensor.numpy(), copy=True)
        except Exception:  # a type numpy cannot view: leave it in the protobuf
            continue
        del graph.initializers[name]
        value.const_value = None
        graph.inputs.append(value)
        weights[name] = array
    return weights


def name_batch_symbol(model: Any) -> None:
    """Rename the exporter's symbol for dim 0 (``s77``) to ``N`` when all inputs share it."""
    symbols = {tuple(i.type.tensor_type.shape.dim)[0].dim_param if i.type.tensor_type.shape.dim else ""
               for i in model.graph.input}
    if len(symbols) != 1:
        return
    symbol = symbols.pop()
    if not symbol or symbol == BATCH_SYMBOL:
        return
    pattern = re.compile(rf"\b{re.escape(symbol)}\b")
    graph = model.graph
    for info in [*graph.input, *graph.output, *graph.value_info]:
        for dim in info.type.tensor_type.shape.dim:
            if dim.dim_param:
                dim.dim_param = pattern.sub(BATCH_SYMBOL, dim.dim_param)


SCRIPT_OPSET = 17  # the TorchScript exporter's opset for the fallback route


def script_to_onnx(script: Any, examples: tuple, input_names: Sequence[str], output_names: Sequence[str] | None,
                   dynamic_batch: bool, where: str) -> Any:
    """TorchScript module -> ``onnx.ModelProto`` with the TorchScript ONNX exporter
    (``torch.onnx.export(..., dynamo=False)``), the route for scripts that ``TS2EPConverter``
    cannot rewrite: it translates ``prim::If`` / ``prim::Loop`` into ONNX ``If`` / ``Loop``
    with their bodies as subgraphs, so data-dependent control flow stays control flow.

    The exporter's own value_info comes from TorchScript's shape analysis and invents symbols
    for dims it could not follow (``Concatstate_out_dim_1`` for a dim that is 1); those are
    dropped so that edgeinfer infers every shape from the declared inputs."""
    import io

    import onnx
    import torch

    inputs = len(examples)
    if len(input_names) != inputs:
        raise ConversionError(f"{where}: input_names has {len(input_names)} names {list(input_names)}, but the model "
                              f"takes {inputs} input(s)")
    with torch.no_grad():
        result = script(*examples)
    outputs = len(result) if isinstance(result, (tuple, list)) else 1
    if output_names is not None and len(output_names) != outputs:
        raise ConversionError(f"{where}: output_names has {len(output_names)} names {list(output_names)}, but the "
                              f"model returns {outputs} tensor(s)")
    output_names = list(output_names) if output_names is not None else default_output_names(outputs)
    dynamic_axes = {name: {0: BATCH_SYMBOL} for name in input_names} if dynamic_batch else None
    buffer = io.BytesIO()
    try:
        torch.onnx.export(script, examples, buffer, dynamo=False, opset_version=SCRIPT_OPSET,
                          input_names=list(input_names), output_names=output_names, dynamic_axes=dynamic_axes,
                          do_constant_folding=True)
        model = onnx.load_from_string(buffer.getvalue())
    except EdgeInferError:
        raise
    except Exception as exc:
        raise ConversionError(f"{where}: the TorchScript ONNX exporter (torch.onnx.export, dynamo=False) failed: "
                              f"{type(exc).__name__}: {_first_line(exc)}") from exc
    _drop_guessed_shapes(model.graph)
    _check_types(model, where)
    return model


def _drop_guessed_shapes(graph: Any) -> None:
    """Remove value_info and the symbolic dims of outputs (main graph and every subgraph),
    keeping ranks and concrete dims; the declared graph inputs stay as they are."""
    import onnx

    del graph.value_info[:]
    for info in graph.output:
        for dim in info.type.tensor_type.shape.dim:
            if not dim.HasField("dim_value"):
                dim.Clear()
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                _drop_guessed_shapes(attribute.g)
            elif attribute.type == onnx.AttributeProto.GRAPHS:
                for sub in attribute.graphs:
                    _drop_guessed_shapes(sub)
