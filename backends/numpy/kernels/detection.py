"""``edgeinfer::CaffeDetectionOutput``: Caffe-SSD's per-class NMS and keep_top_k (semantics:
``edgeinfer.ir.lowering_detection``).

Greedy NMS, two exact ways:

- a fixed threshold (``eta = 1``, the usual case) and up to ``MATRIX_LIMIT`` candidates: the
  overlaps of every candidate pair in one vectorized step, each row packed into a Python int
  bitmask; the walk is then one AND per candidate against the mask of the boxes kept so far.
- otherwise the walk visits only the boxes it keeps: keeping a box suppresses every later
  candidate that overlaps it by more than the current threshold, and the walk jumps to the next
  candidate still standing. With ``eta < 1`` the threshold only falls, so a candidate
  suppressed earlier stays suppressed; one still standing is checked again against every kept
  box at the threshold of its own turn, which is exactly Caffe's walk.
"""

from __future__ import annotations

import numpy as np

from edgeinfer.backends.numpy.registry import kernel
from edgeinfer.ir.lowering_detection import DEFAULTS

_HALF = np.float32(0.5)
MATRIX_LIMIT = 2048  # candidates per class up to which the pairwise overlaps are computed at once


def _overlap(a: np.ndarray, b: np.ndarray, normalized: bool) -> np.ndarray:
    """Caffe's overlap of boxes ``a [4, ...]`` and ``b [4, ...]`` (coordinates first, so that
    each is a contiguous row; the rest broadcast), in float32."""
    ax0, ay0, ax1, ay1 = a
    bx0, by0, bx1, by1 = b
    width = np.minimum(ax1, bx1) - np.maximum(ax0, bx0)
    height = np.minimum(ay1, by1) - np.maximum(ay0, by0)
    overlapping = (width > 0) & (height > 0) if normalized else (width >= 0) & (height >= 0)
    one = np.float32(0 if normalized else 1)
    inter = (width + one) * (height + one)
    union = ((ax1 - ax0 + one) * (ay1 - ay0 + one) + (bx1 - bx0 + one) * (by1 - by0 + one)) - inter
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(overlapping, inter / union, np.float32(0))


def _walk_by_bitmasks(ranked: np.ndarray, threshold: np.float32, normalized: bool) -> list[int]:
    """``ranked``: the candidates' boxes, ``[4, K]``."""
    clash = _overlap(ranked[:, :, None], ranked[:, None, :], normalized) > threshold
    rows = np.packbits(clash, axis=1, bitorder="little")
    kept, kept_mask = [], 0
    for rank in range(ranked.shape[1]):
        if not int.from_bytes(rows[rank].tobytes(), "little") & kept_mask:
            kept.append(rank)
            kept_mask |= 1 << rank
    return kept


def _walk_kept_boxes(ranked: np.ndarray, threshold: np.float32, eta: float, normalized: bool) -> list[int]:
    """``ranked``: the candidates' boxes, ``[4, K]``."""
    standing = np.ones(ranked.shape[1], dtype=bool)
    factor = np.float32(eta)
    kept: list[int] = []
    rank = 0
    while True:
        remaining = np.flatnonzero(standing[rank:])
        if not remaining.size:
            return kept
        rank += int(remaining[0])
        standing[rank] = False
        if kept and eta < 1 and (_overlap(ranked[:, rank], ranked[:, kept], normalized) > threshold).any():
            continue
        kept.append(rank)
        standing[rank + 1:] &= _overlap(ranked[:, rank], ranked[:, rank + 1:], normalized) <= threshold
        if eta < 1 and threshold > _HALF:
            threshold = np.float32(threshold * factor)


def _candidates(scores: np.ndarray, threshold: float, top_k: int) -> np.ndarray:
    order = np.argsort(-scores, kind="stable")
    order = order[scores[order] > np.float32(threshold)]
    return order if top_k < 0 else order[:top_k]


def greedy_nms(boxes: np.ndarray, scores: np.ndarray, *, confidence_threshold: float, nms_threshold: float,
               top_k: int, eta: float, normalized: bool) -> np.ndarray:
    """Prior indices Caffe's ``ApplyNMSFast`` keeps, in its order (score descending)."""
    order = _candidates(scores, confidence_threshold, top_k)
    ranked, threshold = np.ascontiguousarray(boxes[order].T), np.float32(nms_threshold)
    if eta >= 1 and len(order) <= MATRIX_LIMIT:
        return order[_walk_by_bitmasks(ranked, threshold, normalized)]
    return order[_walk_kept_boxes(ranked, threshold, eta, normalized)]


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
