"""``edgeinfer::CaffeDetectionOutput``: Caffe-SSD's per-class NMS and keep_top_k, and its lowering.

``CaffeDetectionOutput(boxes, scores) -> detections``

- ``boxes``: float ``[N, L, P, 4]``, decoded boxes ``(xmin, ymin, xmax, ymax)`` of ``P``
  priors, shared by every class (``L = 1``) or one set per class (``L = C``).
- ``scores``: float ``[N, C, P]``, class confidences.
- attributes: ``background_label_id`` (default 0; a label outside ``[0, C)`` means none),
  ``confidence_threshold`` (default ``-FLT_MAX``), ``nms_threshold`` (0.3), ``top_k`` (-1),
  ``eta`` (1.0), ``keep_top_k`` (-1), ``normalized`` (1).
- ``detections``: float ``[1, 1, M, 7]``, rows ``[image, label, score, xmin, ymin, xmax, ymax]``.

Per image and per class ``c`` other than the background (Caffe's ``ApplyNMSFast``):

1. candidates: priors whose score is ``> confidence_threshold``, sorted by score descending,
   ties by prior index (a stable sort); the first ``top_k`` of them when ``top_k > -1``.
2. greedy NMS: walk the candidates in order; keep one when its overlap with every box kept
   so far is ``<= t``, where ``t`` starts at ``nms_threshold`` and after each keep becomes
   ``t * eta`` while ``eta < 1`` and ``t > 0.5`` (float32 arithmetic, as Caffe's).
   Overlap (Caffe's ``JaccardOverlap``): with ``iw = min(xmax) - max(xmin)`` and ``ih``
   alike, ``inter / (area_a + area_b - inter)`` when ``iw > 0 and ih > 0``, else 0, with
   ``inter = iw * ih`` and ``area = w * h``. With ``normalized = 0`` (OpenCV's pixel
   coordinates), boxes overlap when ``iw >= 0 and ih >= 0`` and every width and height
   counts one more (``(iw + 1) * (ih + 1)``, ``(w + 1) * (h + 1)``).

Then, when ``keep_top_k > -1`` and an image has more detections than that, only its
``keep_top_k`` highest-scoring ones (over every class; ties by class, then by NMS order)
stay. Rows are ordered by image, then label, then score (NMS order), as Caffe writes them.
An image set with no detection at all gives Caffe's placeholder: one row
``[i, -1, -1, -1, -1, -1, -1]`` per image.

The lowering is exact in standard ONNX: per-class candidates by ``TopK`` (which breaks ties by
the lower index, the stable order), the greedy walk as a ``Loop`` over candidate ranks run for
every (image, class) at once with the kept mask and the adaptive thresholds as loop-carried
state, keep_top_k by ``TopK`` over the masked scores, and the rows gathered in mask order
(``NonZero`` walks image, class, rank: Caffe's order).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from edgeinfer.ir.graph import EDGEINFER_DOMAIN, Graph, Node, Value
from edgeinfer.ir.infer import type_rule
from edgeinfer.ir.lowering import LOWERINGS, Lowered, LoweringContext

OP_TYPE = "CaffeDetectionOutput"
NO_THRESHOLD = float(-np.finfo(np.float32).max)  # Caffe's default: every score is a candidate
DEFAULTS = {"background_label_id": 0, "confidence_threshold": NO_THRESHOLD, "nms_threshold": 0.3,
            "top_k": -1, "eta": 1.0, "keep_top_k": -1, "normalized": 1}


def detection_attrs(attrs) -> dict:
    """The node's attributes with the op's defaults filled in."""
    return {key: type(default)(attrs.get(key, default)) for key, default in DEFAULTS.items()}


@type_rule(OP_TYPE, EDGEINFER_DOMAIN)
def _detection_type(node: Node, inputs: Sequence[Value]) -> list[tuple]:
    return [(inputs[1].dtype, (1, 1, None, 7))]


class _Emitter:
    """Nodes of one lowering, into ``nodes`` (the main graph or the loop body)."""

    def __init__(self, ctx: LoweringContext, out: Lowered, prefix: str, nodes: list[Node]):
        self.ctx, self.out, self.prefix, self.nodes = ctx, out, prefix, nodes

    def fresh(self, tag: str) -> str:
        return self.ctx.fresh(f"{self.prefix}__{tag}")

    def __call__(self, op_type: str, inputs: Sequence[str], tag: str, *, out: str | None = None,
                 outputs: int = 1, **attrs) -> str | list[str]:
        names = [out or self.fresh(tag)] if outputs == 1 else [self.fresh(f"{tag}{i}") for i in range(outputs)]
        self.nodes.append(Node(op_type, list(inputs), names, attrs))
        return names[0] if outputs == 1 else names

    def const(self, tag: str, array, dtype=np.float32) -> str:
        return self.out.const(self.ctx, f"{self.prefix}__{tag}", array, dtype)

    def ints(self, tag: str, values) -> str:
        return self.const(tag, np.asarray(values, np.int64), np.int64)

    def reduce(self, op_type: str, x: str, tag: str, axes: Sequence[int] | None = None) -> str:
        """A reduction without kept dims; ``axes`` as an input from the opset that takes it."""
        if axes is None:
            return self(op_type, [x], tag, keepdims=0)
        if self.ctx.opset >= (13 if op_type == "ReduceSum" else 18):
            return self(op_type, [x, self.ints(f"{tag}_axes", list(axes))], tag, keepdims=0)
        return self(op_type, [x], tag, keepdims=0, axes=tuple(axes))


def _overlap(e: _Emitter, box: str, boxes: str, normalized: bool) -> str:
    """Caffe's overlap of ``box [.., 1, 4]`` with each of ``boxes [.., K, 4]`` -> ``[.., K]``."""
    lo_i, hi_i = e("Split", [box, e.ints("two_two", [2, 2])], "box_split", outputs=2, axis=-1)
    lo_j, hi_j = e("Split", [boxes, e.ints("two_two_b", [2, 2])], "boxes_split", outputs=2, axis=-1)
    extent = e("Sub", [e("Min", [hi_i, hi_j], "inter_hi"), e("Max", [lo_i, lo_j], "inter_lo")], "inter_extent")
    zero = e.const("zero", 0.0)
    valid = e("Greater" if normalized else "GreaterOrEqual", [extent, zero], "extent_valid")
    overlapping = e.reduce("ReduceMin", e("Cast", [valid], "valid_int", to=6), "overlapping_int", [-1])
    sides_i = e("Sub", [hi_i, lo_i], "sides_i")
    sides_j = e("Sub", [hi_j, lo_j], "sides_j")
    if not normalized:
        one = e.const("one", 1.0)
        extent = e("Add", [extent, one], "extent_plus_one")
        sides_i = e("Add", [sides_i, one], "sides_i_plus_one")
        sides_j = e("Add", [sides_j, one], "sides_j_plus_one")
    inter = e.reduce("ReduceProd", extent, "inter", [-1])
    area_i = e.reduce("ReduceProd", sides_i, "area_i", [-1])
    area_j = e.reduce("ReduceProd", sides_j, "area_j", [-1])
    union = e("Sub", [e("Add", [area_i, area_j], "area_sum"), inter], "union")
    ratio = e("Div", [inter, union], "ratio")
    return e("Where", [e("Cast", [overlapping], "overlapping", to=9), ratio, zero], "overlap")


