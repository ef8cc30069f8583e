"""Element-wise arithmetic and activations. Both TFLite and ONNX broadcast numpy-style, so an
element-wise op runs in whatever axis order its computed input already has (an NHWC
activation stays NHWC); a constant operand is transposed (and given leading 1-dims) to match.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from edgeinfer.format.tflite.context import OpContext
from edgeinfer.format.tflite.export import ExportError, export_rule, fused_code, identity
from edgeinfer.ir import Graph, Node

BINARY = {"Add": "ADD", "Sub": "SUB", "Mul": "MUL", "Div": "DIV", "Max": "MAXIMUM", "Min": "MINIMUM",
          "Pow": "POW"}
BINARY_OPTIONS = {"ADD": "AddOptions", "SUB": "SubOptions", "MUL": "MulOptions", "DIV": "DivOptions"}
UNARY = {"Exp": "EXP", "Log": "LOG", "Sqrt": "SQRT", "Abs": "ABS", "Neg": "NEG", "Floor": "FLOOR",
         "Ceil": "CEIL", "Sin": "SIN", "Cos": "COS", "Elu": "ELU", "Round": "ROUND", "Sign": "SIGN"}
# Activations with an int8 kernel whose output parameters are free (the rest are fixed below).
SIMPLE_ACTIVATIONS = ("Relu", "HardSwish", "Gelu", "GeluTanh", "LeakyRelu")
WRITABLE_ACTIVATIONS = ("", "Relu", "Clip", "LeakyRelu", "Sigmoid", "Tanh", "HardSigmoid", "HardSwish", "Silu",
                        "Gelu", "GeluTanh")


def activation_support(node: Node) -> str | None:
    activation = str(node.attrs.get("activation", ""))
    if activation not in WRITABLE_ACTIVATIONS:
        return f"fused activation {activation!r} has no TFLite equivalent"
    return None


def _scalar(ctx: OpContext, value: float, hint: str) -> int:
    return ctx.constant(np.asarray(value, np.float32), hint)


def write_activation(ctx: OpContext, x: int, shape: tuple, perm: tuple[int, ...], out: int, activation: str,
                     params: Sequence[float]) -> None:
    """``out = activation(x)`` for an IR activation (``edgeinfer.ir.lowering.ACTIVATIONS``)."""
    code = fused_code(activation, params)
    if activation in ("", "Relu", "Clip") and code is not None:
        opcode = {0: None, 1: "RELU", 2: "RELU_N1_TO_1", 3: "RELU6"}[code]
        if opcode is None:
            ctx.op("RESHAPE", [x, ctx.int32([d if isinstance(d, int) else -1 for d in shape], "shape")], [out],
                   version=1)
        else:
            ctx.op(opcode, [x], [out])
    elif activation == "Clip" and tuple(float(p) for p in params) == (0.0, 1.0):
        ctx.op("RELU_0_TO_1", [x], [out])
    elif activation == "Clip":
        lo, hi = (float(p) for p in params)
        low = ctx.temp(shape, "clip_low") if np.isfinite(hi) else out
        if np.isfinite(lo):
            ctx.op("MAXIMUM", [x, _scalar(ctx, lo, "clip_min")], [low])
        else:
            low = x
        if np.isfinite(hi):
            ctx.op("MINIMUM", [low, _scalar(ctx, hi, "clip_max")], [out])
    elif activation == "Relu" or activation in ("Sigmoid", "Tanh", "HardSwish"):
        ctx.op({"Relu": "RELU", "Sigmoid": "LOGISTIC", "Tanh": "TANH", "HardSwish": "HARD_SWISH"}[activation],
               [x], [out])
    elif activation in ("Gelu", "GeluTanh"):
        ctx.op("GELU", [x], [out], options="GeluOptions", approximate=activation == "GeluTanh")
    elif activation == "LeakyRelu":
        ctx.op("LEAKY_RELU", [x], [out], options="LeakyReluOptions", alpha=float(params[0]))
    elif activation == "Silu":
        gate = ctx.temp(shape, "sigmoid")
        ctx.op("LOGISTIC", [x], [gate])
        ctx.op("MUL", [x, gate], [out], options="MulOptions", fused_activation_function=0)
    elif activation == "HardSigmoid":
        alpha, beta = (float(p) for p in params)
        scaled, shifted = ctx.temp(shape, "hs_scaled"), ctx.temp(shape, "hs_shifted")
        ctx.op("MUL", [x, _scalar(ctx, alpha, "alpha")], [scaled], options="MulOptions", fused_activation_function=0)
        ctx.op("ADD", [scaled, _scalar(ctx, beta, "beta")], [shifted], options="AddOptions", fused_activation_function=0)
        ctx.op("RELU_0_TO_1", [shifted], [out])
    else:
        raise ExportError(f"activation {activation!r} has no TFLite equivalent")


# -- binary ---------------------------------------------------------------------------------------
def binary_layout(ctx: OpContext) -> tuple[int, ...]:
    """The axis order a binary op works in: a computed input's, unless a computed input of
    lower rank would need reshaping (then the IR's)."""
    return ctx.layout(0, 1)


def binary_input(ctx: OpContext, k: int, perm: tuple[int, ...]) -> int:
    """Input ``k`` in axis order ``perm``; a computed input of lower rank than the output
    (a YOLOv8 head's ``[1, 8400]`` strides times ``[1, 4, 8400]`` boxes) is reshaped to the
    output's rank with leading ones, as ONNX broadcasting aligns it, where its shape is static
    (TFLite broadcasts ranks the same way otherwise)."""
    rank = len(ctx.out_shape())
    shape = ctx.shape(k)
    if ctx.exp.is_const(ctx.name(k)) or len(shape) == rank:
        return ctx.input(k, perm)
    source = ctx.input(k)
    if ctx.int8 or not all(isinstance(d, int) for d in shape):
        return source
    full = (1,) * (rank - len(shape)) + tuple(shape)
    out = ctx.temp(full, f"in{k}_rank{rank}", dtype=ctx.dtype(k))
    ctx.op("RESHAPE", [source, ctx.int32(full, f"in{k}_shape")], [out])
    return out


def fusable_activation(ctx: OpContext) -> tuple[Node, int] | None:
    """The activation node that alone reads this node's output and that TFLite can fuse into
    it (RELU, RELU6, RELU_N1_TO_1), with its fused code; float mode only. TFLite importers
    split ``ADD(fused_activation=RELU6)`` into Add and Clip; this writes them back as one."""
    graph, out = ctx.exp.graph, ctx.node.outputs[0]
    value = graph.values.get(out)
    if ctx.int8 or value is None or len(value.uses) != 1 or out in graph.output_names:
        return None
    consumer = value.uses[0][0]
    if consumer.domain or consumer.op_type not in ("Relu", "Clip") or consumer.inputs[0] != out:
        return None
    try:
        code = fused_code(*_ir_activation(consumer, graph))
    except ExportError:
        return None
    return None if not code else (consumer, code)


def binary_rule(opcode: str):
    def export(ctx: OpContext) -> None:
        perm = binary_layout(ctx)
        inputs = [binary_input(ctx, k, perm) for k in (0, 1)]
        options = BINARY_OPTIONS.get(opcode)
        fused = fusable_activation(ctx) if options else None
        if fused is None:
            extra = {"fused_activation_function": 0} if options else {}
            ctx.op(opcode, inputs, [ctx.output(0, perm)], options=options, **extra)
            return
        activation, code = fused
        out = ctx.exp.absorb(activation, perm)  # the activation's output, written by this op
        ctx.op(opcode, inputs, [out], options=options, fused_activation_function=code)
        ctx.skip_output(0)

    return export


def check_binary(node: Node, graph: Graph) -> str | None:
    operands = [name for name in node.inputs if name]
    if len(operands) != 2:
        return f"{node.op_type} of {len(operands)} input(s): the TFLite operator takes two"
    return _check_operands(operands, graph)


def _check_operands(operands: list[str], graph: Graph) -> str | None:
    """One dtype, known ranks up to TFLite's broadcasting limit."""
    kinds = {graph.values[name].dtype for name in operands}
    if len(kinds) > 1:
        return f"operands of different dtypes ({', '.join(sorted(map(str, kinds)))}): TFLite's kernel takes one"
    ranks = [graph.values[name].rank for name in operands]
    if any(rank is None for rank in ranks):
        return "operand ranks must be known"
    if max(ranks, default=0) > 6:
        return f"TFLite broadcasts up to rank 6, found rank {max(ranks)}"
    return None


for _op, _opcode in BINARY.items():
    export_rule(_op, check=check_binary, int8="any" if _opcode in ("ADD", "SUB", "MUL") else "none")(binary_rule(_opcode))


def _terms(node: Node) -> list[str]:
    return [name for name in node.inputs if name]


def check_sum(node: Node, graph: Graph) -> str | None:
    terms = _terms(node)
    if len(terms) > 2 and any(graph.values[name].shape != graph.values[node.outputs[0]].shape for name in terms):
        return (f"a Sum of {len(terms)} inputs is ADD_N, which does not broadcast; expected every input of the "
                f"output's shape, found {[graph.values[name].shape for name in terms]}")
    return _check_operands(terms, graph)


_add = binary_rule("ADD")


def _int8_sum(node: Node, graph: Graph) -> bool:
    return len(_terms(node)) == 2  # ADD's integer kernel; ADD_N has none


@export_rule("Sum", check=check_sum, int8="any", int8_when=_int8_sum)
def sum_(ctx: OpContext) -> None:
    """ONNX's n-ary Sum (ShuffleNet's residual adds; the TFLite importer's ADD_N): one input
    is itself, two an ADD (which broadcasts and fuses a following RELU), more an ADD_N."""
    count = len(_terms(ctx.node))
    if count == 1:
        ctx.alias(0, 0)
    elif count == 2:
        _add(ctx)
    else:
        perm = ctx.layout(*range(count))
        ctx.op("ADD_N", [ctx.input(k, perm) for k in range(count)], [ctx.output(0, perm)])


# -- unary and activations --------------------------------------------------------------------------
def unary_rule(opcode: str):
    def export(ctx: OpContext) -> None:
        perm = ctx.layout(0)
        ctx.op(opcode, [ctx.input(0, perm)], [ctx.output(0, perm)])

    return export


for _op, _opcode in UNARY.items():
    export_rule(_op)(unary_rule(_opcode))


def _ir_activation(node: Node, graph: Graph) -> tuple[str, tuple[float, ...]]:
    op = node.op_type
    if op == "Gelu":
        return ("GeluTanh" if node.attrs.get("approximate", "none") == "tanh" else "Gelu"), ()
    if op == "LeakyRelu":
        return op, (float(node.attrs.get("alpha", 0.01)),)
    if op == "HardSigmoid":
        return op, (float(node.attrs.get("alpha", 0.2)), float(node.attrs.get("beta", 0.5)))
    if op == "Clip":
        return op, _clip_bounds(node, graph)
    return op, ()


def _clip_bounds(node: Node, graph: Graph) -> tuple[float, float]:
    if "min" in node.attrs or "max" in node.attrs:  # opset < 11
        return float(node.attrs.get("min", -np.inf)), float(node.attrs.get("max", np.inf))
    bounds = []
    for k, default in ((1, -np.inf), (2, np.inf)):
        name = node.inputs[k] if k < len(node.inputs) else ""
        if not name:
            bounds.append(default)
            continue
        value = graph.values.get(name)
        if value is None or value.const is None:
            raise ExportError("Clip bounds must be constants")
        bounds.append(float(value.const))
    return tuple(bounds)


def check_clip(node: Node, graph: Graph) -> str | None:
    try:
        _clip_bounds(node, graph)
    except ExportError as exc:
        return str(exc)
    return None


def _activation_rule(ctx: OpContext) -> None:
    activation, params = _ir_activation(ctx.node, ctx.exp.graph)
    perm = ctx.layout(0)
    shape = tuple(ctx.out_shape()[a] for a in perm)
    write_activation(ctx, ctx.input(0, perm), shape, perm, ctx.output(0, perm), activation, params)


export_rule(("Relu", "HardSwish", "LeakyRelu"), int8="any")(_activation_rule)
export_rule("Gelu", since=20, int8="any")(_activation_rule)
export_rule("Gelu", domain="edgeinfer", int8="any")(_activation_rule)
def _int8_clip(node: Node, graph: Graph) -> bool:
    """A clamp TFLite has an int8 kernel for (RELU, RELU6, RELU_N1_TO_1, RELU_0_TO_1)."""
    try:
        bounds = _clip_bounds(node, graph)
    except ExportError:
        return False
    return fused_code("Clip", bounds) is not None or bounds == (0.0, 1.0)


export_rule("Clip", check=check_clip, int8="any", int8_inputs=(0,), int8_when=_int8_clip)(_activation_rule)
export_rule("Sigmoid", int8="fixed", fixed=(1 / 256, -128))(_activation_rule)
export_rule("Tanh", int8="fixed", fixed=(1 / 128, 0))(_activation_rule)
export_rule("HardSigmoid")(_activation_rule)


@export_rule("Reciprocal")
def reciprocal(ctx: OpContext) -> None:
    perm = ctx.layout(0)
    ctx.op("DIV", [_scalar(ctx, 1.0, "one"), ctx.input(0, perm)], [ctx.output(0, perm)], options="DivOptions",
           fused_activation_function=0)


# Abramowitz & Stegun 7.1.26: erf(x) = 1 - t (a1 + t (a2 + ...)) exp(-x^2), t = 1 / (1 + p x), x >= 0;
# absolute error below 1.5e-7. TFLite has no ERF builtin.
ERF_P = 0.3275911
ERF_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)


