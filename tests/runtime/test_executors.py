"""Sequential and DAG-parallel executors, run_async, thread safety and shutdown."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import edgeinfer as ei
from devkit import zoo
from devkit.testing import assert_close, parse_model
from edgeinfer.errors import BackendError, SchedulerError

from .backends import FAIL_MARK, FaultyBackend
from .threads import edgeinfer_threads

RTOL, ATOL = 1e-4, 1e-5  # onnxruntime vs numpy: different summation orders


@pytest.fixture(scope="module")
def inception():
    proto = zoo.inception_net(size=32, width=8, blocks=2, seed=3)
    return proto, ei.convert(proto)


@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
def test_dag_executor_matches_sequential_on_an_inception_net(inception, backend):
    proto, model = inception
    feeds = zoo.example_inputs(proto, seed=1)
    reference = ei.Session(model, backend="numpy").run(feeds)
    with ei.Session(model, backend=backend, threads=2, executor="dag") as session:
        # each inception block's four branches are parts of their own
        assert len(session.plan.parts) >= 8
        got = session.run(feeds)
    assert_close(got["logits"], reference["logits"], rtol=RTOL, atol=ATOL)
    assert not edgeinfer_threads()


def test_dag_branches_overlap_on_two_threads_and_chains_stay_on_the_callers():
    """The calling thread runs its request's parts itself (the stem without any hand-off); at a
    fork one helper joins in, so sibling branches overlap on two threads."""
    import threading

    from .backends import RecordingBackend

    proto = zoo.inception_net(size=16, width=8, blocks=2, seed=5)
    model = ei.convert(proto)
    feeds = zoo.example_inputs(proto, seed=1)
    reference = ei.Session(model).run(feeds)
    engine = RecordingBackend(sleep=0.02)
    with ei.Session(model, backend=[engine], threads=2, executor="dag") as session:
        session.run(feeds)
        engine.intervals.clear()
        got = session.run(feeds)
        parts = len(session.plan.parts)
    assert_close(got["logits"], reference["logits"])
    caller = threading.get_ident()
    calls = sorted(engine.intervals, key=lambda call: call[2])
    assert len(calls) == parts  # each part once
    assert calls[0][1] == caller  # the stem, on the caller's thread
    overlapping = [(a, b) for i, a in enumerate(calls) for b in calls[i + 1:] if b[2] < a[3] and a[2] < b[3]]
    assert overlapping, "no two parts ran at the same time"
    assert all(a[1] != b[1] for a, b in overlapping)
    assert len({thread for _, thread, _, _ in calls}) == 2


def test_dag_executor_drops_each_value_after_its_last_reader(inception, monkeypatch):
    """A request keeps only the activations parts still have to read (and the graph outputs),
    not every value of the graph until it ends."""
    from edgeinfer.runtime.parts import CompiledPart

    proto, model = inception
    feeds = zoo.example_inputs(proto, seed=1)
    reference = ei.Session(model).run(feeds)
    held: list[set[str]] = []
    original = CompiledPart.run

    def recording(self, env):
        held.append(set(env))
        return original(self, env)

    monkeypatch.setattr(CompiledPart, "run", recording)
    with ei.Session(model, backend="numpy", threads=2, executor="dag") as session:
        got = session.run(feeds)
        parts = session.plan.parts
    assert_close(got["logits"], reference["logits"])
    produced = {name for part in parts for name in part.outputs} | set(feeds)
    assert len(held) == len(parts)
    assert max(len(values) for values in held) < len(produced) / 2


def test_dag_executor_serves_multi_head_outputs():
    model = ei.convert(parse_model("""
        <ir_version: 8, opset_import: ["" : 17]>
        heads (float[4, 16] x) => (float[4, 16] h1, float[4, 16] h2, float[4, 16] h3)
        {
            t = Relu(x)
            h1 = Sigmoid(t)
            h2 = Tanh(t)
            h3 = Neg(t)
        }"""), optimize=0)
    feeds = {"x": np.random.default_rng(2).standard_normal((4, 16)).astype(np.float32)}
    reference = ei.Session(model).run(feeds)
    with ei.Session(model, backend="onnxruntime", threads=2, executor="dag") as session:
        got = session.run(feeds)
    assert list(got) == ["h1", "h2", "h3"]
    for name in got:
        assert_close(got[name], reference[name])


@pytest.mark.parametrize("executor", ["sequential", "dag"])
@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
def test_run_is_thread_safe_under_8_threads_x_200_requests(backend, executor):
    proto = zoo.mlp_symbolic_batch(seed=4)
    model = ei.convert(proto)
    reference = ei.Session(model, backend="numpy")
    rng = np.random.default_rng(9)
    requests = [rng.standard_normal((1 + i % 3, 32)).astype(np.float32) for i in range(1600)]
    expected = [reference.run({"x": x})["probs"] for x in requests]
    with ei.Session(model, backend=backend, threads=1, executor=executor) as session:
        def serve(worker: int) -> list[tuple[int, np.ndarray]]:
            return [(i, session.run({"x": requests[i]})["probs"]) for i in range(worker, 1600, 8)]

        with ThreadPoolExecutor(8) as pool:
            results = [r for chunk in pool.map(serve, range(8)) for r in chunk]
    assert len(results) == 1600
    for index, got in results:
        assert_close(got, expected[index], rtol=RTOL, atol=ATOL, name=f"request {index}")


def test_non_thread_safe_executables_get_one_per_thread(inception):
    """Bound to the thread that compiled it (a GPU delegate): each calling thread compiles its
    own, and it is freed when the thread ends."""
    import gc
    import weakref

    proto, model = inception
    engine = FaultyBackend("single", thread_safe=False)
    feeds = zoo.example_inputs(proto, seed=2)
    reference = ei.Session(model).run(feeds)
    with ei.Session(model, backend=[engine, "numpy"], threads=1) as session:
        compiles_before = engine.compiles
        seen: list[weakref.ref] = []

        def call(_):
            seen.extend(weakref.ref(p.executable()) for p in session._runner.parts if p.backend is engine)
            return session.run(feeds)

        with ThreadPoolExecutor(4) as pool:
            outs = list(pool.map(call, range(16)))
        assert engine.violations == 0
        assert engine.compiles > compiles_before  # the worker threads compiled their own
        gc.collect()
        assert not any(ref() is not None for ref in seen)  # freed with their threads: no leak
    for out in outs:
        assert_close(out["logits"], reference["logits"])


def test_movable_executables_are_lent_one_caller_at_a_time_and_reused(inception):
    """Not thread safe but free to change threads (a TFLite interpreter on the CPU): callers
    borrow an idle copy, a new one is compiled only while all are busy, and later threads and
    streams reuse them instead of compiling again."""
    proto, model = inception
    engine = FaultyBackend("movable", thread_safe=False, thread_affine=False)
    feeds = zoo.example_inputs(proto, seed=2)
    reference = ei.Session(model).run(feeds)
    with ei.Session(model, backend=[engine, "numpy"], threads=1) as session:
        for _ in range(3):  # three rounds of fresh threads
            with ThreadPoolExecutor(4) as pool:
                outs = list(pool.map(lambda _: session.run(feeds), range(16)))
            for out in outs:
                assert_close(out["logits"], reference["logits"])
        parts = [p for p in session._runner.parts if p.backend is engine]
        assert engine.violations == 0
        assert all(1 <= p.compiled <= 4 for p in parts)  # at most one per concurrent caller
        first = list(session.stream([feeds] * 6, stages=2, replicas=1))  # plans (profiles, compiles stages)
        compiled = engine.compiles
        for _ in range(3):  # every stream starts fresh worker threads
            again = list(session.stream([feeds] * 6, stages=2, replicas=1))
            for out in again:
                assert_close(out["logits"], first[0]["logits"])
        assert engine.violations == 0
        assert engine.compiles == compiled  # the stages' copies are reused, not compiled again


def test_run_async_returns_futures_in_any_order(inception):
    proto, model = inception
    with ei.Session(model, backend="onnxruntime", threads=1) as session:
        batches = [zoo.example_inputs(proto, seed=s) for s in range(6)]
        futures = [session.run_async(f) for f in batches]
        expected = [session.run(f)["logits"] for f in batches]
        for future, ref in zip(futures, expected):
            assert_close(future.result(timeout=60)["logits"], ref)
    assert not edgeinfer_threads()


@pytest.mark.parametrize("executor", ["sequential", "dag"])
def test_failing_part_reaches_the_caller(executor):
    model = ei.convert(zoo.mlp_symbolic_batch(seed=1))
    engine = FaultyBackend("faulty")
    with ei.Session(model, backend=[engine, "numpy"], threads=2, executor=executor) as session:
        session.run({"x": np.zeros((1, 32), np.float32)})  # a first run that fails would re-partition
        bad = np.full((1, 32), FAIL_MARK, np.float32)
        with pytest.raises(BackendError, match="refusing"):
            session.run({"x": bad})
        future = session.run_async({"x": bad})
        with pytest.raises(BackendError, match="refusing"):
            future.result(timeout=30)
        ok = session.run({"x": np.zeros((1, 32), np.float32)})  # the session still serves
        assert ok["probs"].shape == (1, 10)
    assert not edgeinfer_threads()


@pytest.mark.parametrize("executor", ["sequential", "dag"])
def test_close_is_idempotent_and_later_calls_are_refused(executor):
    model = ei.convert(zoo.mlp_symbolic_batch(seed=1))
    session = ei.Session(model, backend="onnxruntime", threads=2, executor=executor)
    session.run_async({"x": np.zeros((1, 32), np.float32)}).result(timeout=30)
    session.close()
    session.close()
    assert not edgeinfer_threads()
    for call in (lambda: session.run({"x": np.zeros((1, 32), np.float32)}),
                 lambda: session.run_async({"x": np.zeros((1, 32), np.float32)}),
                 lambda: session.stream([{"x": np.zeros((1, 32), np.float32)}])):
        with pytest.raises(SchedulerError, match="session is closed"):
            call()


def test_bad_feeds_raise_before_anything_is_scheduled():
    model = ei.convert(zoo.mlp_symbolic_batch(seed=1))
    with ei.Session(model, backend="onnxruntime", executor="dag", threads=2) as session:
        with pytest.raises(ei.InputError, match="expected rank 2"):
            session.run_async({"x": np.zeros(32, np.float32)})


def test_unknown_executor_is_a_clear_error():
    with pytest.raises(BackendError, match="executor 'threads': expected one of sequential, dag"):
        ei.Session(ei.convert(zoo.mlp_symbolic_batch()), executor="threads")


def test_executor_auto_keeps_the_faster_of_sequential_and_dag(inception):
    proto, model = inception
    feeds = zoo.example_inputs(proto, seed=4)
    reference = ei.Session(model, backend="numpy").run(feeds)
    with ei.Session(model, backend="onnxruntime", threads=2, executor="auto",
                    options=ei.RunOptions(example_feeds=feeds)) as session:
        assert set(session.executor_ms) == {"sequential", "dag"}
        assert session.executor == min(session.executor_ms, key=session.executor_ms.get)
        assert (len(session.plan.parts) > 1) == (session.executor == "dag")
        assert_close(session.run(feeds)["logits"], reference["logits"], rtol=RTOL, atol=ATOL)
    chain_model = ei.convert(zoo.mlp_symbolic_batch())
    with ei.Session(chain_model, executor="auto",
                    options=ei.RunOptions(example_feeds=chain_model.random_feeds())) as chain:
        assert chain.executor == "sequential" and chain.executor_ms == {}  # a chain has no branches
    assert not edgeinfer_threads()


@pytest.mark.parametrize("seed", range(8))
def test_concurrency_counts_the_parts_neither_before_nor_after_each_part(seed):
    """What the DAG executor sizes its thread shares by, against reachability by search."""
    from types import SimpleNamespace

    from edgeinfer.runtime.placement import concurrency

    rng = np.random.default_rng(seed)
    count = int(rng.integers(1, 60))
    parts = [SimpleNamespace(inputs=[f"v{int(j)}" for j in rng.integers(0, i, int(rng.integers(0, 4)))] if i else ["x"],
                             outputs=[f"v{i}"]) for i in range(count)]
    children = {i: {int(name[1:]) for name in part.inputs if name != "x"} for i, part in enumerate(parts)}

    def reach(i: int) -> set[int]:
        seen, todo = set(), list(children[i])
        while todo:
            j = todo.pop()
            if j not in seen:
                seen.add(j)
                todo.extend(children[j])
        return seen

    before = [reach(i) for i in range(count)]
    expected = [sum(1 for j in range(count) if j != i and j not in before[i] and i not in before[j])
                for i in range(count)]
    assert concurrency(parts) == expected
