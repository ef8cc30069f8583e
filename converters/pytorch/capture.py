"""Every PyTorch source becomes one ``torch.export.ExportedProgram``.

- ``nn.Module``: ``torch.export.export`` (non-strict, which traces real Python rather than
  bytecode and so accepts more models), with the module switched to eval mode for the
  capture and restored afterwards.
- ``ExportedProgram`` / ``.pt2``: used as it is; re-exported from ``ep.module()`` only when a
  symbolic batch is asked for and the program was exported with static shapes.
- TorchScript: ``torch.export`` refuses ``ScriptModule``s and the TorchScript-based ONNX
  exporter (``torch.onnx.export(..., dynamo=False)``) is deprecated in torch 2.9+ ("will be
  removed"), so TorchScript goes through ``torch._export.converter.TS2EPConverter`` (the route
  ``torch.export``'s own error message recommends), which rewrites the TorchScript graph
  into an ExportedProgram. A TorchScript file records no input shapes, hence
  ``input_shapes`` (``--input-shape``) is required for it. Where TS2EPConverter fails
  (``prim::If`` / ``prim::Loop`` it cannot rewrite), the converter falls back to the
  TorchScript ONNX exporter after all (``translate.script_to_onnx``): deprecated, but the one
  route that keeps data-dependent control flow as ONNX ``If`` / ``Loop``.

Symbolic batch: every input's dim 0 shares one ``torch.export.Dim``. ``torch.export``
specializes dims of size 0 and 1, so an example with batch 1 is repeated to batch 2 for the
capture; the graph does not depend on the example's values.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from edgeinfer.errors import ConversionError, EdgeInferError

BATCH_SYMBOL = "N"
TRACE_BATCH = 2
_NOISY_LOGGERS = ("torch.onnx", "torch.export", "torch._export", "torch._dynamo", "torch.fx", "onnxscript")


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Silence PyTorch's export chatter (missing torchvision, deprecations) during a conversion."""
    levels = {}
    for name in _NOISY_LOGGERS:
        logger = logging.getLogger(name)
        levels[name] = logger.level
        logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)


@contextlib.contextmanager
def eval_mode(module: Any) -> Iterator[None]:
    """Put every submodule in eval mode, then restore each one's own flag."""
    flags = [(m, m.training) for m in module.modules()]
    module.eval()
    try:
        yield
    finally:
        for submodule, training in flags:
            submodule.training = training


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:300]


def as_example_tuple(example_inputs: Any, where: str) -> tuple:
    import torch

    if example_inputs is None:
        return ()
    if isinstance(example_inputs, torch.Tensor):
        return (example_inputs,)
    if isinstance(example_inputs, (tuple, list)):
        return tuple(example_inputs)
    raise ConversionError(f"{where}: example_inputs must be a tensor or a tuple of tensors, got "
                          f"{type(example_inputs).__name__}")


