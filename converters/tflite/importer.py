"""Turn a verified ``ModelDef`` into an IR ``Graph``.

Every TFLite tensor gets one IR value with the tensor's own dtype (its *raw* value: int8 for
a quantized activation). Op rules work on *float views*: for a quantized tensor the float
view is ``DequantizeLinear(raw)``, and a quantized op output is produced as a float value
and then ``QuantizeLinear``-ed into its raw value. A full-integer model therefore imports as
QDQ: each float op sits between the exact requantization points of the TFLite model, so the
numbers match the TFLite interpreter's to within one quantization step, and backends with
integer kernels can fuse the pattern back. Where TFLite's fixed-point arithmetic differs from
float-then-round, a rule emits an ``edgeinfer::TFLite*`` integer kernel on the raw int8
values instead (``OpContext.emit_int8``), bit-exact with TFLite's builtin kernels.

Tensors stay in TFLite's NHWC layout; rules for layout-sensitive ops wrap the ONNX op in
``Transpose`` nodes (and transpose constant weights here, once). The ``cancel_transposes``
pass removes the pairs that meet between consecutive ops.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgeinfer.converters.tflite.reader import ModelDef, OperatorDef, SubGraphDef, TensorDef, read_options
from edgeinfer.errors import ConversionError, ModelFormatError, UnsupportedOpError
from edgeinfer.ir import Graph, Node, Value
from edgeinfer.ir.names import fresh_name
from edgeinfer.ir.weights import with_stored_weights
from edgeinfer.registry import OpRegistry

OPSET = 17
NHWC_TO_NCHW = (0, 3, 1, 2)
NCHW_TO_NHWC = (0, 2, 3, 1)
_QUANT_DTYPES = {"int8", "uint8", "int16", "int32"}


@dataclass(frozen=True)
class Rule:
    fn: Callable[[OpContext], None]
    options: str | None  # the builtin options table the op carries (schema.OPTIONS_TABLES)


RULES: OpRegistry[Rule] = OpRegistry("TFLite op rule")


def rule(op: str | tuple[str, ...], *, options: str | None = None):
    """Register ``fn(ctx)`` as the converter of TFLite builtin op(s) ``op``."""

    def register(fn: Callable[[OpContext], None]):
        for name in (op,) if isinstance(op, str) else op:
            RULES.register(name, Rule(fn, options))
        return fn

    return register


class Builder:
    """Accumulates nodes and initializers under unique names."""

    def __init__(self) -> None:
        self.nodes: list[Node] = []
        self.initializers: dict[str, np.ndarray] = {}
        self.used: set[str] = set()
        self.stored_fp16: set[str] = set()  # initializers the file stores as float16 (edgeinfer.ir.weights)

    def fresh(self, hint: str) -> str:
        return fresh_name(re.sub(r"\s+", "_", hint) or "t", self.used, sep="__", first=2)

    def const(self, array: np.ndarray, hint: str, *, stored_fp16: bool = False) -> str:
        name = self.fresh(hint)
        self.initializers[name] = np.asarray(array)
        if stored_fp16:
            self.stored_fp16.add(name)
        return name


class SubgraphImporter:
    """Imports one TFLite subgraph into a node list (``nodes``) sharing ``builder``'s names
    and initializers. ``bound`` maps subgraph input tensor indices to existing IR names
    (used when a subgraph becomes a Loop body)."""

    def __init__(self, model: ModelDef, subgraph: SubGraphDef, builder: Builder,
                 nodes: list[Node], bound: dict[int, str] | None = None, depth: int = 0):
        self.model, self.subgraph, self.builder, self.nodes = model, subgraph, builder, nodes
        self.depth = depth  # nesting of control-flow subgraphs (bounded against cyclic files)
        self.raw: dict[int, str] = dict(bound or {})
        self.float_view: dict[int, str] = {}
        self.transposed: dict[tuple[int, tuple[int, ...]], str] = {}  # one Transpose per (tensor, perm)
        # Tensors an op computes from constants at conversion (DEQUANTIZE of a float16
        # weight): their float32 data, and which of them the file stores as float16.
        self.folded: dict[int, np.ndarray] = {}
        self.fp16_weights: set[int] = set()
        self.where = f"{model.where}: subgraph {subgraph.index} ({subgraph.name})"
        self.graph_inputs: list[Value] = []  # set for the main subgraph (for shape inference)
        self.reading: OperatorDef | None = None  # the operator being converted (None: reading outputs)

    # -- values ------------------------------------------------------------------------------
    def tensor(self, index: int) -> TensorDef:
        return self.subgraph.tensors[index]

    def constant(self, index: int) -> np.ndarray | None:
        if index in self.folded:
            return self.folded[index]
        return self.model.tensor_data(self.tensor(index), self.subgraph)

    def emit(self, op_type: str, inputs: Sequence[str], outputs: Sequence[str] | str | int = 1,
             hint: str = "", domain: str = "", **attrs: Any) -> list[str]:
        if isinstance(outputs, int):
            outputs = [self.builder.fresh(f"{hint or op_type}_out{i}" if outputs > 1 else (hint or op_type))
                       for i in range(outputs)]
        elif isinstance(outputs, str):
            outputs = [outputs]
        self.nodes.append(Node(op_type, list(inputs), list(outputs), attrs, domain=domain,
                               name=self.builder.fresh(f"{hint or op_type}_node")))
        return list(outputs)

    def raw_value(self, index: int) -> str:
        """The IR value holding tensor ``index`` with its own dtype (a constant if it has data)."""
        if index in self.raw:
            return self.raw[index]
        tensor = self.tensor(index)
        data = self.constant(index)
        if data is None:
            raise self._undefined(tensor)
        self.raw[index] = self.builder.const(data, tensor.name, stored_fp16=index in self.fp16_weights)
        return self.raw[index]

    def _undefined(self, tensor: TensorDef) -> ModelFormatError:
        """The error for reading ``tensor`` where nothing defines it, saying what was found."""
        reader = self.reading.label if self.reading is not None else "a subgraph output"
        buffer = self.model.buffers[tensor.buffer]
        if tensor.buffer == 0:
            data = "it uses buffer 0 (no data: the mark of an activation)"
        elif buffer is None or len(buffer) == 0:
            data = f"its buffer {tensor.buffer} is empty"
        else:
            data = f"its buffer {tensor.buffer} holds {len(buffer)} bytes"
        producer = self.subgraph.producers.get(tensor.index)
        written = (f"{producer.label} writes it only later" if producer is not None else "no operator writes it")
        return ModelFormatError(
            f"{self.where}: {reader} reads tensor #{tensor.index} {tensor.name!r} ({tensor.type_name} "
            f"{list(tensor.shape)}); expected a subgraph input, a constant with data or an earlier operator's "
            f"output, found none: {written} and {data}")

    def is_quantized(self, tensor: TensorDef) -> bool:
        if tensor.quant is None or tensor.dtype not in _QUANT_DTYPES:
            return False
        if tensor.dtype == "int16":
            raise UnsupportedOpError(f"{self.where}: tensor {tensor.name!r} is int16-quantized (16x8 "
                                     "quantization); only int8/uint8 quantized models are supported")
        return True

    def value(self, index: int, *, perm: Sequence[int] | None = None) -> str:
        """The float view of tensor ``index`` (optionally transposed by ``perm``: constants are
        transposed here, activations get a Transpose node)."""
        tensor = self.tensor(index)
        key = (index, tuple(perm)) if perm is not None else None
        if key in self.transposed:
            return self.transposed[key]
        if key is not None and self.constant(index) is not None:
            self.transposed[key] = self._transposed_constant(index, key[1])
            return self.transposed[key]
        if index not in self.float_view:
            raw = self.raw_value(index)
            self.float_view[index] = self._dequantize(raw, tensor) if self.is_quantized(tensor) else raw
        if key is None:
            return self.float_view[index]
        self.transposed[key] = self.emit("Transpose", [self.float_view[index]], hint=f"{tensor.name}_T",
                                         perm=key[1])[0]
        return self.transposed[key]

    def _dequantize(self, raw: str, tensor: TensorDef, axis_perm: Sequence[int] | None = None) -> str:
        quant = tensor.quant
        attrs: dict[str, Any] = {}
        if quant.per_channel:
            scale, zero = quant.scale, quant.zero_point
            attrs["axis"] = list(axis_perm).index(quant.axis) if axis_perm is not None else quant.axis
        else:
            scale, zero = quant.scale.reshape(()), quant.zero_point.reshape(())
        dtype = np.dtype(tensor.dtype)
        scale_name = self.builder.const(scale.astype(np.float32), f"{tensor.name}_scale")
        zero_name = self.builder.const(zero.astype(dtype), f"{tensor.name}_zero_point")
        return self.emit("DequantizeLinear", [raw, scale_name, zero_name], hint=f"{tensor.name}_dq", **attrs)[0]

    def _transposed_constant(self, index: int, perm: tuple[int, ...]) -> str:
        tensor = self.tensor(index)
        data = np.ascontiguousarray(np.transpose(self.constant(index), perm))
        raw = self.builder.const(data, f"{tensor.name}_T", stored_fp16=index in self.fp16_weights)
        return self._dequantize(raw, tensor, perm) if self.is_quantized(tensor) else raw

    def inferred_shape(self, name: str) -> tuple | None:
        """Shape of IR value ``name`` by ONNX shape inference over the nodes built so far (for
        rules that must fix an attribute, e.g. ConvTranspose pads, where the file only says
        the dim is dynamic)."""
        from edgeinfer.ir.infer import infer_types

        if not self.graph_inputs:
            return None
        graph = Graph(list(self.nodes), self.graph_inputs, [Value(name)], self.builder.initializers,
                      opset={"": OPSET})
        return infer_types(graph).values[name].shape

    # -- operators ---------------------------------------------------------------------------
    def run(self) -> None:
        for op in self.subgraph.operators:
            self.convert_operator(op)
        self.reading = None

    def convert_operator(self, op: OperatorDef) -> None:
        self.reading = op
        # A custom op with a rule of its own (MediaPipe's) is looked up by its custom code.
        entry = RULES.lookup(op.custom_code) if op.opcode == "CUSTOM" and op.custom_code else None
        entry = entry or RULES.lookup(op.opcode)
        if entry is None:
            what = f"custom op {op.custom_code!r}" if op.opcode == "CUSTOM" else f"op {op.opcode}"
            raise UnsupportedOpError(f"{self.where}: {op.label}: TFLite {what} (version {op.version}) is "
                                     "not supported by the edgeinfer TFLite importer")
        for out in op.outputs:
            if out >= 0 and out in self.raw:
                raise ModelFormatError(f"{self.where}: {op.label} writes tensor #{out}, which is already "
                                       "defined (an input, a constant or another op's output)")
        options = read_options(op, entry.options, self.where) if entry.options else {}
        ctx = OpContext(self, op, options)
        try:
            entry.fn(ctx)
        except (IndexError, KeyError, ValueError, TypeError) as exc:
            raise ConversionError(f"{self.where}: {op.label} could not be converted: "
                                  f"{type(exc).__name__}: {exc}") from exc
        ctx.finish()


class OpContext:
    """What a rule sees: the operator, its options, and helpers to read inputs and emit nodes."""

    def __init__(self, importer: SubgraphImporter, op: OperatorDef, options: dict[str, Any]):
        self.imp, self.op, self.options = importer, op, options
        self._float_out: dict[int, str] = {}
        self._raw_out: dict[int, str] = {}

    # reading
    @property
    def where(self) -> str:
        return f"{self.imp.where}: {self.op.label}"

    @property
    def num_inputs(self) -> int:
        return len(self.op.inputs)

    def has(self, k: int) -> bool:
        return k < len(self.op.inputs) and self.op.inputs[k] >= 0

    def tensor(self, k: int) -> TensorDef:
        if not self.has(k):
            raise ConversionError(f"{self.where}: expected input {k}, found it missing")
        return self.imp.tensor(self.op.inputs[k])

    def out_tensor(self, k: int = 0) -> TensorDef:
        return self.imp.tensor(self.op.outputs[k])

    def x(self, k: int = 0, perm: Sequence[int] | None = None) -> str:
        """Float view of input ``k``."""
        self.tensor(k)
        return self.imp.value(self.op.inputs[k], perm=perm)

    def raw(self, k: int) -> str:
        self.tensor(k)
        return self.imp.raw_value(self.op.inputs[k])

    def const(self, k: int) -> np.ndarray | None:
        """The data of input ``k`` if it is a constant (raw, not dequantized)."""
        return self.imp.constant(self.op.inputs[k]) if self.has(k) else None

    def const_required(self, k: int, what: str) -> np.ndarray:
        data = self.const(k)
        if data is None:
            raise UnsupportedOpError(f"{self.where}: {what} (input {k}) must be a constant, found a "
                                     "tensor computed at run time")
        return data

    def shape(self, k: int) -> tuple:
        """Static shape of input ``k`` with None for dims that are dynamic in the signature."""
        tensor = self.tensor(k)
        return _dims(tensor)

    def out_shape(self, k: int = 0) -> tuple:
        return _dims(self.out_tensor(k))

    def opt(self, name: str) -> Any:
        return self.options[name]

    # writing
    def out(self, k: int = 0) -> str:
        """The IR name a rule must give to the float view of output ``k``."""
        if k not in self._float_out:
            tensor = self.out_tensor(k)
            hint = f"{tensor.name}_f" if self.imp.is_quantized(tensor) else tensor.name
            self._float_out[k] = self.imp.builder.fresh(hint)
        return self._float_out[k]

    def set_output(self, k: int, name: str) -> None:
        """Output ``k`` is an existing float value (an op that only relabels its input)."""
        self._float_out[k] = name

    def set_constant_output(self, k: int, array: np.ndarray, *, stored_fp16: bool = False) -> None:
        """Output ``k`` is a constant known at conversion (``array``); it becomes an
        initializer where it is read (transposed there once if a rule wants another layout).
        ``stored_fp16``: the file stores it as float16 (``edgeinfer.ir.weights``)."""
        index = self.op.outputs[k]
        self.imp.folded[index] = np.asarray(array)
        if stored_fp16:
            self.imp.fp16_weights.add(index)

    # integer kernels (edgeinfer::TFLite*, see edgeinfer.ir.lowering_tflite)
    def int8_tensors(self, inputs: Sequence[int], *, per_channel: Sequence[int] = ()) -> bool:
        """Whether inputs ``inputs`` and output 0 are int8 with per-tensor quantization (the
        inputs in ``per_channel`` may be quantized per channel): the case TFLite runs its
        integer kernel for, which the rule can then import as an ``edgeinfer::TFLite*`` op."""
        tensors = [(self.tensor(k), k in per_channel) for k in inputs] + [(self.out_tensor(0), False)]
        return all(t.dtype == "int8" and t.quant is not None and (channel or not t.quant.per_channel)
                   for t, channel in tensors)

    def qlinear(self, k: int) -> list[str]:
        """[raw int8 value, scale, zero point] of input ``k`` (QLinear operand order)."""
        quant = self.tensor(k).quant
        flat = (lambda a: a) if quant.per_channel else (lambda a: a.reshape(()))
        name = self.tensor(k).name
        return [self.raw(k), self.constant(flat(quant.scale).astype(np.float32), f"{name}_scale"),
                self.constant(flat(quant.zero_point).astype(np.int8), f"{name}_zero_point")]

    def out_qlinear(self) -> list[str]:
        """[scale, zero point] of output 0."""
        tensor = self.out_tensor(0)
        return [self.constant(tensor.quant.scale.reshape(()).astype(np.float32), f"{tensor.name}_scale"),
                self.constant(tensor.quant.zero_point.reshape(()).astype(np.int8), f"{tensor.name}_zero_point")]

    def int8_clip_range(self) -> tuple[int, int] | None:
        """The fused activation as an int8 range on output 0 (TFLite's
        ``CalculateActivationRangeQuantized``); None for activations that are not a clamp."""
        from edgeinfer.format.tflite import schema

        code = self.options.get("fused_activation_function", 0)
        act = schema.ACTIVATIONS[code] if 0 <= code < len(schema.ACTIVATIONS) else None
        bounds = {"NONE": (None, None), "RELU": (0.0, None), "RELU6": (0.0, 6.0), "RELU_N1_TO_1": (-1.0, 1.0)}
        quant = self.out_tensor(0).quant
        if act not in bounds or quant is None:
            return None
        scale, zero = float(quant.scale.reshape(-1)[0]), int(quant.zero_point.reshape(-1)[0])

        def level(value: float) -> int:  # zero_point + std::round(value / scale), in float32
            ratio = float(np.float32(value) / np.float32(scale))
            return zero + int(np.copysign(np.floor(abs(ratio) + 0.5), ratio))

        lo, hi = bounds[act]
        return (max(-128, level(lo)) if lo is not None else -128, min(127, level(hi)) if hi is not None else 127)

    def emit_int8(self, op_type: str, inputs: Sequence[str], **attrs: Any) -> None:
        """Emit integer kernel ``edgeinfer::op_type`` producing output 0's raw int8 value."""
        raw = self.imp.builder.fresh(self.out_tensor(0).name)
        self.imp.emit(op_type, inputs, [raw], hint=f"{self.out_tensor(0).name}_{op_type}", domain="edgeinfer",
                      **attrs)
        self._raw_out[0] = raw

    def emit(self, op_type: str, inputs: Sequence[str], outputs: Sequence[str] | str | int = 1,
             **attrs: Any) -> list[str]:
        hint = self.out_tensor(0).name if self.op.outputs and self.op.outputs[0] >= 0 else self.op.opcode
        return self.imp.emit(op_type, inputs, outputs, hint=f"{hint}_{op_type}", **attrs)

    def emit1(self, op_type: str, inputs: Sequence[str], out: str | None = None, **attrs: Any) -> str:
        return self.emit(op_type, inputs, out if out is not None else 1, **attrs)[0]

    def constant(self, array: Any, hint: str) -> str:
        return self.imp.builder.const(np.asarray(array), hint)

    def int64(self, k: int) -> str:
        """Input ``k`` as an int64 value (shape-like inputs; constants are converted here)."""
        data = self.const(k)
        if data is not None:
            return self.constant(data.astype(np.int64), f"{self.tensor(k).name}_i64")
        return self.emit1("Cast", [self.x(k)], to=7)

    def emit_fused(self, op_type: str, inputs: Sequence[str], **attrs: Any) -> None:
        """Emit ``op_type`` followed by the op's fused activation into output 0."""
        if self.options.get("fused_activation_function", 0) == 0:
            self.emit1(op_type, inputs, self.out(), **attrs)
        else:
            self.activation(self.emit1(op_type, inputs, **attrs), self.out())

    def activation(self, name: str, out: str | None = None, code: int | None = None) -> str:
        """Apply the op's fused activation to ``name`` (into ``out`` if given)."""
        code = self.options.get("fused_activation_function", 0) if code is None else code
        return apply_activation(self, name, code, out)

    def finish(self) -> None:
        imp = self.imp
        for k, index in enumerate(self.op.outputs):
            if index < 0:
                continue
            tensor = imp.tensor(index)
            if index in imp.folded:
                continue
            if k in self._raw_out:
                imp.raw[index] = self._raw_out[k]
                continue
            if k not in self._float_out:
                raise ConversionError(f"{self.where}: the rule produced no value for output {k} "
                                      f"({tensor.name!r})")
            name = self._float_out[k]
            if imp.is_quantized(tensor):
                raw = imp.builder.fresh(tensor.name)
                quant = tensor.quant
                if quant.per_channel:
                    raise UnsupportedOpError(f"{self.where}: output {tensor.name!r} is quantized per "
                                             "channel; only per-tensor activations are supported")
                scale = imp.builder.const(quant.scale.reshape(()).astype(np.float32), f"{tensor.name}_scale")
                zero = imp.builder.const(quant.zero_point.reshape(()).astype(tensor.dtype), f"{tensor.name}_zero_point")
                imp.emit("QuantizeLinear", [name, scale, zero], [raw], hint=f"{tensor.name}_q")
                imp.raw[index] = raw
            else:
                imp.raw[index] = name
                imp.float_view[index] = name


