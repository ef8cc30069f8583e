"""The onnxruntime backend against onnxruntime run directly on the original model, and against
the numpy backend."""

from __future__ import annotations

import threading

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import edgeinfer as ei
from devkit import zoo
from devkit.testing import assert_close, parse_model
from edgeinfer.backend import CompileOptions, get_backend
from edgeinfer.backends.onnxruntime import lowerings as lowering_module
from edgeinfer.ir import Graph, Node, Value
from edgeinfer.ir.lowering import Lowered, LoweringContext
from edgeinfer.ir.onnx_io import graph_to_model as export_model
from edgeinfer.registry import OpRegistry

RTOL, ATOL = 1e-4, 1e-5  # two engines, different summation orders and BN folding

ZOO_CASES = {
    "cnn_residual_depthwise": lambda: zoo.cnn_residual_depthwise(seed=1),
    "transformer_encoder_block": lambda: zoo.transformer_encoder_block(seed=1),
    "mlp_symbolic_batch": lambda: zoo.mlp_symbolic_batch(seed=1),
    # every MobileNetV2 layer at a small input size: the numpy backend stays fast enough for tests
    "mobilenet_v2": lambda: zoo.mobilenet_v2(size=64, seed=1),
}


def convert(proto: onnx.ModelProto) -> ei.Model:
    """Import without optimization passes: these tests are about the backend (the round-trip
    tests in tests/test_roundtrip.py run the default pipeline)."""
    return ei.convert(proto, optimize=0)


def ort_direct(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds), strict=True))


@pytest.fixture(scope="module", params=sorted(ZOO_CASES))
def zoo_case(request):
    model = ZOO_CASES[request.param]()
    return request.param, model, convert(model)


def test_zoo_model_matches_onnxruntime_and_numpy(zoo_case):
    name, proto, model = zoo_case
    feeds = zoo.example_inputs(proto, seed=3, batch=2)
    reference = ort_direct(proto, feeds)
    got = ei.Session(model, backend="onnxruntime", threads=1).run(feeds)
    numpy_got = ei.Session(model, backend="numpy").run(feeds)
    assert list(got) == list(reference)
    for output, ref in reference.items():
        assert_close(got[output], ref, rtol=RTOL, atol=ATOL, name=f"{name}:{output} (onnxruntime backend)")
        assert_close(numpy_got[output], got[output], rtol=RTOL, atol=ATOL, name=f"{name}:{output} (numpy)")


@pytest.mark.parametrize("batch", [1, 5])
def test_symbolic_batch_runs_at_any_batch(batch):
    proto = zoo.mlp_symbolic_batch(seed=2)
    session = ei.Session(convert(proto), backend="onnxruntime")
    assert session.inputs[0].shape[0] == "N"
    feeds = zoo.example_inputs(proto, seed=batch, batch=batch)
    got = session.run(feeds)["probs"]
    assert got.shape == (batch, 10)
    assert_close(got, ort_direct(proto, feeds)["probs"], rtol=RTOL, atol=ATOL)


def test_threads_and_session_options_are_honoured():
    session = ei.Session(convert(zoo.mlp_symbolic_batch()), backend="onnxruntime", threads=3)
    options = session.executable.session_options
    assert options.intra_op_num_threads == 3
    assert options.inter_op_num_threads == 1
    assert options.execution_mode == ort.ExecutionMode.ORT_SEQUENTIAL
    assert options.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    assert session.executable.thread_safe
    stats = session.stats()
    assert stats["providers"] == ["CPUExecutionProvider"]
    assert stats["intra_op_num_threads"] == 3


def test_optimization_level_and_session_config_engine_options():
    session = ei.Session(convert(zoo.mlp_symbolic_batch()), backend="onnxruntime",
                         optimization_level="basic", session_config={"session.use_env_allocators": "0"})
    options = session.executable.session_options
    assert options.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    assert options.get_session_config_entry("session.use_env_allocators") == "0"


def test_unknown_provider_is_a_backend_error_listing_the_available_ones():
    with pytest.raises(ei.BackendError, match="NoSuchExecutionProvider") as info:
        ei.Session(convert(zoo.mlp_symbolic_batch()), backend="onnxruntime",
                   providers=["NoSuchExecutionProvider"])
    for available in ort.get_available_providers():
        assert available in str(info.value)


@pytest.mark.parametrize("engine_options, message", [
    ({"provider": ["CPUExecutionProvider"]}, "unknown engine option"),
    ({"provider_options": [{}, {}]}, "one per provider"),
    ({"optimization_level": "max"}, "optimization_level"),
])
def test_bad_engine_options_are_backend_errors(engine_options, message):
    with pytest.raises(ei.BackendError, match=message):
        get_backend("onnxruntime", **engine_options).compile(convert(zoo.mlp_symbolic_batch()).graph,
                                                            CompileOptions())


def test_bad_thread_count_is_a_backend_error():
    with pytest.raises(ei.BackendError, match="threads"):
        get_backend("onnxruntime").compile(convert(zoo.mlp_symbolic_batch()).graph, CompileOptions(threads=0))