def _parameter_names(forward: Any) -> list[str]:
    try:
        params = inspect.signature(forward).parameters.values()
    except (TypeError, ValueError):
        return []
    return [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


def examples_from_shapes(input_shapes: Mapping[str, Sequence[int]], arg_names: Sequence[str],
                         where: str) -> tuple[tuple, list[str]]:
    """Float32 example tensors for ``input_shapes``, ordered like the forward arguments when
    the names match them, else in the order given. Returns (tensors, input names)."""
    import torch

    names = list(input_shapes)
    if set(names) <= set(arg_names):
        names = [n for n in arg_names if n in input_shapes]
    examples = []
    for name in names:
        shape = input_shapes[name]
        if not all(isinstance(d, int) and d > 0 for d in shape):
            raise ConversionError(f"{where}: input shape for {name!r} must be positive integers, got {tuple(shape)}")
        examples.append(torch.randn(*shape, generator=torch.Generator().manual_seed(0)))
    return tuple(examples), names


def _traceable_batch(examples: tuple) -> tuple:
    """Repeat batch-1 examples to ``TRACE_BATCH`` (torch.export specializes sizes 0 and 1)."""
    import torch

    out = []
    for item in examples:
        if isinstance(item, torch.Tensor) and item.dim() > 0 and item.shape[0] == 1:
            item = item.expand(TRACE_BATCH, *item.shape[1:]).clone()
        out.append(item)
    return tuple(out)


def _batch_shapes(examples: tuple, where: str) -> tuple:
    import torch

    batch = torch.export.Dim(BATCH_SYMBOL, min=1)
    shapes = []
    for index, item in enumerate(examples):
        if isinstance(item, torch.Tensor):
            if item.dim() == 0:
                raise ConversionError(f"{where}: dynamic_batch needs every input to have a batch dim, but input "
                                      f"{index} is a scalar")
            shapes.append({0: batch})
        else:
            shapes.append(None)
    return tuple(shapes)


def _export(module: Any, examples: tuple, dynamic_batch: bool, where: str) -> Any:
    import torch

    dynamic_shapes = None
    if dynamic_batch:
        examples = _traceable_batch(examples)
        dynamic_shapes = _batch_shapes(examples, where)
    try:
        return torch.export.export(module, examples, dynamic_shapes=dynamic_shapes, strict=False)
    except EdgeInferError:
        raise
    except Exception as exc:
        hint, message = "", str(exc)
        if dynamic_batch and ("specialized" in message or "Constraints violated" in message):
            hint = " (the model fixes its batch size; convert without dynamic_batch / --dynamic-batch)"
        raise ConversionError(f"{where}: torch.export could not capture the model{hint}: "
                              f"{type(exc).__name__}: {_first_line(exc)}") from exc


def capture_module(module: Any, example_inputs: Any, input_shapes: Mapping[str, Sequence[int]] | None,
                   input_names: Sequence[str] | None, dynamic_batch: bool, where: str) -> tuple[Any, list[str] | None]:
    """``nn.Module`` -> (ExportedProgram, input names or None for the forward's own)."""
    examples = as_example_tuple(example_inputs, where)
    if not examples:
        if not input_shapes:
            raise ConversionError(f"{where}: converting an nn.Module needs example_inputs=(tensor, ...) or "
                                  "input_shapes={name: shape} to trace it")
        examples, shape_names = examples_from_shapes(input_shapes, _parameter_names(module.forward), where)
        input_names = input_names or shape_names
    with eval_mode(module):
        return _export(module, examples, dynamic_batch, where), input_names


def script_examples(script: Any, example_inputs: Any, input_shapes: Mapping[str, Sequence[int]] | None,
                    input_names: Sequence[str] | None, where: str) -> tuple[tuple, list[str]]:
    """Example inputs and input names for a TorchScript module (from ``example_inputs`` or
    float32 tensors of ``input_shapes``)."""
    examples = as_example_tuple(example_inputs, where)
    arg_names = [a.name for a in script.forward.schema.arguments[1:]]
    if not examples:
        if not input_shapes:
            raise ConversionError(f"{where}: a TorchScript model does not record its input shapes; give them with "
                                  f"--input-shape NAME:1x3x224x224 (input_shapes={{name: shape}}) for inputs "
                                  f"{arg_names}")
        examples, shape_names = examples_from_shapes(input_shapes, arg_names, where)
        if len(examples) != len(arg_names):
            raise ConversionError(f"{where}: the TorchScript forward() takes inputs {arg_names}, got shapes for "
                                  f"{shape_names}")
        input_names = input_names or shape_names
    return examples, list(input_names or arg_names[:len(examples)])


def assigned_attributes(script: Any) -> list[str]:
    """Names of module attributes that the TorchScript ``forward`` assigns (``prim::SetAttr``
    anywhere in its inlined graph, control-flow blocks included): state kept between calls.
    The ``if self.training:`` branch of a module in eval mode is not looked into."""
    names: list[str] = []
    training = bool(getattr(script, "training", False))

    def visit(block: Any) -> None:
        for node in block.nodes():
            if node.kind() == "prim::SetAttr" and node.s("name") not in names:
                names.append(node.s("name"))
            blocks = list(node.blocks())
            if node.kind() == "prim::If" and not training and _reads_training(node):
                blocks = blocks[1:]
            for inner in blocks:
                visit(inner)

    try:
        visit(script.inlined_graph)
    except (AttributeError, RuntimeError):  # not a scripted forward with a graph: nothing to say
        return []
    return names


def _reads_training(node: Any) -> bool:
    condition = next(iter(node.inputs())).node()
    return condition.kind() == "prim::GetAttr" and condition.s("name") == "training"


def capture_script(script: Any, examples: tuple, dynamic_batch: bool, where: str) -> Any:
    """TorchScript module -> ExportedProgram (``TS2EPConverter``). It raises ``ConversionError``
    where the TorchScript graph has what the converter cannot rewrite (``prim::If`` blocks whose
    branches differ in what they return, ``prim::Loop``, attribute mutation); the caller then
    takes the TorchScript ONNX exporter instead (``translate.script_to_onnx``)."""
    from torch._export.converter import TS2EPConverter

    try:
        program = TS2EPConverter(script, examples).convert()
    except Exception as exc:
        raise ConversionError(f"{where}: cannot convert the TorchScript graph to an ExportedProgram "
                              f"(TS2EPConverter): {type(exc).__name__}: {_first_line(exc)}") from exc
    if dynamic_batch or not all(isinstance(d, int) for shape in user_input_shapes(program) for d in shape):
        # TS2EPConverter marks dims it cannot prove static as symbols (even the channel count
        # of an image input); re-export at the example's shapes so a static model stays static
        program = _export(program.module(check_guards=False), examples, dynamic_batch, where)
    return program


def _placeholder_examples(program: Any) -> tuple:
    """Zero tensors shaped like the program's user inputs (symbolic dims at ``TRACE_BATCH``)."""
    import torch

    examples = []
    for spec in program.graph_signature.input_specs:
        if spec.kind.name != "USER_INPUT":
            continue
        node = next(n for n in program.graph.nodes if n.op == "placeholder" and n.name == spec.arg.name)
        value = node.meta.get("val")
        if not isinstance(value, torch.Tensor):
            examples.append(value)
            continue
        shape = [d if isinstance(d, int) else TRACE_BATCH for d in value.shape]
        examples.append(torch.zeros(shape, dtype=value.dtype))
    return tuple(examples)


def user_input_shapes(program: Any) -> list[tuple]:
    """Shapes of the program's tensor inputs (ints, or the symbol's name for a symbolic dim)."""
    import torch

    shapes = []
    for node in program.graph.nodes:
        if node.op == "placeholder" and node.name in program.graph_signature.user_inputs:
            value = node.meta.get("val")
            if isinstance(value, torch.Tensor):
                shapes.append(tuple(d if isinstance(d, int) else str(d) for d in value.shape))
    return shapes


def prepare_program(program: Any, dynamic_batch: bool, input_shapes: Mapping[str, Sequence[int]] | None,
                    where: str) -> Any:
    """An ExportedProgram from a file or the caller, made to match the requested shapes."""
    if input_shapes:
        given = [tuple(s) for s in input_shapes.values()]
        found = user_input_shapes(program)
        if len(given) != len(found) or any(
                len(g) != len(f) or any(isinstance(fd, int) and fd != gd for gd, fd in zip(g, f))
                for g, f in zip(given, found)):
            raise ConversionError(f"{where}: the ExportedProgram fixes its input shapes to {found}; the requested "
                                  f"shapes {given} do not match (re-export the model with those shapes)")
    if dynamic_batch and all(shape and isinstance(shape[0], int) for shape in user_input_shapes(program)):
        try:
            program = _export(program.module(check_guards=False), _placeholder_examples(program), True, where)
        except ConversionError as exc:
            raise ConversionError(f"{where}: the ExportedProgram was exported with a static batch and its graph "
                                  "depends on it, so it cannot be given a symbolic batch; re-export it with "
                                  "torch.export.export(model, args, dynamic_shapes=({0: torch.export.Dim('batch')},))"
                                  " or convert without dynamic_batch") from exc
    return program
