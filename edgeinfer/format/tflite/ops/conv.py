"""Conv, FusedConv and ConvTranspose -> CONV_2D, DEPTHWISE_CONV_2D, TRANSPOSE_CONV.

TFLite convolves NHWC activations with OHWI filters (depthwise: 1HW(C*M)); filters are
transposed here, once, and a per-channel quantization axis follows the permutation. TFLite
pads only ``SAME`` (the odd pixel at the end, ONNX ``SAME_UPPER``) or ``VALID``; other
explicit pads become a ``PAD`` in front (in int8 TFLite pads with the zero point, i.e. 0.0).
"""

from __future__ import annotations

import numpy as np

from edgeinfer.format.tflite.context import OpContext
from edgeinfer.format.tflite.export import NCHW_TO_NHWC, ExportError, export_rule, node_fused_code
from edgeinfer.ir import Graph, Node

DEPTHWISE_FILTER = (1, 2, 3, 0)  # [C*M, 1, kh, kw] -> [1, kh, kw, C*M]
TRANSPOSED_FILTER = (1, 2, 3, 0)  # [C_in, C_out, kh, kw] -> [C_out, kh, kw, C_in]


def same_pads(size: int, kernel: int, stride: int, dilation: int) -> tuple[int, int]:
    """TF ``SAME`` padding of one spatial dim: (before, after)."""
    out = -(-size // stride)
    total = max((out - 1) * stride + (kernel - 1) * dilation + 1 - size, 0)
    return total // 2, total - total // 2


def explicit_pads(node: Node, in_hw: tuple, kernel: tuple[int, int], strides, dilations) -> tuple[int, ...] | None:
    """ONNX pads (top, left, bottom, right) of a 2-D window op; None where they depend on
    dims unknown at export (auto_pad SAME_* of a dynamic spatial dim)."""
    auto_pad = node.attrs.get("auto_pad", "NOTSET")
    if auto_pad == "VALID":
        return (0, 0, 0, 0)
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        if not all(isinstance(d, int) for d in in_hw):
            return None
        pairs = [same_pads(*args) for args in zip(in_hw, kernel, strides, dilations, strict=True)]
        if auto_pad == "SAME_LOWER":
            pairs = [(after, before) for before, after in pairs]
        return (pairs[0][0], pairs[1][0], pairs[0][1], pairs[1][1])
    return tuple(int(p) for p in node.attrs.get("pads", (0, 0, 0, 0)))


def tflite_padding(node: Node, in_hw: tuple, kernel, strides, dilations) -> tuple[str, tuple[int, ...] | None]:
    """("SAME" | "VALID", pads to apply with a PAD first or None)."""
    if node.attrs.get("auto_pad", "NOTSET") == "SAME_UPPER":
        return "SAME", None
    pads = explicit_pads(node, in_hw, kernel, strides, dilations)
    if pads is None:
        raise ExportError(f"auto_pad {node.attrs.get('auto_pad')} needs static spatial dims, found {in_hw}")
    if not any(pads):
        return "VALID", None
    if all(isinstance(d, int) for d in in_hw):
        pairs = [same_pads(*args) for args in zip(in_hw, kernel, strides, dilations, strict=True)]
        if pads == (pairs[0][0], pairs[1][0], pairs[0][1], pairs[1][1]):
            return "SAME", None
    return "VALID", pads


def pad_nhwc(ctx: OpContext, x: int, pads: tuple[int, ...], nhwc_shape: tuple, *, value: float | None = None) -> int:
    """``x`` (NHWC) padded spatially by ONNX ``pads`` (top, left, bottom, right)."""
    top, left, bottom, right = pads
    padded = (nhwc_shape[0], _grow(nhwc_shape[1], top + bottom), _grow(nhwc_shape[2], left + right), nhwc_shape[3])
    quant = ctx.quant(0) if ctx.int8 else None
    out = ctx.temp(padded, "padded", quant=quant)
    paddings = ctx.int32([[0, 0], [top, bottom], [left, right], [0, 0]], "paddings")
    if value is None:
        ctx.op("PAD", [x, paddings], [out])
    else:
        fill = (np.asarray(-128, np.int8) if ctx.int8 else np.asarray(value, np.float32)).reshape(())
        ctx.op("PADV2", [x, paddings, ctx.constant(fill, "pad_value", quant=quant)], [out])
    return out


def _grow(dim, amount: int):
    return dim + amount if isinstance(dim, int) else dim


def _window(node: Node) -> tuple[tuple[int, int], tuple[int, int]]:
    strides = tuple(int(s) for s in node.attrs.get("strides", (1, 1)))
    dilations = tuple(int(d) for d in node.attrs.get("dilations", (1, 1)))
    return strides, dilations


def check_conv(node: Node, graph: Graph) -> str | None:
    x = graph.values.get(node.inputs[0])
    if x is None or x.rank != 4:
        return f"only 2-D convolutions (rank-4 input) are exported, found rank {None if x is None else x.rank}"
    w_shape = _const_shape(graph, node.inputs[1])
    if w_shape is None:
        return "the weights must be constant"
    group, channels = int(node.attrs.get("group", 1)), x.shape[1]
    if group != 1 and not isinstance(channels, int):
        return "a grouped convolution needs a static channel count"
    if node.attrs.get("auto_pad", "NOTSET") == "SAME_LOWER" and not x.is_static:
        return "auto_pad SAME_LOWER needs static spatial dims"
    from edgeinfer.format.tflite.ops.elementwise import activation_support

    return activation_support(node)


def _const_shape(graph: Graph, name: str) -> tuple | None:
    """Shape of a constant or of a DequantizeLinear of one (a quantized weight)."""
    value = graph.values.get(name)
    if value is None:
        return None
    if value.const is not None:
        return value.const.shape
    producer = value.producer
    if producer is not None and producer.op_type == "DequantizeLinear" and producer.domain == "":
        return _const_shape(graph, producer.inputs[0])
    return None


def int8_bias(ctx: OpContext, k: int, weight_scale: np.ndarray, units: int) -> int:
    """Input ``k`` (float bias, possibly a view of int32) as TFLite's int32 bias on
    ``input_scale * weight_scale``."""
    scale = (ctx.quant(0).scale.astype(np.float64) * weight_scale.astype(np.float64)).reshape(-1)
    scale = np.broadcast_to(scale, (units,)).astype(np.float32)
    bias = ctx.const(k) if ctx.has(k) else None
    bias = np.zeros(units, np.float32) if bias is None else np.broadcast_to(bias.reshape(-1), (units,))
    values = np.clip(np.round(bias.astype(np.float64) / scale), -(2**31 - 1), 2**31 - 1).astype(np.int32)
    from edgeinfer.format.tflite.export import quant_info

    return ctx.constant(values, "bias", quant=quant_info(scale, np.zeros(units, np.int64), "int32", 0))


def float_bias(ctx: OpContext, k: int, units: int, scale: float = 1.0) -> int:
    bias = ctx.const(k) if ctx.has(k) else None
    if ctx.has(k) and bias is None:
        raise ExportError(f"the bias (input {k}) must be a constant")
    if bias is not None and scale == 1.0 and bias.shape == (units,) and bias.dtype == np.float32:
        return ctx.input(k)  # the bias itself (a float16-stored one stays so)
    bias = np.zeros(units, np.float32) if bias is None else np.broadcast_to(bias.reshape(-1), (units,))
    return ctx.constant((bias * scale).astype(np.float32), "bias")


def conv_output(ctx: OpContext, write, shape: tuple, perm: tuple[int, ...]) -> None:
    """Call ``write(out, fused_code)`` for the node's output, applying an activation TFLite
    cannot fuse as an operator of its own."""
    code = node_fused_code(ctx.node, int8=ctx.int8)
    if code is not None:
        write(ctx.output(0, perm), code)
        return
    raw = ctx.temp(shape, "preact")
    write(raw, 0)
    ctx.activation(raw, shape, perm, ctx.output(0, perm))


@export_rule("Conv", check=check_conv, int8="any", int8_inputs=(0, 1), int8_weights=(1,))
@export_rule("FusedConv", domain="edgeinfer", check=check_conv, int8="any", int8_inputs=(0, 1), int8_weights=(1,))
def conv(ctx: OpContext) -> None:
    w_shape = ctx.exp.values[ctx.exp.views.get(ctx.name(1), ctx.name(1))].const.shape
    out_channels, _, kh, kw = w_shape
    strides, dilations = _window(ctx.node)
    in_nhwc = tuple(ctx.shape(0)[a] for a in NCHW_TO_NHWC)
    padding, pads = tflite_padding(ctx.node, in_nhwc[1:3], (kh, kw), strides, dilations)
    x = ctx.input(0, NCHW_TO_NHWC)
    if pads is not None:
        x = pad_nhwc(ctx, x, pads, in_nhwc)
    group = int(ctx.attrs.get("group", 1))
    # group == channels with one filter channel is depthwise; other groups are a grouped CONV_2D
    # (version 6: TFLite infers the groups from the filter's input channels).
    depthwise = group != 1 and group == in_nhwc[3] and w_shape[1] == 1
    weight = ctx.input(1, DEPTHWISE_FILTER if depthwise else NCHW_TO_NHWC)
    if ctx.int8:
        bias = int8_bias(ctx, 2, ctx.quant(1).scale, out_channels)
    else:
        bias = float_bias(ctx, 2, out_channels)
    common = dict(padding=0 if padding == "SAME" else 1, stride_h=strides[0], stride_w=strides[1],
                  dilation_h_factor=dilations[0], dilation_w_factor=dilations[1])
    out_nhwc = tuple(ctx.out_shape()[a] for a in NCHW_TO_NHWC)

    def write(out: int, code: int) -> None:
        if depthwise:
            ctx.op("DEPTHWISE_CONV_2D", [x, weight, bias], [out], version=3 if ctx.int8 else 1,
                   options="DepthwiseConv2DOptions", depth_multiplier=out_channels // in_nhwc[3],
                   fused_activation_function=code, **common)
        else:
            version = 6 if group != 1 else 3 if ctx.int8 else 1
            ctx.op("CONV_2D", [x, weight, bias], [out], version=version, options="Conv2DOptions",
                   fused_activation_function=code, **common)

    conv_output(ctx, write, out_nhwc, NCHW_TO_NHWC)


def check_conv_transpose(node: Node, graph: Graph) -> str | None:
    x, y = graph.values.get(node.inputs[0]), graph.values.get(node.outputs[0])
    if x is None or x.rank != 4:
        return "only 2-D transposed convolutions (rank-4 input) are exported"
    if _const_shape(graph, node.inputs[1]) is None:
        return "the weights must be constant"
    if int(node.attrs.get("group", 1)) != 1 or any(int(d) != 1 for d in node.attrs.get("dilations", (1, 1))):
        return "grouped or dilated transposed convolutions have no TFLite equivalent"
    if y is None or y.shape is None or not all(isinstance(d, int) for d in (*x.shape[2:], *y.shape[:3])):
        return "transposed convolutions need a static batch and spatial dims (TFLite takes the output shape as a constant)"
    return None


def _conv_transpose_begin(node: Node, size: int, kernel: int, stride: int, out: int, axis: int) -> int:
    """Crop at the start of one spatial dim of the full transposed convolution (ONNX pads)."""
    auto_pad = node.attrs.get("auto_pad", "NOTSET")
    if auto_pad in ("SAME_UPPER", "SAME_LOWER") or "output_shape" in node.attrs:
        extra = int(node.attrs.get("output_padding", (0, 0))[axis])
        total = stride * (size - 1) + extra + kernel - out
        return total // 2 if auto_pad == "SAME_UPPER" else total - total // 2
    if auto_pad == "VALID":
        return 0
    return int(node.attrs.get("pads", (0, 0, 0, 0))[axis])


@export_rule("ConvTranspose", check=check_conv_transpose, int8="any", int8_inputs=(0, 1), int8_weights=(1,))
def conv_transpose(ctx: OpContext) -> None:
    strides, _ = _window(ctx.node)
    w_shape = ctx.exp.values[ctx.exp.views.get(ctx.name(1), ctx.name(1))].const.shape
    _, out_channels, kh, kw = w_shape
    in_hw, out_shape = ctx.shape(0)[2:], ctx.out_shape()
    out_hw = out_shape[2:]
    begins = [_conv_transpose_begin(ctx.node, in_hw[i], (kh, kw)[i], strides[i], out_hw[i], i) for i in range(2)]
    kernel = (kh, kw)
    # TFLite derives the input size back from the output shape it is given: with SAME it must
    # be ceil(out / stride), with VALID (out - kernel) // stride + 1.
    tflite_same = [max(0, (-(-o // s) - 1) * s + k - o) // 2 for o, s, k in zip(out_hw, strides, kernel, strict=True)]
    if begins == tflite_same and all(-(-o // s) == i for o, s, i in zip(out_hw, strides, in_hw, strict=True)):
        padding, full_hw = 0, tuple(out_hw)
    else:
        padding = 1
        full_hw = tuple(max((i - 1) * s + k, b + o) for i, s, k, b, o in zip(in_hw, strides, kernel, begins, out_hw, strict=True))
        if any((f - k) // s + 1 != i for f, k, s, i in zip(full_hw, kernel, strides, in_hw, strict=True)):
            raise ExportError(f"output size {tuple(out_hw)} with pads starting at {tuple(begins)} has no TFLite "
                              "TRANSPOSE_CONV form")
    x = ctx.input(0, NCHW_TO_NHWC)
    weight = ctx.input(1, TRANSPOSED_FILTER)
    bias = int8_bias(ctx, 2, ctx.quant(1).scale, out_channels) if ctx.int8 else float_bias(ctx, 2, out_channels)
    batch = out_shape[0]
    size = ctx.int32([batch if isinstance(batch, int) else 1, *full_hw, out_channels], "output_shape")
    cropped = padding == 1 and any(begins)
    out_nhwc = (batch, *out_hw, out_channels)

    def write(out: int, code: int) -> None:
        target = ctx.temp((batch, *full_hw, out_channels), "full", quant=ctx.out_quant() if ctx.int8 else None) \
            if cropped else out
        ctx.op("TRANSPOSE_CONV", [size, weight, x, bias], [target], version=3, options="TransposeConvOptions",
               padding=padding, stride_h=strides[0], stride_w=strides[1],
               **({"fused_activation_function": code} if code else {}))
        if cropped:
            ctx.op("STRIDED_SLICE", [target, ctx.int32([0, begins[0], begins[1], 0], "begin"),
                                     ctx.int32([0, begins[0] + out_hw[0], begins[1] + out_hw[1], 0], "end"),
                                     ctx.int32([1, 1, 1, 1], "strides")], [out],
                   options="StridedSliceOptions", begin_mask=0b1001, end_mask=0b1001)

    conv_output(ctx, write, out_nhwc, NCHW_TO_NHWC)