@export_rule("Erf")
def erf(ctx: OpContext) -> None:
    perm = ctx.layout(0)
    shape = tuple(ctx.out_shape()[a] for a in perm)
    x = ctx.input(0, perm)
    temps = iter(range(1000))

    def step(opcode: str, inputs: list[int], options: str | None = None) -> int:
        out = ctx.temp(shape, f"erf{next(temps)}")
        extra = {"fused_activation_function": 0} if options else {}
        ctx.op(opcode, inputs, [out], options=options, **extra)
        return out

    magnitude, sign = step("ABS", [x]), step("SIGN", [x])
    denominator = step("ADD", [step("MUL", [magnitude, _scalar(ctx, ERF_P, "erf_p")], "MulOptions"),
                               _scalar(ctx, 1.0, "one")], "AddOptions")
    t = step("DIV", [_scalar(ctx, 1.0, "one"), denominator], "DivOptions")
    poly = _scalar(ctx, ERF_A[-1], "erf_a5")
    for index, coefficient in reversed(list(enumerate(ERF_A[:-1]))):
        poly = step("ADD", [step("MUL", [poly, t], "MulOptions"), _scalar(ctx, coefficient, f"erf_a{index + 1}")],
                    "AddOptions")
    poly = step("MUL", [poly, t], "MulOptions")
    gauss = step("EXP", [step("NEG", [step("MUL", [x, x], "MulOptions")])])
    tail = step("SUB", [_scalar(ctx, 1.0, "one"), step("MUL", [poly, gauss], "MulOptions")], "SubOptions")
    ctx.op("MUL", [sign, tail], [ctx.output(0, perm)], options="MulOptions", fused_activation_function=0)


