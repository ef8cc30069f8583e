"""GPTQ weight rounding (edgeinfer/quantize/gptq.py): the rounded weights lie on the int8 grid
nearest rounding uses (one symmetric scale per output channel, exactly ``q * scale``), and on
held-out inputs each layer's output with them is closer to fp32 than with nearest rounding, for
a dense, a grouped (depthwise) Conv and a Gemm; ``ei.quantize(weight_rounding="gptq")`` says so in
its metadata; bad options are typed errors."""

import json

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import edgeinfer as ei
from edgeinfer.errors import InputError
from edgeinfer.ir.weights import int8_factors, int8_rounded
from edgeinfer.quantize import quantize
from edgeinfer.quantize.gptq import gptq_weights
from edgeinfer.quantize.static import weighted_layers
from tests.quantize.helpers import sqnr


def _model(seed: int = 0) -> ei.Model:
    """x [1,4,12,12] -> Conv (4->8, 3x3, pad 1) -> Relu -> depthwise Conv (8, 3x3, stride 2) ->
    Relu -> Flatten -> Gemm (288->10, transB) -> y."""
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array(rng.standard_normal((8, 4, 3, 3)).astype(np.float32) * 0.3, "w1"),
             numpy_helper.from_array(rng.standard_normal((8, 1, 3, 3)).astype(np.float32) * 0.3, "w2"),
             numpy_helper.from_array(rng.standard_normal((10, 288)).astype(np.float32) * 0.05, "w3")]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], name="dw", group=8, strides=[2, 2], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c2"], ["r2"]),
             helper.make_node("Flatten", ["r2"], ["f"]),
             helper.make_node("Gemm", ["f", "w3"], ["y"], name="fc", transB=1)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 12, 12])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])], inits)
    return ei.convert(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


def _feeds(count: int, seed: int) -> list[dict[str, np.ndarray]]:
    """Smooth (spatially correlated) inputs: the case GPTQ's compensation is for."""
    rng = np.random.default_rng(seed)
    return [{"x": np.cumsum(np.cumsum(rng.standard_normal((1, 4, 12, 12)), axis=2), axis=3).astype(np.float32) / 6}
            for _ in range(count)]


def _with(graph, weights: dict[str, np.ndarray]):
    inits = graph.initializers
    inits.update(weights)
    return graph.replace(list(graph.nodes), initializers=inits)


def _layer_outputs(graph, feeds, names=("c1", "c2", "y")):
    from edgeinfer.quantize.calibrate import run_batches

    return [[out[n] for n in names] for out in run_batches(graph, list(names), feeds, backend="numpy")]


def test_gptq_weights_are_on_the_int8_grid_and_closer_at_each_layer_output():
    model = _model()
    graph = model.graph
    layers = weighted_layers(graph)
    rounded, names = gptq_weights(graph, _feeds(16, 1), layers, backend="numpy")
    assert sorted(names) == ["w1", "w2", "w3"]
    axes = {"w1": 0, "w2": 0, "w3": 0}
    for name, axis in axes.items():
        got = rounded.initializers[name]
        q_scale = int8_factors(got, axis)
        assert q_scale is not None, f"{name} is not exactly int8 x per-channel scale"
        # the same scale nearest rounding takes: the largest weight of each channel keeps 127 steps
        np.testing.assert_array_equal(q_scale[1], int8_factors(int8_rounded(graph.initializers[name], axis), axis)[1])
        assert not np.array_equal(got, int8_rounded(graph.initializers[name], axis))
    nearest = _with(graph, {n: int8_rounded(graph.initializers[n], axes[n]) for n in axes})
    held_out = _feeds(32, 2)  # 8 samples: the output's SQNR moves by 2 dB with a 0.05% change of the scales
    reference, gptq, plain = (_layer_outputs(g, held_out) for g in (graph, rounded, nearest))
    for index, name in enumerate(("c1", "c2", "y")):
        ref = np.concatenate([r[index].ravel() for r in reference])
        with_gptq = sqnr(ref, np.concatenate([r[index].ravel() for r in gptq]))
        with_nearest = sqnr(ref, np.concatenate([r[index].ravel() for r in plain]))
        assert with_gptq > with_nearest + 1.0, (name, with_gptq, with_nearest)


def test_quantize_with_gptq_records_it_and_stays_accurate():
    model = _model()
    calibration = _feeds(16, 3)
    int8 = quantize(model, calibration_data=calibration, backend="numpy", weight_rounding="gptq")
    summary = json.loads(int8.metadata["quantization"])
    assert summary["weight_rounding"]["method"] == "gptq"
    assert summary["weight_rounding"]["weights"] == 3
    held_out = _feeds(4, 4)
    fp32 = ei.Session(model, backend="numpy")
    got = ei.Session(int8, backend="numpy")
    ref = np.concatenate([fp32.run(f)["y"].ravel() for f in held_out])
    assert sqnr(ref, np.concatenate([got.run(f)["y"].ravel() for f in held_out])) > 20


def test_layers_kept_float_with_float32_weights_get_the_float_weights_not_the_rounded_ones():
    """A layer kept float with float32 weights computes on the float model's weights; with int8
    float-layer weights, on the GPTQ-rounded ones (those are its int8 codes). Before, every float32
    weight of a GPTQ calibration was the rounded one, so mixed precision found no float32 weight
    that helped and stored all of them float32 (PP-OCRv4 det: 0.999x fp32)."""
    from edgeinfer.quantize.gptq import with_gptq_weights
    from edgeinfer.quantize.static import calibrate, quantizable_layers, quantize_static

    model = _model()
    feeds = _feeds(16, 6)
    calibration = calibrate(model, feeds, backend="numpy")
    rounded = with_gptq_weights(calibration, feeds, backend="numpy")
    original, gptq = calibration.graph.initializers, rounded.rounded_graph.initializers
    assert not np.array_equal(original["w1"], gptq["w1"]) and not np.array_equal(original["w3"], gptq["w3"])

    def weights(graph) -> dict[str, np.ndarray]:  # a float layer's weight is a constant input of its node
        nodes = {n.name: n for n in graph.nodes}
        return {name: graph.values[nodes[layer].inputs[1]].const for layer, name in (("conv1", "w1"), ("fc", "w3"))}

    float32 = quantize_static(model, rounded, exclude=["conv1", "fc"], float_weights="float32")
    np.testing.assert_array_equal(weights(float32.graph)["w1"], original["w1"])
    np.testing.assert_array_equal(weights(float32.graph)["w3"], original["w3"])
    mixed = quantize_static(model, rounded, exclude=["conv1", "fc"], float_weights="int8", float32_weights=["fc"])
    np.testing.assert_array_equal(weights(mixed.graph)["w1"], gptq["w1"])  # int8-stored: GPTQ's codes
    np.testing.assert_array_equal(weights(mixed.graph)["w3"], original["w3"])
    every = quantize_static(model, rounded, exclude=quantizable_layers(rounded), float_weights="float32")
    for feed in _feeds(4, 7):  # every layer float with float32 weights: the float model itself
        np.testing.assert_allclose(ei.Session(every, backend="numpy").run(feed)["y"],
                                   ei.Session(model, backend="numpy").run(feed)["y"], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("options", [dict(weight_rounding="ada"), dict(weight_rounding="gptq", per_channel=False),
                                     dict(weight_rounding="gptq", mode="dynamic")])
def test_bad_weight_rounding_options_are_typed_errors(options):
    with pytest.raises(InputError, match="weight_rounding|per_channel"):
        quantize(_model(), calibration_data=_feeds(4, 5), backend="numpy", **options)
