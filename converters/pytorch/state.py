"""State that a TorchScript ``forward`` keeps in module attributes, lifted to graph inputs and outputs.

A scripted module such as silero-vad's ``.jit`` VAD assigns attributes in ``forward``
(``prim::SetAttr``: ``self._state = new_state``) and reads them on the next call. A converted
graph cannot hold state, so each attribute that the forward both reads and assigns becomes an
extra graph input named after the attribute (the value before the call) and an extra output
``<attribute>_out`` (the value after it), as in the ONNX export of such models
(``state`` in, ``stateN`` out); the caller feeds each output back as the next call's input.

Why a TorchScript graph pass: ``TS2EPConverter`` turns ``SetAttr`` of a tensor attribute into a
buffer mutation of the ExportedProgram, but it refuses attributes assigned inside ``prim::If``
and ints, and ``torch.export``'s lifting of mutated buffers stops at the dynamo ONNX exporter,
which writes the update back into its own initializer. The TorchScript graph has the whole
story instead, branches and loops included:

1. ``torch._C._freeze_module`` (on a clone) inlines every method and folds every attribute
   that is never assigned (weights, constants, ``training``) into the graph, so the only
   attributes left on ``self`` are the assigned ones.
2. An SSA walk replaces each ``GetAttr`` of a lifted attribute by the value it holds at that
   point (the graph input at the start, the last assigned value after a ``SetAttr``); a value
   assigned in a ``prim::If`` branch leaves the ``If`` as a new output, one assigned in a
   ``prim::Loop`` body becomes a loop-carried value.
3. The final values are appended to the returned tuple; ``self`` is then unused and dropped,
   and the graph becomes a ``ScriptFunction`` that the usual TorchScript routes convert.

Tensors are lifted as they are; ``int``, ``float`` and ``bool`` attributes as 0-d int64,
float64 and bool tensors. Any other kind (lists, optionals, tuples, objects) is refused with a
``ConversionError`` naming the attribute. Non-tensor forward arguments (silero's sample rate)
are specialized to the example's value. The graph's ``metadata[STATE_KEY]`` lists the state
inputs, their outputs and the value that starts a stream (``initial_state``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgeinfer.errors import ConversionError

_log = logging.getLogger(__name__)

STATE_KEY = "pytorch_state"  # graph.metadata: JSON list of {attribute, input, output, dtype, shape, initial}
OUTPUT_SUFFIX = "_out"
MAX_INITIAL_VALUES = 1 << 16  # elements of a non-constant initial value written into the metadata
_SCALARS = {"int": ("aten::Int", "int64"), "float": ("aten::Float", "float64"), "bool": ("aten::Bool", "bool")}


@dataclass(frozen=True)
class StateAttribute:
    """One lifted attribute: its dotted path under the module and its kind (tensor, int, float, bool)."""

    path: tuple[str, ...]
    kind: str

    @property
    def name(self) -> str:
        return ".".join(self.path)


@dataclass
class LiftedScript:
    """A stateful forward as a stateless ``ScriptFunction``:
    ``function(*arguments, *states) -> (*outputs, *new_states)``."""

    function: Any
    argument_names: list[str]
    states: list[StateAttribute]
    initial: list[Any]  # torch tensors: the module's attribute values when it was converted


def lift(script: Any, examples: Sequence[Any], where: str) -> tuple[LiftedScript, tuple]:
    """Lift the attributes that ``script.forward`` assigns. ``examples`` are its arguments;
    non-tensor ones are baked into the graph. Returns the lifted script and the tensor examples
    left as its arguments."""
    import torch

    frozen = torch._C._freeze_module(script._c, [], True, False)
    graph = frozen._get_method("forward").graph.copy()
    self_value = next(iter(graph.inputs()))
    names = [a.name for a in script.forward.schema.arguments[1:]]
    if len(examples) > len(names):
        raise ConversionError(f"{where}: the TorchScript forward() takes {len(names)} input(s) {names}, got "
                              f"{len(examples)} example(s)")
    tensor_examples, argument_names = _specialize_scalars(graph, examples, names, where)
    torch._C._jit_pass_constant_propagation(graph)
    torch._C._jit_pass_dce(graph)

    assigned = _keys_of(graph, "prim::SetAttr", self_value)
    read = _keys_of(graph, "prim::GetAttr", self_value)
    states = [StateAttribute(key, _kind(graph, key, self_value, where)) for key in assigned if key in read]
    if not states:
        raise ConversionError(f"{where}: the TorchScript forward() assigns attributes "
                              f"{['.'.join(k) for k in assigned]} but never reads them back; expected state "
                              "read on the next call")
    env = {}
    for state in states:
        env[state.path] = _state_input(graph, state)
    final = _rewrite_block(graph.block(), env, {s.path: s for s in states}, set(assigned), self_value, where)
    _return_states(graph, [(state, final[state.path]) for state in states])
    torch._C._jit_pass_dce(graph)
    _drop_self(graph, self_value, where)
    _int_truth_as_comparison(graph)
    function = torch._C._create_function_from_graph("forward", graph)
    initial = [_attribute_tensor(script, state) for state in states]
    return LiftedScript(function, argument_names, states, initial), tensor_examples


# ----------------------------------------------------------------------------- graph surgery


def _specialize_scalars(graph: Any, examples: Sequence[Any], names: list[str], where: str) -> tuple[tuple, list[str]]:
    """Replace the forward's non-tensor arguments by constants of their example values."""
    import torch

    inputs = list(graph.inputs())[1:]
    tensors, kept, dropped = [], [], []
    for index, (value, example) in enumerate(zip(inputs, examples)):
        if isinstance(example, torch.Tensor):
            tensors.append(example)
            kept.append(names[index])
        elif isinstance(example, (bool, int, float)):
            constant = graph.insertConstant(example)
            constant.node().moveBefore(next(iter(graph.nodes())))
            value.replaceAllUsesWith(constant)
            dropped.append(index + 1)
        else:
            raise ConversionError(f"{where}: example input {names[index]!r} is a {type(example).__name__}; expected "
                                  "a tensor, or an int, float or bool to bake into the graph")
    for position in reversed(dropped):
        graph.eraseInput(position)
    if dropped:
        _log.info("%s: non-tensor inputs %s baked in at their example values", where, [names[i - 1] for i in dropped])
    return tuple(tensors), kept


