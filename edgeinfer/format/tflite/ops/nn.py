"""Pooling, normalization, resize, padding and reductions."""

from __future__ import annotations

import numpy as np

from edgeinfer.format.tflite.context import OpContext
from edgeinfer.format.tflite.export import NCHW_TO_NHWC, ExportError, export_rule, identity
from edgeinfer.format.tflite.ops.conv import explicit_pads, pad_nhwc, same_pads, tflite_padding
from edgeinfer.ir import Graph, Node


# -- pooling -----------------------------------------------------------------------------------------
def _kernel_strides(node: Node) -> tuple[tuple[int, ...], tuple[int, ...]]:
    return (tuple(int(k) for k in node.attrs["kernel_shape"]),
            tuple(int(s) for s in node.attrs.get("strides", (1, 1))))


def check_pool(node: Node, graph: Graph) -> str | None:
    x = graph.values.get(node.inputs[0])
    if x is None or x.rank != 4:
        return "only 2-D pooling (rank-4 input) is exported"
    if any(int(d) != 1 for d in node.attrs.get("dilations", (1, 1))) or int(node.attrs.get("storage_order", 0)):
        return "dilated pooling and storage_order=1 have no TFLite equivalent"
    if len([o for o in node.outputs if o]) > 1:
        return "MaxPool's indices output has no TFLite equivalent"
    kernel, strides = _kernel_strides(node)
    pads = explicit_pads(node, x.shape[2:], kernel, strides, (1, 1))
    if int(node.attrs.get("ceil_mode", 0)) and not _ceil_is_same(node, kernel, strides, pads):
        if pads is None or not all(isinstance(d, int) for d in x.shape[2:]):
            return "ceil_mode needs static spatial dims"
        for size, k, s, before, after in zip(x.shape[2:], kernel, strides, pads[:2], pads[2:], strict=True):
            if (size + before + after - k) % s:
                return "ceil_mode changes the output size here; TFLite pools with floor"
    if _needs_count_map(node, x.shape[2:], kernel, strides, pads):
        if not all(isinstance(d, int) for d in x.shape[2:]):
            return ("AveragePool with explicit pads that exclude padding from the count needs static spatial "
                    f"dims (for its per-position divisor), found {list(x.shape[2:])}")
        counts = _real_counts(x.shape[2:], kernel, strides, pads)
        if not all(c.min() > 0 for c in counts):
            return (f"AveragePool pads {list(pads)} leave a window of kernel {list(kernel)} with no input "
                    "element (expected pads smaller than the kernel); its average is undefined")
    return None


def _needs_count_map(node: Node, hw: tuple, kernel, strides, pads) -> bool:
    """Whether an AveragePool excludes explicit pads that TFLite's SAME padding would not pad
    from its count: exported as PAD (zeros), a VALID pool (which divides by the kernel area)
    and a MUL by ``kernel area / real elements`` of each window (``_count_scale``)."""
    if node.op_type != "AveragePool" or int(node.attrs.get("count_include_pad", 0)) or pads is None or not any(pads):
        return False
    return not (all(isinstance(d, int) for d in hw) and pads == _same(hw, kernel, strides))


