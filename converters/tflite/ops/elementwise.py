"""Elementwise arithmetic, activations, comparisons and logic (numpy broadcasting in both
TFLite and ONNX, so operands map one to one)."""

from __future__ import annotations

import numpy as np

from edgeinfer.converters.tflite.importer import OpContext, apply_activation, rule
from edgeinfer.format.tflite.schema import ACTIVATIONS

_BINARY = {"ADD": ("Add", "AddOptions"), "SUB": ("Sub", "SubOptions"), "MUL": ("Mul", "MulOptions"),
           "DIV": ("Div", "DivOptions")}
_PLAIN_BINARY = {"MAXIMUM": "Max", "MINIMUM": "Min", "POW": "Pow", "LESS": "Less", "GREATER": "Greater",
                 "EQUAL": "Equal", "LESS_EQUAL": "LessOrEqual", "GREATER_EQUAL": "GreaterOrEqual",
                 "LOGICAL_AND": "And", "LOGICAL_OR": "Or"}
_UNARY = {"LOGISTIC": "Sigmoid", "TANH": "Tanh", "RELU": "Relu", "EXP": "Exp", "LOG": "Log",
          "SQRT": "Sqrt", "ABS": "Abs", "NEG": "Neg", "FLOOR": "Floor", "CEIL": "Ceil", "ROUND": "Round",
          "SIN": "Sin", "COS": "Cos", "ELU": "Elu", "HARD_SWISH": "HardSwish", "LOGICAL_NOT": "Not",
          "SIGN": "Sign"}
_CLIPS = {"RELU6": (0.0, 6.0), "RELU_N1_TO_1": (-1.0, 1.0), "RELU_0_TO_1": (0.0, 1.0)}


_INT8_BINARY = {"Add": "TFLiteAdd", "Sub": "TFLiteSub", "Mul": "TFLiteMul"}


def _binary(onnx_op: str):
    def convert(ctx: OpContext) -> None:
        clip = ctx.int8_clip_range() if onnx_op in _INT8_BINARY else None
        if clip and ctx.int8_tensors((0, 1)):
            ctx.emit_int8(_INT8_BINARY[onnx_op], [*ctx.qlinear(0), *ctx.qlinear(1), *ctx.out_qlinear()],
                          clip_min=clip[0], clip_max=clip[1])
            return
        ctx.emit_fused(onnx_op, [ctx.x(0), ctx.x(1)])

    return convert


def _plain_binary(onnx_op: str):
    def convert(ctx: OpContext) -> None:
        ctx.emit1(onnx_op, [ctx.x(0), ctx.x(1)], ctx.out())

    return convert


def _unary(onnx_op: str):
    def convert(ctx: OpContext) -> None:
        ctx.emit1(onnx_op, [ctx.x(0)], ctx.out())

    return convert


def _clip(code: int):
    def convert(ctx: OpContext) -> None:
        apply_activation(ctx, ctx.x(0), code, ctx.out())

    return convert


for _name, (_op, _options) in _BINARY.items():
    rule(_name, options=_options)(_binary(_op))
for _name, _op in _PLAIN_BINARY.items():
    rule(_name)(_plain_binary(_op))
for _name, _op in _UNARY.items():
    rule(_name)(_unary(_op))
rule("RELU6")(_clip(ACTIVATIONS.index("RELU6")))
rule("RELU_N1_TO_1")(_clip(ACTIVATIONS.index("RELU_N1_TO_1")))


@rule("RELU_0_TO_1")
def relu_0_to_1(ctx: OpContext) -> None:
    ctx.emit1("Clip", [ctx.x(0), ctx.constant(np.float32(0.0), "clip_min"),
                       ctx.constant(np.float32(1.0), "clip_max")], ctx.out())


@rule("NOT_EQUAL")
def not_equal(ctx: OpContext) -> None:
    ctx.emit1("Not", [ctx.emit1("Equal", [ctx.x(0), ctx.x(1)])], ctx.out())


@rule("SQUARED_DIFFERENCE")
def squared_difference(ctx: OpContext) -> None:
    if ctx.int8_tensors((0, 1)):
        ctx.emit_int8("TFLiteSquaredDifference", [*ctx.qlinear(0), *ctx.qlinear(1), *ctx.out_qlinear()])
        return
    diff = ctx.emit1("Sub", [ctx.x(0), ctx.x(1)])
    ctx.emit1("Mul", [diff, diff], ctx.out())


@rule("SQUARE")
def square(ctx: OpContext) -> None:
    x = ctx.x(0)
    ctx.emit1("Mul", [x, x], ctx.out())


@rule("RSQRT")
def rsqrt(ctx: OpContext) -> None:
    if ctx.int8_tensors((0,)):
        ctx.emit_int8("TFLiteRsqrt", [*ctx.qlinear(0), *ctx.out_qlinear()])
        return
    ctx.emit1("Reciprocal", [ctx.emit1("Sqrt", [ctx.x(0)])], ctx.out())


@rule("FLOOR_DIV")
def floor_div(ctx: OpContext) -> None:
    a, b = ctx.x(0), ctx.x(1)
    if np.dtype(ctx.tensor(0).dtype).kind == "f":
        ctx.emit1("Floor", [ctx.emit1("Div", [a, b])], ctx.out())
        return
    # Integer Div truncates; step down by one where the signs differ and it was inexact.
    quotient = ctx.emit1("Div", [a, b])
    inexact = ctx.emit1("Not", [ctx.emit1("Equal", [ctx.emit1("Mul", [quotient, b]), a])])
    zero = ctx.constant(np.zeros((), ctx.tensor(0).dtype), "zero")
    signs_differ = ctx.emit1("Xor", [ctx.emit1("Less", [a, zero]), ctx.emit1("Less", [b, zero])])
    adjust = ctx.emit1("Cast", [ctx.emit1("And", [inexact, signs_differ])],
                       to=_onnx_dtype(ctx.tensor(0).dtype))
    ctx.emit1("Sub", [quotient, adjust], ctx.out())


@rule("FLOOR_MOD")
def floor_mod(ctx: OpContext) -> None:
    a, b = ctx.x(0), ctx.x(1)
    if np.dtype(ctx.tensor(0).dtype).kind == "f":
        floor = ctx.emit1("Floor", [ctx.emit1("Div", [a, b])])
        ctx.emit1("Sub", [a, ctx.emit1("Mul", [floor, b])], ctx.out())
    else:
        ctx.emit1("Mod", [a, b], ctx.out(), fmod=0)


@rule(("SELECT", "SELECT_V2"))
def select(ctx: OpContext) -> None:
    ctx.emit1("Where", [ctx.x(0), ctx.x(1), ctx.x(2)], ctx.out())


@rule("ADD_N")
def add_n(ctx: OpContext) -> None:
    ctx.emit1("Sum", [ctx.x(k) for k in range(ctx.num_inputs)], ctx.out())


def _onnx_dtype(name: str) -> int:
    from edgeinfer.ir import dtypes

    return dtypes.to_onnx(name)
