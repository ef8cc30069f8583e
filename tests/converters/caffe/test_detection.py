"""SSD's DetectionOutput: whole SSD-style nets against OpenCV's DNN module, the parameters OpenCV
departs from Caffe on against a transcription of Caffe-SSD's C++ (``bbox_util.cpp``), and the
standard-ONNX lowering (run by onnxruntime) against the numpy kernel.

OpenCV pads its output to ``keep_top_k * N`` rows of zeros and sorts an image's rows by score;
Caffe writes only the detections, grouped by class. Rows are compared as sets: both sorted by
(image, label, score descending)."""

from __future__ import annotations

import numpy as np
import pytest
from test_nets import conv

from devkit.testing import assert_close
from edgeinfer.errors import ModelFormatError

# OpenCV decodes partly in double (``prior_width * .5``); boxes agree to a few float32 ulps.
BOX_RTOL, BOX_ATOL = 1e-5, 1e-6
CAFFE_NO_THRESHOLD = float(-np.finfo(np.float32).max)  # -FLT_MAX


def _ssd_head(source: str, priors: int, classes: int, loc_classes: int, prior_params: str) -> str:
    text = ""
    for kind, channels in (("loc", priors * loc_classes * 4), ("conf", priors * classes)):
        text += (conv(f"{source}_mbox_{kind}", source, channels, 3, pad=1)
                 + f'layer {{ name: "{source}_{kind}_perm" type: "Permute" bottom: "{source}_mbox_{kind}" '
                   f'top: "{source}_{kind}_perm" permute_param {{ order: 0 order: 2 order: 3 order: 1 }} }}\n'
                 + f'layer {{ name: "{source}_{kind}_flat" type: "Flatten" bottom: "{source}_{kind}_perm" '
                   f'top: "{source}_{kind}_flat" flatten_param {{ axis: 1 }} }}\n')
    return text + (f'layer {{ name: "{source}_mbox_priorbox" type: "PriorBox" bottom: "{source}" bottom: "data" '
                   f'top: "{source}_mbox_priorbox" prior_box_param {{ {prior_params} }} }}\n')


def ssd_net(classes: int, detection_params: str, *, share_location: bool = True, one_channel_priors: bool = False,
            image_bottom: bool = False) -> str:
    """An SSD-style net: two feature maps, heads, softmax over classes, DetectionOutput. (PriorBox
    states clip: OpenCV's default is true, Caffe-SSD's false.)"""
    loc_classes = 1 if share_location else classes
    text = ('name: "SSDDetect"\ninput: "data"\ninput_shape { dim: 1 dim: 3 dim: 48 dim: 48 }\n'
            + conv("conv1", "data", 8, 3, stride=4, pad=1)
            + 'layer { name: "relu1" type: "ReLU" bottom: "conv1" top: "conv1" }\n'
            + conv("conv2", "conv1", 8, 3, stride=2, pad=1)
            + _ssd_head("conv1", 4, classes, loc_classes, "min_size: 12 max_size: 24 aspect_ratio: 2 flip: true clip: false "
                        "variance: 0.1 variance: 0.1 variance: 0.2 variance: 0.2 step: 4")
            + _ssd_head("conv2", 6, classes, loc_classes, "min_size: 24 max_size: 40 aspect_ratio: 2 aspect_ratio: 3 "
                        "flip: true clip: true variance: 0.1 variance: 0.1 variance: 0.2 variance: 0.2"))
    for kind, axis in (("loc", 1), ("conf", 1)):
        text += (f'layer {{ name: "mbox_{kind}" type: "Concat" bottom: "conv1_{kind}_flat" bottom: "conv2_{kind}_flat" '
                 f'top: "mbox_{kind}" concat_param {{ axis: {axis} }} }}\n')
    text += ('layer { name: "mbox_priorbox" type: "Concat" bottom: "conv1_mbox_priorbox" bottom: "conv2_mbox_priorbox" '
             'top: "mbox_priorbox" concat_param { axis: 2 } }\n'
             f'layer {{ name: "conf_reshape" type: "Reshape" bottom: "mbox_conf" top: "conf_reshape" '
             f'reshape_param {{ shape {{ dim: 0 dim: -1 dim: {classes} }} }} }}\n'
             'layer { name: "conf_softmax" type: "Softmax" bottom: "conf_reshape" top: "conf_softmax" '
             'softmax_param { axis: 2 } }\n'
             'layer { name: "conf_flatten" type: "Flatten" bottom: "conf_softmax" top: "conf_flatten" '
             'flatten_param { axis: 1 } }\n')
    priors = "mbox_priorbox"
    if one_channel_priors:  # OpenCV takes encoded-variance priors as boxes only
        text += ('layer { name: "prior_split" type: "Slice" bottom: "mbox_priorbox" top: "prior_boxes" '
                 'top: "prior_variances" slice_param { axis: 1 slice_point: 1 } }\n'
                 'layer { name: "silence" type: "Silence" bottom: "prior_variances" }\n')
        priors = "prior_boxes"
    image = ' bottom: "data"' if image_bottom else ""
    return text + (f'layer {{ name: "detection_out" type: "DetectionOutput" bottom: "mbox_loc" '
                   f'bottom: "conf_flatten" bottom: "{priors}"{image} top: "detection_out" '
                   f'detection_output_param {{ num_classes: {classes} share_location: {str(share_location).lower()} '
                   f'{detection_params} }} }}\n')


