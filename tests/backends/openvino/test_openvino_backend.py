"""The OpenVINO backend against onnxruntime run directly on the original ONNX model."""

from __future__ import annotations

import importlib
import logging
import sys
import threading

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import edgeinfer as ei
from devkit import zoo
from devkit.testing import assert_close, parse_model
from edgeinfer.backend import CompileOptions, get_backend, installed_backends
from edgeinfer.ir import Graph, Node, Value
from edgeinfer.ir.graph import EDGEINFER_DOMAIN
from edgeinfer.ir.onnx_io import graph_to_model

openvino = pytest.importorskip("openvino")

from edgeinfer.backends.openvino import backend as ov_backend  # noqa: E402
from edgeinfer.backends.openvino import convert as ov_convert  # noqa: E402

RTOL, ATOL = 1e-4, 1e-5  # two engines, different summation orders, BN folding and fusions

ZOO_CASES = {
    "cnn_residual_depthwise": lambda: zoo.cnn_residual_depthwise(seed=1),
    "transformer_encoder_block": lambda: zoo.transformer_encoder_block(seed=1),
    "mlp_symbolic_batch": lambda: zoo.mlp_symbolic_batch(seed=1),
    "mobilenet_v2": lambda: zoo.mobilenet_v2(size=64, seed=1),
}


def ort_direct(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds), strict=True))


def assert_matches(got: dict[str, np.ndarray], reference: dict[str, np.ndarray], what: str) -> None:
    assert list(got) == list(reference)
    for output, ref in reference.items():
        assert_close(got[output], ref, rtol=RTOL, atol=ATOL, name=f"{what}:{output}")


@pytest.fixture(scope="module", params=sorted(ZOO_CASES))
def zoo_case(request):
    return request.param, ZOO_CASES[request.param]()


def test_is_an_installed_backend():
    assert "openvino" in installed_backends()
    backend = get_backend("openvino")
    assert backend.name == "openvino" and backend.device == "cpu" and backend.device_name == "CPU"
    explicit = get_backend("openvino", device_name="AUTO:CPU")
    assert explicit.device_name == "AUTO:CPU" and explicit.device == "cpu"
    proto = zoo.mlp_symbolic_batch(seed=6)
    feeds = zoo.example_inputs(proto, batch=2)
    got = explicit.compile(ei.convert(proto, optimize=0).graph, CompileOptions()).run(feeds)
    assert_matches(got, ort_direct(proto, feeds), "AUTO:CPU")


def test_zoo_model_matches_onnxruntime(zoo_case):
    name, proto = zoo_case
    feeds = zoo.example_inputs(proto, seed=3, batch=2)
    got = ei.Session(ei.convert(proto, optimize=0), backend="openvino", threads=1).run(feeds)
    assert_matches(got, ort_direct(proto, feeds), f"{name} (openvino backend)")


def test_fused_edgeinfer_ops_after_optimization_match_the_original_model(zoo_case):
    name, proto = zoo_case
    model = ei.convert(proto, optimize=2)
    backend = get_backend("openvino")
    assert backend.unsupported(model.graph) == {}
    executable = backend.compile(model.graph, CompileOptions(threads=1))
    assert not any(node.domain == EDGEINFER_DOMAIN for node in executable.graph.nodes)  # lowered
    feeds = zoo.example_inputs(proto, seed=4, batch=2)
    assert_matches(executable.run(feeds), ort_direct(proto, feeds), f"{name} (optimize=2)")


def test_optimization_creates_edgeinfer_ops_in_these_models():
    """The test above covers fused ops only if the optimizer makes some in the zoo models."""
    fused = {name: sum(n.domain == EDGEINFER_DOMAIN for n in ei.convert(build(), optimize=2).graph.nodes)
             for name, build in ZOO_CASES.items()}
    assert fused["cnn_residual_depthwise"] > 0 and fused["transformer_encoder_block"] > 0, fused


