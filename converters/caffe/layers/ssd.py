"""PriorBox and DetectionOutput (SSD).

PriorBox: the anchor boxes of one feature map, computed once at conversion time.

The boxes depend only on the shapes of the feature map (bottom 0) and the image (bottom 1),
which are static in a Caffe net, so the layer becomes a constant of shape
``(1, 2, H * W * priors * 4)``: channel 0 holds the boxes (xmin, ymin, xmax, ymax, normalized
by the image size), channel 1 their variances. Per cell and per ``min_size`` the order is:
the square box of ``min_size``, the square box of ``sqrt(min_size * max_size)``, then one
box per aspect ratio other than 1 (``flip`` adds each ratio's reciprocal).

DetectionOutput (bottoms: location predictions, confidences, priors, and with OpenCV's
``clip`` of pixel boxes the image): the boxes are decoded from the priors with standard ops,
per ``code_type`` (``v`` the prior's variance, or 1 with ``variance_encoded_in_target``; ``p``
the prior box, its size ``pw, ph`` one larger in CENTER_SIZE with ``normalized_bbox: false``)::

    CORNER       min = p.min + v * loc.min                 max = p.max + v * loc.max
    CENTER_SIZE  c = p.min + p.size / 2 + v * loc.xy * p.size,   size = exp(v * loc.wh) * p.size,
                 min = c - size / 2                        max = c + size / 2
    CORNER_SIZE  min = p.min + v * loc.min * p.size        max = p.max + v * loc.max * p.size

then clipped to the image with ``clip``; per-class NMS, keep_top_k and the output rows are
``edgeinfer::CaffeDetectionOutput`` (defined in ``edgeinfer.ir.lowering_detection``). Where
OpenCV departs from Caffe-SSD, Caffe's meaning is kept: a missing ``confidence_threshold``
admits every box (OpenCV: scores above 0), ``eta`` adapts the NMS threshold (OpenCV ignores
it), ``top_k: 0`` keeps no candidate (OpenCV: all), CORNER_SIZE decodes as above (OpenCV has no
CORNER_SIZE), rows are grouped by class (OpenCV sorts an image's rows by score) and an empty
result is one ``[i, -1, ...]`` row per image (OpenCV: ``keep_top_k * N`` rows of zeros).
"""

from __future__ import annotations

import numpy as np

from edgeinfer.converters.caffe.builder import LayerContext, layer
from edgeinfer.ir.graph import EDGEINFER_DOMAIN
from edgeinfer.ir.lowering_detection import NO_THRESHOLD, OP_TYPE


def _aspect_ratios(param) -> list[float]:
    ratios = [1.0]
    for ratio in param.aspect_ratio:
        if any(abs(ratio - known) < 1e-6 for known in ratios):
            continue
        ratios.append(float(ratio))
        if param.flip:
            ratios.append(1.0 / float(ratio))
    return ratios


def _box_sizes(ctx: LayerContext, param) -> np.ndarray:
    """(priors, 2) widths and heights, in the order Caffe-SSD emits them."""
    min_sizes, max_sizes = list(param.min_size), list(param.max_size)
    if not min_sizes or any(s <= 0 for s in min_sizes):
        raise ctx.invalid(f"expected positive min_size values, found {min_sizes}")
    if max_sizes and len(max_sizes) != len(min_sizes):
        raise ctx.invalid(f"expected as many max_size ({len(max_sizes)}) as min_size ({len(min_sizes)}) values")
    if any(big <= small for small, big in zip(min_sizes, max_sizes, strict=False)):
        raise ctx.invalid(f"expected each max_size above its min_size, found {min_sizes} / {max_sizes}")
    sizes = []
    for index, small in enumerate(min_sizes):
        sizes.append((small, small))
        if max_sizes:
            side = float(np.sqrt(small * max_sizes[index]))
            sizes.append((side, side))
        for ratio in _aspect_ratios(param):
            if abs(ratio - 1.0) < 1e-6:
                continue
            sizes.append((small * np.sqrt(ratio), small / np.sqrt(ratio)))
    return np.asarray(sizes, dtype=np.float64)