def canonical(rows: np.ndarray) -> np.ndarray:
    """Detection rows sorted by image, label, then score descending."""
    rows = rows.reshape(-1, 7)
    return rows[np.lexsort((-rows[:, 2], rows[:, 1], rows[:, 0]))]


def assert_same_detections(got: np.ndarray, expected: np.ndarray, name: str) -> None:
    got, expected = canonical(got), canonical(expected)
    assert got.shape == expected.shape, f"{name}: {len(got)} detections, expected {len(expected)}"
    assert_close(got[:, :2], expected[:, :2], rtol=0, atol=0, name=f"{name}: image and label")
    assert_close(got[:, 2], expected[:, 2], rtol=0, atol=1e-4, name=f"{name}: score")
    assert_close(got[:, 3:], expected[:, 3:], rtol=BOX_RTOL, atol=BOX_ATOL, name=f"{name}: boxes")


def opencv_detections(raw: np.ndarray, count: int) -> np.ndarray:
    """OpenCV's rows without its zero padding (``count`` real rows come first)."""
    rows = raw.reshape(-1, 7)
    assert not rows[count:].any(), "OpenCV wrote more detections than edgeinfer found"
    return rows[:count]


def _jaccard(a, b) -> float:
    """Overlap of normalized boxes as Caffe-SSD's JaccardOverlap computes it."""
    if b[0] > a[2] or b[2] < a[0] or b[1] > a[3] or b[3] < a[1]:
        return np.float32(0)
    width = min(a[2], b[2]) - max(a[0], b[0])
    height = min(a[3], b[3]) - max(a[1], b[1])
    if not (width > 0 and height > 0):
        return np.float32(0)
    inter = width * height

    def size(box):
        return np.float32(0) if box[2] < box[0] or box[3] < box[1] else (box[2] - box[0]) * (box[3] - box[1])

    return inter / (size(a) + size(b) - inter)


def _apply_nms_fast(boxes, scores, score_threshold, nms_threshold, eta, top_k) -> list[int]:
    pairs = [(scores[i], i) for i in range(len(scores)) if scores[i] > score_threshold]
    pairs.sort(key=lambda pair: -pair[0])  # std::stable_sort, descending
    if top_k > -1:
        pairs = pairs[:top_k]
    adaptive, indices = np.float32(nms_threshold), []
    for _, idx in pairs:
        keep = True
        for kept in indices:
            keep = _jaccard(boxes[idx], boxes[kept]) <= adaptive
            if not keep:
                break
        if keep:
            indices.append(idx)
        if keep and eta < 1 and adaptive > 0.5:
            adaptive = np.float32(adaptive * np.float32(eta))
    return indices