@pytest.mark.parametrize("batch", [1, 5, 3])
def test_symbolic_batch_runs_at_any_batch_with_one_compiled_model(batch, symbolic_session):
    proto, session = symbolic_session
    feeds = zoo.example_inputs(proto, seed=batch, batch=batch)
    got = session.run(feeds)["probs"]
    assert got.shape == (batch, 10)
    assert_close(got, ort_direct(proto, feeds)["probs"], rtol=RTOL, atol=ATOL)


@pytest.fixture(scope="module")
def symbolic_session():
    proto = zoo.mlp_symbolic_batch(seed=2)
    session = ei.Session(ei.convert(proto, optimize=0), backend="openvino")
    assert session.inputs[0].shape[0] == "N"
    assert session.executable.compiled.inputs[0].get_partial_shape()[0].is_dynamic
    return proto, session


def test_int8_qdq_model_runs_integer_kernels_and_agrees_with_exact_math():
    """OpenVINO's INT8 against the numpy backend (exact integer arithmetic; raw onnxruntime is no
    oracle: its u8 x s8 kernels saturate on CPUs without VNNI, and on some with it, as OpenVINO's
    do on this AMD Zen 5). Where OpenVINO's probe says its kernels are exact it fuses the QDQ
    into integer kernels; where they saturate, the plan says it takes the exact rewrite."""
    from edgeinfer.backends.openvino import int8 as ov_int8

    proto = zoo.cnn_residual_depthwise(seed=1)
    fp32 = ei.convert(proto, optimize=2)
    int8 = ei.quantize(fp32, [zoo.example_inputs(proto, seed=seed) for seed in range(8)])
    assert int8.graph.op_histogram()["QuantizeLinear"] > 0
    feeds = zoo.example_inputs(proto, seed=100, batch=8)
    session = ei.Session(int8, backend="openvino", options=ei.RunOptions(debug=True))
    got = session.run(feeds)["logits"]
    reference = ei.Session(int8, backend="numpy").run(feeds)["logits"]
    float_result = ort_direct(proto, feeds)["logits"]
    # Two int8 engines round requantized activations differently, so they do not agree to fp32
    # tolerances; they must agree far better than either agrees with fp32 (the quantization
    # error), and on every top-1 class.
    engines = float(np.abs(got - reference).max())
    quantization = float(np.abs(float_result - reference).max())
    assert engines < 0.5 * quantization, (engines, quantization)
    assert (got.argmax(axis=1) == reference.argmax(axis=1)).all()
    exec_types = {row["exec_type"].lower() for row in session.stats()["profile"]}
    if ov_int8.saturates():
        assert session.executable.stats()["integer_path"] == ov_int8.EXACT_REWRITE
    else:
        assert any("i8" in t or "u8" in t for t in exec_types), exec_types  # QDQ fused, not emulated


def test_threads_hint_and_precision_are_honoured():
    session = ei.Session(ei.convert(zoo.mlp_symbolic_batch(), optimize=0), backend="openvino", threads=1)
    executable = session.executable
    assert executable.thread_safe
    assert executable.property("INFERENCE_NUM_THREADS") == 1  # OpenVINO caps a count above the cores
    stats = session.stats()
    assert stats["inference_num_threads"] == 1
    assert stats["performance_hint"] == "LATENCY"
    assert stats["inference_precision"] == "f32"
    assert stats["execution_devices"] == ["CPU"]


def test_throughput_hint_and_raw_config_engine_options():
    graph = ei.convert(zoo.mlp_symbolic_batch(), optimize=0).graph
    executable = get_backend("openvino", performance_hint="throughput").compile(graph, CompileOptions(threads=2))
    assert executable.stats()["performance_hint"] == "THROUGHPUT"
    executable = get_backend("openvino").compile(
        graph, CompileOptions(engine_options={"config": {"NUM_STREAMS": 2}}))
    assert executable.property("NUM_STREAMS") == 2


