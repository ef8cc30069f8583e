"""The numpy executor: liveness memory plan, fallback reporting, thread limits, typed errors."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.parser
import pytest

import edgeinfer as ei
from devkit.testing import assert_close
from edgeinfer.backends.numpy import executor as executor_module
from edgeinfer.backends.numpy.registry import KERNELS
from edgeinfer.errors import BackendError, UnsupportedOpError
from edgeinfer.registry import OpRegistry

CHAIN_LENGTH = 6
N = 1000


def parse(text: str, opset: int = 17) -> onnx.ModelProto:
    return onnx.parser.parse_model(f'<ir_version: 8, opset_import: ["" : {opset}]>\n{text}')


def chain_model() -> onnx.ModelProto:
    """x -> Neg -> Abs -> Neg -> Abs ... -> y: each intermediate is read once, by the next node."""
    ops = ["Neg", "Abs"] * (CHAIN_LENGTH // 2)
    names = ["x"] + [f"t{i}" for i in range(CHAIN_LENGTH - 1)] + ["y"]
    body = "\n".join(f"{names[i + 1]} = {op}({names[i]})" for i, op in enumerate(ops))
    return parse(f"g (float[{N}] x) => (float[{N}] y) {{\n{body}\n}}")


def session_of(model: onnx.ModelProto, **options) -> ei.Session:
    return ei.Session(ei.convert(model, optimize=0), backend="numpy", **options)


# -- memory plan ------------------------------------------------------------------------------------
def test_chain_peak_is_below_the_sum_of_intermediates():
    session = session_of(chain_model())
    x = np.random.default_rng(1).standard_normal(N).astype(np.float32)
    out = session.run({"x": x})["y"]
    assert_close(out, np.abs(x))  # the chain ends on Abs of +-x
    per_tensor = N * 4
    total = CHAIN_LENGTH * per_tensor  # every intermediate and the output
    peak = session.stats()["peak_intermediate_bytes"]
    assert 0 < peak < total
    assert peak <= 2 * per_tensor  # at most the value being read and the one being written


def test_chain_peak_counts_the_input_and_output_of_a_step():
    session = session_of(chain_model())
    session.run({"x": np.ones(N, np.float32)})
    assert session.stats()["peak_intermediate_bytes"] == 2 * N * 4


def test_intermediates_are_dropped_after_their_last_use(monkeypatch):
    """At each step, every intermediate whose last reader already ran is gone from the
    value table (observed from inside the run, not from the plan)."""
    model = parse("""g (float[4] x) => (float[4] y, float[4] z) {
        a = Neg(x)
        b = Abs(a)
        c = Add(a, b)
        d = Exp(c)
        y = Neg(d)
        z = Abs(b)
    }""")
    session = session_of(model)
    executable = session.executable
    seen: list[set[str]] = []
    for step in executable.steps:
        original = step.call

        def spy(values, _original=original):
            seen.append(set(values))
            return _original(values)

        monkeypatch.setattr(step, "call", spy)
    session.run({"x": np.arange(4, dtype=np.float32)})
    order = [step.node.outputs[0] for step in executable.steps]
    last_read = {}
    for index, step in enumerate(executable.steps):
        for name in step.inputs:
            last_read[name] = index
    for index, live in enumerate(seen):
        dead = {name for name, last in last_read.items() if last < index and name not in ("y", "z")}
        assert not (live & dead), f"before {order[index]}: {sorted(live & dead)} should have been freed"
        assert {name for name in order[:index] if last_read.get(name, -1) >= index} <= live


# -- fallback reporting -------------------------------------------------------------------------------
def test_op_without_kernel_runs_on_reference_and_is_reported(monkeypatch):
    """With an empty kernel registry every op falls back to onnx.reference; results are the
    same and stats() names each op with its node count."""
    model = parse("""g (float[2,3] x) => (float[2,3] y) {
        a = Relu(x)
        b = Neg(a)
        y = Relu(b)
    }""")
    x = np.random.default_rng(2).standard_normal((2, 3)).astype(np.float32)
    native = session_of(model)
    expected = native.run({"x": x})["y"]
    assert native.stats()["fallback_ops"] == {}

    monkeypatch.setattr(executor_module, "KERNELS", OpRegistry("numpy kernel (empty, test)"))
    fallback = session_of(model)
    assert_close(fallback.run({"x": x})["y"], expected)
    assert fallback.stats()["fallback_ops"] == {"Relu": 2, "Neg": 1}


def test_fallback_is_used_only_for_ops_without_a_kernel():
    model = parse("""g (float[3] x) => (float[3] y) {
        a = Relu(x)
        y = Shrink<lambd=0.5, bias=0.1>(a)
    }""")
    has_kernel = KERNELS.lookup("Shrink", version=17) is not None
    session = session_of(model)
    x = np.array([-1.0, 0.3, 2.0], np.float32)
    y = session.run({"x": x})["y"]
    relu = np.maximum(x, 0)
    assert_close(y, np.where(relu > 0.5, relu - 0.1, np.where(relu < -0.5, relu + 0.1, 0)).astype(np.float32))
    assert session.stats()["fallback_ops"] == ({} if has_kernel else {"Shrink": 1})


def test_fallback_node_with_an_omitted_middle_output(monkeypatch):
    from onnx.reference import ReferenceEvaluator

    model = parse("""g (float[3,1,2] x, float[1,8,2] w, float[1,8,2] r) => (float[1,1,2] h) {
        _unused, h = LSTM<hidden_size=2>(x, w, r)
    }""")
    model.graph.node[0].output[0] = ""  # Y omitted, Y_h asked for
    monkeypatch.setattr(executor_module, "KERNELS", OpRegistry("numpy kernel (empty, test)"))
    session = session_of(model)
    rng = np.random.default_rng(4)
    feeds = {name: rng.standard_normal(shape).astype(np.float32)
             for name, shape in [("x", (3, 1, 2)), ("w", (1, 8, 2)), ("r", (1, 8, 2))]}
    assert_close(session.run(feeds)["h"], ReferenceEvaluator(model).run(None, feeds)[0])


# -- threads ------------------------------------------------------------------------------------------
def _blas_threads_seen_by_a_kernel(monkeypatch, threads):
    """Run a model whose only kernel (in a test-only registry) records what threadpoolctl
    reports for the BLAS libraries while it runs."""
    threadpoolctl = pytest.importorskip("threadpoolctl")
    if not [lib for lib in threadpoolctl.threadpool_info() if lib["user_api"] == "blas"]:
        pytest.skip("numpy is not linked to a BLAS that threadpoolctl can see")
    seen: list[list[int]] = []

    def recording_relu(x):
        seen.append([lib["num_threads"] for lib in threadpoolctl.threadpool_info() if lib["user_api"] == "blas"])
        return np.maximum(x, 0)

    registry = OpRegistry("numpy kernel (test)")
    registry.register("Relu", recording_relu, since=1)
    monkeypatch.setattr(executor_module, "KERNELS", registry)
    session = session_of(parse("g (float[2,2] x) => (float[2,2] y) { y = Relu(x) }"), threads=threads)
    y = session.run({"x": np.array([[-1, 2], [3, -4]], np.float32)})["y"]
    assert_close(y, np.array([[0, 2], [3, 0]], np.float32))
    assert session.stats()["fallback_ops"] == {}
    return seen


def test_threads_one_limits_blas_during_the_run(monkeypatch):
    seen = _blas_threads_seen_by_a_kernel(monkeypatch, threads=1)
    assert seen and all(count == 1 for counts in seen for count in counts)


def test_thread_limit_is_released_after_the_run(monkeypatch):
    threadpoolctl = pytest.importorskip("threadpoolctl")
    before = [lib["num_threads"] for lib in threadpoolctl.threadpool_info() if lib["user_api"] == "blas"]
    _blas_threads_seen_by_a_kernel(monkeypatch, threads=1)
    after = [lib["num_threads"] for lib in threadpoolctl.threadpool_info() if lib["user_api"] == "blas"]
    assert after == before


def test_default_threads_leave_blas_alone(monkeypatch):
    threadpoolctl = pytest.importorskip("threadpoolctl")
    before = [lib["num_threads"] for lib in threadpoolctl.threadpool_info() if lib["user_api"] == "blas"]
    seen = _blas_threads_seen_by_a_kernel(monkeypatch, threads=None)
    assert seen == [before]


def test_threads_one_gives_the_same_results_on_matmul():
    model = parse("g (float[64,64] a, float[64,64] b) => (float[64,64] y) { y = MatMul(a, b) }")
    rng = np.random.default_rng(3)
    feeds = {"a": rng.standard_normal((64, 64)).astype(np.float32),
             "b": rng.standard_normal((64, 64)).astype(np.float32)}
    one = session_of(model, threads=1).run(feeds)["y"]
    default = session_of(model).run(feeds)["y"]
    assert_close(one, feeds["a"] @ feeds["b"], rtol=1e-4, atol=1e-4)  # BLAS summation order differs
    assert_close(one, default, rtol=1e-4, atol=1e-4)


# -- typed errors -------------------------------------------------------------------------------------
def test_kernel_exception_becomes_backend_error_naming_the_node(monkeypatch):
    def broken(x):
        raise ValueError("synthetic failure")

    registry = OpRegistry("numpy kernel (test)")
    registry.register("Relu", broken, since=1)
    monkeypatch.setattr(executor_module, "KERNELS", registry)
    model = parse("g (float[2] x) => (float[2] y) { y = Relu(x) }")
    model.graph.node[0].name = "my_relu"
    session = session_of(model)
    with pytest.raises(BackendError, match=r"my_relu.*Relu.*\(2,\).*ValueError: synthetic failure"):
        session.run({"x": np.zeros(2, np.float32)})


def test_bad_reshape_at_run_time_is_a_backend_error():
    model = parse("g (float[2,3] x, int64[2] s) => (float[?,?] y) { y = Reshape(x, s) }")
    model.graph.node[0].name = "reshape_node"
    session = session_of(model)
    with pytest.raises(BackendError, match=r"reshape_node.*shape \[2, 3\].*\[4, 2\]"):
        session.run({"x": np.zeros((2, 3), np.float32), "s": np.array([4, 2], np.int64)})


def test_gather_index_out_of_range_is_a_backend_error():
    model = parse("g (float[3] x, int64[1] i) => (float[1] y) { y = Gather(x, i) }")
    session = session_of(model)
    with pytest.raises(BackendError, match=r"Gather.*index 3 is out of range for an axis of size 3"):
        session.run({"x": np.zeros(3, np.float32), "i": np.array([3], np.int64)})


def test_bad_attribute_value_is_a_backend_error():
    model = parse('g (float[2,3] x, int64[4] p) => (float[?,?] y) { y = Pad<mode="mirror">(x, p) }', opset=13)
    session = session_of(model)
    with pytest.raises(BackendError, match=r"mode must be one of"):
        session.run({"x": np.zeros((2, 3), np.float32), "p": np.zeros(4, np.int64)})


def test_unknown_attribute_is_rejected_at_compile_time():
    from edgeinfer.ir import Graph, Node, Value

    graph = Graph([Node("Relu", ["x"], ["y"], {"bogus": 1}, name="r")], [Value("x", "float32", (2,))],
                  [Value("y", "float32", (2,))], opset={"": 17})
    with pytest.raises(UnsupportedOpError, match=r"'r'.*bogus"):
        executor_module.NumpyBackend().compile(graph)


def test_kernel_returning_too_few_outputs_is_a_backend_error(monkeypatch):
    registry = OpRegistry("numpy kernel (test)")
    registry.register("TopK", lambda x, k, **attrs: x, since=1)
    monkeypatch.setattr(executor_module, "KERNELS", registry)
    session = session_of(parse("g (float[4] x, int64[1] k) => (float[2] v, int64[2] i) { v, i = TopK(x, k) }",
                               opset=11))
    with pytest.raises(BackendError, match=r"returned 1 outputs, expected 2"):
        session.run({"x": np.zeros(4, np.float32), "k": np.array([2], np.int64)})
