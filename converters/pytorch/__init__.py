"""PyTorch front end: ``nn.Module``s, ExportedPrograms (``.pt2``) and TorchScript (``.pt``/``.pth``).

Route: source -> ``torch.export`` ExportedProgram (``capture``) -> op check against edgeinfer's
registry (``ops``) -> ``torch.onnx.export(..., dynamo=True)`` -> ``onnx.ModelProto`` ->
``edgeinfer.converters.onnx.import_model`` (``translate``). TorchScript whose control flow
``TS2EPConverter`` cannot rewrite goes through ``torch.onnx.export(..., dynamo=False)`` instead
(``translate.script_to_onnx``); the route taken is logged and kept in
``model.metadata["source_route"]``.

Why this route: ``torch.export`` is the capture PyTorch maintains (TorchScript is in
maintenance, the TorchScript-based ONNX exporter is deprecated), and the dynamo ONNX exporter
(onnxscript's torchlib) already implements the aten -> ONNX translation for several hundred
ops, including the awkward ones (RNNs, attention, resize, dynamic shapes). Writing our own
aten rules would duplicate that and cover less. What edgeinfer adds is the contract: every op
of the captured program must be in the registry of ops tested end to end, and an op outside it
raises ``UnsupportedOpError`` naming the op and the module it came from, before any
translation; files are classified without executing a pickle (``files``).

``accepts`` is cheap and never imports torch.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from edgeinfer.errors import ConversionError, UnsupportedOpError
from edgeinfer.ir import Graph

from .state import STATE_KEY, initial_state, state_outputs

_log = logging.getLogger(__name__)

# How a model went to ONNX (graph.metadata[ROUTE_KEY]; ei.convert copies it into model.metadata).
ROUTE_KEY = "source_route"
ROUTE_MODULE = "torch.export -> torch.onnx (dynamo)"
ROUTE_PROGRAM = "ExportedProgram -> torch.onnx (dynamo)"
ROUTE_SCRIPT_PROGRAM = "TS2EPConverter -> torch.onnx (dynamo)"
ROUTE_SCRIPT_ONNX = "torch.onnx.export (TorchScript, dynamo=False)"

SUFFIXES = (".pt", ".pth", ".pt2")
_MODULE_CLASSES = {("torch.nn.modules.module", "Module"), ("torch.export.exported_program", "ExportedProgram"),
                   ("torch.jit._script", "ScriptModule"), ("torch.jit._script", "RecursiveScriptModule"),
                   ("torch.jit", "ScriptModule"), ("torch._C", "ScriptModule")}


def accepts(source: Any) -> bool:
    """True for a ``.pt``/``.pth``/``.pt2`` path, an ``nn.Module``, ``ScriptModule`` or
    ``ExportedProgram`` (recognised by class names, without importing torch)."""
    if isinstance(source, (str, os.PathLike)):
        return Path(source).suffix.lower() in SUFFIXES
    return any((cls.__module__, cls.__name__) in _MODULE_CLASSES for cls in type(source).__mro__)


def _kind_of(source: Any) -> str:
    names = {(cls.__module__, cls.__name__) for cls in type(source).__mro__}
    if ("torch.export.exported_program", "ExportedProgram") in names:
        return "exported_program"
    if names & {("torch.jit._script", "ScriptModule"), ("torch.jit._script", "RecursiveScriptModule"),
                ("torch._C", "ScriptModule")}:
        return "torchscript"
    return "module"


def convert(source: Any, *, example_inputs: Any = None, input_names: Sequence[str] | None = None,
            output_names: Sequence[str] | None = None, dynamic_batch: bool = False,
            input_shapes: Mapping[str, Sequence[int]] | None = None, **options: Any) -> Graph:
    """Convert a PyTorch model into an IR ``Graph``.

    ``example_inputs`` (a tensor or tuple) traces an ``nn.Module`` or TorchScript model;
    ``input_shapes`` ({name: shape}) stands in for it with float32 inputs of those shapes
    (what ``--input-shape`` gives). ``dynamic_batch`` makes dim 0 of every input the symbol
    ``N``. ``input_names``/``output_names`` name the graph's inputs and outputs (defaults:
    the forward() argument names, ``output`` / ``output_<i>``).
    """
    if options:
        raise ConversionError(f"PyTorch converter: unknown option(s) {sorted(options)}; expected example_inputs, "
                              "input_names, output_names, dynamic_batch, input_shapes")
    from . import capture, files, ops, translate

    with capture.quiet():
        if isinstance(source, (str, os.PathLike)):
            where = os.fspath(source)
            kind = files.classify(source)
            loaded = _load(source, kind, where)
        else:
            kind = _kind_of(source)
            where = f"<{type(source).__name__}>"
            loaded = source
        extra: dict[str, str] = {}
        if kind == "torchscript":
            model, weights, route, extra = _convert_script(loaded, example_inputs, input_shapes, input_names,
                                                           output_names, dynamic_batch, where)
        else:
            if kind == "exported_program":
                program, route = capture.prepare_program(loaded, dynamic_batch, input_shapes, where), ROUTE_PROGRAM
            else:
                program, input_names = capture.capture_module(loaded, example_inputs, input_shapes, input_names,
                                                              dynamic_batch, where)
                route = ROUTE_MODULE
            ops.check_supported(program.graph_module, where)
            model, weights = translate.to_onnx(program, input_names, output_names, where)
    from edgeinfer.converters.onnx import import_model

    graph = import_model(model, where, external=weights)
    graph.metadata.update(_metadata())
    graph.metadata[ROUTE_KEY] = route
    graph.metadata.update(extra)
    return graph


def _convert_script(script: Any, example_inputs: Any, input_shapes: Mapping[str, Sequence[int]] | None,
                    input_names: Sequence[str] | None, output_names: Sequence[str] | None, dynamic_batch: bool,
                    where: str) -> tuple[Any, dict, str, dict[str, str]]:
    """TorchScript -> (ONNX model, its large weights, route, graph metadata to add). A forward
    that assigns module attributes (state kept between calls) has them lifted to inputs and
    outputs first (``state``)."""
    from . import capture

    examples, input_names = capture.script_examples(script, example_inputs, input_shapes, input_names, where)
    if capture.assigned_attributes(script):
        return _convert_stateful_script(script, examples, input_names, output_names, dynamic_batch, where)
    return (*_export_script(script, examples, input_names, output_names, dynamic_batch, where), {})


def _convert_stateful_script(script: Any, examples: tuple, input_names: Sequence[str],
                             output_names: Sequence[str] | None, dynamic_batch: bool,
                             where: str) -> tuple[Any, dict, str, dict[str, str]]:
    """A forward that keeps state in module attributes, converted with that state as extra
    inputs (named after the attributes) and outputs (``<attribute>_out``); the value that starts
    a stream goes into ``graph.metadata[state.STATE_KEY]`` (read it with ``initial_state``)."""
    import torch

    from . import state
    from .translate import default_output_names

    if dynamic_batch:
        raise ConversionError(f"{where}: the TorchScript forward() keeps state in module attributes, whose batch "
                              "dim edgeinfer cannot tell; convert it without dynamic_batch / --dynamic-batch")
    lifted, tensor_examples = state.lift(script, examples, where)
    start = state.stream_start(lifted, tensor_examples, where)
    lifted = start.lifted
    with torch.no_grad():
        result = lifted.function(*tensor_examples, *start.carried)
    own_outputs = len(result) - len(lifted.states)
    if output_names is not None and len(output_names) != own_outputs:
        raise ConversionError(f"{where}: output_names has {len(output_names)} names {list(output_names)}, but the "
                              f"model returns {own_outputs} tensor(s) besides its state")
    user_inputs = [name for name, example in zip(input_names, examples) if isinstance(example, torch.Tensor)]
    own_names = list(output_names or default_output_names(own_outputs))
    taken = set(user_inputs) | set(own_names)
    state_inputs = [s.name if s.name not in taken else f"state_{s.name}" for s in lifted.states]
    state_outputs = [f"{name}{state.OUTPUT_SUFFIX}" for name in state_inputs]
    model, weights, route = _export_script(lifted.function, (*tensor_examples, *start.carried),
                                           [*user_inputs, *state_inputs], [*own_names, *state_outputs], False, where)
    exported = {value.name for value in model.graph.input}
    folded = [name for name in state_inputs if name not in exported]
    if folded:
        raise ConversionError(f"{where}: the exporter ({route}) folded state input(s) {folded} into constants, so the "
                              "converted graph would not carry that state between calls; expected every state "
                              "attribute to remain a graph input")
    _log.info("%s: state attributes %s lifted to inputs %s and outputs %s", where,
              [s.name for s in lifted.states], state_inputs, state_outputs)
    return model, weights, route, {state.STATE_KEY: state.state_metadata(start, state_inputs, state_outputs, where)}


def _export_script(script: Any, examples: tuple, input_names: Sequence[str], output_names: Sequence[str] | None,
                   dynamic_batch: bool, where: str) -> tuple[Any, dict, str]:
    """TorchScript (a module or function) -> (ONNX model, its large weights, route). First
    ``TS2EPConverter`` and the dynamo exporter; where either fails (control flow it cannot
    rewrite, or rewrites into ``torch.cond``, which the op registry does not take), the
    TorchScript ONNX exporter, which keeps ``prim::If`` / ``prim::Loop`` as ONNX ``If`` /
    ``Loop``. The route taken is logged and recorded in ``model.metadata["source_route"]``."""
    from . import capture, ops, translate

    try:
        program = capture.capture_script(script, examples, dynamic_batch, where)
        ops.check_supported(program.graph_module, where)
        model, weights = translate.to_onnx(program, input_names, output_names, where)
    except (ConversionError, UnsupportedOpError) as exc:  # e.g. a prim::If TS2EP rewrote into torch.cond
        reason = str(exc).removeprefix(f"{where}: ")
        try:
            model = translate.script_to_onnx(script, examples, input_names, output_names, dynamic_batch, where)
        except ConversionError as fallback:
            raise type(exc)(f"{exc}; the fallback, the TorchScript ONNX exporter, failed too: "
                            f"{str(fallback).removeprefix(f'{where}: ')}") from fallback
        _log.warning("%s: %s; converted with the TorchScript ONNX exporter instead (%s), which keeps control "
                     "flow as ONNX If/Loop", where, reason, ROUTE_SCRIPT_ONNX)
        return model, {}, ROUTE_SCRIPT_ONNX  # the TorchScript exporter writes weights into the protobuf
    _log.info("%s: converted with %s", where, ROUTE_SCRIPT_PROGRAM)
    return model, weights, ROUTE_SCRIPT_PROGRAM


def _load(path: str | os.PathLike, kind: str, where: str) -> Any:
    import torch

    from edgeinfer.errors import ModelFormatError

    try:
        if kind == "exported_program":
            return torch.export.load(os.fspath(path))
        return torch.jit.load(os.fspath(path), map_location="cpu")
    except Exception as exc:
        what = "ExportedProgram" if kind == "exported_program" else "TorchScript"
        raise ModelFormatError(f"{where}: cannot load the {what} archive: {type(exc).__name__}: "
                               f"{str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"[:400]) from exc


def _metadata() -> dict[str, str]:
    import torch

    return {"source_framework": "pytorch", "torch_version": torch.__version__}


def supported_ops_markdown() -> str:
    """The generated table of supported PyTorch inputs and ops (``docs/pytorch_ops.md``)."""
    from .ops import supported_ops_markdown as generate

    return generate()


__all__ = ["accepts", "convert", "supported_ops_markdown", "SUFFIXES", "STATE_KEY", "initial_state", "state_outputs"]
