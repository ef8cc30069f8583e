"""The tflite backend's ``supports`` is truthful: a part it accepts compiles and runs (issues 19/22).

Each known lie has a test (a uint8 graph input, float64/float16 activations, symbolic spatial
dims), and a sweep places small graphs (these and devkit.zoo models) with the partitioner and
runs every tflite part against onnxruntime on the same inputs.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import edgeinfer as ei
from devkit import zoo
from devkit.testing import assert_close
from edgeinfer.backend import CompileOptions, get_backend

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("ai_edge_litert")


def _model(nodes, inputs, outputs, inits=(), opset: int = 17) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "t", inputs, outputs, list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 9
    return onnx.shape_inference.infer_shapes(model, strict_mode=True)


def _truthful(session: ei.Session) -> None:
    """No part was moved off tflite after supports() accepted it (the runtime re-partitions a
    part that fails to compile or on its first run, and the plan says so: that is the lie)."""
    text = session.plan.describe()
    assert "failed to compile" not in text and "failed to run" not in text, text


def _onnxruntime(model: onnx.ModelProto, feeds: dict) -> dict:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds), strict=True))


def _qdq_conv_uint8(rng):
    """uint8 graph input and output around a QDQ conv (int8 per-channel weights)."""
    x = rng.integers(0, 256, (1, 4, 7, 7), dtype=np.uint8)
    inits = [numpy_helper.from_array(a, n) for n, a in {
        "xs": np.float32(0.03), "xz": np.uint8(120), "w": rng.integers(-127, 128, (6, 4, 3, 3), dtype=np.int8),
        "ws": rng.uniform(0.002, 0.02, 6).astype(np.float32), "wz": np.zeros(6, np.int8),
        "ys": np.float32(0.2), "yz": np.uint8(128)}.items()]
    nodes = [helper.make_node("DequantizeLinear", ["x", "xs", "xz"], ["xd"]),
             helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"], axis=0),
             helper.make_node("Conv", ["xd", "wd"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("QuantizeLinear", ["r", "ys", "yz"], ["y"])]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.UINT8, x.shape)],
                   [helper.make_empty_tensor_value_info("y")], inits, opset=19)
    return model, {"x": x}


def test_a_uint8_graph_input_and_output_run_on_tflite(rng):
    """The exporter used to refuse a uint8 graph input ("TFLite integer graphs take int8")
    after supports() had accepted it; now the graph takes and returns uint8 (a requantizing
    QUANTIZE at each edge) and matches onnxruntime to one step."""
    model, feeds = _qdq_conv_uint8(rng)
    converted = ei.convert(model, optimize=0)
    assert get_backend("tflite").unsupported(converted.graph) == {}
    session = ei.Session(converted, backend="tflite")
    assert {part.backend for part in session.plan.parts} == {"tflite"}
    got = session.run(feeds)["y"]
    _truthful(session)
    expected = _onnxruntime(model, feeds)["y"]
    assert got.dtype == np.uint8 and got.shape == expected.shape
    assert_close(got, expected, int_steps=1, name="qdq conv uint8 in/out")


def test_a_per_channel_uint8_graph_input_is_declined_not_failed(rng):
    """TFLite requantizes a uint8 edge per tensor only: supports() says so, and the
    DequantizeLinear of that input runs elsewhere."""
    x = rng.integers(0, 256, (1, 3, 4), dtype=np.uint8)
    inits = [numpy_helper.from_array(np.array([0.1, 0.2, 0.3], np.float32), "s"),
             numpy_helper.from_array(np.array([10, 128, 200], np.uint8), "z")]
    nodes = [helper.make_node("DequantizeLinear", ["x", "s", "z"], ["d"], axis=1), helper.make_node("Relu", ["d"], ["y"])]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.UINT8, x.shape)],
                   [helper.make_empty_tensor_value_info("y")], inits, opset=19)
    converted = ei.convert(model, optimize=0)
    declined = get_backend("tflite").unsupported(converted.graph)
    assert list(declined.values()) == ["uint8 graph edge 'x' is quantized per channel; TFLite requantizes "
                                       "uint8 <-> int8 per tensor only"]
    session = ei.Session(converted, backend=["tflite", "numpy"])
    assert_close(session.run({"x": x})["y"], _onnxruntime(model, {"x": x})["y"], name="per-channel uint8 input")
    _truthful(session)


def _unary(op: str, dtype: int) -> onnx.ModelProto:
    return _model([helper.make_node(op, ["x"], ["y"])], [helper.make_tensor_value_info("x", dtype, [2, 5])],
                  [helper.make_tensor_value_info("y", dtype, [2, 5])])


@pytest.mark.parametrize("dtype", [TensorProto.DOUBLE, TensorProto.FLOAT16])
@pytest.mark.parametrize("op", ["Relu", "Sigmoid", "Abs"])
def test_wide_float_activations_are_declined_and_placed_elsewhere(op, dtype, rng):
    """float64 (or float16) activations: TFLite's kernels refuse them at invoke ("Only
    float32, uint8, int8 and int16 are supported"), so supports() declines the node with the
    reason and the partitioner runs it elsewhere, with onnxruntime's numbers."""
    model = _unary(op, dtype)
    converted = ei.convert(model, optimize=0)
    declined = get_backend("tflite").unsupported(converted.graph)
    assert len(declined) == 1 and "TFLite kernels compute on float32" in next(iter(declined.values()))
    session = ei.Session(converted, backend=["tflite", "numpy"])
    assert [part.backend for part in session.plan.parts] == ["numpy"]
    x = rng.standard_normal((2, 5)).astype(helper.tensor_dtype_to_np_dtype(dtype))
    assert_close(session.run({"x": x})["y"], _onnxruntime(model, {"x": x})["y"], name=f"{op} {dtype}")
    _truthful(session)