def _attribute_key(node: Any, self_value: Any) -> tuple[str, ...] | None:
    """The attribute path a ``GetAttr``/``SetAttr`` node names, when its object is ``self`` or a
    chain of submodule ``GetAttr``s from it."""
    path = [node.s("name")]
    value = next(iter(node.inputs()))
    while value.unique() != self_value.unique():
        producer = value.node()
        if producer.kind() != "prim::GetAttr":
            return None
        path.append(producer.s("name"))
        value = next(iter(producer.inputs()))
    return tuple(reversed(path))


def _keys_of(graph_or_block: Any, kind: str, self_value: Any) -> list[tuple[str, ...]]:
    keys: list[tuple[str, ...]] = []
    for node in graph_or_block.findAllNodes(kind, True):
        key = _attribute_key(node, self_value)
        if key is not None and key not in keys:
            keys.append(key)
    return keys


def _kind(graph: Any, key: tuple[str, ...], self_value: Any, where: str) -> str:
    import torch

    value_type = next(n.output().type() for n in graph.findAllNodes("prim::GetAttr", True)
                      if _attribute_key(n, self_value) == key)
    if isinstance(value_type, torch._C.TensorType):
        return "tensor"
    for kind, type_class in (("bool", torch._C.BoolType), ("int", torch._C.IntType), ("float", torch._C.FloatType)):
        if isinstance(value_type, type_class):
            return kind
    raise ConversionError(f"{where}: the TorchScript forward() keeps attribute {'.'.join(key)!r} of type "
                          f"{value_type} between calls; edgeinfer lifts state of type Tensor, int, "
                          "float or bool to graph inputs and outputs, not this (keep the state in a tensor, or "
                          "convert a stateless submodule and carry the state yourself)")


def _state_input(graph: Any, state: StateAttribute) -> Any:
    """A new graph input for ``state``: a tensor, converted to its scalar type where it is one."""
    import torch

    value = graph.addInput(state.name.replace(".", "_"))
    value.setType(torch._C.TensorType.get())
    if state.kind == "tensor":
        return value
    node = graph.create(_SCALARS[state.kind][0], [value], 1)
    node.output().setType(_scalar_type(state.kind))
    graph.prependNode(node)
    return node.output()


def _scalar_type(kind: str) -> Any:
    import torch

    return {"tensor": torch._C.TensorType.get(), "int": torch._C.IntType.get(), "float": torch._C.FloatType.get(),
            "bool": torch._C.BoolType.get()}[kind]