def test_executables_that_share_cores_are_not_pinned():
    """Pipeline replicas and DAG parts (``busy_wait=False``) run side by side: OpenVINO's CPU
    pinning would put all their threads on the same cores. A session alone keeps OpenVINO's
    default, and the user's own config still has the last word."""
    graph = ei.convert(zoo.mlp_symbolic_batch(), optimize=0).graph
    backend = get_backend("openvino")
    default = openvino.Core().get_property("CPU", "ENABLE_CPU_PINNING")
    assert backend.compile(graph, CompileOptions(threads=1)).property("ENABLE_CPU_PINNING") == default
    shared = backend.compile(graph, CompileOptions(threads=1, busy_wait=False))
    assert shared.property("ENABLE_CPU_PINNING") is False
    forced = get_backend("openvino", config={"ENABLE_CPU_PINNING": True})
    assert forced.compile(graph, CompileOptions(threads=1, busy_wait=False)).property("ENABLE_CPU_PINNING") is True
    feeds = zoo.example_inputs(zoo.mlp_symbolic_batch(), batch=3)
    assert_close(shared.run(feeds)["probs"], backend.compile(graph, CompileOptions()).run(feeds)["probs"])


@pytest.mark.parametrize("engine_options, message", [
    ({"hint": "LATENCY"}, "unknown engine option"),
    ({"performance_hint": "FASTEST"}, "performance_hint"),
    ({"precision": "int4"}, "precision"),
    ({"config": [("NUM_STREAMS", 2)]}, "config"),
    ({"device_name": ""}, "device_name"),
])
def test_bad_engine_options_are_backend_errors(engine_options, message):
    with pytest.raises(ei.BackendError, match=message):
        get_backend("openvino", **engine_options)


def test_a_property_openvino_refuses_is_a_backend_error():
    graph = ei.convert(zoo.mlp_symbolic_batch(), optimize=0).graph
    with pytest.raises(ei.BackendError, match="could not compile for CPU"):
        get_backend("openvino", config={"NO_SUCH_PROPERTY": 1}).compile(graph, CompileOptions())


@pytest.mark.parametrize("threads", [0, -2, 1.5, True])
def test_bad_thread_count_is_a_backend_error(threads):
    graph = ei.convert(zoo.mlp_symbolic_batch(), optimize=0).graph
    with pytest.raises(ei.BackendError, match="threads"):
        get_backend("openvino").compile(graph, CompileOptions(threads=threads))


def _missing_device() -> str:
    available = openvino.Core().available_devices
    for device in ("npu", "gpu"):
        if not any(name.startswith(ov_backend.DEVICE_NAMES[device]) for name in available):
            return device
    pytest.skip(f"this machine has every OpenVINO device kind: {available}")


def test_missing_device_is_a_backend_error_listing_the_available_ones():
    device = _missing_device()
    with pytest.raises(ei.BackendError, match=rf"no {device.upper()} device.*fallback=True") as info:
        get_backend("openvino", device=device)
    for available in openvino.Core().available_devices:
        assert available in str(info.value)


def test_missing_device_with_fallback_logs_and_runs_on_the_cpu(caplog):
    device = _missing_device()
    with caplog.at_level(logging.WARNING, logger="edgeinfer.backends.openvino"):
        backend = get_backend("openvino", device=device, fallback=True)
    assert backend.device == "cpu" and backend.device_name == "CPU"
    assert any("falling back to CPU" in record.getMessage() for record in caplog.records)
    proto = zoo.mlp_symbolic_batch(seed=4)
    feeds = zoo.example_inputs(proto, batch=2)
    got = backend.compile(ei.convert(proto, optimize=0).graph, CompileOptions()).run(feeds)
    assert_matches(got, ort_direct(proto, feeds), "fallback")


