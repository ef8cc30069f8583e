"""INT8 on every CPU: the probe, the exact-weight rewrite, and the backend's integer path;
the same integer kernels on the other backends, where they run them.

Exact int64 math is the oracle throughout. The rewrite is tested against it on every CPU (raw
onnxruntime on the rewritten graph); raw onnxruntime on the original graph only where the
probe says its u8 x s8 kernels are exact here. Reproduce an AVX2-only CPU on any x86-64 with
``qemu-x86_64-static -cpu Haswell .venv/bin/python -m pytest -q tests/backends/onnxruntime/test_int8.py``.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import edgeinfer as ei
from devkit.testing import assert_close, integer_conv, integer_matmul, requantize

ort = pytest.importorskip("onnxruntime")
from edgeinfer.backends.onnxruntime import int8  # noqa: E402

LEVELS = ("ORT_DISABLE_ALL", "ORT_ENABLE_ALL")


def _model(nodes: list, inputs: dict[str, np.ndarray], outputs: list[str], consts: dict) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, "int8",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape) for n, a in inputs.items()],
        [helper.make_empty_tensor_value_info(o) for o in outputs],
        [numpy_helper.from_array(np.asarray(a), n) for n, a in consts.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    model.ir_version = 9
    return onnx.shape_inference.infer_shapes(model, strict_mode=True)


def _raw(model: onnx.ModelProto, feeds: dict, level: str = "ORT_DISABLE_ALL") -> np.ndarray:
    options = ort.SessionOptions()
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    options.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"]).run(None, feeds)[0]


def _matmul_integer(rng, low: int = -128, high: int = 128):
    a = rng.integers(0, 256, (3, 64), dtype=np.uint8)
    b = rng.integers(low, high, (64, 16), dtype=np.int8)
    consts = {"b": b, "a_zp": np.uint8(7), "b_zp": rng.integers(-5, 5, 16).astype(np.int8)}
    model = _model([helper.make_node("MatMulInteger", ["a", "b", "a_zp", "b_zp"], ["y"])], {"a": a}, ["y"], consts)
    return model, {"a": a}, integer_matmul(a, b, 7, consts["b_zp"]).astype(np.int32)


def _qlinear_conv(rng):
    x = rng.integers(0, 256, (1, 8, 7, 9), dtype=np.uint8)
    w = rng.integers(-128, 128, (12, 8, 3, 3), dtype=np.int8)
    consts = {"xs": np.float32(0.02), "xz": np.uint8(100), "w": w,
              "ws": rng.uniform(0.001, 0.01, 12).astype(np.float32), "wz": np.zeros(12, np.int8),
              "ys": np.float32(0.4), "yz": np.uint8(120), "b": rng.integers(-900, 900, 12).astype(np.int32)}
    node = helper.make_node("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "b"], ["y"], pads=[1, 1, 1, 1])
    accumulator = integer_conv(x, w, 100, 0, pads=[1, 1, 1, 1]) + consts["b"].reshape(1, -1, 1, 1)
    exact = requantize(accumulator, np.float64(0.02) * consts["ws"] / np.float64(0.4), 120, np.uint8)
    return _model([node], {"x": x}, ["y"], consts), {"x": x}, exact


def _qlinear_matmul(rng):
    a = rng.integers(0, 256, (4, 48), dtype=np.uint8)
    b = rng.integers(-128, 128, (48, 8), dtype=np.int8)
    consts = {"as": np.float32(0.05), "az": np.uint8(130), "b": b, "bs": np.float32(0.01), "bz": np.int8(0),
              "ys": np.float32(2.0), "yz": np.uint8(128)}
    node = helper.make_node("QLinearMatMul", ["a", "as", "az", "b", "bs", "bz", "ys", "yz"], ["y"])
    exact = requantize(integer_matmul(a, b, 130, 0), np.float64(0.05) * np.float64(0.01) / 2.0, 128, np.uint8)
    return _model([node], {"a": a}, ["y"], consts), {"a": a}, exact


def _conv_integer_int8_weights(rng):
    """ConvInteger over int8 weights: onnxruntime has no kernel for it; rewritten, it runs."""
    x = rng.integers(0, 256, (1, 4, 6, 6), dtype=np.uint8)
    w = rng.integers(-128, 128, (6, 4, 3, 3), dtype=np.int8)
    consts = {"w": w, "xz": np.uint8(9), "wz": np.int8(-3)}
    node = helper.make_node("ConvInteger", ["x", "w", "xz", "wz"], ["y"], strides=[2, 1])
    exact = integer_conv(x, w, 9, -3, strides=[2, 1]).astype(np.int32)
    return _model([node], {"x": x}, ["y"], consts), {"x": x}, exact


def _qdq_conv(rng):
    """uint8 activations, int8 per-channel weights in QDQ form (onnxruntime fuses it into
    QLinearConv); the oracle is the same arithmetic in int64."""
    x_q = rng.integers(0, 256, (1, 6, 8, 8), dtype=np.uint8)
    w = rng.integers(-127, 128, (10, 6, 3, 3), dtype=np.int8)
    scales = rng.uniform(0.002, 0.02, 10).astype(np.float32)
    consts = {"xs": np.float32(0.03), "xz": np.uint8(128), "w": w, "ws": scales, "wz": np.zeros(10, np.int8),
              "ys": np.float32(0.25), "yz": np.uint8(128)}
    nodes = [helper.make_node("DequantizeLinear", ["x", "xs", "xz"], ["xd"]),
             helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"], axis=0),
             helper.make_node("Conv", ["xd", "wd"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("QuantizeLinear", ["c", "ys", "yz"], ["y"])]
    exact = requantize(integer_conv(x_q, w, 128, 0, pads=[1, 1, 1, 1]), np.float64(0.03) * scales / 0.25, 128, np.uint8)
    return _model(nodes, {"x": x_q}, ["y"], consts), {"x": x_q}, exact


CASES = {"matmul_integer": _matmul_integer, "qlinear_conv": _qlinear_conv, "qlinear_matmul": _qlinear_matmul,
         "conv_integer_int8_weights": _conv_integer_int8_weights, "qdq_conv": _qdq_conv}
# QLinear* and QDQ requantize in float32 inside the engines: a tie may round one step apart
STEPS = {"matmul_integer": 0, "conv_integer_int8_weights": 0}


def test_probe_predicts_whether_raw_kernels_are_exact(rng):
    model, feeds, exact = _matmul_integer(rng)
    raw_is_exact = np.array_equal(_raw(model, feeds), exact)
    assert raw_is_exact == (not int8.saturates()), (int8.probe_value(), int8.integer_path())
    assert int8.integer_path() in (int8.EXACT_NATIVE, int8.EXACT_NATIVE_OTHER, int8.EXACT_REWRITE)
    assert (int8.integer_path() == int8.EXACT_REWRITE) == int8.saturates()


@pytest.mark.parametrize("case", list(CASES))
def test_exact_weights_matches_int64_math_on_every_cpu(case, rng):
    model, feeds, exact = CASES[case](rng)
    graph = ei.convert(model, optimize=0).graph
    rewritten, labels = int8.exact_weights(graph)
    rewritten.verify()
    assert len(labels) == 1  # it fired, on the one op with a full-range int8 weight
    assert len(rewritten.nodes) == len(graph.nodes)
    assert not any(a.dtype == np.int8 and a.size > 1 for a in rewritten.initializers.values())
    from edgeinfer.ir.onnx_io import graph_to_model

    exported = graph_to_model(rewritten)
    for level in LEVELS:  # the products are exact with or without onnxruntime's fusions
        assert_close(_raw(exported, feeds, level), exact, int_steps=STEPS.get(case, 1), name=f"{case} {level}")
    # numerics unchanged: the reference backend gives the same on both graphs
    before = ei.Session(ei.Model(graph), backend="numpy").run(feeds)["y"]
    after = ei.Session(ei.Model(rewritten), backend="numpy").run(feeds)["y"]
    assert_close(after, before)


@pytest.mark.parametrize("case", list(CASES))
def test_onnxruntime_backend_is_exact_on_every_cpu(case, rng):
    model, feeds, exact = CASES[case](rng)
    session = ei.Session(ei.convert(model, optimize=0), backend="onnxruntime")
    assert [part.backend for part in session.plan.parts] == ["onnxruntime"]
    assert_close(session.run(feeds)["y"], exact, int_steps=STEPS.get(case, 1), name=case)
    assert f"int8 {int8.integer_path()}" in session.plan.describe()
    assert session.executable.stats()["integer_path"] == int8.integer_path()


@pytest.mark.parametrize("backend", ["numpy", "openvino", "tflite"])
@pytest.mark.parametrize("case", list(CASES))
def test_other_backends_match_int64_math_where_they_run_the_op(backend, case, rng):
    from edgeinfer.backend import get_backend
    from edgeinfer.errors import BackendError

    try:
        engine = get_backend(backend)
    except BackendError as exc:
        pytest.skip(f"{backend} is not installed here: {exc}")
    model, feeds, exact = CASES[case](rng)
    converted = ei.convert(model, optimize=0)
    declined = engine.unsupported(converted.graph)
    if declined:
        pytest.skip(f"{backend} declines: {next(iter(declined.values()))}")
    session = ei.Session(converted, backend=backend)
    assert {part.backend for part in session.plan.parts} == {backend}
    got = session.run(feeds)["y"]
    if backend == "openvino":
        from edgeinfer.backends.openvino import int8 as openvino_int8

        # where its kernels saturate, the backend rewrites int8 weights (exact_graph): exact on every CPU
        assert "int8 " + openvino_int8.integer_path() in session.plan.describe()
    assert_close(got, exact, int_steps=STEPS.get(case, 1), name=f"{backend} {case}")


@pytest.mark.parametrize("case", [c for c in CASES if c != "conv_integer_int8_weights"])
def test_raw_onnxruntime_is_exact_where_the_probe_says_so(case, rng):
    if int8.saturates():
        pytest.skip(f"onnxruntime's u8 x s8 kernels saturate on this CPU (probe: {int8.probe_value()} "
                    f"for {int8.EXACT_PRODUCT})")
    model, feeds, exact = CASES[case](rng)
    for level in LEVELS:
        assert_close(_raw(model, feeds, level), exact, int_steps=STEPS.get(case, 1), name=f"{case} {level}")


def test_seven_bit_weights_are_exact_on_every_cpu_without_a_rewrite(rng):
    model, feeds, exact = _matmul_integer(rng, -64, 65)
    graph = ei.convert(model, optimize=0).graph
    assert int8.exact_weights(graph) == (graph, [])
    assert_close(_raw(model, feeds), exact)  # no pair of products leaves int16, whatever the CPU
    expected = int8.integer_path() if not int8.saturates() else int8.SEVEN_BIT
    assert int8.graph_integer_path(graph) == expected


def test_int8_activations_keep_their_weights(rng):
    """int8 x int8 products go to kernels that widen both operands (exact where the int8 probe
    says so); their weights are left as they are (onnxruntime has no int8 x uint8 QLinearConv)."""
    x = rng.integers(-128, 128, (1, 4, 5, 5), dtype=np.int8)
    w = rng.integers(-128, 128, (6, 4, 3, 3), dtype=np.int8)
    consts = {"xs": np.float32(0.02), "xz": np.int8(-3), "w": w, "ws": np.float32(0.01), "wz": np.int8(0),
              "ys": np.float32(0.3), "yz": np.int8(2)}
    model = _model([helper.make_node("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz"], ["y"])],
                   {"x": x}, ["y"], consts)
    graph = ei.convert(model, optimize=0).graph
    assert int8.exact_weights(graph) == (graph, [])
    exact = requantize(integer_conv(x, w, -3, 0), np.float64(0.02) * 0.01 / 0.3, 2, np.int8)
    if not int8.saturates("int8"):
        assert_close(ei.Session(ei.Model(graph), backend="onnxruntime").run({"x": x})["y"], exact, int_steps=1)
    assert int8.graph_integer_path(graph) in (int8.integer_path(), int8.EXACT_NATIVE_OTHER, int8.SATURATING)


def test_float_graphs_have_no_integer_path(mlp_model):
    assert int8.graph_integer_path(ei.convert(mlp_model).graph) is None
    session = ei.Session(ei.convert(mlp_model), backend="onnxruntime")
    assert "int8" not in session.plan.describe()


def test_bench_names_the_integer_path_of_each_onnxruntime_part(tmp_path, rng):
    import json

    from click.testing import CliRunner

    from edgeinfer.cli import main

    model, _, _ = _qlinear_conv(rng)
    path = tmp_path / "qconv.onnx"
    onnx.save(model, path)
    report = tmp_path / "bench.json"
    result = CliRunner().invoke(main, ["bench", str(path), "--backend", "numpy,onnxruntime", "--runs", "2",
                                       "--warmup", "0", "--json", str(report)])
    assert result.exit_code == 0, result.output
    assert "int8 path" in result.output and int8.integer_path() in result.output
    by_name = {r["backend"]: r for r in json.loads(report.read_text())["latency"]}
    assert by_name["onnxruntime"]["integer_paths"] == [f"part 0 (onnxruntime): int8 {int8.integer_path()}"]
    assert by_name["numpy"]["integer_paths"] == []