def _real_counts(hw: tuple[int, int], kernel, strides, pads) -> list[np.ndarray]:
    """Per spatial axis, how many input (not padding) elements each window covers."""
    counts = []
    for size, k, s, before, after in zip(hw, kernel, strides, pads[:2], pads[2:], strict=True):
        start = np.arange((size + before + after - k) // s + 1) * s - before
        counts.append(np.minimum(start + k, size) - np.maximum(start, 0))
    return counts


def _count_scale(hw: tuple[int, int], kernel, strides, pads) -> np.ndarray:
    """``kernel area / real elements`` per output position, NHWC [1, OH, OW, 1]: what turns
    a VALID average over zero-padded input into the average over the real elements only."""
    rows, cols = _real_counts(hw, kernel, strides, pads)
    return (kernel[0] * kernel[1] / np.outer(rows, cols)).astype(np.float32)[None, :, :, None]


def _int8_pool(node: Node, graph: Graph) -> bool:
    """The integer pool applies unless the divisor needs the float MUL by a count map."""
    x = graph.values[node.inputs[0]]
    kernel, strides = _kernel_strides(node)
    return not _needs_count_map(node, x.shape[2:], kernel, strides,
                                explicit_pads(node, x.shape[2:], kernel, strides, (1, 1)))


def _ceil_is_same(node: Node, kernel, strides, pads) -> bool:
    """A ceil_mode max pool whose windows tile the input (kernel == stride <= 2, no pads) is
    TFLite's SAME padding at any size: ceil(H / s) windows, the one pad row or column (never
    more) after the input, where a max ignores it. MTCNN's PNet pools so, on symbolic H and W."""
    return (node.op_type == "MaxPool" and int(node.attrs.get("ceil_mode", 0)) == 1 and pads == (0, 0, 0, 0)
            and node.attrs.get("auto_pad", "NOTSET") == "NOTSET" and tuple(kernel) == tuple(strides)
            and all(s <= 2 for s in strides))


def _same(hw, kernel, strides) -> tuple[int, ...]:
    pairs = [same_pads(*args, 1) for args in zip(hw, kernel, strides, strict=True)]
    return (pairs[0][0], pairs[1][0], pairs[0][1], pairs[1][1])


def _pool(opcode: str):
    def export(ctx: OpContext) -> None:
        kernel, strides = _kernel_strides(ctx.node)
        in_nhwc = tuple(ctx.shape(0)[a] for a in NCHW_TO_NHWC)
        if _ceil_is_same(ctx.node, kernel, strides, explicit_pads(ctx.node, in_nhwc[1:3], kernel, strides, (1, 1))):
            padding, pads = "SAME", None
        else:
            padding, pads = tflite_padding(ctx.node, in_nhwc[1:3], kernel, strides, (1, 1))
        if opcode == "AVERAGE_POOL_2D" and int(ctx.attrs.get("count_include_pad", 0)) and padding == "SAME":
            # TFLite's SAME average leaves the padding out of the count; pad explicitly instead.
            pads = explicit_pads(ctx.node, in_nhwc[1:3], kernel, strides, (1, 1))
            padding = "VALID" if pads is not None and any(pads) else padding
        count_map = padding == "VALID" and _needs_count_map(ctx.node, in_nhwc[1:3], kernel, strides, pads)
        x = ctx.input(0, NCHW_TO_NHWC)
        if pads is not None:
            x = pad_nhwc(ctx, x, pads, in_nhwc, value=-np.finfo(np.float32).max if opcode == "MAX_POOL_2D" else None)
        out = ctx.output(0, NCHW_TO_NHWC)
        pooled = ctx.temp(tuple(ctx.out_shape()[a] for a in NCHW_TO_NHWC), "pooled") if count_map else out
        ctx.op(opcode, [x], [pooled], options="Pool2DOptions",
               padding=0 if padding == "SAME" else 1, stride_h=strides[0], stride_w=strides[1],
               filter_height=kernel[0], filter_width=kernel[1], fused_activation_function=0)
        if count_map:
            scale = ctx.constant(_count_scale(in_nhwc[1:3], kernel, strides, pads), "count_scale")
            ctx.op("MUL", [pooled, scale], [out], options="MulOptions", fused_activation_function=0)

    return export


export_rule("MaxPool", check=check_pool, int8="same")(_pool("MAX_POOL_2D"))
export_rule("AveragePool", check=check_pool, int8="same", int8_when=_int8_pool)(_pool("AVERAGE_POOL_2D"))


def check_rank4(node: Node, graph: Graph) -> str | None:
    x = graph.values.get(node.inputs[0])
    return None if x is not None and x.rank == 4 else "only rank-4 (NCHW) inputs are exported"


def _global_pool(opcode: str):
    def export(ctx: OpContext) -> None:
        ctx.op(opcode, [ctx.input(0, NCHW_TO_NHWC), ctx.int32([1, 2], "axes")], [ctx.output(0, NCHW_TO_NHWC)],
               options="ReducerOptions", keep_dims=True)

    return export


export_rule("GlobalAveragePool", check=check_rank4, int8="any")(_global_pool("MEAN"))
export_rule("GlobalMaxPool", check=check_rank4, int8="same")(_global_pool("REDUCE_MAX"))


# -- reductions --------------------------------------------------------------------------------------
REDUCERS = {"ReduceMean": "MEAN", "ReduceMax": "REDUCE_MAX", "ReduceMin": "REDUCE_MIN", "ReduceSum": "SUM",
            "ReduceProd": "REDUCE_PROD"}


def reduce_axes(node: Node, graph: Graph) -> tuple[int, ...] | None:
    rank = graph.values[node.inputs[0]].rank
    if len(node.inputs) > 1 and node.inputs[1]:
        value = graph.values.get(node.inputs[1])
        if value is None or value.const is None:
            return None
        axes = [int(a) for a in value.const.reshape(-1)]
    else:
        axes = [int(a) for a in node.attrs.get("axes", ())]
    if not axes and not int(node.attrs.get("noop_with_empty_axes", 0)):
        axes = list(range(rank))
    return tuple(sorted(a % rank for a in axes))


def check_reduce(node: Node, graph: Graph) -> str | None:
    if graph.values[node.inputs[0]].rank is None:
        return "the input rank must be known"
    if reduce_axes(node, graph) is None:
        return "the axes must be constant"
    return None


def _reduce(opcode: str):
    def export(ctx: OpContext) -> None:
        axes = reduce_axes(ctx.node, ctx.exp.graph)
        if not axes:
            ctx.alias(0, 0)
            return
        keep = bool(int(ctx.attrs.get("keepdims", 1)))
        rank = ctx.rank(0)  # work in the order the input already has (NHWC after a convolution)
        have = [p for p in ctx.exp.perms(ctx.name(0)) if len(p) == rank]
        perm = next((p for p in have if p != identity(rank)), identity(rank))
        if not keep:  # the surviving axes, in the order they have in that layout
            surviving = [a for a in perm if a not in axes]
            out_perm = tuple(sorted(surviving).index(a) for a in surviving)
        else:
            out_perm = perm
        tflite_axes = [perm.index(a) for a in axes]
        ctx.op(opcode, [ctx.input(0, perm), ctx.int32(tflite_axes, "axes")], [ctx.output(0, out_perm)],
               options="ReducerOptions", keep_dims=keep)

    return export


for _op, _opcode in REDUCERS.items():
    export_rule(_op, check=check_reduce, int8="any" if _opcode == "MEAN" else "none")(_reduce(_opcode))


# -- normalization -----------------------------------------------------------------------------------
def check_layer_norm(node: Node, graph: Graph) -> str | None:
    if graph.values[node.inputs[0]].rank is None:
        return "the input rank must be known"
    if len([o for o in node.outputs if o]) > 1:
        return "LayerNormalization's mean / inv-std outputs are not exported"
    for k in (1, 2):
        if len(node.inputs) > k and node.inputs[k] and graph.values[node.inputs[k]].const is None:
            return "Scale and B must be constants"
    return None


@export_rule("LayerNormalization", since=17, check=check_layer_norm)
@export_rule("LayerNormalization", domain="edgeinfer", check=check_layer_norm)
def layer_norm(ctx: OpContext) -> None:
    """``(x - mean) * rsqrt(var + eps) * scale + bias`` over the axes from ``axis`` to the
    last, from MEAN, SQUARED_DIFFERENCE, ADD, RSQRT, SUB and MUL."""
    rank = ctx.rank(0)
    axis = int(ctx.attrs.get("axis", -1)) % rank
    shape = ctx.shape(0)
    reduced = tuple(d if i < axis else 1 for i, d in enumerate(shape))
    x = ctx.input(0)
    axes = ctx.int32(list(range(axis, rank)), "axes")
    mean, var, centered = ctx.temp(reduced, "mean"), ctx.temp(reduced, "var"), ctx.temp(shape, "centered")
    squares, shifted, inv_std = ctx.temp(shape, "sqdiff"), ctx.temp(reduced, "var_eps"), ctx.temp(reduced, "inv_std")
    ctx.op("MEAN", [x, axes], [mean], options="ReducerOptions", keep_dims=True)
    ctx.op("SQUARED_DIFFERENCE", [x, mean], [squares])
    ctx.op("MEAN", [squares, axes], [var], options="ReducerOptions", keep_dims=True)
    eps = ctx.constant(np.asarray(float(ctx.attrs.get("epsilon", 1e-5)), np.float32), "epsilon")
    ctx.op("ADD", [var, eps], [shifted], options="AddOptions", fused_activation_function=0)
    ctx.op("RSQRT", [shifted], [inv_std])
    ctx.op("SUB", [x, mean], [centered], options="SubOptions", fused_activation_function=0)
    normalized = ctx.temp(shape, "normalized")
    ctx.op("MUL", [centered, inv_std], [normalized], options="MulOptions", fused_activation_function=0)
    scale = ctx.constant(ctx.const(1).astype(np.float32), "scale")
    if not ctx.has(2):
        ctx.op("MUL", [normalized, scale], [ctx.output(0)], options="MulOptions", fused_activation_function=0)
        return
    scaled = ctx.temp(shape, "scaled")
    ctx.op("MUL", [normalized, scale], [scaled], options="MulOptions", fused_activation_function=0)
    ctx.op("ADD", [scaled, ctx.constant(ctx.const(2).astype(np.float32), "bias")], [ctx.output(0)],
           options="AddOptions", fused_activation_function=0)


def check_batch_norm(node: Node, graph: Graph) -> str | None:
    x = graph.values.get(node.inputs[0])
    if x is None or x.rank is None or x.rank < 2:
        return "the input rank must be known and at least 2"
    if any(graph.values[name].const is None for name in node.inputs[1:5]):
        return "scale, bias, mean and var must be constants (inference mode)"
    if int(node.attrs.get("training_mode", 0)) or len([o for o in node.outputs if o]) > 1:
        return "training-mode BatchNormalization is not exported"
    return None


@export_rule("BatchNormalization", check=check_batch_norm)
def batch_norm(ctx: OpContext) -> None:
    """``x * a + b`` per channel (axis 1), ``a = scale / sqrt(var + eps)``, ``b = bias - mean * a``."""
    gamma, beta, mean, var = (ctx.const(k).astype(np.float64) for k in (1, 2, 3, 4))
    a = gamma / np.sqrt(var + float(ctx.attrs.get("epsilon", 1e-5)))
    b = beta - mean * a
    rank = ctx.rank(0)
    perm = ctx.layout(0)
    channel_shape = tuple(-1 if i == 1 else 1 for i in range(rank))

    def per_channel(values: np.ndarray, hint: str) -> int:
        return ctx.constant(np.transpose(values.astype(np.float32).reshape(channel_shape), perm), hint)

    shape = tuple(ctx.shape(0)[i] for i in perm)
    scaled = ctx.temp(shape, "scaled")
    ctx.op("MUL", [ctx.input(0, perm), per_channel(a, "scale")], [scaled], options="MulOptions",
           fused_activation_function=0)
    ctx.op("ADD", [scaled, per_channel(b, "shift")], [ctx.output(0, perm)], options="AddOptions",
           fused_activation_function=0)


# -- resize ------------------------------------------------------------------------------------------
# (mode, coordinate_transformation_mode, nearest_mode) -> (opcode, align_corners, half_pixel_centers)
RESIZE_MODES = {
    ("linear", "asymmetric", None): ("RESIZE_BILINEAR", False, False),
    ("linear", "align_corners", None): ("RESIZE_BILINEAR", True, False),
    ("linear", "half_pixel", None): ("RESIZE_BILINEAR", False, True),
    ("linear", "pytorch_half_pixel", None): ("RESIZE_BILINEAR", False, True),
    ("nearest", "asymmetric", "floor"): ("RESIZE_NEAREST_NEIGHBOR", False, False),
    ("nearest", "align_corners", "round_prefer_ceil"): ("RESIZE_NEAREST_NEIGHBOR", True, False),
    ("nearest", "tf_half_pixel_for_nn", "floor"): ("RESIZE_NEAREST_NEIGHBOR", False, True),
    ("nearest", "half_pixel", "round_prefer_ceil"): ("RESIZE_NEAREST_NEIGHBOR", False, True),
}


def resize_mode(node: Node) -> tuple[str, bool, bool] | None:
    mode = node.attrs.get("mode", "nearest")
    nearest = node.attrs.get("nearest_mode", "round_prefer_floor") if mode == "nearest" else None
    key = (mode, node.attrs.get("coordinate_transformation_mode", "half_pixel"), nearest)
    return RESIZE_MODES.get(key)


def check_resize(node: Node, graph: Graph) -> str | None:
    x, y = graph.values.get(node.inputs[0]), graph.values.get(node.outputs[0])
    if x is None or x.rank != 4 or y is None or y.shape is None:
        return "only rank-4 (NCHW) resizes with a known output shape are exported"
    if not all(isinstance(d, int) for d in y.shape[2:]) or x.shape[:2] != y.shape[:2]:
        return "the output's spatial dims must be static and batch and channels unchanged"
    if resize_mode(node) is None:
        return (f"mode {node.attrs.get('mode', 'nearest')!r} with coordinate_transformation_mode "
                f"{node.attrs.get('coordinate_transformation_mode', 'half_pixel')!r} and nearest_mode "
                f"{node.attrs.get('nearest_mode', 'round_prefer_floor')!r} has no TFLite equivalent; expected one "
                f"of {sorted(RESIZE_MODES)}")
    if int(node.attrs.get("antialias", 0)) or node.attrs.get("axes"):
        return "antialias and axes have no TFLite equivalent"
    return None


@export_rule("Resize", since=11, check=check_resize, int8="same")
def resize(ctx: OpContext) -> None:
    opcode, align_corners, half_pixel = resize_mode(ctx.node)
    options = "ResizeBilinearOptions" if opcode == "RESIZE_BILINEAR" else "ResizeNearestNeighborOptions"
    size = ctx.int32(list(ctx.out_shape()[2:]), "size")
    ctx.op(opcode, [ctx.input(0, NCHW_TO_NHWC), size], [ctx.output(0, NCHW_TO_NHWC)],
           version=3 if half_pixel else None, options=options, align_corners=align_corners,
           half_pixel_centers=half_pixel)


# -- padding -----------------------------------------------------------------------------------------
def pad_amounts(node: Node, graph: Graph) -> list[tuple[int, int]] | None:
    rank = graph.values[node.inputs[0]].rank
    if "pads" in node.attrs:  # opset < 11
        pads = [int(p) for p in node.attrs["pads"]]
    else:
        value = graph.values.get(node.inputs[1])
        if value is None or value.const is None:
            return None
        pads = [int(p) for p in value.const.reshape(-1)]
    axes = list(range(rank))
    if len(node.inputs) > 3 and node.inputs[3]:
        value = graph.values.get(node.inputs[3])
        if value is None or value.const is None:
            return None
        axes = [int(a) % rank for a in value.const.reshape(-1)]
    amounts = [(0, 0)] * rank
    half = len(pads) // 2
    for i, axis in enumerate(axes):
        amounts[axis] = (pads[i], pads[i + half])
    return amounts


def _pad_value(node: Node, graph: Graph) -> float | None:
    if "value" in node.attrs:
        return float(node.attrs["value"])
    if len(node.inputs) > 2 and node.inputs[2]:
        value = graph.values.get(node.inputs[2])
        return None if value is None or value.const is None else float(value.const.reshape(-1)[0])
    return 0.0


def check_pad(node: Node, graph: Graph) -> str | None:
    if graph.values[node.inputs[0]].rank is None:
        return "the input rank must be known"
    amounts = pad_amounts(node, graph)
    if amounts is None or _pad_value(node, graph) is None:
        return "pads, constant_value and axes must be constants"
    if any(p < 0 for pair in amounts for p in pair):
        return "negative pads (cropping) are not exported"
    if node.attrs.get("mode", "constant") not in ("constant", "reflect"):
        return f"pad mode {node.attrs.get('mode')!r} has no TFLite equivalent (constant and reflect have)"
    return None


def _int8_pad(node: Node, graph: Graph) -> bool:
    return node.attrs.get("mode", "constant") == "constant" and float(node.attrs.get("value", 0.0)) == 0.0


@export_rule("Pad", check=check_pad, int8="same", int8_inputs=(0,), int8_when=_int8_pad)
def pad(ctx: OpContext) -> None:
    amounts = pad_amounts(ctx.node, ctx.exp.graph)
    perm = ctx.layout(0)
    paddings = ctx.int32([amounts[a] for a in perm], "paddings")
    x, out = ctx.input(0, perm), ctx.output(0, perm)
    value = _pad_value(ctx.node, ctx.exp.graph)
    if ctx.attrs.get("mode", "constant") == "reflect":
        ctx.op("MIRROR_PAD", [x, paddings], [out], options="MirrorPadOptions", mode=0)
    elif value == 0.0 or ctx.int8:
        if ctx.int8 and value != 0.0:
            raise ExportError("an int8 Pad must pad with 0.0")
        ctx.op("PAD", [x, paddings], [out])
    else:
        fill = ctx.constant(np.asarray(value, np.dtype(ctx.dtype(0))), "pad_value")
        ctx.op("PADV2", [x, paddings, fill], [out])


# -- depth/space rearrangement and local response normalization -------------------------------------
def check_depth_space(node: Node, graph: Graph) -> str | None:
    x = graph.values.get(node.inputs[0])
    if x is None or x.rank != 4:
        return "only rank-4 inputs are exported"
    if node.op_type == "DepthToSpace" and node.attrs.get("mode", "DCR") != "DCR":
        return "DepthToSpace mode CRD has no TFLite equivalent (TFLite's DEPTH_TO_SPACE is DCR)"
    return None


def _depth_space(opcode: str, options: str):
    def export(ctx: OpContext) -> None:
        x = ctx.input(0, NCHW_TO_NHWC)
        ctx.op(opcode, [x], [ctx.output(0, NCHW_TO_NHWC)], options=options, block_size=int(ctx.attrs["blocksize"]))

    return export


export_rule("DepthToSpace", check=check_depth_space, int8="same")(_depth_space("DEPTH_TO_SPACE", "DepthToSpaceOptions"))
export_rule("SpaceToDepth", check=check_depth_space, int8="same")(_depth_space("SPACE_TO_DEPTH", "SpaceToDepthOptions"))


def check_lrn(node: Node, graph: Graph) -> str | None:
    x = graph.values.get(node.inputs[0])
    if x is None or x.rank != 4:
        return "only rank-4 inputs are exported"
    if int(node.attrs["size"]) % 2 == 0:
        return "an even LRN size sums an asymmetric window; TFLite's radius gives symmetric ones"
    return None


@export_rule("LRN", check=check_lrn)
def lrn(ctx: OpContext) -> None:
    """ONNX: ``x / (bias + alpha / size * sum_window(x^2))^beta`` over channels; TFLite sums
    ``2 * radius + 1`` channels and scales by ``alpha`` itself."""
    size = int(ctx.attrs["size"])
    ctx.op("LOCAL_RESPONSE_NORMALIZATION", [ctx.input(0, NCHW_TO_NHWC)], [ctx.output(0, NCHW_TO_NHWC)],
           options="LocalResponseNormalizationOptions", radius=(size - 1) // 2,
           bias=float(ctx.attrs.get("bias", 1.0)), alpha=float(ctx.attrs.get("alpha", 1e-4)) / size,
           beta=float(ctx.attrs.get("beta", 0.75)))