def _decode(prior, variance, code: str, loc):
    t = loc if variance is None else variance * loc
    if code == "CORNER":
        return np.concatenate([prior[:2] + t[:2], prior[2:] + t[2:]])
    width, height = prior[2] - prior[0], prior[3] - prior[1]
    if code == "CORNER_SIZE":
        return np.array([prior[0] + t[0] * width, prior[1] + t[1] * height,
                         prior[2] + t[2] * width, prior[3] + t[3] * height], np.float32)
    center_x = t[0] * width + (prior[0] + prior[2]) / np.float32(2)
    center_y = t[1] * height + (prior[1] + prior[3]) / np.float32(2)
    box_w, box_h = np.exp(t[2]) * width, np.exp(t[3]) * height
    return np.array([center_x - box_w / 2, center_y - box_h / 2, center_x + box_w / 2, center_y + box_h / 2],
                    np.float32)


def caffe_detection_output(loc, conf, prior, *, classes, share_location=True, background=0, nms_threshold=0.3,
                           top_k=-1, eta=1.0, code="CORNER", encoded=False, keep_top_k=-1,
                           confidence=CAFFE_NO_THRESHOLD) -> np.ndarray:
    """A line-by-line transcription of Caffe-SSD's DetectionOutputLayer::Forward_cpu."""
    num, count = loc.shape[0], prior.shape[2] // 4
    loc_classes = 1 if share_location else classes
    loc = loc.reshape(num, count, loc_classes, 4)
    conf = conf.reshape(num, count, classes)
    prior_boxes = prior[0, 0].reshape(count, 4)
    variances = None if encoded else prior[0, 1].reshape(count, 4)
    rows = []
    for i in range(num):
        decoded = {}
        for c in range(loc_classes):
            label = -1 if share_location else c
            if label != background:
                decoded[label] = [_decode(prior_boxes[p], None if encoded else variances[p], code, loc[i, p, c])
                                  for p in range(count)]
        indices, found = {}, 0
        for c in range(classes):
            if c == background:
                continue
            indices[c] = _apply_nms_fast(decoded[-1 if share_location else c], conf[i, :, c], confidence,
                                         nms_threshold, eta, top_k)
            found += len(indices[c])
        if -1 < keep_top_k < found:
            pairs = [(conf[i, idx, label], label, idx) for label in sorted(indices) for idx in indices[label]]
            pairs.sort(key=lambda pair: -pair[0])
            indices = {}
            for _, label, idx in pairs[:keep_top_k]:
                indices.setdefault(label, []).append(idx)
        for label in sorted(indices):
            for idx in indices[label]:
                rows.append([i, label, conf[i, idx, label], *decoded[-1 if share_location else label][idx]])
    if not rows:
        rows = [[i] + [-1] * 6 for i in range(num)]
    return np.asarray(rows, np.float32)


# -- whole SSD-style nets against OpenCV ---------------------------------------------------------
NET_CASES = {
    "center_size_shared": (4, True, False, "background_label_id: 0 nms_param { nms_threshold: 0.45 top_k: 400 } "
                                           "code_type: CENTER_SIZE keep_top_k: 200 confidence_threshold: 0.01"),
    "corner_per_class_top_k": (3, False, False, "background_label_id: 0 nms_param { nms_threshold: 0.3 top_k: 25 } "
                                                "code_type: CORNER keep_top_k: 30 confidence_threshold: 0.2"),
    "encoded_variance_no_background": (3, False, True, "background_label_id: -1 nms_param { nms_threshold: 0.5 "
                                                      "top_k: 60 } code_type: CENTER_SIZE "
                                                      "variance_encoded_in_target: true keep_top_k: 40 "
                                                      "confidence_threshold: 0.3"),
    "background_last_clip": (3, True, False, "background_label_id: 2 nms_param { nms_threshold: 0.4 } "
                                             "code_type: CENTER_SIZE keep_top_k: 50 confidence_threshold: 0.25 "
                                             "clip: true"),
}


