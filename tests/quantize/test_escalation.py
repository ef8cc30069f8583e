"""The default INT8 guard escalates by itself: where plain INT8 leaves an output (or one part of
an output that concatenates parts of different magnitude) below the quality floor on held-out
samples, ``quantize`` keeps the noisiest layers float until the floor holds, and says which
layers and what they cost.

The detector below concatenates boxes in pixels (x320) with class probabilities; one class's
logits span +-100, so the logits' per-tensor INT8 scale leaves the other classes a few steps.
Measured whole, the output keeps 36 dB (the boxes dominate); its probabilities alone fall to
about 6 dB."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
from click.testing import CliRunner
from helpers import sqnr
from onnx import TensorProto, helper, numpy_helper

import edgeinfer as ei
from edgeinfer.quantize import guard

BOXES, SCORES = (slice(0, 4), slice(4, 7))


def detector(loud_class: float) -> ei.Model:
    rng = np.random.default_rng(0)
    w1 = rng.normal(0, 0.3, (8, 8, 3, 3)).astype(np.float32)
    wb = rng.normal(0, 0.3, (4, 8, 1, 1)).astype(np.float32)
    wc = rng.normal(0, 0.3, (3, 8, 1, 1)).astype(np.float32)
    wc[0] *= loud_class
    inits = [numpy_helper.from_array(a, n) for a, n in ((w1, "w1"), (wb, "wb"), (wc, "wc"),
                                                       (np.array([320.0], np.float32), "k"))]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["h0"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["h0"], ["h"]),
             helper.make_node("Conv", ["h", "wb"], ["b0"]), helper.make_node("Mul", ["b0", "k"], ["boxes"]),
             helper.make_node("Conv", ["h", "wc"], ["logits"]), helper.make_node("Sigmoid", ["logits"], ["scores"]),
             helper.make_node("Concat", ["boxes", "scores"], ["out"], axis=1)]
    graph = helper.make_graph(nodes, "detector", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 8, 8])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 7, 8, 8])], inits)
    return ei.convert(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


def samples(count: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.normal(0, 1, (1, 8, 8, 8)).astype(np.float32)} for _ in range(count)]


def outputs(model: ei.Model, feeds: list[dict], backend: str) -> np.ndarray:
    with ei.Session(model, backend=backend) as session:
        return np.concatenate([session.run(f)["out"] for f in feeds])


def quantized(model: ei.Model, **options) -> tuple[ei.Model, list]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = ei.quantize(model, samples(20, 1), **options)
    return result, [w for w in caught if issubclass(w.category, (guard.QuantizationQualityWarning,
                                                                 guard.QuantizationEscalationWarning))]


@pytest.fixture(scope="module")
def loud():
    fp32 = detector(400.0)
    return fp32, outputs(fp32, samples(6, 99), "numpy")


def test_the_guard_measures_each_part_of_a_concatenated_output(loud):
    fp32, reference = loud
    plain, caught = quantized(fp32, quality_floor=None)
    got = outputs(plain, samples(6, 99), "numpy")
    assert sqnr(reference, got) > 30  # whole: the boxes hide what happened to the probabilities
    assert sqnr(reference[:, SCORES], got[:, SCORES]) < 12
    quality = json.loads(plain.metadata["quantization"])["quality"]["outputs"]
    assert set(quality) == {"out[:, 0:4]", "out[:, 4:7]"} and quality["out[:, 4:7]"]["sqnr_db"] < 12
    assert [w.category for w in caught] == [guard.QuantizationQualityWarning]
    assert "output 'out[:, 4:7]'" in str(caught[0].message)
    assert "escalated" not in json.loads(plain.metadata["quantization"])


@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
def test_default_quantize_escalates_below_the_floor_and_says_what_it_cost(loud, backend):
    fp32, reference = loud
    mixed, caught = quantized(fp32)
    assert [w.category for w in caught] == [guard.QuantizationEscalationWarning]  # no quality warning left
    message = str(caught[0].message)
    assert "output 'out[:, 4:7]'" in message and "below the 20 dB floor" in message and "logits" in message
    record = json.loads(mixed.metadata["quantization"])["escalated"]
    assert record["reason"]["output"] == "out[:, 4:7]" and record["reason"]["sqnr_db"] < 12
    assert "logits" in record["kept_float"] and 0 < record["float_layers"] < record["quantizable_layers"]
    assert 0 < record["float_flops_share"] < 0.5 and record["held_out_worst_db"] >= 20
    # a toy of 1,800 weights: the file is mostly its graph; still below fp32, never below plain INT8
    assert record["plain_int8_file_bytes"] <= record["file_bytes"] < record["fp32_file_bytes"]
    mixed.graph.verify()
    got = outputs(mixed, samples(6, 99), backend)
    assert sqnr(reference[:, SCORES], got[:, SCORES]) >= 20  # was about 6 dB
    assert sqnr(reference[:, BOXES], got[:, BOXES]) >= 30
    assert any(n.op_type == "QuantizeLinear" for n in mixed.graph.nodes)  # the rest stays INT8


def test_a_model_above_the_floor_is_not_escalated():
    fp32 = detector(1.0)
    default, caught = quantized(fp32)
    plain, _ = quantized(fp32, quality_floor=None)
    assert caught == [] and "escalated" not in json.loads(default.metadata["quantization"])
    feeds = samples(2, 5)
    np.testing.assert_array_equal(outputs(default, feeds, "numpy"), outputs(plain, feeds, "numpy"))


def test_cli_says_it_escalated_and_off_keeps_plain_int8(loud, tmp_path):
    import onnx

    from edgeinfer.cli.quantize import quantize_command
    from edgeinfer.ir.onnx_io import graph_to_model

    fp32, _ = loud
    source = tmp_path / "detector.onnx"
    onnx.save(graph_to_model(fp32.graph), source)
    calib = tmp_path / "calib"
    calib.mkdir()
    for index, feed in enumerate(samples(20, 1)):
        np.save(calib / f"{index}.npy", feed["x"])
    result = CliRunner().invoke(quantize_command, [str(source), "--calib", str(calib), "-o", str(tmp_path / "a.eim")])
    assert result.exit_code == 0, result.output
    assert "quality floor: plain INT8 output out[:, 4:7] was" in result.output
    result = CliRunner().invoke(quantize_command, [str(source), "--calib", str(calib), "--quality-floor", "off",
                                                   "-o", str(tmp_path / "b.eim")])
    assert result.exit_code == 0 and "quality floor" not in result.output
    result = CliRunner().invoke(quantize_command, [str(source), "--calib", str(calib), "--quality-floor", "loud",
                                                   "-o", str(tmp_path / "c.eim")])
    assert result.exit_code == 2 and "expected a number of dB or 'off'" in result.output
