"""Interp (PSPNet/DeepLab) and single-bottom Upsample (YOLO-style Caffe forks).

Interp crops ``pad_beg``/``pad_end`` (both <= 0) from the input, then resizes bilinearly with
corners aligned (source position ``(in - 1) / (out - 1) * i``) to a size given by
``height``/``width``, ``zoom_factor`` (``out = in + (in - 1)(zoom - 1)``), ``shrink_factor``
(``out = (in - 1) / shrink + 1``, integer division), shrink then zoom, or a second bottom's
spatial size: ONNX Resize with ``coordinate_transformation_mode=align_corners``.

Upsample with one bottom repeats each pixel ``scale`` times (nearest neighbour). SegNet's
Upsample with a second bottom (a pooling mask) is max-unpooling and is not supported; nor is
a size-based Upsample, whose rounding differs between forks.
"""

from __future__ import annotations

from edgeinfer.converters.caffe.builder import LayerContext, layer


def _interp_size(ctx: LayerContext, size: int, param, axis_field: str) -> int:
    zoom, shrink = param.HasField("zoom_factor"), param.HasField("shrink_factor")
    if zoom and param.zoom_factor < 1 or shrink and param.shrink_factor < 1:
        raise ctx.invalid("zoom_factor and shrink_factor must be >= 1")
    if shrink:
        size = (size - 1) // param.shrink_factor + 1
    if zoom:
        size = size + (size - 1) * (param.zoom_factor - 1)
    if not (zoom or shrink):
        size = getattr(param, axis_field)
    return size


@layer("Interp")
def interp(ctx: LayerContext) -> None:
    ctx.expect_bottoms(1, 2)
    ctx.expect_tops(1)
    param = ctx.param("interp_param")
    shape = ctx.shape()
    if len(shape) != 4:
        raise ctx.unsupported(f"Interp of a rank-{len(shape)} input; expected NCHW")
    if param.pad_beg > 0 or param.pad_end > 0:
        raise ctx.invalid(f"expected pad_beg and pad_end <= 0 (crops), found {param.pad_beg}, {param.pad_end}")
    by_size = param.HasField("height") and param.HasField("width")
    by_factor = param.HasField("zoom_factor") or param.HasField("shrink_factor")
    specs = int(by_size) + int(by_factor) + int(len(ctx.inputs) == 2)
    if specs != 1:
        raise ctx.invalid("expected exactly one of height/width, zoom_factor/shrink_factor or a second bottom")
    value = ctx.inputs[0]
    height, width = (dim + param.pad_beg + param.pad_end for dim in shape[2:])
    if height < 1 or width < 1:
        raise ctx.invalid(f"pads {param.pad_beg}, {param.pad_end} crop away the whole input {list(shape)}")
    if param.pad_beg or param.pad_end:
        begin = -param.pad_beg
        value = ctx.node("Slice", [value, ctx.ints([begin, begin], "starts"),
                                   ctx.ints([begin + height, begin + width], "ends"), ctx.ints([2, 3], "axes")],
                         suffix="crop")
    if len(ctx.inputs) == 2:
        out_h, out_w = ctx.shape(1)[2:]
    else:
        out_h, out_w = _interp_size(ctx, height, param, "height"), _interp_size(ctx, width, param, "width")
    if out_h < 1 or out_w < 1:
        raise ctx.invalid(f"output size {out_h}x{out_w} is empty")
    attrs = {"mode": "linear", "coordinate_transformation_mode": "align_corners"}
    if ctx.builder.dynamic_batch:  # N and C from the tensor itself
        leading = ctx.node("Slice", [ctx.node("Shape", [value]), ctx.ints([0], "zero"), ctx.ints([2], "two")])
        sizes = ctx.node("Concat", [leading, ctx.ints([out_h, out_w], "spatial")], {"axis": 0}, suffix="sizes")
    else:
        sizes = ctx.ints([shape[0], shape[1], out_h, out_w], "sizes")
    ctx.node("Resize", [value, "", "", sizes], attrs, top=0)


@layer("Upsample")
def upsample(ctx: LayerContext) -> None:
    ctx.expect_tops(1)
    if len(ctx.inputs) != 1:
        raise ctx.unsupported("Upsample with a mask bottom (SegNet max-unpooling) is not supported")
    param = ctx.param("upsample_param")
    if param.HasField("upsample_h") or param.HasField("upsample_w"):
        raise ctx.unsupported("Upsample to an explicit upsample_h/upsample_w size is ambiguous between Caffe "
                              "forks; only integer scale factors are supported")
    scale_h = param.scale_h if param.HasField("scale_h") else param.scale
    scale_w = param.scale_w if param.HasField("scale_w") else param.scale
    if scale_h < 1 or scale_w < 1:
        raise ctx.invalid(f"expected scale factors >= 1, found {scale_h}, {scale_w}")
    if len(ctx.shape()) != 4:
        raise ctx.unsupported(f"Upsample of a rank-{len(ctx.shape())} input; expected NCHW")
    attrs = {"mode": "nearest", "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}
    scales = ctx.const([1.0, 1.0, float(scale_h), float(scale_w)], "scales")
    ctx.node("Resize", [ctx.inputs[0], "", scales], attrs, top=0)