@pytest.mark.parametrize("case", list(NET_CASES))
def test_ssd_net_matches_opencv(harness, case):
    classes, shared, one_channel, params = NET_CASES[case]
    prototxt, caffemodel = harness.write(ssd_net(classes, params, share_location=shared,
                                                 one_channel_priors=one_channel), case)
    model = harness.convert(prototxt, caffemodel, outputs=["detection_out", "conf_flatten"])
    model.graph.verify()
    suppressed = 0
    for seed in range(3):
        feeds = harness.feeds(model, seed=seed)
        got = harness.run(model, feeds)
        detections = got["detection_out"]
        assert detections.shape[:2] == (1, 1) and detections.shape[3] == 7
        expected = harness.opencv(prototxt, caffemodel, feeds, ["detection_out"])["detection_out"]
        assert_same_detections(detections, opencv_detections(expected, detections.shape[2]), f"{case}/{seed}")
        suppressed += _suppressed_count(detections, got["conf_flatten"], classes, params)
    assert suppressed > 0, "no input made NMS drop a candidate; the case does not test NMS"


def _suppressed_count(detections: np.ndarray, conf: np.ndarray, classes: int, params: str) -> int:
    """Candidates above the confidence threshold that did not come out (NMS or keep_top_k)."""
    threshold = float(params.split("confidence_threshold: ")[1].split()[0])
    candidates = int((conf.reshape(-1, classes) > threshold).sum())
    return candidates - detections.reshape(-1, 7).shape[0]


def test_ssd_net_at_batch_three_matches_opencv(harness):
    classes, shared, one_channel, params = NET_CASES["center_size_shared"]
    prototxt, caffemodel = harness.write(ssd_net(classes, params), "batch3")
    model = harness.convert(prototxt, caffemodel, dynamic_batch=True)
    feeds = harness.feeds(model, batch=3)
    got = harness.run(model, feeds)["detection_out"]
    assert set(np.unique(got.reshape(-1, 7)[:, 0])) == {0.0, 1.0, 2.0}
    expected = harness.opencv(prototxt, caffemodel, feeds, ["detection_out"])["detection_out"]
    assert_same_detections(got, opencv_detections(expected, got.shape[2]), "batch3")


def test_pixel_boxes_with_clip_match_opencv(harness):
    """OpenCV's normalized_bbox: false: +1 on widths and heights, clip to the image's pixels."""
    params = ("background_label_id: 0 nms_param { nms_threshold: 0.3 top_k: 100 } code_type: CENTER_SIZE "
              "keep_top_k: 100 confidence_threshold: 0.2 normalized_bbox: false clip: true")
    prototxt, caffemodel = harness.write(ssd_net(3, params, image_bottom=True), "pixels")
    model = harness.convert(prototxt, caffemodel)
    for seed in range(2):
        feeds = harness.feeds(model, seed=seed)
        got = harness.run(model, feeds)["detection_out"]
        expected = harness.opencv(prototxt, caffemodel, feeds, ["detection_out"])["detection_out"]
        assert_same_detections(got, opencv_detections(expected, got.shape[2]), f"pixels/{seed}")


# -- Caffe's meaning where OpenCV departs, on inputs with crowded boxes ---------------------------
def detection_inputs_net(priors: int, classes: int, loc_classes: int, params: str, prior_channels: int = 2) -> str:
    return (f'name: "det"\ninput: "loc"\ninput_shape {{ dim: 2 dim: {priors * loc_classes * 4} }}\n'
            f'input: "conf"\ninput_shape {{ dim: 2 dim: {priors * classes} }}\n'
            f'input: "prior"\ninput_shape {{ dim: 1 dim: {prior_channels} dim: {priors * 4} }}\n'
            'layer { name: "det" type: "DetectionOutput" bottom: "loc" bottom: "conf" bottom: "prior" top: "det" '
            f'detection_output_param {{ num_classes: {classes} {params} }} }}\n')


CLASSES, PRIORS = 4, 48