def _rewrite_block(block: Any, env: dict, states: Mapping[tuple, StateAttribute], assigned: set,
                   self_value: Any, where: str) -> dict:
    """Replace the attribute reads and writes of ``block`` by values; returns the state after it."""
    env = dict(env)
    for node in list(block.nodes()):
        kind = node.kind()
        key = _attribute_key(node, self_value) if kind in ("prim::GetAttr", "prim::SetAttr") else None
        if kind == "prim::GetAttr" and key in states:
            node.output().replaceAllUsesWith(env[key])
            node.destroy()
        elif kind == "prim::SetAttr" and key in assigned:
            if key in states:
                env[key] = list(node.inputs())[1]
            node.destroy()  # an attribute written and never read affects no output
        elif kind == "prim::If":
            _rewrite_if(node, env, states, assigned, self_value, where)
        elif kind == "prim::Loop":
            _rewrite_loop(node, env, states, assigned, self_value, where)
        elif any(_keys_of(inner, "prim::GetAttr", self_value) or _keys_of(inner, "prim::SetAttr", self_value)
                 for inner in node.blocks()):
            raise ConversionError(f"{where}: the TorchScript forward() uses its state attributes inside a {kind} "
                                  "block; expected them in plain code, prim::If or prim::Loop")
    return env


def _rewrite_if(node: Any, env: dict, states: Mapping, assigned: set, self_value: Any, where: str) -> None:
    branches = list(node.blocks())
    after = [_rewrite_block(branch, env, states, assigned, self_value, where) for branch in branches]
    for key, state in states.items():
        if all(result[key].unique() == env[key].unique() for result in after):
            continue
        for branch, result in zip(branches, after):
            branch.registerOutput(result[key])
        output = node.addOutput()
        output.setType(_scalar_type(state.kind))
        env[key] = output


def _rewrite_loop(node: Any, env: dict, states: Mapping, assigned: set, self_value: Any, where: str) -> None:
    body = next(iter(node.blocks()))
    carried = [key for key in _keys_of(body, "prim::SetAttr", self_value) if key in states]
    inner = dict(env)
    for key in carried:
        node.addInput(env[key])
        parameter = body.addInputToBlock()
        parameter.setType(_scalar_type(states[key].kind))
        inner[key] = parameter
    result = _rewrite_block(body, inner, states, assigned, self_value, where)
    for key in carried:
        body.registerOutput(result[key])
        output = node.addOutput()
        output.setType(_scalar_type(states[key].kind))
        env[key] = output


def _return_states(graph: Any, finals: list[tuple[StateAttribute, Any]]) -> None:
    """Return ``(*outputs, *final states as tensors)`` instead of the forward's own result."""
    import torch

    result = next(iter(graph.outputs()))
    values = list(result.node().inputs()) if result.node().kind() == "prim::TupleConstruct" else [result]
    returned = graph.return_node()
    for state, value in finals:
        if state.kind != "tensor":
            if state.kind == "bool":
                node = graph.create("aten::Int", [value], 1)
                node.output().setType(torch._C.IntType.get())
                node.insertBefore(returned)
                value = node.output()
            node = graph.create("prim::NumToTensor", [value], 1)
            node.output().setType(torch._C.TensorType.get())
            node.insertBefore(returned)
            value = node.output()
            if state.kind == "bool":
                value = _bool_tensor(graph, value, returned)
        values.append(value)
    packed = graph.create("prim::TupleConstruct", values, 1)
    packed.output().setType(torch._C.TupleType([v.type() for v in values]))
    packed.insertBefore(returned)
    graph.eraseOutput(0)
    graph.registerOutput(packed.output())


def _bool_tensor(graph: Any, value: Any, before: Any) -> Any:
    """``value.to(torch.bool)`` as a graph node (``aten::ne(value, 0)``)."""
    import torch

    zero = graph.insertConstant(0)
    zero.node().moveBefore(before)
    node = graph.create("aten::ne", [value, zero], 1)
    node.output().setType(torch._C.TensorType.get())
    node.insertBefore(before)
    return node.output()


def _int_truth_as_comparison(graph: Any) -> None:
    """``bool(n)`` of an int as ``n != 0``: the TorchScript ONNX exporter writes ``aten::Bool``
    of an int as the int itself, and then refuses ``not`` of it (silero's
    ``not bool(len(self._context))``, which reads lifted state)."""
    import torch

    for node in graph.findAllNodes("aten::Bool", True):
        value = next(iter(node.inputs()))
        if not isinstance(value.type(), torch._C.IntType):
            continue
        zero = graph.insertConstant(0)
        zero.node().moveBefore(node)
        compare = graph.create("aten::ne", [value, zero], 1)
        compare.output().setType(torch._C.BoolType.get())
        compare.insertBefore(node)
        node.output().replaceAllUsesWith(compare.output())
        node.destroy()