@pytest.mark.parametrize("requested, available, expected", [
    ("GPU", ["CPU", "GPU.0", "GPU.1"], "GPU"),
    ("GPU.1", ["CPU", "GPU.0", "GPU.1"], "GPU.1"),
    ("AUTO:GPU,CPU", ["CPU", "GPU.0"], "AUTO:GPU,CPU"),
    ("HETERO:NPU,CPU", ["CPU", "GPU.0"], None),
    ("GPU.2", ["CPU", "GPU.0", "GPU.1"], None),
    ("NPU", ["CPU", "NPU.X"], "NPU"),
])
def test_device_resolution(requested, available, expected):
    if expected is None:
        with pytest.raises(ei.BackendError, match="no .* device"):
            ov_backend.resolve_device(requested, available, fallback=False)
        assert ov_backend.resolve_device(requested, available, fallback=True) == "CPU"
    else:
        assert ov_backend.resolve_device(requested, available, fallback=False) == expected


def test_unsupported_nodes_say_why():
    backend = get_backend("openvino")
    graph = Graph([], [], [], opset={"": 17})
    assert "opset 17" in backend.supports(Node("Gelu", ["x"], ["y"]), graph)  # Gelu arrived in opset 20
    assert backend.supports(Node("Gelu", ["x"], ["y"]), Graph([], [], [], opset={"": 20})) is None
    assert "NotAnOp" in backend.supports(Node("NotAnOp", ["x"], ["y"]), graph)
    assert "no conversion rule" in backend.supports(Node("Relu", ["x"], ["y"], domain="com.example"), graph)
    assert "lowering" in backend.supports(Node("FusedThing", ["x"], ["y"], domain="edgeinfer"), graph)
    assert backend.supports(Node("FusedConv", ["x", "w"], ["y"], domain="edgeinfer"), graph) is None
    # untyped inputs: only "is there a rule" can be asked, and Conv has one
    assert backend.supports(Node("Conv", ["x", "w"], ["y"]), graph) is None


def _label_encoder_graph() -> Graph:
    node = Node("LabelEncoder", ["x"], ["y"], {"keys_int64s": (1, 2), "values_int64s": (3, 4)},
                domain="ai.onnx.ml", name="encoder")
    return Graph([node], [Value("x", "int64", (3,))], [Value("y", "int64", (3,))], opset={"": 17, "ai.onnx.ml": 3})


def test_an_op_without_a_conversion_rule_is_refused_by_supports_and_compile():
    graph = _label_encoder_graph()
    backend = get_backend("openvino")
    assert "no conversion rule" in backend.supports(graph.nodes[0], graph)
    assert list(backend.unsupported(graph)) == [graph.nodes[0].label]
    with pytest.raises(ei.BackendError, match=r"could not convert graph.*'encoder'.*no conversion rule"):
        backend.compile(graph, CompileOptions())


def test_a_conversion_that_fails_on_these_input_types_gives_openvinos_reason():
    node = Node("Col2Im", ["x", "size", "block"], ["y"], name="col2im")
    graph = Graph([node], [Value("x", "float32", (1, 4, 9)), Value("size", "float32", (2,)),
                           Value("block", "float32", (2,))], [Value("y", "float32", (1, 1, 4, 4))], opset={"": 18})
    backend = get_backend("openvino")
    reason = backend.supports(node, graph)
    assert "Col2Im" in reason and "i64" in reason
    with pytest.raises(ei.BackendError, match=r"'col2im' \(Col2Im\)"):
        backend.compile(graph, CompileOptions())
    typed = Graph([node], [Value("x", "float32", (1, 4, 9)), Value("size", "int64", (2,)),
                           Value("block", "int64", (2,))], [Value("y", "float32", (1, 1, 4, 4))], opset={"": 18})
    assert backend.supports(typed.nodes[0], typed) is None


