"""The export driver: walks the graph, keeps every value's TFLite tensors per axis order, and
gives each rule an ``OpContext`` (see ``export.py`` for the layout and quantization scheme)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from edgeinfer.errors import EdgeInferError
from edgeinfer.format.tflite.export import (
    ExportError,
    ExportRule,
    QuantInfo,
    compose_transpose,
    find_rule,
    identity,
    label_error,
    node_fused_code,
    quant_info,
    relative,
)
from edgeinfer.format.tflite.writer import ModelWriter
from edgeinfer.ir import Graph, Node, Value
from edgeinfer.ir.names import fresh_name
from edgeinfer.ir.weights import storage_array, stored_weight_dtype

FLOAT_TYPES = ("float32", "float16", "float64")
RAW_INT8 = ("int8", "uint8")
# edgeinfer::TFLite* integer ops: (value, scale, zero point) input positions, then the output's
# (scale, zero point) positions (edgeinfer.ir.lowering_tflite documents the operand order).
TFLITE_INT8_OPERANDS = {
    "TFLiteFullyConnected": ((0, 3), 6), "TFLiteBatchMatMul": ((0, 3), 6), "TFLiteAdd": ((0, 3), 6),
    "TFLiteSub": ((0, 3), 6), "TFLiteMul": ((0, 3), 6), "TFLiteSquaredDifference": ((0, 3), 6),
    "TFLiteMean": ((0,), 3), "TFLiteSoftmax": ((0,), 3), "TFLiteRsqrt": ((0,), 3),
}


class Exporter:
    def __init__(self, graph: Graph):
        self.graph = graph
        self.values = dict(graph.values)  # plus the views the exporter makes (transposed int8 values)
        self.writer = ModelWriter()
        self.reps: dict[str, dict[tuple[int, ...], int]] = {}  # value -> axis order -> tensor
        self.views: dict[str, str] = {}  # float value -> the integer value it dequantizes
        self.quant: dict[str, QuantInfo] = {}  # integer value -> its quantization
        self._consts: dict[tuple[str, tuple[int, ...], str], int] = {}
        self._names: set[str] = set()
        self._absorbed: set[int] = set()  # ids of nodes an earlier operator already computed
        self._collect_quantization()

    # -- quantization parameters ------------------------------------------------------------------
    def _const(self, name: str) -> np.ndarray | None:
        value = self.values.get(name) if name else None
        return None if value is None else value.const

    def _record(self, raw: str, scale: str, zero: str, axis: int | None, where: Node) -> None:
        scale_data = self._const(scale)
        zero_data = self._const(zero) if zero else None
        if scale_data is None or (zero and zero_data is None):
            raise label_error(where, ExportError("quantization scale and zero point must be constants"))
        dtype = self.values[raw].dtype or (zero_data.dtype.name if zero_data is not None else "uint8")
        rank = self.values[raw].rank
        if axis is not None and axis < 0 and rank is not None:
            axis += rank
        self.quant.setdefault(raw, quant_info(scale_data, zero_data, dtype, axis))

    def _collect_quantization(self) -> None:
        for node in self.graph.nodes:
            if node.domain == "" and node.op_type in ("QuantizeLinear", "DequantizeLinear"):
                raw = node.inputs[0] if node.op_type == "DequantizeLinear" else node.outputs[0]
                zero = node.inputs[2] if len(node.inputs) > 2 else ""
                scale = self._const(node.inputs[1])
                axis = int(node.attrs.get("axis", 1)) if scale is not None and scale.size > 1 else None
                self._record(raw, node.inputs[1], zero, axis, node)
            elif node.domain == "edgeinfer" and node.op_type in TFLITE_INT8_OPERANDS:
                operands, out = TFLITE_INT8_OPERANDS[node.op_type]
                for k in operands:
                    scale = self._const(node.inputs[k + 1])
                    axis = 0 if scale is not None and scale.size > 1 else None
                    self._record(node.inputs[k], node.inputs[k + 1], node.inputs[k + 2], axis, node)
                self._record(node.outputs[0], node.inputs[out], node.inputs[out + 1], None, node)

    # -- tensors ----------------------------------------------------------------------------------
    def dtype(self, name: str) -> str:
        value = self.values.get(name)
        if value is None or value.dtype is None:
            raise ExportError(f"value {name!r} has no known dtype")
        return value.dtype

    def shape(self, name: str) -> tuple:
        value = self.values.get(name)
        if (value is None or value.shape is None) and name in self.views:  # a float result stored as int8
            value = self.values.get(self.views[name])
        if value is None or value.shape is None:
            raise ExportError(f"value {name!r} has no known shape (TFLite needs every rank)")
        return value.shape

    def fresh(self, base: str) -> str:
        return fresh_name(base, self._names, sep="_")

    def tensor_name(self, value: str, perm: Sequence[int]) -> str:
        if tuple(perm) == identity(len(perm)):
            return self.fresh(value)
        return self.fresh(f"{value}@{''.join(str(a) for a in perm)}")

    def new_tensor(self, name: str, shape, dtype: str, *, data: np.ndarray | None = None,
                   quant: QuantInfo | None = None, perm: Sequence[int] | None = None) -> int:
        if quant is not None:
            dtype = "int8" if dtype in RAW_INT8 else dtype
        return self.writer.add_tensor(name, shape, dtype, data,
                                      quant.tflite(perm) if quant is not None else None)

    def const_tensor(self, array: np.ndarray, hint: str, *, quant: QuantInfo | None = None,
                     perm: Sequence[int] | None = None) -> int:
        array = np.asarray(array)
        if array.dtype == np.float64:
            array = array.astype(np.float32)
        return self.new_tensor(self.fresh(hint), array.shape, array.dtype.name, data=array, quant=quant, perm=perm)

    def constant(self, name: str, perm: Sequence[int], want: str) -> int:
        """A constant IR value (``want`` "float": dequantized if it is a view) in axis order ``perm``."""
        key = (name, tuple(perm), want)
        if key in self._consts:
            return self._consts[key]
        raw = self.views.get(name, name)
        data = self._const(raw)
        quant = self.quant.get(raw)
        rank = data.ndim
        if len(perm) > rank:  # a lower-rank operand broadcast against a higher-rank one
            data = data.reshape((1,) * (len(perm) - rank) + data.shape)
            if quant is not None and quant.axis is not None:
                quant = QuantInfo(quant.scale, quant.zero_point, quant.axis + len(perm) - rank, quant.shift)
        if want == "float" and raw != name:
            data = dequantize(data, quant)
            quant = None
        elif quant is not None:
            data = (data.astype(np.int32) + quant.shift).astype(np.int8) if quant.shift else data
        data = np.ascontiguousarray(np.transpose(data, perm))
        hint = name if len(perm) == rank and perm == identity(rank) else f"{name}@{''.join(map(str, perm))}"
        stored = storage_array(data, stored_weight_dtype(self.graph, raw)) if quant is None else data
        if stored.dtype != data.dtype:  # a float16-stored weight: float16 behind DEQUANTIZE, as TFLite keeps it
            narrow = self.const_tensor(stored, f"{hint}_fp16")
            self._consts[key] = self.new_tensor(self.fresh(hint), data.shape, "float32")
            self.writer.add_operator("DEQUANTIZE", [narrow], [self._consts[key]], version=2)
            return self._consts[key]
        self._consts[key] = self.const_tensor(data, hint, quant=quant, perm=perm)
        return self._consts[key]

    def is_const(self, name: str) -> bool:
        return self._const(self.views.get(name, name)) is not None

    def perms(self, name: str) -> list[tuple[int, ...]]:
        return list(self.reps.get(self.views.get(name, name), {}))

    def tensor(self, name: str, perm: Sequence[int], want: str = "float") -> int:
        """The tensor holding value ``name`` in axis order ``perm``; ``want`` "float" gives a
        float tensor (a ``DEQUANTIZE`` of a view), "raw" the integer tensor a view reads."""
        perm = tuple(perm)
        if self.is_const(name):
            return self.constant(name, perm, want)
        if name in self.views:
            raw = self.views[name]
            if want == "raw":
                return self.tensor(raw, perm)
            found = self.reps.get(name, {}).get(perm)
            if found is not None:
                return found
            source = self.tensor(raw, perm)
            out = self.new_tensor(self.tensor_name(name, perm), _permuted(self.shape(name), perm), "float32")
            self.writer.add_operator("DEQUANTIZE", [source], [out], version=2)
            self.reps.setdefault(name, {})[perm] = out
            return out
        have = self.reps.get(name)
        if not have:
            raise ExportError(f"value {name!r} is read before any exported node produces it")
        if perm in have:
            return have[perm]
        origin = identity(len(perm)) if identity(len(perm)) in have else next(iter(have))
        source = have[origin]
        quant = self.quant.get(name)
        out = self.new_tensor(self.tensor_name(name, perm), _permuted(self.shape(name), perm), self.dtype(name),
                              quant=quant, perm=perm)
        self.reorder(source, out, _permuted(self.shape(name), origin), relative(origin, perm), quant is not None)
        have[perm] = out
        return out

    def reorder(self, source: int, out: int, shape: tuple, perm: tuple[int, ...], int8: bool) -> None:
        """``out = transpose(source, perm)``: a RESHAPE where only size-1 axes move."""
        moved = [axis for axis in perm if shape[axis] != 1]
        if all(isinstance(d, int) for d in shape) and moved == sorted(moved):
            new_shape = np.asarray([shape[axis] for axis in perm], np.int32)
            self.writer.add_operator("RESHAPE", [source, self.const_tensor(new_shape, "shape")], [out])
            return
        perm_tensor = self.const_tensor(np.asarray(perm, np.int32), "perm")
        self.writer.add_operator("TRANSPOSE", [source, perm_tensor], [out], version=2 if int8 else 1)

    def absorb(self, node: Node, perm: Sequence[int]) -> int:
        """The tensor of ``node``'s output in axis order ``perm``, to be written by the operator
        being exported (which computes ``node`` too, as a fused activation); ``node`` itself
        then writes nothing."""
        self._absorbed.add(id(node))
        name = node.outputs[0]
        perm = tuple(perm)
        tensor = self.new_tensor(self.tensor_name(name, perm), _permuted(self.shape(name), perm), self.dtype(name))
        self.reps.setdefault(name, {})[perm] = tensor
        return tensor

    def relabel_transpose(self, source: str, target: str, node_perm: Sequence[int]) -> None:
        """``target = Transpose(source, node_perm)`` without an operator: target's tensors are
        source's, read in another axis order."""
        into = self.reps.setdefault(target, {})
        for perm, tensor in self.reps.get(source, {}).items():
            into.setdefault(compose_transpose(perm, node_perm), tensor)

    # -- the walk ---------------------------------------------------------------------------------
    def run(self, description: str) -> bytes:
        for value in self.graph.inputs:
            quant = self.quant.get(value.name)
            tensor = self.new_tensor(self.fresh(value.name), self.shape(value.name), self.dtype(value.name),
                                     quant=quant)
            self.writer.inputs.append(self._uint8_edge(value.name, tensor, quant, into_graph=True))
            self.reps[value.name] = {identity(len(value.shape)): tensor}
        for node in self.graph.nodes:
            try:
                self.export_node(node)
            except EdgeInferError as exc:
                raise label_error(node, exc) from exc
        for value in self.graph.outputs:
            rank = len(self.shape(value.name))
            if self.is_const(value.name):
                raise ExportError(f"graph output {value.name!r} is a constant; TFLite outputs are computed")
            tensor = self.tensor(value.name, identity(rank))
            quant = self.quant.get(value.name) if value.name not in self.views else None
            self.writer.outputs.append(self._uint8_edge(value.name, tensor, quant, into_graph=False))
        return self.writer.to_bytes(description=description, subgraph_name=self.graph.name)

    def _uint8_edge(self, name: str, tensor: int, quant: QuantInfo | None, *, into_graph: bool) -> int:
        """The graph's own tensor for a graph input or output: ``tensor`` itself, or for a uint8
        value (held as int8 inside, see the module docstring) a uint8 tensor with the value's
        own zero point and a requantizing ``QUANTIZE`` (uint8 <-> int8, the same real numbers)
        between them, so that the TFLite graph takes and returns the IR's uint8 arrays."""
        if quant is None or not quant.shift or self.dtype(name) != "uint8":
            return tensor
        outer = QuantInfo(quant.scale, quant.zero_point - quant.shift, quant.axis, 0)
        if not outer.per_tensor:
            raise ExportError(f"graph {'input' if into_graph else 'output'} {name!r} is uint8 with per-channel "
                              "quantization; TFLite requantizes uint8 <-> int8 per tensor only")
        edge = self.writer.add_tensor(self.fresh(f"{name}_uint8"), self.shape(name), "uint8", None, outer.tflite())
        source, target = (edge, tensor) if into_graph else (tensor, edge)
        self.writer.add_operator("QUANTIZE", [source], [target], version=2)
        return edge

    def export_node(self, node: Node) -> None:
        if id(node) in self._absorbed:
            return
        if node.domain == "" and node.op_type == "DequantizeLinear":
            self.views[node.outputs[0]] = node.inputs[0]
            return
        if node.domain == "" and node.op_type == "QuantizeLinear":
            self._quantize(node)
            return
        if node.domain == "" and node.op_type in ("Transpose", "Identity", "Dropout"):
            self._relabel(node)
            return
        rule = find_rule(node, self.graph)
        if rule is None:
            raise ExportError("no TFLite export rule for this op")
        if rule.check is not None:
            reason = rule.check(node, self.graph)
            if reason is not None:
                raise ExportError(reason)
        from edgeinfer.format.tflite.context import OpContext

        ctx = OpContext(self, node, rule, self._int8_output(node, rule))
        rule.fn(ctx)
        ctx.finish()

    def _relabel(self, node: Node) -> None:
        source, target = node.inputs[0], node.outputs[0]
        if self.is_const(source) and source not in self.views:
            data = self._const(source)
            if node.op_type == "Transpose":
                data = np.transpose(data, [int(a) for a in node.attrs.get("perm", ())] or None)
            self.values[target] = Value(target, const=np.ascontiguousarray(data))
        elif node.op_type == "Transpose":
            self._transpose(node)
        else:
            self._alias(source, target)

    def _alias(self, source: str, target: str) -> None:
        if source in self.views:
            self.views[target] = self.views[source]
        else:
            self.reps[target] = self.reps.setdefault(source, {})

    def _transpose(self, node: Node) -> None:
        perm = tuple(int(a) for a in node.attrs.get("perm", ())) or tuple(reversed(identity(
            len(self.shape(node.inputs[0])))))
        source, target = node.inputs[0], node.outputs[0]
        if source in self.views:  # a per-tensor view commutes with the transpose
            raw = self.views[source]
            quant = self.quant[raw]
            if quant.per_tensor:
                moved = self.fresh(f"{raw}__T")
                self.quant[moved] = quant
                self.values[moved] = Value(moved, self.values[raw].dtype, self.values[target].shape)
                self.relabel_transpose(raw, moved, perm)
                self.views[target] = moved
                return
            self.tensor(source, identity(len(perm)))
        self.relabel_transpose(source, target, perm)

    def _quantize(self, node: Node) -> None:
        out = node.outputs[0]
        if self.reps.get(out):  # written by the integer op that produced the input
            return
        source = node.inputs[0]
        perms = self.perms(source) or [identity(len(self.shape(source)))]
        perm = perms[0]
        quant = self.quant[out]
        if source in self.views and not self.is_const(source):
            raw = self.views[source]
            if self.quant[raw].same(quant):
                self.reps[out] = self.reps[raw]
                return
            inp = self.tensor(source, perm, "raw")
        else:
            inp = self.tensor(source, perm)
        target = self.new_tensor(self.tensor_name(out, perm), _permuted(self.shape(out), perm), self.dtype(out),
                                 quant=quant, perm=perm)
        self.writer.add_operator("QUANTIZE", [inp], [target], version=2)
        self.reps.setdefault(out, {})[perm] = target

    def _int8_output(self, node: Node, rule: ExportRule) -> str | None:
        """The integer value the node's integer op writes (the QuantizeLinear output reading
        its result), or None when the node is exported as a float op."""
        if rule.int8 == "none" or len([o for o in node.outputs if o]) != 1:
            return None
        if (rule.int8_when is not None and not rule.int8_when(node, self.graph)) or node_fused_code(node, int8=True) is None:
            return None
        out = node.outputs[0]
        consumers = self.graph.consumers(out)
        if not consumers or out in self.graph.output_names or any(
                c.op_type != "QuantizeLinear" or c.domain for c in consumers):
            return None
        targets = [c.outputs[0] for c in consumers]
        if any(not self.quant[t].same(self.quant[targets[0]]) or self.quant[t].shift != self.quant[targets[0]].shift
               for t in targets) or not self.quant[targets[0]].per_tensor:
            return None
        indices = rule.int8_inputs if rule.int8_inputs is not None else [
            k for k, name in enumerate(node.inputs) if name and self.values[name].dtype in FLOAT_TYPES]
        for k in indices:
            if k >= len(node.inputs) or not node.inputs[k]:
                continue
            raw = self.views.get(node.inputs[k])
            if raw is None or self.values[raw].dtype not in RAW_INT8:
                return None
            quant = self.quant[raw]
            if k in rule.int8_weights and self.is_const(node.inputs[k]):
                if quant.zero_point.any():
                    return None
            elif not quant.per_tensor:
                return None
        return targets[0]


def dequantize(data: np.ndarray, quant: QuantInfo | None) -> np.ndarray:
    if quant is None:
        return data.astype(np.float32)
    shape = [1] * data.ndim
    if quant.axis is not None:
        shape[quant.axis] = -1
    zero = (quant.zero_point - quant.shift).reshape(shape)
    return ((data.astype(np.float64) - zero) * quant.scale.reshape(shape)).astype(np.float32)


def _permuted(shape: tuple, perm: Sequence[int]) -> tuple:
    return tuple(shape[axis] for axis in perm)


__all__ = ["Exporter", "dequantize"]
