"""Element-wise layers: ReLU, PReLU, ReLU6, Clip, Sigmoid, TanH, ELU, AbsVal, BNLL, Swish,
Threshold, Power, Exp, Log and Dropout (an identity at inference: Caffe scales at training).

Power: ``y = (shift + scale x) ^ power``; Exp: ``y = base ^ (shift + scale x)``;
Log: ``y = log_base(shift + scale x)``; ``base = -1`` means e.
"""

from __future__ import annotations

import math

import numpy as np

from edgeinfer.converters.caffe.builder import Blob, LayerContext, layer


def _unary(ctx: LayerContext, op_type: str, attrs: dict | None = None) -> None:
    ctx.expect_bottoms(1)
    ctx.expect_tops(1)
    ctx.node(op_type, ctx.inputs, attrs, top=0)


def _affine(ctx: LayerContext, value: str, scale: float, shift: float, top: int | None = None) -> str:
    """``shift + scale * value``, emitting only the ops that are not identities (the last
    one as top ``top`` if given; an Identity if both are)."""
    if scale != 1.0:
        value = ctx.node("Mul", [value, ctx.const(scale, "scale")], top=None if shift else top, suffix="scale")
    if shift != 0.0:
        value = ctx.node("Add", [value, ctx.const(shift, "shift")], top=top, suffix="shift")
    if top is not None and scale == 1.0 and shift == 0.0:
        value = ctx.identity(value, top)
    return value


@layer("ReLU")
def relu(ctx: LayerContext) -> None:
    slope = ctx.param("relu_param").negative_slope
    if slope:
        _unary(ctx, "LeakyRelu", {"alpha": float(slope)})
    else:
        _unary(ctx, "Relu")


@layer("PReLU")
def prelu(ctx: LayerContext) -> None:
    ctx.expect_bottoms(1)
    shape = ctx.shape()
    if len(shape) < 2:
        raise ctx.invalid(f"expected an input of rank >= 2, found shape {list(shape)}")
    shared = ctx.param("prelu_param").channel_shared
    (slope,) = ctx.blobs([Blob((1,) if shared else (shape[1],), 0.25)])
    slope = slope if shared else slope.reshape((shape[1],) + (1,) * (len(shape) - 2))
    ctx.node("PRelu", [ctx.inputs[0], ctx.const(slope, "slope")], top=0)


def _clip(ctx: LayerContext, low: float, high: float) -> None:
    ctx.expect_bottoms(1)
    ctx.node("Clip", [ctx.inputs[0], ctx.const(low, "min"), ctx.const(high, "max")], top=0)


@layer("ReLU6")
def relu6(ctx: LayerContext) -> None:
    _clip(ctx, 0.0, 6.0)


@layer("Clip")
def clip(ctx: LayerContext) -> None:
    param = ctx.param("clip_param")
    if not (param.HasField("min") and param.HasField("max")):
        raise ctx.invalid("expected clip_param with both min and max")
    _clip(ctx, param.min, param.max)


@layer("Sigmoid")
def sigmoid(ctx: LayerContext) -> None:
    _unary(ctx, "Sigmoid")


@layer("TanH")
def tanh(ctx: LayerContext) -> None:
    _unary(ctx, "Tanh")


@layer("ELU")
def elu(ctx: LayerContext) -> None:
    _unary(ctx, "Elu", {"alpha": float(ctx.param("elu_param").alpha)})


@layer("AbsVal")
def absval(ctx: LayerContext) -> None:
    _unary(ctx, "Abs")


@layer("BNLL")
def bnll(ctx: LayerContext) -> None:
    _unary(ctx, "Softplus")


@layer("Swish")
def swish(ctx: LayerContext) -> None:
    ctx.expect_bottoms(1)
    beta = float(ctx.param("swish_param").beta)
    gate = ctx.inputs[0] if beta == 1.0 else ctx.node("Mul", [ctx.inputs[0], ctx.const(beta, "beta")])
    ctx.node("Mul", [ctx.inputs[0], ctx.node("Sigmoid", [gate])], top=0)


@layer("Threshold")
def threshold(ctx: LayerContext) -> None:
    ctx.expect_bottoms(1)
    above = ctx.node("Greater", [ctx.inputs[0], ctx.const(ctx.param("threshold_param").threshold, "threshold")])
    ctx.node("Cast", [above], {"to": 1}, top=0)


@layer("Dropout")
def dropout(ctx: LayerContext) -> None:
    _unary(ctx, "Identity")


@layer("Power")
def power(ctx: LayerContext) -> None:
    ctx.expect_bottoms(1)
    param = ctx.param("power_param")
    if param.power == 1.0:
        _affine(ctx, ctx.inputs[0], float(param.scale), float(param.shift), top=0)
        return
    value = _affine(ctx, ctx.inputs[0], float(param.scale), float(param.shift))
    ctx.node("Pow", [value, ctx.const(float(param.power), "power")], top=0)


@layer("Exp")
def exp(ctx: LayerContext) -> None:
    ctx.expect_bottoms(1)
    param = ctx.param("exp_param")
    log_base = 1.0 if param.base == -1.0 else _log_of_base(ctx, param.base)
    value = _affine(ctx, ctx.inputs[0], float(param.scale) * log_base, float(param.shift) * log_base)
    ctx.node("Exp", [value], top=0)


@layer("Log")
def log(ctx: LayerContext) -> None:
    ctx.expect_bottoms(1)
    param = ctx.param("log_param")
    value = _affine(ctx, ctx.inputs[0], float(param.scale), float(param.shift))
    if param.base == -1.0:
        ctx.node("Log", [value], top=0)
    else:
        natural = ctx.node("Log", [value])
        ctx.node("Mul", [natural, ctx.const(np.float32(1.0 / _log_of_base(ctx, param.base)), "inv_log_base")],
                 top=0)


def _log_of_base(ctx: LayerContext, base: float) -> float:
    if base <= 0:
        raise ctx.invalid(f"expected base -1 (e) or a positive base, found {base}")
    return math.log(base)