def test_run_failure_names_the_node():
    proto = parse_model("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[N] x, int64[2] shape) => (float[?, ?] y)
        { y = Reshape(x, shape) }""")
    proto.graph.node[0].name = "the_reshape"
    session = ei.Session(convert(proto), backend="onnxruntime")
    with pytest.raises(ei.BackendError, match=r"the_reshape.*Reshape"):
        session.run({"x": np.zeros(5, np.float32), "shape": np.array([2, 2], np.int64)})


@pytest.mark.parametrize("node, inputs, constants", [
    (Node("Transpose", ["x"], ["y"], {"perm": (0, 1, 2)}, name="bad_node"), ["x"], {}),  # perm too long
    (Node("Add", ["x", "c"], ["y"], name="bad_node"), ["x"], {"c": np.ones(3, np.int64)}),  # float + int64
])
def test_compile_failure_names_the_node(node, inputs, constants):
    graph = Graph([node], [Value(name, "float32", (2, 3)) for name in inputs], [Value("y", "float32", None)],
                  constants, opset={"": 17})
    # refused by the claim (no CPU kernel for float + int64) or by onnxruntime's compile (perm)
    with pytest.raises(ei.BackendError, match=rf"(could not compile|cannot run 1 node).*bad_node.*{node.op_type}|"
                                              rf"could not compile.*{node.op_type}.*bad_node"):
        get_backend("onnxruntime").compile(graph, CompileOptions())


def test_executable_run_with_a_wrong_dtype_is_a_backend_error():
    executable = get_backend("onnxruntime").compile(convert(zoo.mlp_symbolic_batch()).graph, CompileOptions())
    with pytest.raises(ei.BackendError, match="failed to run"):
        executable.run({"x": np.zeros((1, 32), np.float64)})



def test_executable_runs_the_engine_directly_as_the_public_run_would():
    proto = zoo.mlp_symbolic_batch(seed=2)
    executable = get_backend("onnxruntime").compile(convert(proto).graph, CompileOptions())
    feeds = {"x": np.random.default_rng(0).standard_normal((3, 32)).astype(np.float32)}
    public = executable.session.run(None, feeds)  # onnxruntime's own checks, every call
    got = executable.run(feeds)
    assert list(got) == [o.name for o in executable.session.get_outputs()]
    for name, array in zip(got, public, strict=True):
        np.testing.assert_array_equal(got[name], array)
    with pytest.raises(ei.BackendError, match="failed to run.*missing|failed to run.*Missing|failed to run.*input"):
        executable.run({})  # what the public run would refuse, the engine refuses too, typed
    executable.close()
    with pytest.raises(ei.BackendError, match="closed"):
        executable.run(feeds)


def test_an_execution_provider_failure_goes_through_onnxruntimes_fallback(monkeypatch):
    executable = get_backend("onnxruntime").compile(convert(zoo.mlp_symbolic_batch(seed=2)).graph, CompileOptions())
    feeds = {"x": np.ones((2, 32), np.float32)}
    expected = executable.run(feeds)
    EPFail = type("EPFail", (RuntimeError,), {})  # onnxruntime's pybind class of that name
    calls = []

    def failing(*args):
        raise EPFail("provider failed")

    def public(names, given):
        calls.append(names)
        return [expected[name] for name in executable.output_names]

    monkeypatch.setattr(executable, "_run", failing)
    monkeypatch.setattr(executable.session, "run", public, raising=False)
    got = executable.run(feeds)
    assert calls == [None]  # the public run, which retries on the fallback providers
    for name in expected:
        np.testing.assert_array_equal(got[name], expected[name])

def test_supports_knows_onnx_ops_by_opset():
    backend = get_backend("onnxruntime")
    graph = Graph([], [], [], opset={"": 17})
    assert backend.supports(Node("Conv", ["x", "w"], ["y"]), graph) is None
    assert "opset 17" in backend.supports(Node("Gelu", ["x"], ["y"]), graph)  # Gelu arrived in opset 20
    assert backend.supports(Node("Gelu", ["x"], ["y"]), Graph([], [], [], opset={"": 20})) is None
    assert "NotAnOp" in backend.supports(Node("NotAnOp", ["x"], ["y"]), graph)
    assert "lowering" in backend.supports(Node("FusedThing", ["x"], ["y"], domain="edgeinfer"), graph)


def _scaled_relu_graph() -> Graph:
    node = Node("ScaledRelu", ["x"], ["y"], {"alpha": 2.5}, domain="edgeinfer", name="toy")
    return Graph([node], [Value("x", "float32", ("N", 4))], [Value("y", "float32", ("N", 4))],
                 opset={"": 17, "edgeinfer": 1})


def test_a_registered_lowering_is_applied_before_export(monkeypatch):
    monkeypatch.setattr(lowering_module, "LOWERINGS", OpRegistry("onnxruntime lowering"))
    backend = get_backend("onnxruntime")
    graph = _scaled_relu_graph()
    assert backend.supports(graph.nodes[0], graph) is not None
    with pytest.raises(ei.BackendError, match="ScaledRelu"):
        backend.compile(graph, CompileOptions())

    @lowering_module.lowering("ScaledRelu", domain="edgeinfer")
    def lower_scaled_relu(node: Node, ctx: LoweringContext) -> Lowered:
        out = Lowered([])
        alpha = out.const(ctx, f"{node.outputs[0]}__alpha", node.attrs["alpha"])
        scaled = ctx.fresh(f"{node.outputs[0]}__scaled")
        out.nodes += [Node("Mul", [node.inputs[0], alpha], [scaled]), Node("Relu", [scaled], node.outputs)]
        return out

    assert backend.supports(graph.nodes[0], graph) is None
    executable = backend.compile(graph, CompileOptions())
    assert [n.op_type for n in executable.graph.nodes] == ["Mul", "Relu"]
    reference = parse_model("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[N, 4] x) => (float[N, 4] y)
        { alpha = Constant<value = float {2.5}>()
          scaled = Mul(x, alpha)
          y = Relu(scaled) }""")
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    assert_close(executable.run({"x": x})["y"], ort_direct(reference, {"x": x})["y"])