def _drop_self(graph: Any, self_value: Any, where: str) -> None:
    uses = [use.user for use in self_value.uses()]
    if uses:
        what = sorted({u.s("name") if u.kind() == "prim::GetAttr" else u.kind() for u in uses})
        raise ConversionError(f"{where}: after lifting the assigned attributes, the TorchScript forward() still uses "
                              f"the module through {what} (an attribute changed in place rather than assigned?); "
                              "expected state to be assigned with self.name = value")
    graph.eraseInput(0)


def _attribute_tensor(script: Any, state: StateAttribute) -> Any:
    import torch

    value = script
    for name in state.path:
        value = getattr(value, name)
    if state.kind == "tensor":
        return value.detach().clone()
    return torch.tensor(value, dtype=getattr(torch, _SCALARS[state.kind][1]))


# ----------------------------------------------------------------------------- initial values


@dataclass
class StreamStart:
    """What the export and the metadata need: the lifted script to export (settled scalars baked
    in), the state examples for the export, the initial state and the baked scalars."""

    lifted: LiftedScript
    carried: list[Any]
    initial: list[Any]
    baked: dict[str, Any]


def stream_start(lifted: LiftedScript, examples: tuple, where: str) -> StreamStart:
    """Decide how a stream starts, checked against the lifted script run from the module's own
    attribute values on the examples and then on random inputs of the same shapes.

    - The export's state examples are the values one call leaves (the shapes a stream carries).
    - A tensor attribute whose value has another shape or dtype than that (an empty tensor the
      forward replaces on the first call, as silero's ``_state`` and ``_context``) starts at
      zeros of the carried shape.
    - An int/bool attribute that settles after one call (silero's ``_last_sr``: the sample rate
      of the previous call, compared to reset the state when it changes) is baked into the graph
      at that value: the TorchScript ONNX exporter infers the shape of an ``If`` whose branches
      differ in rank (a reset to an empty tensor) from its first branch and folds a ``len`` of it,
      so a reset branch left live would freeze the state.

    Each choice is kept only where the stream it gives matches the module's own; otherwise the
    conversion is refused."""
    import torch

    inputs = [examples, _random_like(examples)]
    reference = _stream(lifted.function, inputs, lifted.initial)
    carried = reference[0][len(reference[0]) - len(lifted.states):]
    initial = [start if start.shape == after.shape and start.dtype == after.dtype else torch.zeros_like(after)
               for start, after in zip(lifted.initial, carried)]
    second = reference[1][len(reference[1]) - len(lifted.states):]
    settled = {i: carried[i] for i, state in enumerate(lifted.states)
               if state.kind != "tensor" and torch.equal(carried[i], second[i])}
    for bake in ([settled, {}] if settled else [{}]):
        candidate = _bake(lifted, bake) if bake else lifted
        kept = [i for i in range(len(lifted.states)) if i not in bake]
        got = _stream(candidate.function, inputs, [initial[i] for i in kept])
        own = len(reference[0]) - len(lifted.states)
        expected = [[*outputs[:own], *(outputs[own + i] for i in kept)] for outputs in reference]
        if all(len(g) == len(e) and all(torch.equal(a, b) for a, b in zip(g, e)) for g, e in zip(got, expected)):
            baked = {lifted.states[i].name: carried[i].item() for i in bake}
            if baked:
                _log.info("%s: state attributes %s settle after one call and are baked into the graph", where, baked)
            return StreamStart(candidate, [carried[i] for i in kept], [initial[i] for i in kept], baked)
    changed = [s.name for s, a, b in zip(lifted.states, initial, lifted.initial) if a is not b]
    raise ConversionError(f"{where}: the module's state attributes {changed} hold values of another shape than the "
                          "forward() leaves in them, and zeros of that shape do not start the same stream; call the "
                          "module once before converting it, so that its attributes hold state of the shape a "
                          "stream carries")


def _random_like(examples: tuple) -> tuple:
    import torch

    generator = torch.Generator().manual_seed(0)
    return tuple(torch.randn(e.shape, generator=generator).to(e.dtype) if e.is_floating_point() else e.clone()
                 for e in examples)