def test_run_failure_names_the_node():
    proto = parse_model("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[N] x, int64[2] shape) => (float[?, ?] y)
        { y = Reshape(x, shape) }""")
    proto.graph.node[0].name = "the_reshape"
    session = ei.Session(ei.convert(proto, optimize=0), backend="openvino")
    with pytest.raises(ei.BackendError, match=r"failed to run.*the_reshape.*Reshape"):
        session.run({"x": np.zeros(5, np.float32), "shape": np.array([2, 2], np.int64)})


def test_outputs_that_are_inputs_or_constants_and_unused_inputs():
    graph = Graph([Node("Relu", ["x"], ["y"])], [Value("x", "float32", ("N", 3)), Value("unused", "float32", (2,))],
                  [Value("y", "float32", ("N", 3)), Value("x", "float32", ("N", 3)), Value("c", "float32", (2,))],
                  {"c": np.array([1.5, -2.0], np.float32)}, opset={"": 17})
    feeds = {"x": np.array([[-1.0, 0.5, 2.0]], np.float32), "unused": np.zeros(2, np.float32)}
    got = get_backend("openvino").compile(graph, CompileOptions()).run(feeds)
    assert_matches(got, ort_direct(graph_to_model(graph), feeds), "passthrough")


DTYPE_CASES = {
    "bool_int64_and_scalar": ("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[N, 5] x, bool[N, 5] m) => (int64[N] index, bool[N, 5] positive, float total)
        { zero = Constant<value = float {0.0}>()
          above = Greater(x, zero)
          positive = And(above, m)
          index = ArgMax<axis = 1, keepdims = 0>(x)
          total = ReduceSum<keepdims = 0>(x) }""",
        lambda rng: {"x": rng.standard_normal((3, 5)).astype(np.float32), "m": rng.random((3, 5)) > 0.5}),
    "float16": ("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float16[N, 4] x) => (float16[N, 4] y)
        { y = Softmax<axis = -1>(x) }""",
        lambda rng: {"x": rng.standard_normal((2, 4)).astype(np.float16)}),
    "uint8_int32": ("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (uint8[N, 4] x, int32[N, 4] y) => (int32[N, 4] z, uint8[N, 4] w)
        { wide = Cast<to = 6>(x)
          z = Add(wide, y)
          w = Identity(x) }""",
        lambda rng: {"x": rng.integers(0, 255, (2, 4), dtype=np.uint8),
                     "y": rng.integers(-1000, 1000, (2, 4), dtype=np.int32)}),
    "empty_batch": ("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[N, 4] x) => (float[N, 4] y)
        { y = Relu(x) }""",
        lambda rng: {"x": np.zeros((0, 4), np.float32)}),
}


@pytest.mark.parametrize("case", sorted(DTYPE_CASES))
def test_dtypes_scalars_and_empty_tensors_match_onnxruntime(case):
    text, make_feeds = DTYPE_CASES[case]
    proto = parse_model(text)
    feeds = make_feeds(np.random.default_rng(0))
    got = ei.Session(ei.convert(proto, optimize=0), backend="openvino").run(feeds)
    reference = ort_direct(proto, feeds)
    assert list(got) == list(reference)
    for output, ref in reference.items():
        assert got[output].dtype == ref.dtype
        assert_close(got[output], ref, rtol=RTOL, atol=ATOL, name=f"{case}:{output}")


def test_float64_nodes_are_left_to_backends_with_float64_kernels():
    proto = parse_model("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (double[N, 4] x) => (double[N, 4] y)
        { y = Exp(x) }""")
    graph = ei.convert(proto, optimize=0).graph
    assert "float64" in get_backend("openvino").supports(graph.nodes[0], graph)


@pytest.mark.parametrize("hint", ["LATENCY", "THROUGHPUT"])  # one stream; several streams
def test_eight_threads_run_one_executable_at_once(hint):
    proto = zoo.cnn_residual_depthwise(seed=5)
    executable = get_backend("openvino", performance_hint=hint).compile(ei.convert(proto, optimize=2).graph,
                                                                      CompileOptions(threads=2))
    inputs = [zoo.example_inputs(proto, seed=seed) for seed in range(8)]
    expected = [ort_direct(proto, feeds)["logits"] for feeds in inputs]
    results: dict[int, list[np.ndarray]] = {}
    requests: dict[int, object] = {}  # the requests themselves: a finished thread's would free its id
    barrier = threading.Barrier(8)

    def work(index: int) -> None:
        barrier.wait()
        results[index] = [executable.run(inputs[index])["logits"] for _ in range(25)]
        requests[index] = executable._request()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len({id(request) for request in requests.values()}) == 8  # one infer request per thread
    for index, ref in enumerate(expected):
        for got in results[index]:
            assert_close(got, ref, rtol=RTOL, atol=ATOL)