# -- softmax ----------------------------------------------------------------------------------------
def _softmax(opcode: str):
    def export(ctx: OpContext) -> None:
        rank = ctx.rank(0)
        axis = int(ctx.attrs.get("axis", -1)) % rank
        perm = ctx.layout(0)
        if perm[-1] != axis:  # TFLite normalizes the last axis
            perm = tuple(a for a in identity(rank) if a != axis) + (axis,)
        options = {"options": "SoftmaxOptions", "beta": 1.0} if opcode == "SOFTMAX" else {}
        ctx.op(opcode, [ctx.input(0, perm)], [ctx.output(0, perm)], **options)

    return export


def check_softmax(node: Node, graph: Graph) -> str | None:
    if graph.opset.get("", 17) < 13:
        return "Softmax before opset 13 flattens to 2-D (coerced); upgrade the model's opset"
    return None


export_rule("Softmax", check=check_softmax, int8="fixed", fixed=(1 / 256, -128))(_softmax("SOFTMAX"))
export_rule("LogSoftmax", check=check_softmax, int8="fixed", fixed=(16 / 256, 127))(_softmax("LOG_SOFTMAX"))


# PRelu is a binary op whose slope broadcasts to x (TFLite's PRELU takes alpha as its second input).
export_rule("PRelu", check=check_binary)(binary_rule("PRELU"))
