"""Empirical bias correction (edgeinfer/quantize/bias_correction.py): on a model whose weights
round in one direction, the INT8 output's per-channel mean error against fp32 shrinks and its
SQNR rises on held-out inputs; layers kept float are untouched; the same bytes; numpy and
onnxruntime agree; the metadata says so. Layers kept float on int8-rounded weights lose the
mean shift of that rounding, from the input channel means calibration records."""

import json
from dataclasses import replace

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import edgeinfer as ei
from edgeinfer.errors import InputError
from edgeinfer.model import Model
from edgeinfer.quantize import quantize
from edgeinfer.quantize.bias_correction import correct_biases
from edgeinfer.quantize.calibrate import run_batches
from edgeinfer.quantize.qdq import StaticOptions, plan_quantization
from edgeinfer.quantize.static import calibrate, quantizable_layers, quantize_static
from tests.quantize.helpers import sqnr

SIZE = 10


def _biased_weight(rng, channels: int, inputs: int, k: int, step: float) -> np.ndarray:
    """Weights ``(n + 0.45) * step``: symmetric int8 per channel (one weight per channel at
    127 steps fixes the scale to ``step``) rounds every other one down by 0.45 steps."""
    n = rng.integers(-60, 60, size=(channels, inputs, k, k)).astype(np.float64)
    w = (n + 0.45) * step
    w[:, 0, 0, 0] = 127 * step
    return w.astype(np.float32)


def _model(seed: int = 0, gemm: bool = False) -> Model:
    """x [1,3,10,10] (positive) -> Conv A (3->12, 3x3) -> Relu -> Conv B (12->6, 1x1) -> y, both
    with biases and weights that round down; with ``gemm``, a Flatten and a Gemm (600->5) follow."""
    rng = np.random.default_rng(seed)
    w_a = _biased_weight(rng, 12, 3, 3, 0.01)
    w_b = _biased_weight(rng, 6, 12, 1, 0.01)
    inits = [numpy_helper.from_array(w_a, "w_a"), numpy_helper.from_array(rng.standard_normal(12).astype(np.float32) * 0.1, "b_a"),
             numpy_helper.from_array(w_b, "w_b"), numpy_helper.from_array(rng.standard_normal(6).astype(np.float32) * 0.1, "b_b")]
    nodes = [helper.make_node("Conv", ["x", "w_a", "b_a"], ["a"], name="conv_a", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["a"], ["r"], name="relu_a"),
             helper.make_node("Conv", ["r", "w_b", "b_b"], ["b" if gemm else "y"], name="conv_b")]
    shape = [1, 6, SIZE, SIZE]
    if gemm:
        w_c = (rng.integers(-60, 60, size=(5, 6 * SIZE * SIZE)) + 0.45) * 0.001
        w_c[:, 0] = 0.127
        inits += [numpy_helper.from_array(w_c.astype(np.float32), "w_c"),
                  numpy_helper.from_array(rng.standard_normal(5).astype(np.float32) * 0.1, "b_c")]
        nodes += [helper.make_node("Relu", ["b"], ["rb"], name="relu_b"),
                  helper.make_node("Flatten", ["rb"], ["f"], name="flatten"),
                  helper.make_node("Gemm", ["f", "w_c", "b_c"], ["y"], name="gemm", transB=1)]
        shape = [1, 5]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 3, SIZE, SIZE])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, shape)], inits)
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(proto)
    return ei.convert(proto, optimize=0)


def _feeds(count: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.uniform(0.0, 1.0, (1, 3, SIZE, SIZE)).astype(np.float32)} for _ in range(count)]


def _outputs(model: Model, feeds: list[dict], backend: str = "numpy") -> np.ndarray:
    session = ei.Session(model, backend=backend)
    return np.concatenate([session.run(f)["y"] for f in feeds])


def _channel_mean_error(reference: np.ndarray, got: np.ndarray) -> np.ndarray:
    axes = tuple(i for i in range(reference.ndim) if i != 1)
    return np.abs((got.astype(np.float64) - reference).mean(axis=axes))


