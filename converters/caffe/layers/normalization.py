"""BatchNorm, Scale, Bias, LRN, Normalize (SSD) and MVN.

- BatchNorm stores running sums: ``mean = blob0 / s``, ``var = blob1 / s`` with the scale
  factor ``s = blob2[0]`` (``s = 0`` means the statistics are zero; ``moving_average_fraction``
  only drives training's updates of the sums). It has no affine part (a following Scale layer
  holds it; NVIDIA's ``scale_bias`` adds blobs 3 and 4, and its TEST phase reads blobs 0 and 1
  as they are, without the scale factor); a pass fuses BatchNormalization, Mul
  and Add into Conv. Caffe uses those statistics when ``use_global_stats`` is true, or unset in
  the TEST phase (``use_global_stats_ = phase == TEST`` unless the field is given). With
  ``use_global_stats: false``, even in a deploy net, Caffe normalizes by the statistics of the
  batch itself, per channel over N and the spatial axes: ``(x - mean) / sqrt(var + eps)`` with
  the biased variance; the stored blobs are ignored. (OpenCV's importer does the same through an
  MVN layer, for batch 1 only.)
- Scale/Bias multiply/add a blob (or a second bottom) whose shape covers input axes
  ``[axis, axis + num_axes)``, broadcast over the rest.
- LRN ACROSS_CHANNELS is ONNX's LRN; WITHIN_CHANNEL is Caffe's composition
  ``x * (1 + alpha * avgpool(x^2, n x n, pad (n-1)/2)) ^ -beta`` (``k`` is unused there).
- Normalize: ``x / sqrt(sum(x^2) + eps) * scale``, the sum over (C, H, W) with
  ``across_spatial`` or over C per position without it.
- MVN: ``(x - mean) / (std + eps)`` over (H, W), or (C, H, W) with ``across_channels``.
"""

from __future__ import annotations

import numpy as np

from edgeinfer.converters.caffe.builder import Blob, LayerContext, layer
from edgeinfer.converters.caffe.layers.dense import normalize_axis
from edgeinfer.converters.caffe.layers.pooling import emit_caffe_pool


@layer("BatchNorm")
def batch_norm(ctx: LayerContext) -> None:
    ctx.expect_bottoms(1)
    ctx.expect_tops(1)
    param = ctx.param("batch_norm_param")
    global_stats = param.use_global_stats if param.HasField("use_global_stats") else ctx.spec.phase == "TEST"
    shape = ctx.shape()
    if len(shape) < 2:
        raise ctx.invalid(f"expected an input of rank >= 2, found shape {list(shape)}")
    channels = shape[1]
    expected = [Blob((channels,), 0.0), Blob((channels,), 1.0), Blob((1,), 1.0)]
    if param.scale_bias:  # OpenCV/fork extension: affine blobs after the statistics
        expected += [Blob((channels,), 1.0), Blob((channels,), 0.0)]
    blobs = ctx.blobs(expected)
    if not global_stats:
        _batch_statistics_norm(ctx, len(shape), float(param.eps), blobs[3:] if param.scale_bias else None)
        return
    factor = float(blobs[2].reshape(-1)[0])
    # NVIDIA's fork keeps blob 2 as an unused "variance correction" (OpenCV ignores it too)
    factor = 1.0 if param.scale_bias else 0.0 if factor == 0 else 1.0 / factor
    mean = (blobs[0] * factor).astype(np.float32)
    var = (blobs[1] * factor).astype(np.float32)
    gamma = blobs[3] if param.scale_bias else np.ones(channels, np.float32)
    beta = blobs[4] if param.scale_bias else np.zeros(channels, np.float32)
    inputs = [ctx.inputs[0], ctx.const(gamma, "scale"), ctx.const(beta, "bias"), ctx.const(mean, "mean"),
              ctx.const(var, "var")]
    ctx.node("BatchNormalization", inputs, {"epsilon": float(param.eps)}, top=0)


def _batch_statistics_norm(ctx: LayerContext, rank: int, eps: float, affine: list[np.ndarray] | None) -> None:
    """Caffe's BatchNorm on the batch's own statistics (per channel over every other axis)."""
    axes = (0, *range(2, rank))
    x = ctx.inputs[0]
    mean = ctx.node("ReduceMean", [x], {"axes": axes, "keepdims": 1}, suffix="batch_mean")
    centered = ctx.node("Sub", [x, mean], suffix="center")
    variance = ctx.node("ReduceMean", [ctx.node("Mul", [centered, centered], suffix="square")],
                        {"axes": axes, "keepdims": 1}, suffix="batch_variance")
    std = ctx.node("Sqrt", [ctx.node("Add", [variance, ctx.const(eps, "eps")], suffix="variance_eps")], suffix="std")
    normalized = ctx.node("Div", [centered, std], top=None if affine else 0, suffix="normalized")
    if affine:
        broadcast = (-1,) + (1,) * (rank - 2)
        scaled = ctx.node("Mul", [normalized, ctx.const(affine[0].reshape(broadcast), "scale")], suffix="scaled")
        ctx.node("Add", [scaled, ctx.const(affine[1].reshape(broadcast), "bias")], top=0)