def prior_boxes(ctx: LayerContext, param, layer_hw: tuple[int, int], image_hw: tuple[int, int]) -> np.ndarray:
    height, width = layer_hw
    if param.HasField("img_h") or param.HasField("img_w"):
        image_h, image_w = param.img_h, param.img_w
    elif param.HasField("img_size"):
        image_h = image_w = param.img_size
    else:
        image_h, image_w = image_hw
    if param.HasField("step_h") or param.HasField("step_w"):
        step_h, step_w = param.step_h, param.step_w
    elif param.HasField("step"):
        step_h = step_w = param.step
    else:
        step_h, step_w = image_h / height, image_w / width
    sizes = _box_sizes(ctx, param)
    center_y = (np.arange(height, dtype=np.float64) + param.offset) * step_h
    center_x = (np.arange(width, dtype=np.float64) + param.offset) * step_w
    cy, cx = np.meshgrid(center_y, center_x, indexing="ij")  # (H, W)
    half_w, half_h = sizes[:, 0] / 2, sizes[:, 1] / 2  # (P,)
    boxes = np.stack([(cx[..., None] - half_w) / image_w, (cy[..., None] - half_h) / image_h,
                      (cx[..., None] + half_w) / image_w, (cy[..., None] + half_h) / image_h], axis=-1)
    boxes = boxes.astype(np.float32).reshape(-1)  # (H, W, P, 4) flattened, Caffe's order
    if param.clip:
        boxes = np.clip(boxes, 0.0, 1.0)
    variances = [float(v) for v in param.variance] or [0.1]
    if len(variances) not in (1, 4) or any(v <= 0 for v in variances):
        raise ctx.invalid(f"expected 1 or 4 positive variances, found {variances}")
    variance = np.resize(np.asarray(variances, np.float32), boxes.shape)
    return np.stack([boxes, variance])[None]


@layer("PriorBox")
def prior_box(ctx: LayerContext) -> None:
    ctx.expect_bottoms(2)
    ctx.expect_tops(1)
    feature, image = ctx.shape(0), ctx.shape(1)
    if len(feature) != 4 or len(image) != 4:
        raise ctx.invalid(f"expected NCHW bottoms, found shapes {list(feature)} and {list(image)}")
    boxes = prior_boxes(ctx, ctx.param("prior_box_param"), feature[2:], image[2:])
    ctx.identity(ctx.const(boxes, "boxes"))


_CODE_TYPES = {1: "CORNER", 2: "CENTER_SIZE", 3: "CORNER_SIZE"}


def _detection_sizes(ctx: LayerContext, classes: int, loc_classes: int, encoded: bool) -> tuple[int, int, int]:
    """(images, priors, prior channels), checked against the bottoms' shapes."""
    loc, conf, priors = ctx.shape(0), ctx.shape(1), ctx.shape(2)
    if len(priors) != 3 or priors[0] != 1 or priors[2] % 4:
        raise ctx.invalid(f"expected priors of shape [1, 2, 4 * priors], found {list(priors)}")
    count, channels = priors[2] // 4, priors[1]
    if channels not in ((1, 2) if encoded else (2,)):
        raise ctx.invalid(f"expected priors with {'1 or 2 channels' if encoded else '2 channels (boxes, variances)'}"
                          f", found {channels}")
    images = loc[0]
    per_image = {"location": (loc, count * loc_classes * 4), "confidence": (conf, count * classes)}
    for what, (shape, expected) in per_image.items():
        if shape[0] != images or int(np.prod(shape[1:], dtype=np.int64)) != expected:
            raise ctx.invalid(f"expected {what} predictions of shape [{images}, {expected}] for {count} priors and "
                              f"{classes} classes, found {list(shape)}")
    return images, count, channels


def _pair(ctx: LayerContext, value: str, start: int, suffix: str) -> str:
    """Coordinates ``[start, start + 2)`` of the last axis: (x, y) of a box's min or max."""
    return ctx.node("Slice", [value, ctx.ints([start], "start"), ctx.ints([start + 2], "end"), ctx.ints([-1], "axis")],
                    suffix=suffix)