def crowded_inputs(seed: int, priors: int, classes: int, loc_classes: int) -> dict[str, np.ndarray]:
    """Priors packed around the image centre so that decoded boxes overlap heavily."""
    rng = np.random.default_rng(seed)
    centers = rng.uniform(0.35, 0.65, (priors, 2))
    sizes = rng.uniform(0.1, 0.4, (priors, 2))
    boxes = np.concatenate([centers - sizes / 2, centers + sizes / 2], axis=1).reshape(-1)
    variances = np.tile([0.1, 0.1, 0.2, 0.2], priors)
    logits = rng.standard_normal((2, priors, classes)) * 2
    conf = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    return {"loc": (rng.standard_normal((2, priors * loc_classes * 4)) * 0.5).astype(np.float32),
            "conf": conf.reshape(2, -1).astype(np.float32),
            "prior": np.stack([boxes, variances])[None].astype(np.float32)}


CAFFE_CASES = {
    # eta < 1 (OpenCV ignores eta), no confidence_threshold (OpenCV: scores above 0)
    "adaptive_eta": (False, "share_location: true nms_param { nms_threshold: 0.7 eta: 0.8 } code_type: CENTER_SIZE",
                     {"nms_threshold": 0.7, "eta": 0.8, "code": "CENTER_SIZE"}),
    # CORNER_SIZE (absent from OpenCV's schema), per-class boxes, keep_top_k across classes
    "corner_size_per_class": (True, "share_location: false nms_param { nms_threshold: 0.4 top_k: 20 } "
                                 "code_type: CORNER_SIZE keep_top_k: 12 confidence_threshold: 0.05",
                              {"share_location": False, "nms_threshold": 0.4, "top_k": 20, "code": "CORNER_SIZE",
                               "keep_top_k": 12, "confidence": 0.05}),
    # CORNER with random offsets: boxes come out inverted (xmax < xmin) and never overlap
    "corner_inverted_boxes": (False, "share_location: true background_label_id: 1 nms_param { nms_threshold: 0.2 } "
                                 "code_type: CORNER variance_encoded_in_target: true",
                              {"background": 1, "nms_threshold": 0.2, "code": "CORNER", "encoded": True}),
    # top_k: 0 keeps no candidate (OpenCV keeps all): Caffe's placeholder row per image
    "top_k_zero_is_empty": (False, "share_location: true nms_param { nms_threshold: 0.4 top_k: 0 } code_type: CENTER_SIZE",
                            {"nms_threshold": 0.4, "top_k": 0, "code": "CENTER_SIZE"}),
}


def crowded_case(harness, case: str, per_class: bool, params: str, seeds: int):
    """The converted detection net of a case and ``seeds`` sets of crowded inputs for it."""
    loc_classes = CLASSES if per_class else 1
    prototxt, _ = harness.write(detection_inputs_net(PRIORS, CLASSES, loc_classes, params), case, weights=False)
    return harness.convert(prototxt, None), [crowded_inputs(seed, PRIORS, CLASSES, loc_classes) for seed in range(seeds)]


@pytest.mark.parametrize("case", list(CAFFE_CASES))
def test_detection_output_matches_caffe(harness, case):
    per_class, params, oracle = CAFFE_CASES[case]
    model, inputs = crowded_case(harness, case, per_class, params, seeds=3)
    for seed, feeds in enumerate(inputs):
        got = harness.run(model, feeds)["det"].reshape(-1, 7)
        expected = caffe_detection_output(feeds["loc"], feeds["conf"], feeds["prior"], classes=CLASSES, **oracle)
        # Caffe's own order, not only the same set
        assert_close(got[:, :3], expected[:, :3], rtol=0, atol=0, name=f"{case}/{seed}: image, label, score")
        assert_close(got[:, 3:], expected[:, 3:], rtol=BOX_RTOL, atol=BOX_ATOL, name=f"{case}/{seed}: boxes")
        if case == "top_k_zero_is_empty":
            assert_close(got, np.array([[0] + [-1] * 6, [1] + [-1] * 6], np.float32), rtol=0, atol=0)