@pytest.mark.parametrize("wide", [TensorProto.DOUBLE, TensorProto.FLOAT16])
def test_casts_from_and_to_wide_floats_stay_on_tflite(wide, rng):
    """CAST is the TFLite kernel that takes float64 and float16: a float32 Relu between two
    casts runs on tflite whole."""
    nodes = [helper.make_node("Cast", ["x"], ["f"], to=TensorProto.FLOAT), helper.make_node("Relu", ["f"], ["r"]),
             helper.make_node("Cast", ["r"], ["y"], to=wide)]
    model = _model(nodes, [helper.make_tensor_value_info("x", wide, [3, 4])], [helper.make_tensor_value_info("y", wide, [3, 4])])
    session = ei.Session(ei.convert(model, optimize=0), backend="tflite")
    assert {part.backend for part in session.plan.parts} == {"tflite"}
    x = rng.standard_normal((3, 4)).astype(helper.tensor_dtype_to_np_dtype(wide))
    got = session.run({"x": x})["y"]
    _truthful(session)
    assert got.dtype == x.dtype
    assert_close(got, _onnxruntime(model, {"x": x})["y"])


def _symbolic_conv_net(rng, batch: int | str = 1) -> onnx.ModelProto:
    """A PNet-like fully convolutional net (valid 3x3 convs, PRelu, a max pool, a softmax over
    channels and a box head) with symbolic height and width; the pool rounds up (ceil_mode) as
    PNet's does."""
    inits, nodes = [], []

    def conv(x, out, cin, k, y):
        inits.append(numpy_helper.from_array((rng.standard_normal((out, cin, k, k)) * 0.3).astype(np.float32), y + "_w"))
        inits.append(numpy_helper.from_array(rng.standard_normal(out).astype(np.float32) * 0.1, y + "_b"))
        nodes.append(helper.make_node("Conv", [x, y + "_w", y + "_b"], [y]))

    def prelu(x, channels, y):
        inits.append(numpy_helper.from_array(np.full((channels, 1, 1), 0.25, np.float32), y + "_slope"))
        nodes.append(helper.make_node("PRelu", [x, y + "_slope"], [y]))

    conv("x", 10, 3, 3, "c1")
    prelu("c1", 10, "p1")
    nodes.append(helper.make_node("MaxPool", ["p1"], ["m1"], kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1))
    conv("m1", 16, 10, 3, "c2")
    prelu("c2", 16, "p2")
    conv("p2", 32, 16, 3, "c3")
    prelu("c3", 32, "p3")
    conv("p3", 2, 32, 1, "c4")
    nodes.append(helper.make_node("Softmax", ["c4"], ["prob"], axis=1))
    conv("p3", 4, 32, 1, "box")
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, "H", "W"])],
                  [helper.make_empty_tensor_value_info("prob"), helper.make_empty_tensor_value_info("box")], inits)