def _nms_body(ctx: LoweringContext, out: Lowered, prefix: str, attrs: dict, cand_boxes: str,
              valid: str, ranks: str) -> Graph:
    """Loop body, one candidate rank per iteration for every (image, class) at once.
    State: ``kept [N, C, K]`` bool and ``threshold [N, C]`` float; outer: candidate boxes
    ``[N, C, K, 4]``, ``valid [N, C, K]`` bool and ``ranks [K]`` int64."""
    nodes: list[Node] = []
    e = _Emitter(ctx, out, prefix, nodes)
    step, cond_in, kept, threshold = (e.fresh(t) for t in ("step", "cond_in", "kept_in", "threshold_in"))
    cond_out, kept_out, threshold_out = (e.fresh(t) for t in ("cond_out", "kept_out", "threshold_out"))
    box = e("Gather", [cand_boxes, e("Unsqueeze", [step, e.ints("axis0", [0])], "step_1d")], "box", axis=2)
    overlap = _overlap(e, box, cand_boxes, bool(attrs["normalized"]))  # [N, C, K]
    limit = e("Unsqueeze", [threshold, e.ints("axis_last", [-1])], "limit")
    clash = e("And", [kept, e("Greater", [overlap, limit], "above")], "clash")
    suppressed = e("Cast", [e.reduce("ReduceMax", e("Cast", [clash], "clash_int", to=6), "suppressed_int", [-1])],
                   "suppressed", to=9)
    candidate = e("Squeeze", [e("Gather", [valid, e("Unsqueeze", [step, e.ints("axis0_b", [0])], "step_1d_b")],
                                "valid_step", axis=2), e.ints("axis_last_b", [-1])], "candidate")
    keep = e("And", [candidate, e("Not", [suppressed], "not_suppressed")], "keep")
    here = e("Equal", [ranks, step], "here")  # [K]
    placed = e("And", [e("Unsqueeze", [keep, e.ints("axis_last_c", [-1])], "keep_col"), here], "placed")
    e("Or", [kept, placed], "kept", out=kept_out)
    if attrs["eta"] < 1:
        shrink = e("And", [keep, e("Greater", [threshold, e.const("half", 0.5)], "above_half")], "shrink")
        scaled = e("Mul", [threshold, e.const("eta", attrs["eta"])], "scaled")
        e("Where", [shrink, scaled, threshold], "threshold", out=threshold_out)
    else:
        e("Identity", [threshold], "threshold", out=threshold_out)
    e("Identity", [cond_in], "cond", out=cond_out)
    inputs = [Value(step, "int64", ()), Value(cond_in, "bool", ()), Value(kept, "bool", None),
              Value(threshold, "float32", None)]
    outputs = [Value(cond_out, "bool", ()), Value(kept_out, "bool", None), Value(threshold_out, "float32", None)]
    return Graph(nodes, inputs, outputs, {}, name=f"{prefix}_nms_body")