def test_large_weights_are_handed_over_by_address_not_serialized():
    assert ov_convert.memory_external_data_supported()
    graph = ei.convert(zoo.mobilenet_v2(size=32, seed=0), optimize=0).graph
    by_address, _, buffers = ov_convert.export(graph)
    serialized, _, none = ov_convert.export(graph, in_memory_weights=False)
    big = [a for a in graph.initializers.values() if a.nbytes >= ov_convert.EXTERNAL_MIN_BYTES]
    assert big and len(buffers) == len(big) and not none
    placeholder_bytes = 100  # location, address and length of one external entry, at most
    assert len(serialized) - len(by_address) >= sum(a.nbytes - placeholder_bytes for a in big)
    feeds = zoo.example_inputs(zoo.mobilenet_v2(size=32, seed=0))
    request = {}
    for label, model_bytes in (("address", by_address), ("serialized", serialized)):
        compiled = ov_backend.core().compile_model(ov_convert.read_onnx(model_bytes), "CPU")
        request[label] = compiled.create_infer_request().infer(feeds)[compiled.outputs[0]]
    assert_close(request["address"], request["serialized"], rtol=0, atol=0, name="same weights either way")


def test_debug_mode_reports_a_per_node_profile():
    proto = zoo.mlp_symbolic_batch()
    session = ei.Session(ei.convert(proto, optimize=0), backend="openvino",
                         options=ei.RunOptions(debug=True))
    session.run(zoo.example_inputs(proto))
    profile = session.stats()["profile"]
    assert profile and all(row["ms"] >= 0 and row["node"] for row in profile)
    plain = ei.Session(ei.convert(proto, optimize=0), backend="openvino", options=ei.RunOptions(debug=False))
    plain.run(zoo.example_inputs(proto))
    assert "profile" not in plain.stats()


def test_without_openvino_the_backend_is_not_installed(monkeypatch):
    for name in [m for m in sys.modules if m == "openvino" or m.startswith(("openvino.", "edgeinfer.backends.openvino"))]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "openvino", None)  # import openvino -> ImportError
    with pytest.raises(ImportError):
        importlib.import_module("edgeinfer.backends.openvino")
    assert "openvino" not in installed_backends()
    with pytest.raises(ei.BackendError, match="pip install 'edgeinfer\\[openvino\\]'"):
        get_backend("openvino")


def test_a_zero_size_input_is_a_typed_error_not_a_crash():
    """OpenVINO 2026.4 crashes the process on an empty batch through a Conv (a segmentation
    fault, seen in the fallback's single-node probe): the executable refuses it first, and a
    Session moves those nodes to the numpy reference, which returns the empty result."""
    model = ei.convert(parse_model("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[N, 2, 4, 4] x) => (float[N, 2, 4, 4] y) {
            w = Constant <value = float[2, 2, 1, 1] {1.0, 0.5, -0.5, 1.0}> ()
            y = Conv (x, w)
        }"""))
    executable = get_backend("openvino").compile(model.graph)
    with pytest.raises(ei.BackendError, match=r"zero-size input\(s\) \{'x': \(0, 2, 4, 4\)\}"):
        executable.run({"x": np.zeros((0, 2, 4, 4), np.float32)})
    executable.close()
    with ei.Session(model, backend="openvino") as session:
        assert session.run({"x": np.zeros((0, 2, 4, 4), np.float32)})["y"].shape == (0, 2, 4, 4)
