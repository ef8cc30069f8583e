"""Build a ``torch.fx.GraphModule`` from an IR graph: one module call per node.

Each IR node becomes a ``NodeOp`` (its lowering with the attributes bound) called from an fx
graph in the IR's topological order; weights are buffers of the root module, so
``GraphModule.to(device)`` moves them once. Three things are decided per node at build time:

- *folded*: every input is a constant (a ``Constant``, the Cast that widens fp16-stored
  weights): the node runs once now, on the CPU in float32, and its results become constants;
- *host*: shape arithmetic (``Shape``/``Size`` and the small integer ops computing on their
  results: Gather, Concat, Unsqueeze, ...) runs on CPU tensors whatever the device, so a
  ``Reshape`` whose target shape is computed reads it without a device-to-host sync;
- *device*: everything else. A host value that reaches a data input of a device node is
  copied to the device once (one ``ToDevice`` node per value).

Inputs a lowering declares ``static`` (shapes, axes, sizes) are baked into the node as Python
lists when they are constants.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx

from edgeinfer.errors import BackendError, EdgeInferError
from edgeinfer.ir import Graph, Node

from .registry import LOWERINGS, Lowering, LoweringContext
from .tensors import to_torch, torch_dtype

# Ops that compute on host values (shape vectors) when every input is a host value or a
# constant. Ops whose results may be large (Expand, Tile, ConstantOfShape, Range) are not here:
# they read host inputs as sizes and produce on the device.
HOST_OPS = frozenset({
    "Gather", "Concat", "Unsqueeze", "Squeeze", "Slice", "Cast", "Add", "Sub", "Mul", "Div", "Equal", "Less",
    "Greater", "Where", "Reshape", "Identity", "Max", "Min", "ReduceProd", "Floor", "Ceil", "Sqrt", "Not",
    "Mod", "Neg", "Abs", "Transpose", "Flatten", "Sum",
})
SOURCE_OPS = frozenset({"Shape", "Size"})  # their results are host values
NOT_FOLDED = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
                        "Multinomial", "Bernoulli"})


class NodeFailure(RuntimeError):
    def __init__(self, label: str, exc: Exception):
        super().__init__(f"{label}: {type(exc).__name__}: {exc}")
        self.label = label


class NodeOp:
    """One IR node: ``fn(*inputs, **attrs)`` with static inputs baked into ``layout``.

    A plain callable, the target of an fx ``call_function`` node (an ``nn.Module`` per node
    would add its ``__call__`` machinery, hooks included, to every node of every run); fx
    names it in the generated code by ``__name__``."""

    def __init__(self, label: str, fn, layout: list[tuple[str, Any]], attrs: dict[str, Any], name: str = "node"):
        self.__name__ = self.__qualname__ = name
        self.__module__ = "edgeinfer_graph"
        self.label = label
        self.fn = fn
        self.layout = layout  # per input position: ("arg", None) | ("const", value)
        self.attrs = attrs

    def __call__(self, *args):
        it = iter(args)
        inputs = [next(it) if kind == "arg" else value for kind, value in self.layout]
        try:
            return self.fn(*inputs, **self.attrs)
        except NodeFailure:
            raise
        except Exception as exc:  # an engine error at run time: name the node
            raise NodeFailure(self.label, exc) from exc


class ToDevice:
    """A host value entering device compute: copied once, float32 in the compute precision."""

    def __init__(self, device: torch.device, float_dtype: torch.dtype, name: str):
        self.__name__ = self.__qualname__ = name
        self.__module__ = "edgeinfer_graph"
        self.device = device
        self.float_dtype = float_dtype

    def __call__(self, x):
        return x.to(self.device, self.float_dtype if x.dtype == torch.float32 else x.dtype)


@dataclass
class Built:
    module: fx.GraphModule
    placements: dict[str, str] = field(default_factory=dict)  # node label -> "folded" | "host" | "device"


def find_lowering(node: Node, graph: Graph) -> Lowering | None:
    return LOWERINGS.lookup(node.op_type, domain=node.domain, version=graph.opset.get(node.domain, 1))


class Cast:
    """A float value into another compute precision (a node kept fp32 beside reduced ones)."""

    def __init__(self, dtype: torch.dtype, name: str):
        self.__name__ = self.__qualname__ = name
        self.__module__ = "edgeinfer_graph"
        self.dtype = dtype

    def __call__(self, x):
        return x.to(self.dtype)


class _Builder:
    def __init__(self, graph: Graph, device: torch.device, float_dtype: torch.dtype,
                 fp32_outputs: frozenset[str] = frozenset()):
        self.graph = graph
        self.device = device
        self.float_dtype = float_dtype
        # mixed precision: the nodes writing these compute in float32 (their float inputs cast in,
        # their weights kept float32), the others in ``float_dtype``
        self.fp32_outputs = fp32_outputs if float_dtype != torch.float32 else frozenset()
        self.value_dtype: dict[str, torch.dtype] = {}  # a device value's float precision, where not float_dtype
        self.casts: dict[tuple[str, torch.dtype], fx.Node] = {}
        self.constants: dict[str, torch.Tensor] = {n: to_torch(a) for n, a in graph.initializers.items()}
        self.host: set[str] = set()
        self.fx = fx.Graph()
        self.root = torch.nn.Module()
        self.env: dict[str, fx.Node] = {}
        self.buffers: dict[str, fx.Node] = {}
        self.on_device: dict[str, fx.Node] = {}
        self.placements: dict[str, str] = {}

    def context(self, node: Node, on_host: bool) -> LoweringContext:
        float_dtype = torch.float32 if on_host else self.compute_dtype(node)

        def dtypes(names):
            found = []
            for name in names:
                value = self.graph.values.get(name) if name else None
                dtype = torch_dtype(value.dtype) if value is not None else None
                found.append(float_dtype if dtype == torch.float32 else dtype)
            return tuple(found)

        return LoweringContext(label=node.label, opset=self.graph.opset.get(node.domain, 1),
                               device=torch.device("cpu") if on_host else self.device,
                               num_outputs=len(node.outputs), output_dtypes=dtypes(node.outputs),
                               input_dtypes=dtypes(node.inputs), float_dtype=float_dtype)

    def node_op(self, node: Node, lowering: Lowering, on_host: bool, layout, name: str = "node") -> NodeOp:
        attrs = dict(node.attrs)
        if lowering.wants_ctx:
            attrs["_ctx"] = self.context(node, on_host)
        return NodeOp(node.label, lowering.fn, layout, attrs, name)

    def const_slot(self, name: str, position: int, lowering: Lowering) -> tuple[str, Any]:
        tensor = self.constants[name]
        return ("const", tensor.tolist() if position in lowering.static else tensor)

    def add(self, index: int, node: Node, lowering: Lowering) -> None:
        inputs = list(node.inputs)
        while inputs and not inputs[-1]:
            inputs.pop()  # trailing omitted inputs: the lowering's defaults apply
        given = [n for n in inputs if n]
        if all(n in self.constants for n in given) and node.op_type not in NOT_FOLDED and not node.subgraphs():
            self.fold(node, lowering, inputs)
            return
        on_host = node.op_type in SOURCE_OPS or (
            node.op_type in HOST_OPS and node.domain == "" and any(n in self.host for n in given)
            and all(n in self.host or n in self.constants for n in given))
        layout, args = [], []
        for position, name in enumerate(inputs):
            if not name:
                layout.append(("const", None))
            elif name in self.constants and (on_host or position in lowering.static):
                layout.append(self.const_slot(name, position, lowering))
            else:
                layout.append(("arg", None))
                host_ok = on_host or position in lowering.static
                arg = self.input_node(name, host_ok)
                args.append(arg if on_host or not self.fp32_outputs else self.in_precision(name, arg, node, host_ok))
        op = self.node_op(node, lowering, on_host, layout, f"n{index}_{node.op_type}")
        call = self.fx.call_function(op, tuple(args))
        self.placements[node.label] = "host" if on_host else "device"
        outputs = [o for o in node.outputs]
        if not on_host and self.compute_dtype(node) != self.float_dtype:
            self.value_dtype.update((name, torch.float32) for name in outputs if name)
        if len(outputs) == 1:
            self.bind(outputs[0], call, on_host)
        else:
            for position, name in enumerate(outputs):
                if name:
                    self.bind(name, self.fx.call_function(_item, (call, position)), on_host)

    def compute_dtype(self, node: Node) -> torch.dtype:
        """What the node's float32 values compute in: float32 for a node kept fp32."""
        return torch.float32 if any(o in self.fp32_outputs for o in node.outputs if o) else self.float_dtype

    def in_precision(self, name: str, arg: fx.Node, node: Node, host_ok: bool) -> fx.Node:
        """``arg`` (the value ``name`` as ``input_node`` gave it) in ``node``'s compute precision."""
        value = self.graph.values.get(name)
        if value is None or torch_dtype(value.dtype) != torch.float32 or (host_ok and name in self.host):
            return arg  # not a float32 value, or a host value (float32) where the lowering takes one
        want = self.compute_dtype(node)
        if name in self.constants:
            return self.buffer(name, want)  # a kept node's weights stay float32, not rounded and widened
        have = self.float_dtype if name in self.host else self.value_dtype.get(name, self.float_dtype)
        if have == want:
            return arg
        if (name, want) not in self.casts:
            self.casts[(name, want)] = self.fx.call_function(Cast(want, f"cast_{len(self.casts)}"), (arg,))
        return self.casts[(name, want)]

    def bind(self, name: str, fx_node: fx.Node, on_host: bool) -> None:
        self.env[name] = fx_node
        if on_host:
            self.host.add(name)

    def input_node(self, name: str, host_ok: bool) -> fx.Node:
        if name in self.constants:
            return self.buffer(name)
        if name in self.host and not host_ok:
            if name not in self.on_device:
                to_device = ToDevice(self.device, self.float_dtype, f"to_device_{len(self.on_device)}")
                self.on_device[name] = self.fx.call_function(to_device, (self.env[name],))
            return self.on_device[name]
        return self.env[name]

    def buffer(self, name: str, dtype: torch.dtype | None = None) -> fx.Node:
        """A constant as a module buffer, float32 in ``dtype`` (default: the compute precision)."""
        dtype = self.float_dtype if dtype is None else dtype
        key = name if dtype == self.float_dtype else f"{name}\0{dtype}"
        if key not in self.buffers:
            tensor = self.constants[name]
            if tensor.dtype == torch.float32:
                tensor = tensor.to(dtype)
            target = f"c{len(self.buffers)}"
            self.root.register_buffer(target, tensor)
            self.buffers[key] = self.fx.get_attr(target)
        return self.buffers[key]

    def fold(self, node: Node, lowering: Lowering, inputs: list[str]) -> None:
        layout = [self.const_slot(n, p, lowering) if n else ("const", None) for p, n in enumerate(inputs)]
        try:
            result = self.node_op(node, lowering, True, layout)()
        except NodeFailure as exc:
            raise BackendError(f"torch backend could not fold constant node {exc}") from exc
        results = result if isinstance(result, (tuple, list)) else (result,)
        for name, value in zip(node.outputs, results):
            if name:
                self.constants[name] = value
        self.placements[node.label] = "folded"

    def build(self, lowerings: list[Lowering]) -> Built:
        for position, name in enumerate(self.graph.input_names):
            self.env[name] = self.fx.placeholder(f"input_{position}")
        for index, (node, lowering) in enumerate(zip(self.graph.nodes, lowerings, strict=True)):
            self.add(index, node, lowering)
        outputs = tuple(self.input_node(name, True) if name not in self.constants else self.buffer(name)
                        for name in self.graph.output_names)  # the executable casts each to its declared type
        self.fx.output(outputs)
        self.fx.lint()
        return Built(fx.GraphModule(self.root, self.fx, class_name="EdgeInferGraph"), self.placements)


def _item(result, index: int):
    return result[index]


def build_module(graph: Graph, device: torch.device, float_dtype: torch.dtype,
                 fp32_outputs: frozenset[str] = frozenset()) -> Built:
    """The GraphModule computing ``graph`` (weights still on the CPU: the caller moves them);
    the nodes writing ``fp32_outputs`` compute in float32 whatever ``float_dtype`` is."""
    lowerings = []
    for node in graph.nodes:
        found = find_lowering(node, graph)
        if found is None:
            raise BackendError(f"torch backend has no lowering for {node.label}")
        lowerings.append(found)
    try:
        return _Builder(graph, device, float_dtype, fp32_outputs).build(lowerings)
    except EdgeInferError:
        raise
    except Exception as exc:
        raise BackendError(f"torch backend could not build graph {graph.name!r}: {type(exc).__name__}: {exc}") from exc