def lower_caffe_detection_output(node: Node, ctx: LoweringContext) -> Lowered:
    attrs = detection_attrs(node.attrs)
    boxes, scores = node.inputs[0], node.inputs[1]
    prefix = node.outputs[0]
    out = Lowered([])
    e = _Emitter(ctx, out, prefix, out.nodes)
    # per-class scores without the background class; labels keeps the real class ids
    scores_shape = e("Shape", [scores], "scores_shape")
    classes = e("Gather", [scores_shape, e.ints("i1", 1)], "classes", axis=0)
    label_range = e("Range", [e.ints("i0", 0), classes, e.ints("i1b", 1)], "labels_all")
    background = e.ints("background", attrs["background_label_id"])
    foreground = e("Not", [e("Equal", [label_range, background], "is_background")], "foreground")
    labels = e("Compress", [label_range, foreground], "labels", axis=0)
    class_scores = e("Gather", [scores, labels], "class_scores", axis=1)  # [N, C', P]
    boxes_shape = e("Shape", [boxes], "boxes_shape")
    per_class = e("Greater", [e("Gather", [boxes_shape, e.ints("i1c", 1)], "loc_classes", axis=0),
                              e.ints("i1d", 1)], "per_class")
    loc_index = e("Where", [per_class, labels, e("Mul", [labels, e.ints("i0b", 0)], "zeros_like_labels")],
                  "loc_index")
    class_boxes = e("Gather", [boxes, loc_index], "class_boxes", axis=1)  # [N, C', P, 4]
    # candidates: the top_k highest scores per class (stable), above the confidence threshold
    priors = e("Gather", [e("Shape", [scores], "scores_shape_b"), e.ints("i2", [2])], "priors", axis=0)
    k = priors if attrs["top_k"] < 0 else e("Min", [priors, e.ints("top_k", [attrs["top_k"]])], "k")
    sorted_scores, order = e("TopK", [class_scores, k], "topk", outputs=2, axis=-1, largest=1, sorted=1)
    valid = e("Greater", [sorted_scores, e.const("confidence", attrs["confidence_threshold"])], "valid")
    order_4 = e("Expand", [e("Unsqueeze", [order, e.ints("axis_last", [-1])], "order_col"),
                           e("Concat", [e("Shape", [order], "order_shape"), e.ints("four", [4])], "shape4",
                                 axis=0)], "order4")
    cand_boxes = e("GatherElements", [class_boxes, order_4], "cand_boxes", axis=2)  # [N, C', K, 4]
    # the greedy walk, for as many ranks as the longest candidate list
    counts = e.reduce("ReduceSum", e("Cast", [valid], "valid_int", to=7), "valid_counts", [-1])
    trips = e.reduce("ReduceMax", counts, "trips")
    ranks = e("Range", [e.ints("r0", 0), e("Squeeze", [k], "k_scalar"), e.ints("r1", 1)], "ranks")
    kept0 = e("ConstantOfShape", [e("Shape", [valid], "valid_shape")], "kept0", value=np.zeros(1, np.bool_))
    pairs = e("Slice", [e("Shape", [valid], "valid_shape_b"), e.ints("s0", [0]), e.ints("s2", [2])], "pairs")
    threshold0 = e("Expand", [e.const("nms_threshold", attrs["nms_threshold"]), pairs], "threshold0")
    body = _nms_body(ctx, out, prefix, attrs, cand_boxes, valid, ranks)
    kept, _ = e("Loop", [trips, e.const("true", True, np.bool_), kept0, threshold0], "nms", outputs=2, body=body)
    # keep_top_k over the kept boxes of each image, then the rows in mask order
    if attrs["keep_top_k"] > -1:
        kept = _keep_top_k(e, kept, sorted_scores, attrs["keep_top_k"])
    hits = e("Transpose", [e("NonZero", [kept], "hits_t")], "hits", perm=(1, 0))  # [M, 3]: image, class, rank
    image = e("Cast", [e("Gather", [hits, e.ints("c0", 0)], "hit_image", axis=1)], "image", to=1)
    label = e("Cast", [e("Gather", [labels, e("Gather", [hits, e.ints("c1", 1)], "hit_class", axis=1)],
                         "hit_label", axis=0)], "label", to=1)
    score = e("GatherND", [sorted_scores, hits], "score")
    box = e("GatherND", [cand_boxes, hits], "hit_box")
    column = e.ints("axis_last_b", [-1])
    rows = e("Concat", [e("Unsqueeze", [image, column], "image_col"), e("Unsqueeze", [label, column], "label_col"),
                        e("Unsqueeze", [score, column], "score_col"), box], "rows", axis=1)
    # no detection at all: one [i, -1, ...] row per image (Caffe's placeholder)
    images = e("Gather", [scores_shape, e.ints("i0c", [0])], "images", axis=0)
    image_ids = e("Cast", [e("Range", [e.ints("z", 0), e("Squeeze", [images], "images_scalar"), e.ints("o", 1)],
                             "image_range")], "image_ids", to=1)
    filler = e("Expand", [e.const("minus_ones", -np.ones((1, 6), np.float32)),
                          e("Concat", [images, e.ints("six", [6])], "filler_shape", axis=0)], "filler")
    placeholder = e("Concat", [e("Unsqueeze", [image_ids, column], "image_ids_col"), filler], "placeholder", axis=1)
    found = e("Gather", [e("Shape", [hits], "hits_shape"), e.ints("c0b", [0])], "found", axis=0)
    start = e("Mul", [images, e("Cast", [e("Greater", [found, e.ints("zero_i", [0])], "any_found")], "any_int",
                                     to=7)], "start")
    stacked = e("Concat", [placeholder, rows], "stacked", axis=0)
    chosen = e("Slice", [stacked, start, e.ints("end", [np.iinfo(np.int64).max]), e.ints("axis0c", [0])], "chosen")
    e("Reshape", [chosen, e.ints("out_shape", [1, 1, -1, 7])], "out", out=node.outputs[0])
    return out