@pytest.mark.parametrize("sequential", [True, False])
@pytest.mark.parametrize("gemm", [False, True])
def test_bias_correction_shrinks_the_mean_error_and_raises_sqnr_on_held_out_inputs(gemm, sequential):
    model = _model(gemm=gemm)
    calibration_feeds, held_out = _feeds(16, seed=1), _feeds(8, seed=2)
    calibration = calibrate(model, calibration_feeds)
    plain = quantize_static(model, calibration)
    corrected = quantize_static(model, calibration, bias_correction=True, bias_correction_feeds=calibration_feeds,
                                sequential_correction=sequential)
    reference = _outputs(model, held_out)
    before, after = _outputs(plain, held_out), _outputs(corrected, held_out)
    error_before, error_after = _channel_mean_error(reference, before), _channel_mean_error(reference, after)
    assert error_after.max() < 0.5 * error_before.max()
    assert sqnr(reference, after) > sqnr(reference, before) + 1.0


@pytest.mark.parametrize("gemm", [False, True])
def test_layers_kept_float_lose_the_mean_shift_of_their_int8_rounded_weights(gemm):
    model = _model(gemm=gemm)
    calibration_feeds, held_out = _feeds(16, seed=5), _feeds(8, seed=6)
    calibration = calibrate(model, calibration_feeds)
    layers = quantizable_layers(calibration)
    corrected = quantize_static(model, calibration, exclude=layers, float_weights="int8")
    plain = quantize_static(model, replace(calibration, input_means={}), exclude=layers, float_weights="int8")
    # calibration recorded each layer input's channel means over every sample and position
    reads = {"conv_a": ("x", "w_a", "b_a"), "conv_b": ("r", "w_b", "b_b")}
    if gemm:
        reads["gemm"] = ("f", "w_c", "b_c")
    runs = list(run_batches(calibration.graph, [x for x, _, _ in reads.values()], calibration_feeds, backend="numpy"))
    means = {}
    for x, _, _ in reads.values():
        data = np.concatenate([np.asarray(r[x], np.float64) for r in runs])
        means[x] = data.mean(axis=0) if data.ndim == 2 else data.mean(axis=(0, 2, 3))
        np.testing.assert_allclose(calibration.input_means[x], means[x], rtol=1e-5, atol=1e-6)  # another backend
    # each bias is b - (W_r - W) E[x]; without recorded means it stays b; either is then stored
    # as its float16 value (float16_float_biases: a relative change under 2**-11)
    def half(array):
        return np.asarray(array, np.float32).astype(np.float16).astype(np.float32)

    for layer, (x, weight, bias) in reads.items():
        node = next(n for n in corrected.graph.nodes if n.name == layer)
        rounded = corrected.graph.initializers[node.inputs[1]].astype(np.float64)
        error = rounded - model.graph.initializers[weight].astype(np.float64)
        assert np.abs(error).max() > 0  # the weights were rounded
        shift = error @ means[x] if layer == "gemm" else error.sum(axis=(2, 3)) @ means[x]
        got = corrected.graph.initializers[node.inputs[2]]
        assert np.array_equal(half(got), got)
        np.testing.assert_allclose(got, model.graph.initializers[bias] - shift, rtol=2.0**-11, atol=1e-7)
        plain_node = next(n for n in plain.graph.nodes if n.name == layer)
        assert np.array_equal(plain.graph.initializers[plain_node.inputs[2]], half(model.graph.initializers[bias]))
    summary = json.loads(corrected.metadata["quantization"])["float_layer_weights"]
    assert summary == {"format": "int8", "weights": len(reads), "biases_corrected": len(reads)}
    # numerics on held-out inputs: the mean error per channel shrinks, SQNR rises; the backends agree
    reference = _outputs(model, held_out)
    before, after = _outputs(plain, held_out), _outputs(corrected, held_out)
    assert _channel_mean_error(reference, after).max() < 0.5 * _channel_mean_error(reference, before).max()
    assert sqnr(reference, after) > sqnr(reference, before) + 3.0
    np.testing.assert_allclose(_outputs(corrected, held_out, "onnxruntime"), after, rtol=1e-4, atol=1e-5)


def test_only_the_int32_biases_change_and_a_float_layer_keeps_its_bias():
    model = _model()
    feeds = _feeds(12, seed=3)
    calibration = calibrate(model, feeds)
    plain = quantize_static(model, calibration, exclude=["conv_b"])
    corrected = quantize_static(model, calibration, exclude=["conv_b"], bias_correction=True, bias_correction_feeds=feeds)
    # the same tensors (names, dtypes, shapes: the same bytes); only conv_a's int32 bias differs
    before, after = plain.graph.initializers, corrected.graph.initializers
    assert {k: (v.dtype, v.shape) for k, v in before.items()} == {k: (v.dtype, v.shape) for k, v in after.items()}
    changed = sorted(k for k in before if not np.array_equal(before[k], after[k]))
    assert changed and all(after[k].dtype == np.int32 for k in changed)
    float_bias = [n for n in corrected.graph.nodes if n.name == "conv_b"][0].inputs[2]
    assert np.array_equal(after[float_bias], model.graph.initializers["b_b"])
    assert json.loads(corrected.metadata["quantization"])["bias_correction"]["layers"] == 1
    assert "bias_correction" not in json.loads(plain.metadata["quantization"])


