"""OpenVINO's INT8 on every CPU: the probe, the exact path (int8 weights as uint8, zero point
+ 128, where the probe saturates), and the path the plan names; exact int64 math is the oracle.

The onnxruntime test module (``tests/backends/onnxruntime/test_int8.py``) runs its integer
cases on this backend too. Reproduce an AVX2-only CPU with ``qemu-x86_64-static -cpu Haswell
.venv/bin/python -m pytest -q tests/backends/openvino/test_openvino_int8.py``.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import edgeinfer as ei
from devkit.testing import assert_close, integer_conv, integer_matmul, requantize

pytest.importorskip("openvino")
from edgeinfer.backends.openvino import int8  # noqa: E402
from edgeinfer.backends.openvino.backend import OpenVinoBackend  # noqa: E402


def _model(nodes: list, inputs: dict[str, np.ndarray], consts: dict, outputs=("y",)) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, "int8",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape) for n, a in inputs.items()],
        [helper.make_empty_tensor_value_info(name) for name in outputs], [numpy_helper.from_array(np.asarray(a), n) for n, a in consts.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    model.ir_version = 9
    return onnx.shape_inference.infer_shapes(model, strict_mode=True)


def _qdq(op: str, x: np.ndarray, w: np.ndarray, xz: int, scales: np.ndarray, **attrs):
    """x (uint8 or int8) by int8 weights in QDQ form; the oracle is the same arithmetic in int64."""
    out = x.dtype.type
    consts = {"xs": np.float32(0.03), "xz": out(xz), "w": w, "ws": scales, "wz": np.zeros(scales.shape, np.int8),
              "ys": np.float32(0.25), "yz": out(3)}
    nodes = [helper.make_node("DequantizeLinear", ["x", "xs", "xz"], ["xd"]),
             helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"], axis=0 if op == "Conv" else 1),
             helper.make_node(op, ["xd", "wd"], ["c"], **attrs),
             helper.make_node("QuantizeLinear", ["c", "ys", "yz"], ["y"])]
    if op == "Conv":
        acc = integer_conv(x, w, xz, 0, pads=attrs.get("pads"))
        multiplier = np.float64(0.03) * scales.reshape(1, -1, 1, 1) / 0.25
    else:
        acc, multiplier = integer_matmul(x, w, xz, 0), np.float64(0.03) * scales / 0.25
    exact = requantize(acc, multiplier, 3, x.dtype)
    return _model(nodes, {"x": x}, consts), {"x": x}, exact


def _qdq_matmul(rng, low: int = -128, high: int = 128):
    x = rng.integers(0, 256, (4, 48), dtype=np.uint8)
    return _qdq("MatMul", x, rng.integers(low, high, (48, 8), dtype=np.int8), 130,
                rng.uniform(0.002, 0.02, 8).astype(np.float32))


def _qdq_conv_int8_activations(rng):
    x = rng.integers(-128, 128, (1, 6, 7, 7), dtype=np.int8)
    return _qdq("Conv", x, rng.integers(-128, 128, (8, 6, 3, 3), dtype=np.int8), -5,
                rng.uniform(0.002, 0.02, 8).astype(np.float32), pads=[1, 1, 1, 1])


def _compile(model: onnx.ModelProto):
    return OpenVinoBackend(device="cpu").compile(ei.convert(model, optimize=0).graph)


def test_probe_predicts_whether_the_integer_kernels_are_exact(rng):
    """Raw OpenVINO (no rewrite) on a full-range QDQ MatMul is exact exactly where the probe says."""
    from edgeinfer.backends.openvino.backend import compile_config, core
    from edgeinfer.backends.openvino.convert import read_onnx

    model, feeds, exact = _qdq_matmul(rng)
    compiled = core().compile_model(read_onnx(model.SerializeToString()), "CPU", compile_config("CPU", {}, None, False))
    raw = next(iter(compiled.create_infer_request().infer(feeds).values()))
    off = int(np.abs(raw.astype(np.int64) - exact).max())
    assert (off <= 1) == (not int8.saturates()), (int8.probe_value(), off)
    assert int8.integer_path() == (int8.EXACT_REWRITE if int8.saturates() else int8.EXACT)


@pytest.mark.parametrize("make", [_qdq_matmul, _qdq_conv_int8_activations])
def test_openvino_backend_matches_int64_math_on_every_cpu(make, rng):
    model, feeds, exact = make(rng)
    session = ei.Session(ei.convert(model, optimize=0), backend="openvino")
    assert_close(session.run(feeds)["y"], exact, int_steps=1)
    assert f"int8 {int8.integer_path()}" in session.plan.describe()
    assert session.executable.stats()["integer_path"] == int8.integer_path()


@pytest.mark.parametrize("make", [_qdq_matmul, _qdq_conv_int8_activations])
def test_exact_graph_rewrites_only_where_the_probe_saturates(make, rng):
    model, feeds, exact = make(rng)
    graph = ei.convert(model, optimize=0).graph
    rewritten, path = int8.exact_graph(graph)
    assert path == int8.integer_path()
    if not int8.saturates():
        assert rewritten is graph
        return
    rewritten.verify()
    assert not any(a.dtype == np.int8 and a.size > 1 for a in rewritten.initializers.values())
    # numerics unchanged: the reference backend gives the same on both graphs
    before = ei.Session(ei.Model(graph), backend="numpy").run(feeds)["y"]
    assert_close(ei.Session(ei.Model(rewritten), backend="numpy").run(feeds)["y"], before)


def test_seven_bit_weights_keep_the_integer_kernels_and_are_exact(rng):
    model, feeds, exact = _qdq_matmul(rng, -64, 65)
    graph = ei.convert(model, optimize=0).graph
    rewritten, path = int8.exact_graph(graph)
    assert rewritten is graph
    assert path == (int8.SEVEN_BIT if int8.saturates() else int8.EXACT)
    assert_close(_compile(model).run(feeds)["y"], exact, int_steps=1)  # no pair of products leaves int16


def test_float_graphs_have_no_integer_path(mlp_model):
    assert int8.graph_integer_path(ei.convert(mlp_model).graph) is None
    session = ei.Session(ei.convert(mlp_model), backend="openvino")
    assert "int8" not in session.plan.describe()
    assert session.executable.stats()["integer_path"] is None


def test_compile_takes_the_exact_path_where_the_kernels_saturate(rng):
    """The compiled graph carries uint8 weights where the probe saturates (the CI step under
    ``qemu-x86_64-static -cpu Haswell`` fails if this is skipped there)."""
    if not int8.saturates():
        pytest.skip(f"OpenVINO's u8 x s8 kernels are exact here (probe: {int8.probe_value()})")
    model, feeds, exact = _qdq_matmul(rng)
    executable = _compile(model)
    assert executable.integer_path == int8.EXACT_REWRITE
    dtypes = {a.dtype for a in executable.graph.initializers.values() if a.size > 1}
    assert np.dtype(np.uint8) in dtypes and np.dtype(np.int8) not in dtypes
    assert_close(executable.run(feeds)["y"], exact, int_steps=1)


def _conv_beside_channel_pad(rng):
    """MediaPipe's face-landmark block in QDQ form: one quantized tensor read by a strided
    depthwise Conv (pads 0,0,1,1) and by MaxPool -> Pad along channels (16 -> 32), every
    QuantizeLinear/DequantizeLinear reading the same scale and zero point initializers (as
    ``ei.quantize`` writes them). OpenVINO's Pad transformation widened the shared zero point to
    32 channels in place, and compiling failed: "Argument shapes are inconsistent"."""
    channels, xz, ys, yz = 16, 92, np.float32(0.25), 130
    x = rng.integers(0, 256, (1, channels, 12, 12), dtype=np.uint8)
    w = rng.integers(-127, 128, (channels, 1, 3, 3), dtype=np.int8)
    scales = rng.uniform(0.002, 0.02, channels).astype(np.float32)
    consts = {"s": np.float32(0.1), "z": np.uint8(xz), "w": w, "ws": scales, "ys": ys, "yz": np.uint8(yz),
              "pads": np.array([0, 0, 0, 0, 0, channels, 0, 0], np.int64)}
    conv = {"group": channels, "kernel_shape": [3, 3], "strides": [2, 2], "pads": [0, 0, 1, 1]}
    nodes = [helper.make_node("DequantizeLinear", ["x", "s", "z"], ["xd"]),
             helper.make_node("DequantizeLinear", ["w", "ws"], ["wd"], axis=0),
             helper.make_node("Conv", ["xd", "wd"], ["c"], **conv),
             helper.make_node("QuantizeLinear", ["c", "ys", "yz"], ["y"]),
             helper.make_node("MaxPool", ["xd"], ["m"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("QuantizeLinear", ["m", "s", "z"], ["mq"]),
             helper.make_node("DequantizeLinear", ["mq", "s", "z"], ["md"]),
             helper.make_node("Pad", ["md", "pads"], ["p"]),
             helper.make_node("QuantizeLinear", ["p", "s", "z"], ["padded"])]
    model = _model(nodes, {"x": x}, consts, outputs=("y", "padded"))
    acc = integer_conv(x, w, xz, 0, group=channels, strides=[2, 2], pads=[0, 0, 1, 1])
    exact_y = requantize(acc, np.float64(0.1) * scales / np.float64(ys), yz, np.uint8)
    pooled = x.reshape(1, channels, 6, 2, 6, 2).max(axis=(3, 5))
    exact_padded = np.pad(pooled, [(0, 0), (0, channels), (0, 0), (0, 0)], constant_values=xz)  # real 0 is zp
    return model, {"x": x}, {"y": exact_y, "padded": exact_padded}


def test_conv_beside_a_channel_pad_sharing_its_zero_point_compiles_and_is_exact(rng):
    model, feeds, exact = _conv_beside_channel_pad(rng)
    graph = ei.convert(model, optimize=0).graph
    qdq = [n for n in graph.nodes if n.op_type in int8.QDQ_OPS]
    assert len({n.inputs[2] for n in qdq if n.inputs[1] == "s"}) == 1  # the shared constants reach the backend
    got = OpenVinoBackend(device="cpu").compile(graph).run(feeds)
    assert_close(got["y"], exact["y"], int_steps=1)
    np.testing.assert_array_equal(got["padded"], exact["padded"])
    owned = int8.own_quantization_parameters(graph)
    owned.verify()
    readers = [name for n in owned.nodes if n.op_type in int8.QDQ_OPS for name in n.inputs[1:3] if name]
    assert len(readers) == len(set(readers))  # every scale and zero point read once
    assert_close(ei.Session(ei.Model(owned), backend="numpy").run(feeds)["y"],
                 ei.Session(ei.Model(graph), backend="numpy").run(feeds)["y"])


def test_a_quantized_conv_transpose_runs_on_float_weights_and_matches_the_reference(rng):
    """OpenVINO computes an INT8 ConvTranspose wrongly (PP-OCRv4 det: -10 dB where onnxruntime
    gives 4.2 dB); the backend hands it the weight's float32 values instead (the activations stay
    quantized). The rewrite keeps the numbers: the same result as the numpy reference."""
    cin, cout = 8, 6
    x = rng.integers(0, 256, (1, cin, 7, 7), dtype=np.uint8)
    w = rng.integers(-127, 128, (cin, cout, 2, 2), dtype=np.int8)
    scales = rng.uniform(0.002, 0.02, cout).astype(np.float32)
    consts = {"s": np.float32(0.05), "z": np.uint8(100), "w": w, "ws": scales, "b": rng.standard_normal(cout).astype(np.float32),
              "ys": np.float32(0.2), "yz": np.uint8(120)}
    nodes = [helper.make_node("DequantizeLinear", ["x", "s", "z"], ["xd"]),
             helper.make_node("DequantizeLinear", ["w", "ws"], ["wd"], axis=1),
             helper.make_node("ConvTranspose", ["xd", "wd", "b"], ["c"], strides=[2, 2], kernel_shape=[2, 2]),
             helper.make_node("QuantizeLinear", ["c", "ys", "yz"], ["y"])]
    graph = ei.convert(_model(nodes, {"x": x}, consts), optimize=0).graph
    rewritten = int8.float_transposed_conv_weights(graph)
    rewritten.verify()
    transposed = next(n for n in rewritten.nodes if n.op_type == "ConvTranspose")
    assert rewritten.values[transposed.inputs[1]].const.dtype == np.float32
    assert sum(n.op_type == "DequantizeLinear" for n in rewritten.nodes) == 1  # the activation's stays
    want = ei.Session(ei.Model(graph), backend="numpy").run({"x": x})["y"]
    assert_close(ei.Session(ei.Model(rewritten), backend="numpy").run({"x": x})["y"], want, int_steps=1)
    assert_close(OpenVinoBackend(device="cpu").compile(graph).run({"x": x})["y"], want, int_steps=1)