@pytest.mark.parametrize("batch", [1, "N"])
def test_symbolic_spatial_dims_run_at_every_size(batch, rng):
    """With symbolic H and W the flatbuffer's placeholder dims (1) are too small for a valid
    3x3 conv: XNNPACK used to fail ("failed to reshape"). Now each input shape signature gets an
    interpreter prepared at that shape (kept for the next request of the same shape)."""
    model = _symbolic_conv_net(rng, batch)
    converted = ei.convert(model)
    assert get_backend("tflite").unsupported(converted.graph) == {}
    session = ei.Session(converted, backend="tflite")
    assert {part.backend for part in session.plan.parts} == {"tflite"}
    sizes = [(12, 12), (37, 50), (12, 12), (64, 23)]
    for h, w in sizes:
        x = rng.standard_normal((2 if batch == "N" else 1, 3, h, w)).astype(np.float32)
        got, expected = session.run({"x": x}), _onnxruntime(model, {"x": x})
        for name in ("prob", "box"):
            assert_close(got[name], expected[name], rtol=1e-4, atol=1e-4, name=f"{name} at {h}x{w}")
        _truthful(session)
    assert session.executable.stats()["shape_signatures"] == 3


@pytest.mark.parametrize(("kernel", "on_tflite"), [(2, True), (3, False)])
@pytest.mark.parametrize("hw", [(7, 10), ("H", "W")])
def test_ceil_mode_max_pool_runs_where_it_is_same_padding(kernel, on_tflite, hw, rng):
    """A ceil_mode max pool with kernel == stride == 2 is TFLite's SAME (static or symbolic
    dims, odd sizes round up); kernel 3 stride 2 is not, and is declined rather than wrong."""
    nodes = [helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[kernel] * 2, strides=[2, 2], ceil_mode=1)]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, *hw])],
                   [helper.make_empty_tensor_value_info("y")])
    converted = ei.convert(model, optimize=0)
    declined = get_backend("tflite").unsupported(converted.graph)
    assert (declined == {}) is on_tflite, declined
    session = ei.Session(converted, backend=["tflite", "numpy"])
    assert [part.backend for part in session.plan.parts] == ["tflite" if on_tflite else "numpy"]
    for size in [(7, 10), (8, 11)] if hw[0] == "H" else [hw]:
        x = rng.standard_normal((1, 3, *size)).astype(np.float32)
        assert_close(session.run({"x": x})["y"], _onnxruntime(model, {"x": x})["y"], name=f"pool {size}")
        _truthful(session)


def test_shape_signatures_kept_are_bounded(rng):
    from edgeinfer.backends.tflite.backend import TFLiteExecutable

    model = _symbolic_conv_net(rng)
    executable = get_backend("tflite").compile(ei.convert(model).graph, CompileOptions())
    for size in range(12, 12 + TFLiteExecutable.SHAPES_KEPT + 3):  # 12: the smallest size the net takes
        x = rng.standard_normal((1, 3, size, size)).astype(np.float32)
        assert_close(executable.run({"x": x})["box"], _onnxruntime(model, {"x": x})["box"], rtol=1e-4, atol=1e-4,
                     name=f"box {size}")
    assert executable.stats()["shape_signatures"] == TFLiteExecutable.SHAPES_KEPT


