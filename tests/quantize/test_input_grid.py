"""Graph inputs made from 8-bit pixels are quantized exactly: calibration finds their grid
(``histogram.ValueGrid``) and the input's QuantizeLinear takes its step and a zero point on it."""

from dataclasses import replace

import numpy as np
import onnx
import pytest
from helpers import sqnr
from onnx import helper, numpy_helper

import edgeinfer as ei
from edgeinfer.quantize.histogram import ValueGrid
from edgeinfer.quantize.methods import INT8, UINT8, fake_quantize, quant_params
from edgeinfer.quantize.static import calibrate, grid_range, quantize_static

SIZE = 12


def _grid(*batches: np.ndarray):
    grid = ValueGrid()
    for batch in batches:
        grid.update(batch)
    return grid.grid


def test_pixel_grids_are_found_and_other_values_are_not():
    rng = np.random.default_rng(0)
    pixels = rng.integers(9, 245, (2, 3, 8, 8)).astype(np.float32)
    step, first, last = _grid(pixels[:1] / 255.0, pixels[1:] / 255.0)  # two batches, one grid
    assert step == pytest.approx(1 / 255, rel=1e-6) and (first, last) == (pixels.min(), pixels.max())
    assert _grid(pixels - 128.0)[1:] == (pixels.min() - 128, pixels.max() - 128)
    assert _grid((pixels - 127.5) / 127.5) is None  # 0 is not on that grid: no zero point holds it
    assert _grid(rng.standard_normal((1, 3, 8, 8)).astype(np.float32)) is None  # over 256 values
    assert _grid(np.full((4,), 0.5, np.float32)) is None  # one value: no step to find
    assert _grid(np.array([0.4, 0.8, 1.2], np.float32)) is None  # few values sit on a coarse grid by chance
    levels = np.arange(40, dtype=np.float32)
    assert _grid(levels * 0.1) is not None and _grid(np.append(levels * 0.1, 0.23)) is None  # 0.23 is off it


def test_grid_ranges_quantize_every_level_exactly():
    step = np.float32(1 / 255)
    for grid, qtype, expected in (((step, 9, 244), UINT8, 0), ((step, -40, 200), UINT8, 48),
                                  ((step, -250, -3), UINT8, 255), ((step, -100, 120), INT8, 0)):
        lo, hi = grid_range(grid, qtype)
        scale, zero_point = quant_params(lo, hi, qtype)
        assert int(zero_point) == expected and scale == pytest.approx(step, rel=1e-6)
        levels = np.arange(grid[1], grid[2] + 1)
        values = (levels * step).astype(np.float32)
        np.testing.assert_allclose(fake_quantize(values, scale, zero_point, qtype), values, rtol=0, atol=1e-7)
    assert grid_range((step, 0, 300), UINT8) is None  # more levels than uint8 has
    assert grid_range((step, 100, 300), UINT8) is None  # 0 and 300 do not fit in 256 levels
    assert grid_range((step, 0, 200), INT8) is None  # symmetric int8 reaches 127


def _model() -> ei.Model:
    """x [1,3,12,12] in [0, 1] -> Conv (3->8, 3x3) -> Relu -> Conv (8->4, 1x1) -> y."""
    rng = np.random.default_rng(1)
    inits = {"w1": rng.standard_normal((8, 3, 3, 3)) * 0.5, "b1": rng.standard_normal(8) * 0.1,
             "w2": rng.standard_normal((4, 8, 1, 1)) * 0.5, "b2": rng.standard_normal(4) * 0.1}
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["a"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["a"], ["r"], name="relu"),
             helper.make_node("Conv", ["r", "w2", "b2"], ["y"], name="conv2")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 3, SIZE, SIZE])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 4, SIZE, SIZE])],
                              [numpy_helper.from_array(v.astype(np.float32), k) for k, v in inits.items()])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(proto)
    return ei.convert(proto, optimize=0)


def _pixels(count: int, seed: int, low: int = 9, high: int = 245) -> list[dict]:
    """Gray-ish photos as ddddocr feeds them: pixels of a narrower range than 0-255, ``x / 255``."""
    rng = np.random.default_rng(seed)
    return [{"x": (rng.integers(low, high, (1, 3, SIZE, SIZE)).astype(np.float32) / np.float32(255.0))}
            for _ in range(count)]


@pytest.mark.parametrize("method", ["mse", "minmax"])
def test_pixel_input_is_quantized_exactly(method):
    model = _model()
    calibration = calibrate(model, _pixels(8, seed=2))
    assert calibration.input_grids["x"][0] == pytest.approx(1 / 255, rel=1e-6)
    exact = quantize_static(model, calibration, method=method)
    rounded = quantize_static(model, replace(calibration, input_grids={}), method=method)
    held_out = _pixels(6, seed=3, low=0, high=256)  # darker and brighter pixels than calibration saw
    for quantized, is_exact in ((exact, True), (rounded, False)):
        node = next(n for n in quantized.graph.nodes if n.op_type == "QuantizeLinear" and n.inputs[0] == "x")
        scale, zero_point = (quantized.graph.initializers[name] for name in node.inputs[1:3])
        x = np.concatenate([f["x"] for f in held_out])
        error = np.abs(fake_quantize(x, float(scale), int(zero_point), UINT8) - x).max()
        assert (error < 1e-6) == is_exact, (scale, zero_point, error)
    # the model's output: the exact input removes one source of noise, on every backend
    reference = np.concatenate([ei.Session(model, backend="numpy").run(f)["y"] for f in held_out])
    outputs = {label: np.concatenate([ei.Session(m, backend="numpy").run(f)["y"] for f in held_out])
               for label, m in (("exact", exact), ("rounded", rounded))}
    assert sqnr(reference, outputs["exact"]) > sqnr(reference, outputs["rounded"]) + 0.5
    got = np.concatenate([ei.Session(exact, backend="onnxruntime").run(f)["y"] for f in held_out])
    np.testing.assert_allclose(got, outputs["exact"], atol=0.02 * float(np.abs(reference).max()))


def test_inputs_off_any_grid_keep_the_methods_range():
    model = _model()
    rng = np.random.default_rng(4)
    feeds = [{"x": rng.uniform(0, 1, (1, 3, SIZE, SIZE)).astype(np.float32)} for _ in range(4)]
    calibration = calibrate(model, feeds)
    assert calibration.input_grids == {}
    assert calibration.ranges("mse")["x"] == replace(calibration, input_grids={}).ranges("mse")["x"]