def test_a_lowering_that_drops_an_output_is_rejected(monkeypatch):
    monkeypatch.setattr(lowering_module, "LOWERINGS", OpRegistry("onnxruntime lowering"))
    lowering_module.lowering("ScaledRelu", domain="edgeinfer")(
        lambda node, ctx: Lowered([Node("Relu", ["x"], ["other"])]))
    with pytest.raises(ei.BackendError, match="does not produce"):
        get_backend("onnxruntime").compile(_scaled_relu_graph(), CompileOptions())


def test_one_executable_runs_from_several_threads():
    proto = zoo.cnn_residual_depthwise(seed=5)
    executable = get_backend("onnxruntime").compile(convert(proto).graph, CompileOptions(threads=1))
    inputs = [zoo.example_inputs(proto, seed=seed) for seed in range(4)]
    expected = [ort_direct(proto, feeds)["logits"] for feeds in inputs]
    results: dict[int, np.ndarray] = {}

    def work(index: int) -> None:
        for _ in range(5):
            results[index] = executable.run(inputs[index])["logits"]

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for index, ref in enumerate(expected):
        assert_close(results[index], ref, rtol=RTOL, atol=ATOL)


def test_large_initializers_are_shared_not_serialized():
    proto = zoo.mobilenet_v2(size=32, seed=0)
    model = convert(proto)
    executable = get_backend("onnxruntime").compile(model.graph, CompileOptions())
    shared = {id(a) for a in executable._external if isinstance(a, np.ndarray)}
    big = [a for a in model.graph.initializers.values() if a.nbytes >= 16 * 1024 and a.flags.c_contiguous]
    assert big and all(id(a) in shared for a in big)
    feeds = zoo.example_inputs(proto)
    assert_close(executable.run(feeds)["logits"], ort_direct(proto, feeds)["logits"], rtol=RTOL, atol=ATOL)


def test_edgeinfer_fused_ops_run_through_their_standard_lowering():
    rng = np.random.default_rng(0)
    weight = (rng.standard_normal((4, 3, 3, 3)) * 0.3).astype(np.float32)
    fused = Node("FusedConv", ["x", "w"], ["y"], {"pads": (1, 1, 1, 1), "activation": "Clip",
                                                  "activation_params": (0.0, 6.0)}, domain="edgeinfer")
    graph = Graph([fused], [Value("x", "float32", (1, 3, 8, 8))], [Value("y", "float32", (1, 4, 8, 8))],
                  {"w": weight}, opset={"": 17, "edgeinfer": 1})
    backend = get_backend("onnxruntime")
    assert backend.supports(fused, graph) is None
    reference = parse_model("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[1, 3, 8, 8] x, float[4, 3, 3, 3] w) => (float[1, 4, 8, 8] y)
        { c = Conv<pads = [1, 1, 1, 1]>(x, w)
          lo = Constant<value = float {0.0}>()
          hi = Constant<value = float {6.0}>()
          y = Clip(c, lo, hi) }""")
    x = (rng.standard_normal((1, 3, 8, 8)) * 4).astype(np.float32)
    got = backend.compile(graph, CompileOptions()).run({"x": x})["y"]
    assert_close(got, ort_direct(reference, {"x": x, "w": weight})["y"])


def test_initializers_of_ml_dtypes_are_serialized_not_shared():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(1)
    weight = rng.standard_normal((64, 128)).astype(ml_dtypes.bfloat16)  # 16 KiB: large enough to share
    graph = Graph([Node("Cast", ["w"], ["wf"], {"to": onnx.TensorProto.FLOAT}), Node("MatMul", ["x", "wf"], ["y"])],
                  [Value("x", "float32", (2, 64))], [Value("y", "float32", (2, 128))], {"w": weight},
                  opset={"": 17})
    executable = get_backend("onnxruntime").compile(graph, CompileOptions())
    assert not executable._external
    x = rng.standard_normal((2, 64)).astype(np.float32)
    reference = ort_direct(export_model(graph), {"x": x})["y"]
    assert_close(executable.run({"x": x})["y"], reference)