def test_a_request_of_a_bad_shape_leaves_the_part_usable(rng):
    """A static part asked at a shape its graph cannot take fails with a BackendError, and the
    next request at its own shape runs (the interpreter is not left at the bad shape)."""
    from edgeinfer.errors import BackendError

    model = zoo.cnn_residual_depthwise()
    feeds = zoo.example_inputs(model, seed=2)
    executable = get_backend("tflite").compile(ei.convert(model).graph, CompileOptions())
    (name, x), = feeds.items()
    with pytest.raises(BackendError, match="failed to run"):
        executable.run({name: np.zeros(x.shape[:2] + (5,), x.dtype)})  # rank 3 for a rank-4 input
    got = executable.run(feeds)
    for output, want in _onnxruntime(model, feeds).items():
        assert_close(got[output], want, rtol=1e-4, atol=1e-4, name=output)


def _sweep_models(rng) -> dict[str, tuple[onnx.ModelProto, dict]]:
    models = {"cnn_residual_depthwise": zoo.cnn_residual_depthwise(), "mlp_symbolic_batch": zoo.mlp_symbolic_batch(),
              "transformer_encoder_block": zoo.transformer_encoder_block(),
              "mobilenet_v2": zoo.mobilenet_v2(64, width_mult=0.35, classes=10),
              "inception_net": zoo.inception_net(32, blocks=2, width=8, classes=10)}
    cases = {name: (model, zoo.example_inputs(model, seed=3)) for name, model in models.items()}
    cases["qdq_conv_uint8"] = _qdq_conv_uint8(rng)
    symbolic = _symbolic_conv_net(rng)
    cases["symbolic_conv_net"] = (symbolic, {"x": rng.standard_normal((1, 3, 29, 41)).astype(np.float32)})
    for op in ("Relu", "Sigmoid"):
        for dtype in (TensorProto.DOUBLE, TensorProto.FLOAT16):
            x = rng.standard_normal((2, 5)).astype(helper.tensor_dtype_to_np_dtype(dtype))
            cases[f"{op}_{np.dtype(helper.tensor_dtype_to_np_dtype(dtype)).name}"] = (_unary(op, dtype), {"x": x})
    return cases


def test_every_part_tflite_accepts_compiles_and_runs(rng):
    """The general check: the partitioner places each graph across tflite and numpy by
    supports(); every tflite part must then compile, run, and give onnxruntime's numbers."""
    failures = []
    for name, (model, feeds) in _sweep_models(rng).items():
        converted = ei.convert(model)
        session = ei.Session(converted, backend=["tflite", "numpy"])  # a part that fails to compile raises
        got = session.run(feeds)
        _truthful(session)
        expected = _onnxruntime(model, feeds)
        for output, want in expected.items():
            try:
                assert_close(got[output], want, rtol=1e-3, atol=1e-4, int_steps=1, name=f"{name} {output}")
            except AssertionError as exc:
                failures.append(str(exc).splitlines()[0])
        assert any(part.backend == "tflite" for part in session.plan.parts) or name.startswith(("Relu", "Sigmoid")), (
            f"{name}: tflite took no part: {session.plan.describe()}")
    assert not failures, failures


UNARY = ("Relu", "Abs", "Neg", "Sigmoid", "Tanh", "Exp", "Log", "Sqrt", "Floor", "Ceil", "Round", "Sign", "Sin",
         "Cos", "Reciprocal", "Softmax", "Identity", "Not", "Erf", "Elu", "LeakyRelu", "HardSigmoid", "Softplus")
BINARY = ("Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Equal", "Less", "Greater", "And", "Or", "Mod", "PRelu",
          "Where")
DTYPES = (TensorProto.FLOAT, TensorProto.INT32, TensorProto.INT64, TensorProto.BOOL, TensorProto.INT8,
          TensorProto.UINT8, TensorProto.INT16)


