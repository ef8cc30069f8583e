"""The runtime per shape signature: decisions on real shapes only, a bounded plan cache that
closes what it evicts, and close() releasing everything compiled."""

from __future__ import annotations

import gc
import json
import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import edgeinfer as ei
from devkit import zoo
from devkit.testing import assert_close
from edgeinfer.backend import Backend, get_backend
from edgeinfer.errors import EdgeInferError, InputError, SchedulerError
from edgeinfer.runtime import auto
from edgeinfer.runtime.feeds import Signature
from edgeinfer.runtime.options import session_keywords
from edgeinfer.runtime.plans import ReferenceFallbackWarning

from .threads import edgeinfer_threads


def detector(seed: int = 0) -> onnx.ModelProto:
    """A detector-like graph with symbolic height and width: a strided conv, a 2x2 pool, and a
    head that reshapes the pooled grid into (2, cells / 2) rows and concatenates them with a
    second branch. At 1x1 (what guessed dims give) the pool has nothing to pool and the reshape
    cannot split one cell in two: every engine fails there."""
    rng = np.random.default_rng(seed)
    w = numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.2, "w")
    shape = numpy_helper.from_array(np.array([1, 8, 2, -1], np.int64), "shape")
    nodes = [
        helper.make_node("Conv", ["image", "w"], ["c"], strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Reshape", ["p", "shape"], ["rows"]),
        helper.make_node("Sigmoid", ["rows"], ["scores"]),
        helper.make_node("Concat", ["rows", "scores"], ["boxes"], axis=2),
    ]
    graph = helper.make_graph(
        nodes, "detector", [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, "height", "width"])],
        [helper.make_tensor_value_info("boxes", TensorProto.FLOAT, [1, 8, 4, None])], initializer=[w, shape])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def image(height: int, width: int, seed: int = 0) -> dict[str, np.ndarray]:
    return {"image": np.random.default_rng(seed).standard_normal((1, 3, height, width)).astype(np.float32)}


@pytest.fixture(scope="module")
def model():
    return ei.convert(detector())


def test_guessed_dims_would_fail_so_auto_waits_for_real_shapes(model, tmp_path, monkeypatch):
    with pytest.raises(EdgeInferError):  # what random feeds (symbols at 1) give: no engine runs it
        ei.Session(model, backend="numpy").run(model.random_feeds())
    measured: list[tuple] = []
    real = auto.measure

    def counting(model, lists, feeds, **kwargs):
        measured.append(tuple(feeds["image"].shape))
        return real(model, lists, feeds, **kwargs)

    monkeypatch.setattr(auto, "measure", counting)
    reference = ei.Session(model, backend="numpy")
    with ei.Session(model, backend="auto", threads=1, options=ei.AutoOptions(cache=tmp_path)) as session:
        assert measured == [] and session.auto_choice is None  # nothing decided on guessed dims
        with pytest.raises(SchedulerError, match="first run with real shapes"):
            session.plan  # noqa: B018 - the property raises
        for height, width in [(64, 64), (32, 48), (64, 64)]:
            feeds = image(height, width, seed=height + width)
            assert_close(session.run(feeds)["boxes"], reference.run(feeds)["boxes"], rtol=1e-4, atol=1e-5)
        # two signatures, each measured once: the second did not re-time the first
        assert measured == [(1, 3, 64, 64), (1, 3, 32, 48)]
        assert set(session.compiled_plans) == {Signature((("height", 64), ("width", 64))),
                                               Signature((("height", 32), ("width", 48)))}
        assert str(session.signature(image(32, 48))) == "height=32,width=48"
    stored = json.loads((tmp_path / auto.CACHE_FILE).read_text())
    assert len(stored) == 2  # the disk cache key holds the signature
    with ei.Session(model, backend="auto", threads=1, options=ei.AutoOptions(cache=tmp_path)) as again:
        again.run(image(32, 48))
        assert again.auto_choice.cached and len(measured) == 2