def _dims(tensor: TensorDef) -> tuple:
    if tensor.signature is None:
        return tensor.shape
    return tuple(None if s == -1 else d for d, s in zip(tensor.shape, tensor.signature, strict=True))


def apply_activation(ctx: OpContext, name: str, code: int, out: str | None) -> str:
    from edgeinfer.format.tflite import schema

    act = schema.ACTIVATIONS[code] if 0 <= code < len(schema.ACTIVATIONS) else f"#{code}"
    if act == "NONE":
        return ctx.emit1("Identity", [name], out) if out is not None else name
    if act == "RELU":
        return ctx.emit1("Relu", [name], out)
    if act in ("RELU6", "RELU_N1_TO_1"):
        lo, hi = (0.0, 6.0) if act == "RELU6" else (-1.0, 1.0)
        return ctx.emit1("Clip", [name, ctx.constant(np.float32(lo), "clip_min"),
                                  ctx.constant(np.float32(hi), "clip_max")], out)
    if act == "TANH":
        return ctx.emit1("Tanh", [name], out)
    raise UnsupportedOpError(f"{ctx.where}: fused activation {act} is not supported")


def import_model(model: ModelDef, *, signature_shapes: bool = True) -> Graph:
    """The IR graph of the model's main subgraph (subgraph 0); other subgraphs are imported
    where control-flow ops use them."""
    from edgeinfer.converters.tflite import ops  # noqa: F401  (registers the rules)

    main = model.subgraphs[0]
    builder = Builder()
    nodes: list[Node] = []
    inputs: list[Value] = []
    bound: dict[int, str] = {}
    for index in main.inputs:
        tensor = main.tensors[index]
        if tensor.dtype is None:
            raise UnsupportedOpError(f"{model.where}: input {tensor.name!r} has type {tensor.type_name}, "
                                     "which edgeinfer cannot feed")
        name = builder.fresh(tensor.name)
        bound[index] = name
        inputs.append(Value(name, tensor.dtype, input_shape(tensor, signature_shapes)))
    importer = SubgraphImporter(model, main, builder, nodes, bound)
    importer.graph_inputs = inputs
    importer.run()
    outputs = []
    for index in main.outputs:
        tensor = main.tensors[index]
        name = importer.raw_value(index)
        if (name in builder.initializers or name in bound.values() or name in {v.name for v in outputs}
                or not name.startswith(tensor.name)):
            name = importer.emit("Identity", [name], hint=tensor.name)[0]
        outputs.append(Value(name, tensor.dtype, input_shape(tensor, signature_shapes)))
    metadata = {"tflite_description": model.description} if model.description else {}
    if builder.stored_fp16:
        metadata = with_stored_weights(metadata, builder.stored_fp16, "float16")
    return Graph(nodes, inputs, outputs, builder.initializers, opset={"": OPSET},
                 name=main.name or "main", metadata=metadata)


def input_shape(tensor: TensorDef, signature_shapes: bool) -> tuple:
    """Dims that the signature marks dynamic (-1) become symbols: the batch ``N``, others
    ``<tensor>_d<i>``."""
    if not signature_shapes or tensor.signature is None:
        return tensor.shape
    return tuple(d if s != -1 else ("N" if i == 0 else f"{tensor.name}_d{i}")
                 for i, (d, s) in enumerate(zip(tensor.shape, tensor.signature, strict=True)))
