"""Randomized comparisons of the numpy NN kernels with onnxruntime.

Configurations the ONNX node cases do not cover: grouped + dilated + strided convolutions
with asymmetric pads, depthwise convolutions (with a channel multiplier), 1x1 fast paths,
1-D and 3-D windows, ConvTranspose with groups and output_shape, ceil-mode pools with
dilations and MaxPool indices, integer convolutions with per-channel weights, LRN. Each
model runs through ``ei.Session(ei.convert(model), backend="numpy")`` and through
onnxruntime; outputs must agree in dtype and value. Integer kernels whose products onnxruntime
computes in u8 x s8 kernels (which saturate on x86 CPUs without VNNI) have exact int64 math
as their oracle instead (``_compare_exact``).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import edgeinfer as ei
from devkit.testing import assert_close, integer_conv, integer_matmul, requantize

ort = pytest.importorskip("onnxruntime")
int8 = pytest.importorskip("edgeinfer.backends.onnxruntime.int8")

OPSET = 19


def _model(op: str, feeds: dict[str, np.ndarray], consts: dict[str, np.ndarray], n_outputs: int = 1,
           input_order: list[str] | None = None, **attrs) -> onnx.ModelProto:
    names = input_order or [*feeds, *consts]
    outputs = [f"y{k}" for k in range(n_outputs)]
    node = helper.make_node(op, names, outputs, **attrs)
    graph = helper.make_graph(
        [node], op,
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape) for n, a in feeds.items()],
        [helper.make_empty_tensor_value_info(o) for o in outputs],
        [numpy_helper.from_array(a, n) for n, a in consts.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 9
    return onnx.shape_inference.infer_shapes(model, strict_mode=True)  # onnxruntime wants typed outputs


def _compare(model: onnx.ModelProto, feeds: dict[str, np.ndarray], **tolerance) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    expected = ort.InferenceSession(model.SerializeToString(), options,
                                    providers=["CPUExecutionProvider"]).run(None, feeds)
    got = ei.Session(ei.convert(model), backend="numpy").run(feeds)
    results = []
    for index, ref in enumerate(expected):
        value = got[f"y{index}"]
        assert value.dtype == ref.dtype, f"y{index}: dtype {value.dtype} != onnxruntime's {ref.dtype}"
        assert_close(value, ref, name=f"y{index}", **tolerance)
        results.append(value)
    return results


def _compare_exact(model: onnx.ModelProto, feeds: dict[str, np.ndarray], exact: np.ndarray, **tolerance) -> None:
    """The numpy backend and edgeinfer's onnxruntime backend against exact integer math, and
    raw onnxruntime too where its u8 x s8 kernels do not saturate on this CPU."""
    converted = ei.convert(model)
    for backend in ("numpy", "onnxruntime"):
        got = ei.Session(converted, backend=backend).run(feeds)["y0"]
        assert got.dtype == exact.dtype, f"{backend}: dtype {got.dtype} != {exact.dtype}"
        assert_close(got, exact, name=f"{backend} y0", **tolerance)
    if not int8.saturates():
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        raw = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        assert_close(raw.run(None, feeds)[0], exact, name="raw onnxruntime y0", **tolerance)


def _normal(rng, *shape) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


CONV_CASES = [
    # (N, C, spatial, M, kernel, group, strides, dilations, pads or auto_pad)
    (2, 6, (13, 11), 9, (3, 2), 3, (2, 1), (2, 3), (1, 0, 2, 3)),
    (1, 8, (12, 12), 8, (3, 3), 8, (1, 1), (1, 1), (1, 1, 1, 1)),  # depthwise
    (1, 4, (15, 9), 12, (3, 3), 4, (2, 2), (1, 2), (0, 2, 1, 0)),  # depthwise, multiplier 3
    (2, 16, (7, 9), 24, (1, 1), 1, (1, 1), (1, 1), (0, 0, 0, 0)),  # pointwise fast path
    (1, 16, (9, 9), 8, (1, 1), 2, (2, 2), (1, 1), (0, 0, 0, 0)),  # strided grouped 1x1
    (1, 5, (17,), 7, (4,), 1, (3,), (2,), (2, 1)),  # 1-D
    (1, 4, (6, 7, 5), 6, (3, 2, 2), 2, (1, 2, 1), (1, 1, 2), (1, 0, 1, 0, 1, 1)),  # 3-D
    (1, 6, (10, 9), 6, (3, 3), 1, (2, 2), (1, 1), "SAME_UPPER"),
    (1, 6, (10, 9), 6, (4, 3), 2, (3, 2), (1, 1), "SAME_LOWER"),
    (1, 6, (10, 9), 6, (3, 3), 1, (2, 3), (2, 1), "VALID"),
    (2, 3, (20,), 6, (3,), 3, (1,), (2,), (2, 1)),  # depthwise 1-D, multiplier 2, unit stride
    (1, 4, (5, 6, 7), 4, (3, 2, 3), 4, (1, 1, 1), (1, 2, 1), (1, 0, 2, 1, 1, 0)),  # depthwise 3-D
    (1, 5, (9, 8), 5, (5, 5), 5, (1, 1), (1, 1), "SAME_UPPER"),  # depthwise 5x5
]


@pytest.mark.parametrize("case", CONV_CASES, ids=[f"conv{i}" for i in range(len(CONV_CASES))])
def test_conv_matches_onnxruntime(case) -> None:
    n, c, spatial, m, kernel, group, strides, dilations, padding = case
    rng = np.random.default_rng(len(spatial) * 100 + c)
    x = _normal(rng, n, c, *spatial)
    w = _normal(rng, m, c // group, *kernel)
    b = _normal(rng, m)
    pad_attr = {"auto_pad": padding} if isinstance(padding, str) else {"pads": list(padding)}
    model = _model("Conv", {"x": x}, {"w": w, "b": b}, kernel_shape=list(kernel), group=group,
                   strides=list(strides), dilations=list(dilations), **pad_attr)
    _compare(model, {"x": x})


@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER"])
def test_dilated_same_conv_matches_reference(rng, auto_pad: str) -> None:
    from onnx.reference import ReferenceEvaluator  # onnxruntime rejects dilated SAME padding

    x = _normal(rng, 1, 4, 11, 10)
    w = _normal(rng, 8, 2, 3, 2)
    model = _model("Conv", {"x": x}, {"w": w}, group=2, strides=[2, 1], dilations=[2, 3], auto_pad=auto_pad)
    (expected,) = ReferenceEvaluator(model).run(None, {"x": x})
    y = ei.Session(ei.convert(model), backend="numpy").run({"x": x})["y0"]
    assert_close(y, expected)


def test_conv_float64_stays_float64(rng) -> None:
    from onnx.reference import ReferenceEvaluator  # onnxruntime has no float64 Conv

    x = rng.standard_normal((1, 3, 8, 8))
    w = rng.standard_normal((4, 3, 3, 3))
    model = _model("Conv", {"x": x}, {"w": w}, pads=[1, 1, 1, 1], strides=[2, 1])
    (expected,) = ReferenceEvaluator(model).run(None, {"x": x})
    y = ei.Session(ei.convert(model), backend="numpy").run({"x": x})["y0"]
    assert y.dtype == np.float64
    assert_close(y, expected)


CONV_TRANSPOSE_CASES = [
    dict(strides=[2, 2], pads=[1, 0, 0, 1]),
    dict(strides=[2, 3], dilations=[2, 1], output_padding=[1, 2], group=2),
    dict(strides=[2, 2], output_shape=[15, 16]),
    dict(strides=[3, 2], auto_pad="SAME_UPPER"),
    dict(strides=[2, 2], auto_pad="SAME_LOWER", group=2),
    dict(strides=[1, 1], dilations=[2, 2], pads=[2, 1, 1, 2]),
]


@pytest.mark.parametrize("attrs", CONV_TRANSPOSE_CASES, ids=[f"convT{i}" for i in range(len(CONV_TRANSPOSE_CASES))])
def test_conv_transpose_matches_onnxruntime(rng, attrs) -> None:
    group = attrs.get("group", 1)
    x = _normal(rng, 2, 4, 7, 8)
    w = _normal(rng, 4, 6 // group, 3, 3)
    b = _normal(rng, 6)
    model = _model("ConvTranspose", {"x": x}, {"w": w, "b": b}, kernel_shape=[3, 3], **attrs)
    _compare(model, {"x": x})


def test_conv_transpose_1d_and_3d(rng) -> None:
    for spatial, kernel in (((9,), [4]), ((4, 5, 3), [2, 3, 2])):
        x = _normal(rng, 1, 3, *spatial)
        w = _normal(rng, 3, 2, *kernel)
        model = _model("ConvTranspose", {"x": x}, {"w": w}, kernel_shape=kernel, strides=[2] * len(kernel))
        _compare(model, {"x": x})


POOL_CASES = [
    dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1),
    dict(kernel_shape=[3, 2], strides=[2, 2], pads=[1, 0, 1, 1], ceil_mode=1),
    dict(kernel_shape=[2, 2], strides=[3, 2], dilations=[2, 2], pads=[1, 1, 0, 0], ceil_mode=1),
    dict(kernel_shape=[3, 3], strides=[1, 1], auto_pad="SAME_UPPER"),
    dict(kernel_shape=[2, 3], strides=[2, 2], auto_pad="SAME_LOWER"),
    dict(kernel_shape=[3, 3], strides=[2, 1], dilations=[1, 2]),
]


@pytest.mark.parametrize("attrs", POOL_CASES, ids=[f"pool{i}" for i in range(len(POOL_CASES))])
def test_max_pool_with_indices_matches_onnxruntime(rng, attrs) -> None:
    x = _normal(rng, 2, 3, 11, 10)
    for storage_order in (0, 1):
        model = _model("MaxPool", {"x": x}, {}, n_outputs=2, storage_order=storage_order, **attrs)
        _compare(model, {"x": x})


@pytest.mark.parametrize("attrs", POOL_CASES + [dict(kernel_shape=[1, 3], strides=[1, 1]), dict(kernel_shape=[1, 1])],
                         ids=[f"pool{i}" for i in range(len(POOL_CASES) + 2)])
def test_max_pool_values_match_onnxruntime(rng, attrs) -> None:
    """The separable path (no indices output): float32, float64 and int8, odd sizes."""
    for x in (_normal(rng, 2, 3, 11, 10), rng.standard_normal((1, 2, 7, 9)),
              rng.integers(-128, 128, (1, 2, 9, 8), dtype=np.int8)):
        (y,) = _compare(_model("MaxPool", {"x": x}, {}, **attrs), {"x": x})
        assert not np.shares_memory(y, x)


@pytest.mark.parametrize("attrs", POOL_CASES, ids=[f"pool{i}" for i in range(len(POOL_CASES))])
def test_average_pool_matches_onnxruntime(rng, attrs) -> None:
    x = _normal(rng, 2, 3, 11, 10)
    for count_include_pad in (0, 1):
        if count_include_pad and attrs.get("dilations"):
            continue  # onnxruntime does not implement dilated AveragePool with counted pads
        model = _model("AveragePool", {"x": x}, {}, count_include_pad=count_include_pad, **attrs)
        _compare(model, {"x": x})


def test_max_pool_int8_and_3d(rng) -> None:
    x = rng.integers(-128, 128, (1, 2, 9, 8), dtype=np.int8)
    _compare(_model("MaxPool", {"x": x}, {}, kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]), {"x": x})
    x3 = _normal(rng, 1, 2, 5, 6, 7)
    _compare(_model("MaxPool", {"x": x3}, {}, kernel_shape=[2, 3, 2], strides=[2, 2, 2], ceil_mode=1), {"x": x3})


def test_lp_pool_matches_onnxruntime(rng) -> None:
    x = _normal(rng, 1, 3, 9, 8)
    for p in (1, 2, 3):
        model = _model("LpPool", {"x": x}, {}, kernel_shape=[3, 2], strides=[2, 2], pads=[1, 0, 0, 1], p=p)
        _compare(model, {"x": x}, rtol=1e-4)  # x**3 sums: onnxruntime accumulates in another order


def test_global_pools_match_onnxruntime(rng) -> None:
    x = _normal(rng, 2, 5, 6, 7)
    for op in ("GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool"):
        _compare(_model(op, {"x": x}, {}), {"x": x})


def test_qlinear_conv_per_channel_matches_onnxruntime(rng) -> None:
    """Full-range u8 x s8 products: exact int64 math is the oracle; raw onnxruntime is compared
    with it only where its u8 x s8 kernels are exact on this CPU (the probe), and edgeinfer's
    onnxruntime backend everywhere (it takes the exact path where they saturate)."""
    x = rng.integers(0, 256, (1, 8, 9, 10), dtype=np.uint8)
    w = rng.integers(-127, 128, (6, 4, 3, 3), dtype=np.int8)
    consts = {
        "x_scale": np.float32(0.02), "x_zero_point": np.uint8(121),
        "w": w, "w_scale": rng.uniform(0.001, 0.01, 6).astype(np.float32), "w_zero_point": np.zeros(6, np.int8),
        "y_scale": np.float32(0.05), "y_zero_point": np.uint8(128),
        "b": rng.integers(-500, 500, 6).astype(np.int32),
    }
    consts = {k: np.asarray(v) for k, v in consts.items()}
    order = ["x", "x_scale", "x_zero_point", "w", "w_scale", "w_zero_point", "y_scale", "y_zero_point", "b"]
    attrs = {"group": 2, "strides": [2, 1], "pads": [1, 0, 1, 2], "dilations": [1, 2]}
    model = _model("QLinearConv", {"x": x}, consts, input_order=order, **attrs)
    accumulator = integer_conv(x, w, consts["x_zero_point"], consts["w_zero_point"], **attrs)
    accumulator += consts["b"].reshape(1, -1, 1, 1)
    multiplier = consts["x_scale"].astype(np.float64) * consts["w_scale"] / consts["y_scale"]
    exact = requantize(accumulator, multiplier, consts["y_zero_point"], np.uint8)
    # the engines requantize in float32: a product that lands on a tie may round one step apart
    _compare_exact(model, {"x": x}, exact, int_steps=1)


def test_conv_integer_matches_onnxruntime(rng) -> None:
    x = rng.integers(0, 256, (1, 4, 8, 9), dtype=np.uint8)
    w = rng.integers(0, 256, (6, 2, 3, 3), dtype=np.uint8)
    consts = {"w": w, "x_zero_point": np.asarray(np.uint8(100)), "w_zero_point": np.asarray(np.uint8(131))}
    model = _model("ConvInteger", {"x": x}, consts, input_order=["x", "w", "x_zero_point", "w_zero_point"],
                   group=2, pads=[1, 1, 0, 2], strides=[1, 2])
    _compare(model, {"x": x})


def test_matmul_integer_per_row_and_column_zero_points(rng) -> None:
    a = rng.integers(0, 256, (2, 5, 7), dtype=np.uint8)
    b = rng.integers(-128, 128, (7, 4), dtype=np.int8)
    consts = {"b": b, "a_zero_point": np.asarray(np.uint8(3)), "b_zero_point": rng.integers(-5, 5, 4).astype(np.int8)}
    model = _model("MatMulInteger", {"a": a}, consts, input_order=["a", "b", "a_zero_point", "b_zero_point"])
    exact = integer_matmul(a, b, consts["a_zero_point"], consts["b_zero_point"]).astype(np.int32)
    _compare_exact(model, {"a": a}, exact)


def test_lrn_matches_onnxruntime(rng) -> None:
    # onnx.reference's LRN loops over the batch axis instead of the channels, so ORT is the oracle.
    x = _normal(rng, 3, 7, 5, 4)
    for size in (3, 5):  # onnxruntime implements odd sizes only
        _compare(_model("LRN", {"x": x}, {}, size=size, alpha=0.01, beta=0.6, bias=1.5), {"x": x})


def test_resize_modes_match_onnxruntime(rng) -> None:
    x = _normal(rng, 1, 2, 6, 7)
    scales = np.array([1, 1, 1.7, 0.6], dtype=np.float32)
    for mode, transform in (("linear", "half_pixel"), ("cubic", "pytorch_half_pixel"), ("nearest", "asymmetric"),
                            ("cubic", "half_pixel"), ("nearest", "half_pixel")):
        model = _model("Resize", {"x": x}, {"roi": np.zeros(0, np.float32), "scales": scales}, mode=mode,
                       coordinate_transformation_mode=transform)
        _compare(model, {"x": x}, rtol=1e-5, atol=1e-5)
    # align_corners from sizes: with scales whose output length is fractional, onnxruntime divides
    # by the integer length and onnx.reference (which the node cases follow) by the fractional one.
    sizes = np.array([1, 2, 11, 4], dtype=np.int64)
    model = _model("Resize", {"x": x}, {"roi": np.zeros(0, np.float32), "scales": np.zeros(0, np.float32),
                                        "sizes": sizes}, mode="linear", coordinate_transformation_mode="align_corners")
    _compare(model, {"x": x}, rtol=1e-5, atol=1e-5)


def test_resize_uint8_linear_rounds(rng) -> None:
    x = rng.integers(0, 256, (1, 3, 5, 6), dtype=np.uint8)
    scales = np.array([1, 1, 2.0, 1.5], dtype=np.float32)
    model = _model("Resize", {"x": x}, {"roi": np.zeros(0, np.float32), "scales": scales}, mode="linear")
    _compare(model, {"x": x}, int_steps=1)  # onnxruntime interpolates uint8 in fixed point


def test_batchnorm_training_mode_raises(rng) -> None:
    x = _normal(rng, 2, 3, 4, 4)
    params = {k: np.abs(_normal(rng, 3)) for k in ("scale", "b", "mean", "var")}
    model = _model("BatchNormalization", {"x": x}, params, n_outputs=3, training_mode=1)
    with pytest.raises(ei.UnsupportedOpError, match="training"):
        ei.Session(ei.convert(model), backend="numpy").run({"x": x})


def test_bad_conv_shapes_raise_a_typed_error(rng) -> None:
    x = _normal(rng, 1, 6, 8, 8)
    w = _normal(rng, 4, 4, 3, 3)  # 6 channels cannot be split into groups of 4
    model = _model("Conv", {"x": x}, {"w": w})
    with pytest.raises(ei.EdgeInferError, match="group"):
        ei.Session(ei.convert(model), backend="numpy").run({"x": x})