def _keep_top_k(e: _Emitter, kept: str, sorted_scores: str, keep_top_k: int) -> str:
    """``kept`` limited to the ``keep_top_k`` highest kept scores of each image."""
    if keep_top_k == 0:
        return e("And", [kept, e("Not", [kept], "not_kept")], "none_kept")
    masked = e("Reshape", [e("Where", [kept, sorted_scores, e.const("lowest", -np.inf)], "masked"),
                           e.ints("flat_shape", [0, -1])], "masked_flat")  # [N, C' * K]
    width = e("Gather", [e("Shape", [masked], "masked_shape"), e.ints("w1", [1])], "width", axis=0)
    k = e("Min", [width, e.ints("keep_top_k", [keep_top_k])], "keep_k")
    _, best = e("TopK", [masked, k], "best", outputs=2, axis=-1, largest=1, sorted=1)
    zeros = e("ConstantOfShape", [e("Shape", [masked], "masked_shape_b")], "zeros",
              value=np.zeros(1, np.float32))
    ones = e("ConstantOfShape", [e("Shape", [best], "best_shape")], "ones", value=np.ones(1, np.float32))
    chosen = e("ScatterElements", [zeros, best, ones], "chosen_flat", axis=1)
    selected = e("Reshape", [e("Greater", [chosen, e.const("zero_k", 0.0)], "chosen_bool"),
                             e("Shape", [kept], "kept_shape")], "selected")
    return e("And", [kept, selected], "top_kept")


LOWERINGS.register(OP_TYPE, lower_caffe_detection_output, domain=EDGEINFER_DOMAIN)
