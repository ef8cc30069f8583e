"""LSTM/GRU weights under static INT8: never quantized (float compute), stored as int8 values
times one scale per gate row with ``float_weights="int8"`` (mixed precision's default), float32
where the search or the caller keeps them wide."""

import json

import numpy as np
import onnx
import pytest
from helpers import sqnr
from onnx import helper, numpy_helper

import edgeinfer as ei
from edgeinfer.ir.weights import int8_factors, int8_stored_weights
from edgeinfer.quantize.sensitivity import quantize_to_sqnr
from edgeinfer.quantize.static import calibrate, quantize_static, recurrent_layers

STEPS, FEATURES, HIDDEN = 7, 8, 12
GATES = {"LSTM": 4, "GRU": 3}


def _model(op: str, seed: int = 0) -> ei.Model:
    """x [T, 1, 8] -> MatMul (8->16) -> Relu -> bidirectional ``op`` (hidden 12, with biases) -> y [T, 2, 1, 12]."""
    rng = np.random.default_rng(seed)
    rows = GATES[op] * HIDDEN
    weights = {"w0": rng.standard_normal((FEATURES, 16)) * 0.4,
               "W": rng.standard_normal((2, rows, 16)) * 0.3, "R": rng.standard_normal((2, rows, HIDDEN)) * 0.3,
               "B": rng.standard_normal((2, 2 * rows)) * 0.1}
    nodes = [helper.make_node("MatMul", ["x", "w0"], ["m"], name="proj"),
             helper.make_node("Relu", ["m"], ["r"], name="relu"),
             helper.make_node(op, ["r", "W", "R", "B"], ["y"], name="rnn", hidden_size=HIDDEN, direction="bidirectional")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [STEPS, 1, FEATURES])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [STEPS, 2, 1, HIDDEN])],
                              [numpy_helper.from_array(w.astype(np.float32), name) for name, w in weights.items()])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(proto)
    return ei.convert(proto, optimize=0)


def _feeds(count: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((STEPS, 1, FEATURES)).astype(np.float32)} for _ in range(count)]


def _outputs(model: ei.Model, feeds: list[dict], backend: str) -> np.ndarray:
    session = ei.Session(model, backend=backend)
    return np.concatenate([session.run(f)["y"] for f in feeds])


@pytest.mark.parametrize("op", ["LSTM", "GRU"])
def test_recurrent_weights_are_stored_as_int8_per_gate_row(op, tmp_path):
    model = _model(op)
    calibration = calibrate(model, _feeds(12, seed=1))
    held_out = _feeds(6, seed=2)
    assert recurrent_layers(model.graph) == ["rnn"]
    plain = quantize_static(model, calibration)  # float32 float weights: the recurrent layer as it was
    small = quantize_static(model, calibration, float_weights="int8")
    wide = quantize_static(model, calibration, float_weights="int8", float32_weights=["rnn"])
    original = model.graph.initializers
    assert int8_stored_weights(small.graph.metadata) == {"W": 1, "R": 1}
    for name in ("W", "R"):
        assert np.array_equal(plain.graph.initializers[name], original[name])
        assert np.array_equal(wide.graph.initializers[name], original[name])
        rounded = small.graph.initializers[name]
        q, scale = int8_factors(rounded, 1)  # exactly int8 values times one scale per gate row
        assert scale.shape == (1, rounded.shape[1], 1) and np.abs(q).max() == 127
        np.testing.assert_allclose(rounded, original[name], atol=float(scale.max()) / 2 * 1.0001)
    assert np.array_equal(small.graph.initializers["B"], original["B"])  # the bias stays float
    assert "rnn" not in int8_stored_weights(wide.graph.metadata)
    # the file keeps a byte a weight: W and R's float32 bytes shrink to a quarter (plus scales)
    sizes = {}
    for label, quantized in (("plain", plain), ("small", small)):
        quantized.save(tmp_path / f"{label}.eim")
        sizes[label] = (tmp_path / f"{label}.eim").stat().st_size
    saved = sum(original[name].nbytes for name in ("W", "R")) * 3 / 4
    assert sizes["plain"] - sizes["small"] > 0.9 * saved
    loaded = ei.load(tmp_path / "small.eim")
    for name in ("W", "R"):
        assert np.array_equal(loaded.graph.initializers[name], small.graph.initializers[name])
    # numerics on held-out inputs: int8 recurrent weights cost little next to the quantized
    # projection; every backend computes the same float recurrence on them
    reference = _outputs(model, held_out, "numpy")
    with_plain, with_small = _outputs(plain, held_out, "numpy"), _outputs(small, held_out, "numpy")
    assert sqnr(reference, with_small) > 25.0
    assert sqnr(reference, with_small) > sqnr(reference, with_plain) - 3.0
    weights_only = quantize_static(model, calibration, exclude=["proj"], float_weights="int8", float32_weights=["proj"])
    assert sqnr(reference, _outputs(weights_only, held_out, "numpy")) > 35.0  # int8 recurrent weights alone
    np.testing.assert_allclose(_outputs(small, held_out, "onnxruntime"), with_small, rtol=1e-4, atol=1e-5)


def test_the_search_keeps_recurrent_weights_wide_only_where_the_target_needs_them():
    model = _model("LSTM", seed=3)
    feeds = _feeds(12, seed=4)
    calibration = calibrate(model, feeds)
    reference = _outputs(model, feeds[:8], "numpy")
    weights_only = quantize_static(model, calibration, exclude=["proj"], float_weights="int8", float32_weights=["proj"])
    ceiling = sqnr(reference, _outputs(weights_only, feeds[:8], "numpy"))
    for target, wide in ((ceiling - 12.0, False), (ceiling + 3.0, True)):
        result = quantize_to_sqnr(model, calibration, target, feeds=feeds[:8], method="mse", backend="numpy")
        summary = json.loads(result.model.metadata["quantization"])["mixed_precision"]
        assert summary["met"] and summary["sqnr_db"] >= target
        assert ("W" in int8_stored_weights(result.model.graph.metadata)) != wide
        stored = result.model.graph.initializers["W"]
        assert np.array_equal(stored, model.graph.initializers["W"].astype(np.float16).astype(np.float32)) == wide