def _decode(ctx: LayerContext, loc: str, prior: str, variance: str | None, code: str, normalized: bool) -> str:
    """Decoded boxes ``[N, L, P, 4]`` from predictions ``[N, L, P, 4]`` and priors ``[1, 1, P, 4]``."""
    offsets = loc if variance is None else ctx.node("Mul", [loc, variance], suffix="scaled")
    low, high = _pair(ctx, offsets, 0, "offset_min"), _pair(ctx, offsets, 2, "offset_max")
    prior_min, prior_max = _pair(ctx, prior, 0, "prior_min"), _pair(ctx, prior, 2, "prior_max")
    if code == "CORNER":
        return ctx.node("Concat", [ctx.node("Add", [prior_min, low], suffix="box_min"),
                                   ctx.node("Add", [prior_max, high], suffix="box_max")], {"axis": -1},
                        suffix="boxes")
    size = ctx.node("Sub", [prior_max, prior_min], suffix="prior_size")
    if code == "CORNER_SIZE":
        return ctx.node("Concat", [ctx.node("Add", [prior_min, ctx.node("Mul", [low, size])], suffix="box_min"),
                                   ctx.node("Add", [prior_max, ctx.node("Mul", [high, size])], suffix="box_max")],
                        {"axis": -1}, suffix="boxes")
    if not normalized:  # pixel boxes count both end pixels (OpenCV)
        size = ctx.node("Add", [size, ctx.const(1.0, "one")], suffix="prior_pixels")
    half = ctx.const(0.5, "half")
    center = ctx.node("Add", [prior_min, ctx.node("Mul", [size, half])], suffix="prior_center")
    center = ctx.node("Add", [ctx.node("Mul", [low, size]), center], suffix="box_center")
    extent = ctx.node("Mul", [ctx.node("Mul", [ctx.node("Exp", [high]), size], suffix="box_size"), half],
                      suffix="box_half")
    return ctx.node("Concat", [ctx.node("Sub", [center, extent], suffix="box_min"),
                               ctx.node("Add", [center, extent], suffix="box_max")], {"axis": -1}, suffix="boxes")


def _clip(ctx: LayerContext, boxes: str, normalized: bool) -> str:
    """OpenCV's ``clip``: each coordinate into [0, 1], or into the image's pixels (bottom 3)."""
    if normalized:
        upper = [1.0, 1.0, 1.0, 1.0]
    elif len(ctx.inputs) == 4 and len(ctx.shape(3)) == 4:
        height, width = ctx.shape(3)[2:]
        upper = [width - 1, height - 1, width - 1, height - 1]
    else:
        raise ctx.invalid("clip with normalized_bbox: false needs the image as bottom 3 (NCHW) for its size")
    capped = ctx.node("Min", [boxes, ctx.const(upper, "clip_max")], suffix="clip_max")
    return ctx.node("Max", [capped, ctx.const(0.0, "clip_min")], suffix="clip")


@layer("DetectionOutput")
def detection_output(ctx: LayerContext) -> None:
    ctx.expect_bottoms(3, 4)
    ctx.expect_tops(1)
    param = ctx.param("detection_output_param")
    classes = int(param.num_classes)
    if not param.HasField("num_classes") or classes < 1:
        raise ctx.invalid(f"expected num_classes >= 1, found {classes if param.HasField('num_classes') else 'none'}")
    nms = param.nms_param
    if nms.nms_threshold < 0 or not 0 < nms.eta <= 1:
        raise ctx.invalid(f"expected nms_threshold >= 0 and 0 < eta <= 1, found {nms.nms_threshold} and {nms.eta}")
    code = _CODE_TYPES[param.code_type]
    loc_classes = 1 if param.share_location else classes
    encoded, normalized = bool(param.variance_encoded_in_target), bool(param.normalized_bbox)
    images, priors, channels = _detection_sizes(ctx, classes, loc_classes, encoded)
    loc = ctx.node("Transpose", [ctx.reshape(ctx.inputs[0], [images, priors, loc_classes, 4], suffix="loc")],
                   {"perm": (0, 2, 1, 3)}, suffix="loc_by_class")
    prior_blob = ctx.node("Reshape", [ctx.inputs[2], ctx.ints([1, channels, priors, 4], "prior_shape")],
                          suffix="priors")
    prior = ctx.node("Slice", [prior_blob, ctx.ints([0], "c0"), ctx.ints([1], "c1"), ctx.ints([1], "axis1")],
                     suffix="prior_boxes")
    variance = None if encoded else ctx.node(
        "Slice", [prior_blob, ctx.ints([1], "v0"), ctx.ints([2], "v1"), ctx.ints([1], "axis1b")], suffix="variances")
    boxes = _decode(ctx, loc, prior, variance, code, normalized)
    if param.clip:
        boxes = _clip(ctx, boxes, normalized)
    scores = ctx.node("Transpose", [ctx.reshape(ctx.inputs[1], [images, priors, classes], suffix="conf")],
                      {"perm": (0, 2, 1)}, suffix="scores")
    attrs = {"background_label_id": int(param.background_label_id),
             "confidence_threshold": float(param.confidence_threshold) if param.HasField("confidence_threshold")
             else NO_THRESHOLD,
             "nms_threshold": float(nms.nms_threshold), "top_k": int(nms.top_k) if nms.HasField("top_k") else -1,
             "eta": float(nms.eta), "keep_top_k": int(param.keep_top_k), "normalized": int(normalized)}
    ctx.node(OP_TYPE, [boxes, scores], attrs, top=0, domain=EDGEINFER_DOMAIN)