def _broadcast_operand(ctx: LayerContext, field_name: str, op_type: str, fill: float) -> None:
    """Scale (Mul) or Bias (Add) by a blob or by a second bottom; Scale may add a bias blob."""
    ctx.expect_bottoms(1, 2)
    ctx.expect_tops(1)
    param = ctx.param(field_name)
    shape = ctx.shape()
    axis = normalize_axis(ctx, param.axis, len(shape))
    if len(ctx.inputs) == 2:
        operand_shape = tuple(ctx.shape(1))
        if tuple(shape[axis:axis + len(operand_shape)]) != operand_shape:
            raise ctx.invalid(f"bottom 1 of shape {list(operand_shape)} does not match input axes "
                              f"{axis}.. of shape {list(shape)}")
    else:
        end = len(shape) if param.num_axes == -1 else axis + param.num_axes
        if param.num_axes < -1 or end > len(shape):
            raise ctx.invalid(f"num_axes {param.num_axes} from axis {axis} exceeds input rank {len(shape)}")
        operand_shape = tuple(shape[axis:end])
    broadcast = operand_shape + (1,) * (len(shape) - axis - len(operand_shape))
    with_bias = field_name == "scale_param" and param.bias_term
    expected = ([] if len(ctx.inputs) == 2 else [Blob(operand_shape, fill)]) + \
        ([Blob(operand_shape, 0.0)] if with_bias else [])
    blobs = ctx.blobs(expected)
    if len(ctx.inputs) == 2:
        operand = ctx.reshape(ctx.inputs[1], broadcast)
    else:
        operand = ctx.const(blobs[0].reshape(broadcast), field_name.split("_")[0])
    result = ctx.node(op_type, [ctx.inputs[0], operand], top=None if with_bias else 0)
    if with_bias:
        ctx.node("Add", [result, ctx.const(blobs[-1].reshape(broadcast), "bias")], top=0)


@layer("Scale")
def scale(ctx: LayerContext) -> None:
    _broadcast_operand(ctx, "scale_param", "Mul", 1.0)


@layer("Bias")
def bias(ctx: LayerContext) -> None:
    _broadcast_operand(ctx, "bias_param", "Add", 0.0)


@layer("LRN")
def lrn(ctx: LayerContext) -> None:
    ctx.expect_bottoms(1)
    ctx.expect_tops(1)
    param = ctx.param("lrn_param")
    size = int(param.local_size)
    if size % 2 == 0:
        raise ctx.invalid(f"expected an odd local_size, found {size}")
    if param.norm_region == param.ACROSS_CHANNELS:
        attrs = {"size": size, "alpha": float(param.alpha), "beta": float(param.beta), "bias": float(param.k)}
        ctx.node("LRN", ctx.inputs, attrs, top=0)
        return
    shape = ctx.shape()
    if len(shape) != 4:
        raise ctx.unsupported(f"WITHIN_CHANNEL LRN of a rank-{len(shape)} input; expected NCHW")
    x = ctx.inputs[0]
    squared = ctx.node("Mul", [x, x], suffix="square")
    pad = (size - 1) // 2
    mean = emit_caffe_pool(ctx, squared, shape, "AVE", (size, size), (pad, pad), (1, 1), True, top=None)
    scaled = ctx.node("Mul", [mean, ctx.const(float(param.alpha), "alpha")], suffix="alpha")
    base = ctx.node("Add", [scaled, ctx.const(1.0, "one")], suffix="shift")
    factor = ctx.node("Pow", [base, ctx.const(-float(param.beta), "neg_beta")], suffix="pow")
    ctx.node("Mul", [x, factor], top=0)


@layer("Normalize")
def normalize(ctx: LayerContext) -> None:
    ctx.expect_bottoms(1)
    ctx.expect_tops(1)
    param = ctx.param("norm_param")
    shape = ctx.shape()
    if len(shape) != 4:
        raise ctx.unsupported(f"Normalize of a rank-{len(shape)} input; expected NCHW")
    axes = (1, 2, 3) if param.across_spatial else (1,)
    x = ctx.inputs[0]
    sum_squares = ctx.node("ReduceSumSquare", [x], {"axes": axes, "keepdims": 1})
    norm = ctx.node("Sqrt", [ctx.node("Add", [sum_squares, ctx.const(float(param.eps), "eps")])])
    normalized = ctx.node("Div", [x, norm])
    shared = param.channel_shared
    (weights,) = ctx.blobs([Blob((1,) if shared else (shape[1],), 1.0)])
    weights = weights if shared else weights.reshape(shape[1], 1, 1)
    ctx.node("Mul", [normalized, ctx.const(weights, "scale")], top=0)


@layer("MVN")
def mvn(ctx: LayerContext) -> None:
    ctx.expect_bottoms(1)
    ctx.expect_tops(1)
    param = ctx.param("mvn_param")
    rank = len(ctx.shape())
    axes = tuple(range(1 if param.across_channels else 2, rank))
    x = ctx.inputs[0]
    mean = ctx.node("ReduceMean", [x], {"axes": axes, "keepdims": 1}, suffix="mean")
    centered = ctx.node("Sub", [x, mean], top=None if param.normalize_variance else 0, suffix="center")
    if not param.normalize_variance:
        return
    variance = ctx.node("ReduceMean", [ctx.node("Mul", [centered, centered])], {"axes": axes, "keepdims": 1},
                        suffix="variance")
    std = ctx.node("Add", [ctx.node("Sqrt", [variance]), ctx.const(float(param.eps), "eps")], suffix="std")
    ctx.node("Div", [centered, std], top=0)