def test_nothing_quantized_leaves_the_float_graph_as_it_was():
    model = _model()
    feeds = _feeds(4, seed=4)
    calibration = calibrate(model, feeds)
    options = StaticOptions(exclude=frozenset({"conv_a", "conv_b", "relu_a"}))
    ranges = calibration.ranges("mse")
    graph, done = correct_biases(calibration.graph, lambda g: plan_quantization(g, ranges, options), feeds)
    assert done == [] and graph is calibration.graph


def test_a_zero_bias_is_corrected_only_when_asked_and_the_backends_agree():
    model = _model()
    graph = model.graph
    zeroed = {**graph.initializers, "b_a": np.zeros(12, np.float32)}
    model = Model(graph.replace(initializers=zeroed))
    feeds, held_out = _feeds(16, seed=5), _feeds(8, seed=6)
    calibration = calibrate(model, feeds)
    default = quantize_static(model, calibration, bias_correction=True, bias_correction_feeds=feeds)
    asked = quantize_static(model, calibration, bias_correction=True, bias_correction_feeds=feeds,
                            correct_zero_biases=True)
    assert json.loads(default.metadata["quantization"])["bias_correction"]["layers"] == 1
    assert json.loads(asked.metadata["quantization"])["bias_correction"]["layers"] == 2
    extra = set(asked.graph.initializers) - set(default.graph.initializers)  # conv_a's int32 bias and its scale
    assert set(default.graph.initializers) <= set(asked.graph.initializers)
    assert sorted(str(asked.graph.initializers[k].dtype) for k in extra) == ["float32", "int32"]
    reference = _outputs(model, held_out)
    error_default = _channel_mean_error(reference, _outputs(default, held_out))
    error_asked = _channel_mean_error(reference, _outputs(asked, held_out))
    assert error_asked.max() < error_default.max()
    # the corrected model runs the same on onnxruntime (its integer kernels) as on numpy, within
    # a small part of the INT8 error
    on_numpy, on_ort = _outputs(asked, held_out, "numpy"), _outputs(asked, held_out, "onnxruntime")
    int8_error = np.mean((on_numpy.astype(np.float64) - reference) ** 2)
    assert np.mean((on_numpy.astype(np.float64) - on_ort) ** 2) < 0.05 * int8_error


def test_quantize_with_bias_correction_records_it_and_refuses_the_searches():
    model = _model()
    feeds = _feeds(20, seed=7)
    corrected = quantize(model, feeds, bias_correction=True)
    summary = json.loads(corrected.metadata["quantization"])
    assert summary["bias_correction"]["layers"] == 2
    assert summary["bias_correction"]["samples"] <= summary["calibration_samples"]
    assert "quality" in summary
    held_out = _feeds(8, seed=8)
    reference = _outputs(model, held_out)
    plain = quantize(model, feeds)
    assert sqnr(reference, _outputs(corrected, held_out)) > sqnr(reference, _outputs(plain, held_out))
    limited = json.loads(quantize(model, feeds, bias_correction=True, limit=12).metadata["quantization"])
    assert limited["bias_correction"]["samples"] == limited["calibration_samples"] < 12  # no sample past the limit
    with pytest.raises(InputError, match="bias_correction"):
        quantize(model, feeds, bias_correction=True, min_sqnr=30.0)
    with pytest.raises(InputError, match="calibration samples"):
        quantize_static(model, calibrate(model, feeds), bias_correction=True)


def test_cli_bias_correction_flag(tmp_path):
    from click.testing import CliRunner

    from edgeinfer.cli.quantize import quantize_command

    model = _model()
    model.save(tmp_path / "m.eim")
    calib = tmp_path / "calib"
    calib.mkdir()
    for i, feed in enumerate(_feeds(10, seed=9)):
        np.save(calib / f"{i}.npy", feed["x"])
    out = tmp_path / "m.int8.eim"
    result = CliRunner().invoke(quantize_command, [str(tmp_path / "m.eim"), "--calib", str(calib), "--bias-correction",
                                                   "-q", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert json.loads(ei.load(out).metadata["quantization"])["bias_correction"]["layers"] == 2