def _elementwise(op: str, dtype: int) -> onnx.ModelProto | None:
    names = ["a"] if op in UNARY else ["c", "a", "b"] if op == "Where" else ["a", "b"]
    inputs = [helper.make_tensor_value_info(n, TensorProto.BOOL if n == "c" else dtype, [2, 3]) for n in names]
    node = helper.make_node(op, names, ["y"], **({"axis": -1} if op == "Softmax" else {}))
    try:
        model = _model([node], inputs, [helper.make_empty_tensor_value_info("y")])
        onnx.checker.check_model(model, full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError):
        return None  # ONNX has no such op for this dtype
    return model


def test_elementwise_ops_tflite_accepts_run_in_every_dtype():
    """Every element-wise op x dtype (float32, int32, int64, bool, raw int8/uint8/int16) that
    supports() accepts compiles and gives the numbers of onnxruntime (or, where onnxruntime
    has no kernel for the dtype, of the numpy backend). Measured lies this fixed: RELU/PRELU
    on int32/int64, ABS/SIGN/POW/DIV on int64, an unquantized int8 ADD that aborted the
    process, and the compile probe's integer division by zero."""
    backend = get_backend("tflite")
    accepted, failures = 0, []
    for op in UNARY + BINARY:
        for dtype in DTYPES:
            model = _elementwise(op, dtype)
            if model is None:
                continue
            converted = ei.convert(model, optimize=0)
            if backend.unsupported(converted.graph):
                continue
            accepted += 1
            np_dtype = helper.tensor_dtype_to_np_dtype(dtype)
            feeds = {n.name: (np.array([[True, False, True], [False, True, True]]) if np_dtype == np.bool_ or n.name == "c"
                              else (np.arange(6).reshape(2, 3) % 4 + 1).astype(np_dtype)) for n in model.graph.input}
            name = f"{op} {np.dtype(np_dtype).name}"
            try:
                got = backend.compile(converted.graph, CompileOptions()).run(feeds)["y"]
                try:
                    expected = _onnxruntime(model, feeds)["y"]
                except Exception:  # onnxruntime has no kernel for this dtype: the numpy backend is the reference
                    expected = ei.Session(converted, backend="numpy").run(feeds)["y"]
                assert_close(got, expected, rtol=1e-5, atol=1e-5, name=name)
            except Exception as exc:  # noqa: BLE001  (collected: every lie is listed at once)
                failures.append(f"{name}: {str(exc).splitlines()[0][:200]}")
    assert accepted > 50 and not failures, failures


def test_a_value_read_only_inside_an_if_branch_leaves_its_tflite_part(rng):
    """Silero VAD's shape: a tflite part computes a value that only an If body (on numpy)
    reads, from the outer scope; the part must output it (Graph.subgraph counted only direct
    inputs as uses, and the run failed with a KeyError once the tflite part compiled)."""
    def branch(op: str) -> onnx.GraphProto:
        return helper.make_graph([helper.make_node(op, ["r"], ["o"])], op.lower(), [],
                                 [helper.make_tensor_value_info("o", TensorProto.FLOAT, [2, 3])])

    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Sigmoid", ["x"], ["s"]),
             helper.make_node("If", ["c"], ["b"], then_branch=branch("Neg"), else_branch=branch("Abs")),
             helper.make_node("Add", ["b", "s"], ["y"])]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
                           helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    session = ei.Session(ei.convert(model, optimize=0), backend=["tflite", "numpy"])
    assert [part.backend for part in session.plan.parts][0] == "tflite"
    for flag in (True, False):
        feeds = {"x": rng.standard_normal((2, 3)).astype(np.float32), "c": np.array(flag)}
        assert_close(session.run(feeds)["y"], _onnxruntime(model, feeds)["y"], rtol=1e-5, atol=1e-6, name=f"If {flag}")
        _truthful(session)