def test_kept_box_walk_matches_caffe_without_the_pairwise_matrix(harness, monkeypatch):
    """The numpy kernel's other NMS path (many candidates, no pairwise matrix) at eta = 1."""
    from edgeinfer.backends.numpy.kernels import detection

    monkeypatch.setattr(detection, "MATRIX_LIMIT", 0)
    per_class, params, oracle = CAFFE_CASES["corner_size_per_class"]
    model, inputs = crowded_case(harness, "walk", per_class, params, seeds=2)
    for seed, feeds in enumerate(inputs):
        got = harness.run(model, feeds)["det"].reshape(-1, 7)
        expected = caffe_detection_output(feeds["loc"], feeds["conf"], feeds["prior"], classes=CLASSES, **oracle)
        assert_close(got, expected, rtol=BOX_RTOL, atol=BOX_ATOL, name=f"walk/{seed}")


# -- the standard-ONNX lowering (onnxruntime) against the numpy kernel ----------------------------
LOWERING_CASES = {
    **{name: (per_class, params) for name, (per_class, params, _) in CAFFE_CASES.items()},
    "pixels_keep_top_k": (False, "share_location: true nms_param { nms_threshold: 0.3 eta: 0.9 top_k: 30 } "
                             "code_type: CENTER_SIZE keep_top_k: 10 normalized_bbox: false"),
    "keep_top_k_zero_is_empty": (False, "share_location: true nms_param { nms_threshold: 0.3 } "
                                        "code_type: CENTER_SIZE keep_top_k: 0"),
}


@pytest.mark.parametrize("case", list(LOWERING_CASES))
def test_lowering_on_onnxruntime_matches_numpy_kernel(harness, case):
    model, inputs = crowded_case(harness, case, *LOWERING_CASES[case], seeds=2)
    for seed, feeds in enumerate(inputs):
        reference = harness.run(model, feeds)["det"]
        got = harness.run(model, feeds, backend="onnxruntime")["det"]
        assert got.shape == reference.shape, f"{case}/{seed}: {got.shape} rows, numpy kernel {reference.shape}"
        assert_close(got, reference, rtol=BOX_RTOL, atol=BOX_ATOL, name=f"{case}/{seed}")


def test_lowered_ssd_net_matches_opencv(harness):
    classes, shared, one_channel, params = NET_CASES["corner_per_class_top_k"]
    prototxt, caffemodel = harness.write(ssd_net(classes, params, share_location=shared), "lowered")
    model = harness.convert(prototxt, caffemodel)
    feeds = harness.feeds(model, seed=3)
    got = harness.run(model, feeds, backend="onnxruntime")["detection_out"]
    expected = harness.opencv(prototxt, caffemodel, feeds, ["detection_out"])["detection_out"]
    assert_same_detections(got, opencv_detections(expected, got.shape[2]), "lowered")


# -- bad nets ------------------------------------------------------------------------------------
@pytest.mark.parametrize("params, priors_channels, message", [
    ("share_location: true", 2, None),
    ("num_classes: 4 share_location: true nms_param { eta: 1.5 }", 2, "0 < eta <= 1"),
    ("num_classes: 3 share_location: true", 2, r"confidence predictions of shape \[2, 144\]"),
    ("num_classes: 4 share_location: false", 2, r"location predictions of shape \[2, 768\]"),
    ("num_classes: 4 share_location: true", 1, "2 channels"),
])
def test_bad_detection_output_is_a_model_format_error(harness, params, priors_channels, message):
    text = detection_inputs_net(48, 4, 1, "", priors_channels).replace("num_classes: 4 ", params + " ")
    prototxt, _ = harness.write(text, "bad", weights=False)
    with pytest.raises(ModelFormatError, match=message or "expected num_classes >= 1, found none"):
        harness.convert(prototxt, None)


def test_detection_net_round_trips_through_eim(harness, tmp_path):
    import edgeinfer as ei

    classes, shared, one_channel, params = NET_CASES["background_last_clip"]
    prototxt, caffemodel = harness.write(ssd_net(classes, params), "eim")
    model = harness.convert(prototxt, caffemodel)
    model.save(tmp_path / "ssd.eim")
    loaded = ei.load(tmp_path / "ssd.eim")
    feeds = harness.feeds(model)
    assert_close(harness.run(loaded, feeds)["detection_out"], harness.run(model, feeds)["detection_out"],
                 rtol=0, atol=0)
