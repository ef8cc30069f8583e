"""Quantization of what real detectors contain: a Concat of boxes and probabilities, graph
outputs, float16-stored weights, near-zero channels, the quality guard and ``exclude``.
Each test compares the INT8 model's numerics with fp32 on the same inputs."""

import json
import warnings

import numpy as np
import pytest
from helpers import sqnr

import edgeinfer as ei
from devkit.testing import parse_model
from edgeinfer.errors import InputError
from edgeinfer.quantize import guard, quantize
from edgeinfer.quantize.static import calibrate, quantize_static

HEAD = """
<ir_version: 8, opset_import: ["" : 17]>
head (float[1,4,64] boxes_in, float[1,3,64] cls_in) => (float[1,7,64] out) {
    k = Constant <value = float[1] {320.0}> ()
    boxes = Mul(boxes_in, k)
    scores = Sigmoid(cls_in)
    out = Concat <axis = 1> (boxes, scores)
}
"""


def head_samples(count: int, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{"boxes_in": rng.uniform(0, 1, (1, 4, 64)).astype(np.float32),
             "cls_in": rng.normal(-2, 2, (1, 3, 64)).astype(np.float32)} for _ in range(count)]


@pytest.fixture(scope="module")
def head():
    fp32 = ei.convert(parse_model(HEAD))
    return fp32, calibrate(fp32, head_samples(8))


@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
def test_concat_of_boxes_and_probabilities_keeps_both_precisions(head, backend):
    fp32, calibration = head
    int8 = quantize_static(fp32, calibration, method="minmax")
    concat = next(n for n in int8.graph.nodes if n.op_type == "Concat")
    producers = [int8.graph.producer(i) for i in concat.inputs]
    assert [p.op_type for p in producers] == ["DequantizeLinear", "DequantizeLinear"]  # each its own scale
    scales = [float(int8.graph.initializers[p.inputs[1]]) for p in producers]
    assert scales[0] > 100 * scales[1]
    assert concat.outputs[0] == "out"  # float: no QuantizeLinear spans both ranges
    feeds = head_samples(1, seed=7)[0]
    ref = ei.Session(fp32, backend="numpy").run(feeds)["out"]
    got = ei.Session(int8, backend=backend).run(feeds)["out"]
    # one step of 320/255 over both would round every score to 0; each with its own scale they keep
    # the rounding of the Sigmoid's input and output (a few steps of 1/255)
    assert np.abs(got[:, 4:] - ref[:, 4:]).max() < 0.02 and np.abs(ref[:, 4:]).max() > 0.5
    assert np.abs(got[:, :4] - ref[:, :4]).max() <= scales[0]
    assert sqnr(ref[:, 4:], got[:, 4:]) > 35


def test_concat_of_similar_ranges_stays_quantized():
    text = """
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[1,2,8,8] a, float[1,2,8,8] b) => (float[1,2,8,8] y) {
        w = Constant <value = float[2,4,1,1] {0.5, -0.25, 0.75, 0.1, -0.3, 0.2, 0.4, -0.6}> ()
        c = Concat <axis = 1> (a, b)
        y = Conv(c, w)
    }
    """
    fp32 = ei.convert(parse_model(text))
    rng = np.random.default_rng(0)
    samples = [{"a": rng.normal(0, 1, (1, 2, 8, 8)).astype(np.float32),
                "b": rng.normal(0, 3, (1, 2, 8, 8)).astype(np.float32)} for _ in range(6)]
    int8 = quantize_static(fp32, calibrate(fp32, samples), method="minmax")
    concat = next(n for n in int8.graph.nodes if n.op_type == "Concat")
    assert [c.op_type for c in int8.graph.consumers(concat.outputs[0])] == ["QuantizeLinear"]
    ref = ei.Session(fp32, backend="numpy").run(samples[0])["y"]
    assert sqnr(ref, ei.Session(int8, backend="numpy").run(samples[0])["y"]) > 30


