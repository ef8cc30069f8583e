"""``edgeinfer::CaffeDetectionOutput``: Caffe-SSD's per-class NMS and keep_top_k (semantics:
``edgeinfer.ir.lowering_detection``).

Greedy NMS visits only the boxes it keeps: keeping a box suppresses every later candidate that
overlaps it by more than the current threshold, in one vectorized step, and the walk jumps to
the next candidate still standing. With ``eta < 1`` the threshold only falls, so a candidate
suppressed earlier stays suppressed; one still standing is checked again against every kept
box at the threshold of its own turn, which is exactly Caffe's walk.
"""

from __future__ import annotations

import numpy as np

from edgeinfer.backends.numpy.registry import kernel
from edgeinfer.ir.lowering_detection import DEFAULTS

_HALF = np.float32(0.5)


def _overlap(box: np.ndarray, boxes: np.ndarray, normalized: bool) -> np.ndarray:
    """Caffe's overlap of ``box [4]`` with each row of ``boxes [K, 4]``, in float32."""
    extent = np.minimum(box[2:], boxes[:, 2:]) - np.maximum(box[:2], boxes[:, :2])
    overlapping = (extent > 0).all(axis=1) if normalized else (extent >= 0).all(axis=1)
    if not normalized:
        extent = extent + np.float32(1)
    inter = extent[:, 0] * extent[:, 1]
    sides_a = box[2:] - box[:2] + np.float32(0 if normalized else 1)
    sides_b = boxes[:, 2:] - boxes[:, :2] + np.float32(0 if normalized else 1)
    union = (sides_a[0] * sides_a[1] + sides_b[:, 0] * sides_b[:, 1]) - inter
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(overlapping, inter / union, np.float32(0))


def _candidates(scores: np.ndarray, threshold: float, top_k: int) -> np.ndarray:
    order = np.argsort(-scores, kind="stable")
    order = order[scores[order] > np.float32(threshold)]
    return order if top_k < 0 else order[:top_k]


def greedy_nms(boxes: np.ndarray, scores: np.ndarray, *, confidence_threshold: float, nms_threshold: float,
               top_k: int, eta: float, normalized: bool) -> np.ndarray:
    """Prior indices Caffe's ``ApplyNMSFast`` keeps, in its order (score descending)."""
    order = _candidates(scores, confidence_threshold, top_k)
    ranked = boxes[order]
    standing = np.ones(len(order), dtype=bool)
    threshold, factor = np.float32(nms_threshold), np.float32(eta)
    kept: list[int] = []
    rank = 0
    while True:
        remaining = np.flatnonzero(standing[rank:])
        if not remaining.size:
            break
        rank += int(remaining[0])
        standing[rank] = False
        if kept and eta < 1 and (_overlap(ranked[rank], ranked[kept], normalized) > threshold).any():
            continue
        kept.append(rank)
        standing[rank + 1:] &= _overlap(ranked[rank], ranked[rank + 1:], normalized) <= threshold
        if eta < 1 and threshold > _HALF:
            threshold = np.float32(threshold * factor)
    return order[kept]


@kernel("CaffeDetectionOutput", domain="edgeinfer")
def caffe_detection_output(boxes, scores, *, background_label_id=DEFAULTS["background_label_id"],
                           confidence_threshold=DEFAULTS["confidence_threshold"],
                           nms_threshold=DEFAULTS["nms_threshold"], top_k=DEFAULTS["top_k"], eta=DEFAULTS["eta"],
                           keep_top_k=DEFAULTS["keep_top_k"], normalized=DEFAULTS["normalized"]):
    if scores.ndim != 3 or boxes.ndim != 4 or boxes.shape[-1] != 4:
        raise ValueError(f"expected boxes [N, L, P, 4] and scores [N, C, P], found {list(boxes.shape)} "
                         f"and {list(scores.shape)}")
    images, classes, priors = scores.shape
    if boxes.shape[0] != images or boxes.shape[2] != priors or boxes.shape[1] not in (1, classes):
        raise ValueError(f"boxes {list(boxes.shape)} do not match scores {list(scores.shape)}: expected "
                         f"[{images}, 1 or {classes}, {priors}, 4]")
    boxes = boxes.astype(np.float32, copy=False)
    scores = scores.astype(np.float32, copy=False)
    rows = []
    for image in range(images):
        found = []  # (label, prior) in Caffe's order: label, then NMS order
        for label in range(classes):
            if label == background_label_id:
                continue
            class_boxes = boxes[image, label if boxes.shape[1] > 1 else 0]
            kept = greedy_nms(class_boxes, scores[image, label], confidence_threshold=confidence_threshold,
                              nms_threshold=nms_threshold, top_k=top_k, eta=eta, normalized=bool(normalized))
            found += [(label, int(prior)) for prior in kept]
        if -1 < keep_top_k < len(found):
            found_scores = np.array([scores[image, label, prior] for label, prior in found], np.float32)
            best = np.sort(np.argsort(-found_scores, kind="stable")[:keep_top_k])
            found = [found[i] for i in best]
        for label, prior in found:
            box = boxes[image, label if boxes.shape[1] > 1 else 0, prior]
            rows.append([image, label, scores[image, label, prior], *box])
    if not rows:
        rows = [[image] + [-1] * 6 for image in range(images)]
    return np.asarray(rows, np.float32).reshape(1, 1, -1, 7)
