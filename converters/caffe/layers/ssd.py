"""PriorBox (SSD): the anchor boxes of one feature map, computed once at conversion time.

The boxes depend only on the shapes of the feature map (bottom 0) and the image (bottom 1),
which are static in a Caffe net, so the layer becomes a constant of shape
``(1, 2, H * W * priors * 4)``: channel 0 holds the boxes (xmin, ymin, xmax, ymax, normalized
by the image size), channel 1 their variances. Per cell and per ``min_size`` the order is:
the square box of ``min_size``, the square box of ``sqrt(min_size * max_size)``, then one
box per aspect ratio other than 1 (``flip`` adds each ratio's reciprocal).
"""

from __future__ import annotations

import numpy as np

from edgeinfer.converters.caffe.builder import LayerContext, layer


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