def test_example_feeds_decide_at_construction(model, tmp_path):
    feeds = image(40, 40)
    with ei.Session(model, backend="auto", threads=1, options=[ei.RunOptions(example_feeds=feeds), ei.AutoOptions(cache=False)]) as session:
        assert session.auto_choice is not None and not session.auto_choice.cached
        assert session.auto_choice.prepared is None  # the winner's runner is the plan's, nothing extra kept
        assert list(session.compiled_plans) == [Signature((("height", 40), ("width", 40)))]


def test_static_models_decide_at_construction():
    from devkit.testing import parse_model

    static = ei.convert(parse_model("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[2, 8] x) => (float[2, 8] y)
        {
            a = Relu(x)
            b = Sigmoid(a)
            c = Tanh(a)
            y = Add(b, c)
        }"""), optimize=0)
    with ei.Session(static, executor="auto") as session:  # no feeds given: the shapes are known
        assert set(session.executor_ms) == {"sequential", "dag"}
        assert list(session.compiled_plans) == [Signature()]


def test_pipeline_plan_needs_real_shapes_for_symbolic_inputs(model):
    with ei.Session(model, backend="onnxruntime", threads=2) as session:
        with pytest.raises(InputError, match="does not plan on guessed dims"):
            session.pipeline_plan()
        plan = session.pipeline_plan(image(32, 32), stages=1, replicas=1)
        assert len(plan.stages) == 1


def test_plan_cache_is_bounded_and_closes_what_it_evicts():
    chain = ei.convert(zoo.mlp_symbolic_batch(seed=3))
    with ei.Session(chain, executor="auto", options=ei.RunOptions(plan_cache_size=2)) as session:
        first = session.compiled_plan({"x": np.zeros((1, 32), np.float32)})
        parts = list(first.runner.parts)
        for batch in (1, 2, 3):
            session.run({"x": np.ones((batch, 32), np.float32)})
        assert session.plan_cache.evicted == [Signature((("N", 1),))]
        assert first.closed and all(p.closed for p in parts)
        assert set(session.compiled_plans) == {Signature((("N", 2),)), Signature((("N", 3),))}
        out = session.run({"x": np.ones((1, 32), np.float32)})  # built again, evicting N=2
        assert out["probs"].shape == (1, 10) and session.plan_cache.built == 4



def test_a_repeated_signature_reuses_its_plan_and_never_runs_a_closed_one():
    chain = ei.convert(zoo.mlp_symbolic_batch(seed=3))
    reference = ei.Session(chain, backend="numpy")
    rng = np.random.default_rng(0)
    feeds = {batch: {"x": rng.standard_normal((batch, 32)).astype(np.float32)} for batch in (1, 2)}
    with ei.Session(chain, executor="auto", options=ei.RunOptions(plan_cache_size=1)) as session:
        looked_up = []
        real = session.plan_cache.acquire

        def acquire(key, build, *args):
            looked_up.append(key)
            return real(key, build, *args)

        session.plan_cache.acquire = acquire
        for batch in (1, 1, 1, 2, 2, 1, 1):
            assert_close(session.run(feeds[batch])["probs"], reference.run(feeds[batch])["probs"],
                         rtol=1e-5, atol=1e-6)
        one, two = Signature((("N", 1),)), Signature((("N", 2),))
        assert looked_up == [one, one, one, two, two, one, one]  # each run holds its plan open through the cache
        assert session.plan_cache.evicted == [one, two] and session.plan_cache.built == 3
        recent = session.compiled_plans[one]
        session.compiled_plan(feeds[2])  # evicts (and closes) the plan N=1 runs on, outside run()
        assert recent.closed
        assert_close(session.run(feeds[1])["probs"], reference.run(feeds[1])["probs"], rtol=1e-5, atol=1e-6)
        assert looked_up[-1] == one and session.plan_cache.built == 5  # built again, not run closed

def test_a_plan_in_use_is_closed_only_when_its_user_is_done():
    chain = ei.convert(zoo.mlp_symbolic_batch(seed=3))
    with ei.Session(chain, executor="auto", options=ei.RunOptions(plan_cache_size=1)) as session:
        stream = session.stream([{"x": np.ones((1, 32), np.float32)}] * 4, stages=1, replicas=1)
        next(stream)  # the stream leases the N=1 plan
        in_use = session.compiled_plans[Signature((("N", 1),))]
        session.run({"x": np.ones((2, 32), np.float32)})  # evicts N=1 while the stream runs on it
        assert not in_use.closed
        assert len(list(stream)) == 3
        assert in_use.closed


def test_buckets_group_values_into_one_signature():
    chain = ei.convert(zoo.mlp_symbolic_batch(seed=3))
    with ei.Session(chain, executor="auto", options=ei.RunOptions(buckets={"N": [4, 16]})) as session:
        for batch in (1, 3, 4, 9):
            assert session.run({"x": np.ones((batch, 32), np.float32)})["probs"].shape == (batch, 10)
        assert {str(s) for s in session.compiled_plans} == {"N=<=4", "N=<=16"}


def big_model(features: int = 4096) -> onnx.ModelProto:
    """Two 64 MB weight matrices (128 MB of weights)."""
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.standard_normal((features, features)).astype(np.float32) * 0.01, "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((features, features)).astype(np.float32) * 0.01, "w2")
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["a"]),
             helper.make_node("Tanh", ["h"], ["t"]), helper.make_node("MatMul", ["a", "w2"], ["m"]),
             helper.make_node("Add", ["m", "t"], ["y"])]
    graph = helper.make_graph(nodes, "big", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, features])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, features])],
                              initializer=[w1, w2])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("options", [
    {"backend": "onnxruntime", "executor": "dag"},
    {"backend": "auto", "executor": "dag", "cache": False},
    {"backend": "auto", "executor": "sequential", "debug": True, "cache": False},
])
def test_close_returns_resident_memory(options):
    psutil = pytest.importorskip("psutil")
    process = psutil.Process()
    model = ei.convert(big_model())
    feeds = model.random_feeds()
    weights = sum(a.nbytes for a in model.graph.initializers.values())
    assert weights >= 50 * 2**20
    gc.collect()
    before = process.memory_info().rss
    session = ei.Session(model, threads=1, **session_keywords(**options))
    session.run(feeds)
    list(session.stream([feeds] * 4, stages=1, replicas=2))
    session.close()
    gc.collect()
    after = process.memory_info().rss
    assert after - before <= 0.1 * before, f"{(after - before) / 2**20:.0f} MB still resident after close()"
    assert after - before <= 0.25 * weights, f"{(after - before) / 2**20:.0f} MB of {weights / 2**20:.0f} MB kept"
    assert not edgeinfer_threads()


def erf_on_double() -> onnx.ModelProto:
    """onnxruntime's schema check accepts Erf on double; it has no kernel for it."""
    nodes = [helper.make_node("Add", ["x", "x"], ["a"]), helper.make_node("Erf", ["a"], ["b"]),
             helper.make_node("Mul", ["b", "x"], ["y"])]
    graph = helper.make_graph(nodes, "erf64", [helper.make_tensor_value_info("x", TensorProto.DOUBLE, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.DOUBLE, [2, 3])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_onnxruntimes_claim_leaves_a_node_without_a_cpu_kernel_to_the_next_backend():
    model = ei.convert(erf_on_double(), optimize=0)
    feeds = {"x": np.linspace(-1, 1, 6).reshape(2, 3)}
    with ei.Session(model, backend="onnxruntime") as session:
        placed = {model.graph.nodes[i].op_type: b for i, b in enumerate(session.plan.assignment.backends)}
        assert placed == {"Add": "onnxruntime", "Erf": "numpy", "Mul": "onnxruntime"}
        assert "no CPU kernel for Erf(13) on tensor(double)" in session.plan.describe()  # claimed up front
        assert "moved off" not in session.compiled_plan(feeds).describe()  # nothing failed to compile
        assert_close(session.run(feeds)["y"], ei.Session(model, backend="numpy").run(feeds)["y"])


@pytest.fixture
def wrong_claim(monkeypatch):
    """onnxruntime's claim misses its own gap (an engine newer than its kernel table, say): the
    compile failure is what moves the node, the path every backend falls back on."""
    monkeypatch.setattr("edgeinfer.backends.onnxruntime.kernels.kernel_reason", lambda *args: None)


def test_a_part_that_fails_to_compile_moves_to_the_next_backend(wrong_claim):
    model = ei.convert(erf_on_double(), optimize=0)
    feeds = {"x": np.linspace(-1, 1, 6).reshape(2, 3)}
    reference = ei.Session(model, backend="numpy").run(feeds)["y"]
    with ei.Session(model, backend="onnxruntime") as session:
        placed = {model.graph.nodes[i].op_type: b for i, b in enumerate(session.plan.assignment.backends)}
        assert placed == {"Add": "onnxruntime", "Erf": "numpy", "Mul": "onnxruntime"}
        assert "onnxruntime: failed to compile" in session.plan.describe()  # the plan says why
        assert "moved off onnxruntime" in session.compiled_plan(feeds).describe()
        assert_close(session.run(feeds)["y"], reference)


def test_an_auto_candidate_that_fails_to_compile_is_re_partitioned_and_says_so(tmp_path, wrong_claim):
    """auto's candidates compile through the same ``compile`` as a plan: the node onnxruntime
    accepted but cannot compile moves to numpy, the candidate is timed, and the choice says why."""
    model = ei.convert(erf_on_double(), optimize=0)
    feeds = {"x": np.linspace(-1, 1, 6).reshape(2, 3)}
    with ei.Session(model, backend="auto", threads=1, options=ei.AutoOptions(cache=False)) as session:
        choice = session.auto_choice
        assert "onnxruntime,numpy" in choice.median_ms and "onnxruntime,numpy" not in choice.skipped
        assert "moved off onnxruntime" in choice.repartitions["onnxruntime,numpy"][0]
        assert "re-partitioned: 1 node(s) moved off onnxruntime (node 'b' (Erf))" in choice.describe()
        if choice.backends == ["onnxruntime", "numpy"]:
            assert "moved off onnxruntime" in session.compiled_plan(feeds).describe()
        assert_close(session.run(feeds)["y"], ei.Session(model).run(feeds)["y"])


@pytest.mark.parametrize("executor", ["sequential", "dag"])
def test_a_part_that_fails_its_first_run_is_re_partitioned(executor):
    from .backends import BrokenAtRunBackend

    proto = zoo.inception_net(size=16, blocks=1, width=8, classes=5)
    model = ei.convert(proto)
    feeds = zoo.example_inputs(proto, seed=1)
    reference = ei.Session(model).run(feeds)["logits"]
    engine = BrokenAtRunBackend(ops={"MaxPool"})
    with ei.Session(model, backend=[engine, "numpy"], threads=2, executor=executor) as session:
        assert_close(session.run(feeds)["logits"], reference, rtol=1e-4, atol=1e-5)
        placed = session.plan.assignment.backends
        ops = {model.graph.nodes[i].op_type for i, b in enumerate(placed) if b == "numpy"}
        assert ops == {"MaxPool"}  # the culprits only, found by probing single nodes
        assert "broken: failed to run" in session.plan.describe()
        plan_before = session.plan
        assert_close(session.run(feeds)["logits"], reference, rtol=1e-4, atol=1e-5)
        assert session.plan is plan_before  # proven: no more probing


class _Float32Only(Backend):
    """An engine that declines float64 values (as TFLite and OpenVINO do)."""

    name = "faulty"

    def __init__(self):
        self.inner = get_backend("numpy")

    def supports(self, node, graph):
        dtypes = {str(graph.values[v].dtype) for v in node.inputs if v in graph.values}
        return "value is float64" if "float64" in dtypes else None

    def compile(self, graph, options):
        return self.inner.compile(graph, options)


def test_a_named_backend_that_takes_nothing_says_so():
    """Everything quietly on numpy would hide that the engine the caller named never ran: the
    session warns, with the engine's reasons, and still runs (on the reference)."""
    graph = helper.make_graph([helper.make_node("Sqrt", ["x"], ["y"])], "doubles",
                              [helper.make_tensor_value_info("x", TensorProto.DOUBLE, [3])],
                              [helper.make_tensor_value_info("y", TensorProto.DOUBLE, [3])])
    model = ei.convert(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    feeds = {"x": np.array([1.0, 4.0, 9.0])}
    with pytest.warns(ReferenceFallbackWarning, match=r"backend faulty took none of the model's 1 nodes.*float64"):
        session = ei.Session(model, backend=[_Float32Only(), "numpy"])
    assert [p.backend for p in session.plan.parts] == ["numpy"]
    np.testing.assert_array_equal(session.run(feeds)["y"], np.sqrt(feeds["x"]))
    with warnings.catch_warnings():
        warnings.simplefilter("error", ReferenceFallbackWarning)
        ei.Session(model, backend="numpy")  # the reference named alone: nothing to say
        float32 = ei.Session(ei.convert(zoo.mlp_symbolic_batch(seed=1)), backend=[_Float32Only(), "numpy"])
        assert {p.backend for p in float32.plan.parts} == {"faulty"}  # it took the nodes: nothing to say


def test_feed_checks_remember_only_shapes_that_passed():
    """The checker skips the shape checks for feed shapes it has passed before; a bad shape is
    refused every time, before and after good ones, and the signature follows the shapes."""
    from edgeinfer.model import TensorInfo
    from edgeinfer.runtime.feeds import FeedChecker

    checker = FeedChecker([TensorInfo("a", "float32", ("N", 4)), TensorInfo("b", "float32", (2, "N"))])
    good = {"a": np.zeros((3, 4), np.float32), "b": np.zeros((2, 3), np.float32)}
    clash = {"a": np.zeros((3, 4), np.float32), "b": np.zeros((2, 5), np.float32)}
    wide = {"a": np.zeros((3, 5), np.float32), "b": np.zeros((2, 3), np.float32)}
    for _ in range(2):
        with pytest.raises(InputError, match="symbol 'N' = 5"):
            checker.check(clash)
        with pytest.raises(InputError, match="dim 1 must be 4"):
            checker.check(wide)
        assert checker.signature(checker.check(good)) == Signature((("N", 3),))
    other = {"a": np.zeros((7, 4), np.float32), "b": np.zeros((2, 7), np.float32)}
    assert str(checker.signature(checker.check(other))) == "N=7"
    with pytest.raises(InputError, match="expected dtype float32"):
        checker.check({"a": good["a"].astype(np.float64), "b": good["b"]})


def test_feed_checks_of_fixed_shapes_names_and_lists():
    """Fixed-shape inputs are compared with their shape on every call (no memo needed): a
    wrong one is refused after good ones; a feed under another name (with the right count of
    feeds) is refused naming both; a list or a Python number becomes an array of its own
    dtype, refused if that is not the input's."""
    from edgeinfer.model import TensorInfo
    from edgeinfer.runtime.feeds import FeedChecker

    checker = FeedChecker([TensorInfo("x", "float32", (1, 3)), TensorInfo("s", "int64", ())])
    good = {"x": np.zeros((1, 3), np.float32), "s": np.array(16000)}
    checked = checker.check(good)
    assert checked == good and checked is not good
    with pytest.raises(InputError, match=r"dim 1 must be 3"):
        checker.check({**good, "x": np.zeros((1, 4), np.float32)})
    with pytest.raises(InputError, match=r"\(unknown: \['X'\]\) \(missing: \['x'\]\)"):
        checker.check({"X": good["x"], "s": good["s"]})
    with pytest.raises(InputError, match="input 'x': expected dtype float32, got float64"):
        checker.check({**good, "x": [[0.0, 1.0, 2.0]]})
    ints = checker.check({**good, "s": 16000})  # a Python int becomes an int64 scalar array
    assert isinstance(ints["s"], np.ndarray) and ints["s"].dtype == np.int64 and ints["s"].shape == ()