def _stream(function: Any, inputs: Sequence[tuple], state: Sequence[Any]) -> list[list[Any]]:
    """Outputs of ``function`` called on each of ``inputs`` in turn, feeding its state back."""
    import torch

    results, state = [], list(state)
    with torch.no_grad():
        for arguments in inputs:
            result = function(*arguments, *state)
            result = list(result) if isinstance(result, (tuple, list)) else [result]
            results.append(result)
            state = result[len(result) - len(state):]
    return results


def _bake(lifted: LiftedScript, values: Mapping[int, Any]) -> LiftedScript:
    """``lifted`` with the scalar states ``values`` ({state index: 0-d tensor}) made constants:
    their inputs and outputs removed."""
    import torch

    graph = lifted.function.graph.copy()
    arguments = len(lifted.argument_names)
    packed = next(iter(graph.outputs())).node()
    own = packed.inputsSize() - len(lifted.states)
    for index in sorted(values, reverse=True):
        state_input = list(graph.inputs())[arguments + index]
        value = values[index].item()
        constant = graph.insertConstant(bool(value) if lifted.states[index].kind == "bool" else value)
        constant.node().moveBefore(next(iter(graph.nodes())))
        for user in [use.user for use in state_input.uses()]:  # the aten::Int / aten::Bool of _state_input
            user.output().replaceAllUsesWith(constant)
            user.destroy()
        graph.eraseInput(arguments + index)
        packed.removeInput(own + index)
    packed.output().setType(torch._C.TupleType([v.type() for v in packed.inputs()]))
    torch._C._jit_pass_constant_propagation(graph)
    torch._C._jit_pass_dce(graph)
    function = torch._C._create_function_from_graph("forward", graph)
    states = [s for i, s in enumerate(lifted.states) if i not in values]
    initial = [v for i, v in enumerate(lifted.initial) if i not in values]
    return LiftedScript(function, lifted.argument_names, states, initial)


def state_metadata(start: StreamStart, input_names: Sequence[str], output_names: Sequence[str], where: str) -> str:
    """The JSON of ``metadata[STATE_KEY]``: one entry per state input, then one per baked scalar
    (``{"attribute", "kind", "baked": value}``, no input or output)."""
    entries = []
    for state, input_name, output_name, value in zip(start.lifted.states, input_names, output_names, start.initial):
        array = value.detach().cpu().numpy()
        entry = {"attribute": state.name, "kind": state.kind, "input": input_name, "output": output_name,
                 "dtype": str(array.dtype), "shape": list(array.shape)}
        flat = array.reshape(-1)
        if flat.size and np.all(flat == flat[0]):
            entry["fill"] = flat[0].item()
        elif flat.size == 0:
            entry["fill"] = 0
        elif flat.size <= MAX_INITIAL_VALUES:
            entry["values"] = flat.tolist()
        else:
            _log.warning("%s: the initial value of state %r has %d elements, too many to record; start a stream "
                         "with the module's attribute value", where, state.name, flat.size)
        entries.append(entry)
    entries += [{"attribute": name, "baked": value} for name, value in start.baked.items()]
    return json.dumps(entries)


def state_entries(model: Any) -> list[dict]:
    """The state entries of a converted model (a ``Model`` or ``Graph``); [] for a stateless one."""
    graph = getattr(model, "graph", model)
    text = graph.metadata.get(STATE_KEY)
    return [entry for entry in json.loads(text) if "input" in entry] if text else []


def initial_state(model: Any) -> dict[str, np.ndarray]:
    """Feeds that start a stream of a converted stateful TorchScript module: {state input: value}.
    After each call, feed output ``state_outputs(model)[name]`` back as input ``name``."""
    feeds = {}
    for entry in state_entries(model):
        dtype, shape = np.dtype(entry["dtype"]), tuple(entry["shape"])
        if "fill" in entry:
            feeds[entry["input"]] = np.full(shape, entry["fill"], dtype)
        elif "values" in entry:
            feeds[entry["input"]] = np.asarray(entry["values"], dtype).reshape(shape)
        else:
            raise ConversionError(f"state input {entry['input']!r}: the converted model does not record its initial "
                                  f"value (too large); expected it from the module's attribute {entry['attribute']!r}")
    return feeds


def state_outputs(model: Any) -> dict[str, str]:
    """{state input name: the output that carries its next value}."""
    return {entry["input"]: entry["output"] for entry in state_entries(model)}