CONV_OUT = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[1,3,8,8] x) => (float[1,4,8,8] y) {
    y = Conv <pads = [1, 1, 1, 1]> (x, w, bias)
}
"""


def with_initializers(text: str, **arrays: np.ndarray):
    import onnx
    from onnx import numpy_helper, parser

    model = parser.parse_model(text)
    model.graph.initializer.extend(numpy_helper.from_array(a, name) for name, a in arrays.items())
    onnx.checker.check_model(model)
    return model


def conv_model(weight: np.ndarray) -> ei.Model:
    return ei.convert(with_initializers(CONV_OUT, w=weight, bias=np.linspace(-0.5, 0.5, 4).astype(np.float32)))


def conv_samples(count: int = 6) -> list[dict]:
    rng = np.random.default_rng(1)
    return [{"x": rng.normal(0, 1, (1, 3, 8, 8)).astype(np.float32)} for _ in range(count)]


def test_graph_output_op_keeps_a_float_output_unless_asked():
    weight = np.random.default_rng(0).normal(0, 0.5, (4, 3, 3, 3)).astype(np.float32)
    fp32 = conv_model(weight)
    calibration = calibrate(fp32, conv_samples())
    kept = quantize_static(fp32, calibration, method="minmax")
    asked = quantize_static(fp32, calibration, method="minmax", quantize_outputs=True)
    assert kept.graph.producer("y").op_type == "Conv"
    assert asked.graph.producer("y").op_type == "DequantizeLinear"
    feeds = conv_samples(1)[0]
    ref = ei.Session(fp32, backend="numpy").run(feeds)["y"]
    errors = [np.abs(ei.Session(m, backend="numpy").run(feeds)["y"] - ref).max() for m in (kept, asked)]
    assert errors[0] < errors[1]  # the output's own rounding is gone


def fp16_cast_model(weight: np.ndarray) -> ei.Model:
    """Conv whose weight is stored float16 behind a Cast and a layout Transpose (a TFLite import)."""
    text = CONV_OUT.replace("y = Conv", "w32 = Cast <to = 1> (w16)\n    w = Transpose <perm = [3, 0, 1, 2]> (w32)\n"
                                        "    y = Conv")
    model = with_initializers(text, w16=weight.transpose(1, 2, 3, 0).astype(np.float16),
                              bias=np.linspace(-0.5, 0.5, 4).astype(np.float32))
    return ei.convert(model, optimize=2)


def test_float16_weights_behind_a_cast_are_quantized():
    weight = np.random.default_rng(0).normal(0, 0.5, (4, 3, 3, 3)).astype(np.float32)
    fp16 = fp16_cast_model(weight)
    assert "Cast" in fp16.graph.op_histogram()  # constant folding keeps the narrow storage
    int8 = quantize_static(fp16, calibrate(fp16, conv_samples()), method="minmax")
    ops = int8.graph.op_histogram()
    assert "Cast" not in ops and "Transpose" not in ops
    int8_weights = [a for a in int8.graph.initializers.values() if a.dtype == np.int8 and a.ndim == 4]
    assert [a.shape for a in int8_weights] == [(4, 3, 3, 3)]
    assert sum(a.nbytes for a in int8.graph.initializers.values()) < sum(
        a.nbytes for a in fp16.graph.initializers.values())
    feeds = conv_samples(1)[0]
    ref = ei.Session(fp16, backend="numpy").run(feeds)["y"]
    assert sqnr(ref, ei.Session(int8, backend="numpy").run(feeds)["y"]) > 30


def test_float32_weights_stored_narrow_are_quantized():
    """The other form: a float32 constant whose storage is float16 (``weight_storage`` metadata)."""
    weight = np.random.default_rng(0).normal(0, 0.5, (4, 3, 3, 3)).astype(np.float16).astype(np.float32)
    fp32 = conv_model(weight)
    graph = fp32.graph.copy()
    graph.metadata = {**graph.metadata, "weight_storage": '{"float16": ["w"]}'}
    stored = ei.Model(graph, fp32.metadata)
    int8 = quantize_static(stored, calibrate(stored, conv_samples()), method="minmax")
    assert any(a.dtype == np.int8 and a.shape == weight.shape for a in int8.graph.initializers.values())
    feeds = conv_samples(1)[0]
    ref = ei.Session(fp32, backend="numpy").run(feeds)["y"]
    assert sqnr(ref, ei.Session(int8, backend="numpy").run(feeds)["y"]) > 30


@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
def test_near_zero_channel_gets_a_normal_scale(tmp_path, backend):
    weight = np.random.default_rng(0).normal(0, 0.5, (4, 3, 3, 3)).astype(np.float32)
    weight[2] = 3e-40  # subnormal weights: absmax / 127 would be a subnormal scale
    fp32 = conv_model(weight)
    int8 = quantize_static(fp32, calibrate(fp32, conv_samples()), method="minmax")
    tiny = np.finfo(np.float32).tiny
    scales = [a for n, a in int8.graph.initializers.items() if n.endswith("_scale")]
    assert all((s >= tiny).all() for s in scales)
    int8.save(tmp_path / "m.eim")
    loaded = ei.load(tmp_path / "m.eim")  # verify accepts it
    feeds = conv_samples(1)[0]
    ref = ei.Session(fp32, backend="numpy").run(feeds)["y"]
    got = ei.Session(loaded, backend=backend).run(feeds)["y"]
    assert sqnr(ref, got) > 30 and np.isfinite(got).all()


def test_quality_guard_records_figures_and_stays_quiet_when_good():
    weight = np.random.default_rng(0).normal(0, 0.5, (4, 3, 3, 3)).astype(np.float32)
    fp32 = conv_model(weight)
    with warnings.catch_warnings():
        warnings.simplefilter("error", guard.QuantizationQualityWarning)
        int8 = quantize(fp32, conv_samples(10), "minmax")
    quality = json.loads(int8.metadata["quantization"])["quality"]
    assert quality["held_out"] and quality["samples"] == 2  # every 5th of 10
    assert quality["outputs"]["y"]["sqnr_db"] > 25 and quality["outputs"]["y"]["cosine"] > 0.999


def test_quality_guard_warns_in_one_line_naming_the_worst_layers():
    """Held-out samples (every 5th) 100x larger than what calibration saw: they saturate."""
    weight = np.random.default_rng(0).normal(0, 0.5, (4, 3, 3, 3)).astype(np.float32)
    fp32 = conv_model(weight)
    samples = conv_samples(10)
    for index in (4, 9):
        samples[index] = {"x": samples[index]["x"] * 100}
    with pytest.warns(guard.QuantizationQualityWarning) as caught:
        int8 = quantize(fp32, samples, "minmax", quality_floor=None)  # plain INT8: the guard's own warning
    message = str(caught[0].message)
    assert "\n" not in message and "output 'y'" in message and "held-out" in message
    assert "worst layers: " in message and "dB" in message
    quality = json.loads(int8.metadata["quantization"])["quality"]["outputs"]["y"]
    ref = np.concatenate([ei.Session(fp32, backend="numpy").run(samples[i])["y"].ravel() for i in (4, 9)])
    got = np.concatenate([ei.Session(int8, backend="numpy").run(samples[i])["y"].ravel() for i in (4, 9)])
    assert quality["sqnr_db"] < guard.MIN_SQNR_DB
    assert quality["sqnr_db"] == pytest.approx(sqnr(ref, got), abs=0.5)


def test_exclude_of_an_unknown_layer_is_an_error(head):
    fp32, calibration = head
    with pytest.raises(InputError, match="no_such_layer.*no such layer"):
        quantize_static(fp32, calibration, exclude=["no_such_layer"])
    kept = quantize_static(fp32, calibration, exclude=["scores"])  # a node's output names it too
    assert kept.graph.producer("scores").op_type == "Sigmoid"


def test_prelu_islands_are_said_to_split_the_integer_chain():
    text = """
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[1,3,8,8] x) => (float[1,3,8,8] y) {
        a = Conv <pads = [1, 1, 1, 1]> (x, w)
        b = PRelu(a, slope)
        y = Conv <pads = [1, 1, 1, 1]> (b, w)
    }
    """
    rng = np.random.default_rng(0)
    fp32 = ei.convert(with_initializers(text, w=rng.normal(0, 0.3, (3, 3, 3, 3)).astype(np.float32),
                                        slope=np.array([0.1, 0.2, 0.3], np.float32).reshape(3, 1, 1)))
    samples = [{"x": rng.normal(0, 1, (1, 3, 8, 8)).astype(np.float32)} for _ in range(5)]
    with pytest.warns(guard.QuantizationSpeedWarning, match="1 PRelu layers stay float.*slower than fp32"):
        int8 = quantize(fp32, samples, "minmax")
    assert guard.float_islands(int8.graph) == ["b"]
    ref = ei.Session(fp32, backend="numpy").run(samples[0])["y"]
    assert sqnr(ref, ei.Session(int8, backend="numpy").run(samples[0])["y"]) > 25
