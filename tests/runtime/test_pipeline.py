"""The pipeline executor (Session.stream) and its stage planner."""

from __future__ import annotations

import gc
import itertools
import time
import tracemalloc

import numpy as np
import pytest

import edgeinfer as ei
from devkit import zoo
from devkit.testing import assert_close
from edgeinfer.errors import BackendError, InputError, RequestTimeoutError
from edgeinfer.runtime.stream.split import crossing_bytes, replicate, split, throughput

from .backends import FAIL_MARK, SLOW_MARK, FaultyBackend
from .threads import edgeinfer_threads

RTOL, ATOL = 1e-4, 1e-5


@pytest.fixture(scope="module")
def cnn():
    proto = zoo.cnn_residual_depthwise(seed=5)
    return proto, ei.convert(proto)


def requests_for(proto, count: int, seed: int = 0):
    return [zoo.example_inputs(proto, seed=seed + i) for i in range(count)]


@pytest.mark.parametrize("stages", [1, 2, 3, "auto"])
def test_stream_yields_every_result_in_input_order(cnn, stages):
    proto, model = cnn
    requests = requests_for(proto, 40)
    reference = ei.Session(model, backend="numpy")
    expected = [reference.run(r)["logits"] for r in requests]
    with ei.Session(model, backend="onnxruntime", threads=2) as session:
        got = list(session.stream(iter(requests), stages=stages))
        plan = next(iter(session.stage_plans.values()))
        if stages != "auto":
            assert len(plan.stages) == stages
    assert len(got) == len(expected)
    for index, (out, ref) in enumerate(zip(got, expected)):
        assert_close(out["logits"], ref, rtol=RTOL, atol=ATOL, name=f"request {index}")
    assert not edgeinfer_threads()


def test_stages_cover_the_graph_contiguously_and_describe_themselves(cnn):
    proto, model = cnn
    with ei.Session(model, backend="onnxruntime", threads=2) as session:
        plan = session.pipeline_plan(zoo.example_inputs(proto), stages=3, replicas=1)
        ranges = [(s.nodes.start, s.nodes.stop) for s in plan.stages]
        assert ranges[0][0] == 0 and ranges[-1][1] == len(model.graph.nodes)
        assert all(a[1] == b[0] and a[0] < a[1] for a, b in zip(ranges, ranges[1:]))
        assert plan.replicas == [1, 1, 1]
        assert len(plan.stage_seconds) == 3 and all(t > 0 for t in plan.stage_seconds)
        text = plan.describe()
        assert "3 stage(s)" in text and "stage 2: nodes" in text


def test_pipeline_over_two_backends_matches_numpy(cnn):
    proto, model = cnn
    engine = FaultyBackend("partial", ops={"Relu", "Add", "MaxPool", "GlobalAveragePool", "Flatten"})
    requests = requests_for(proto, 12, seed=50)
    reference = ei.Session(model, backend="numpy")
    with ei.Session(model, backend=["onnxruntime", engine, "numpy"], threads=2) as session:
        outs = list(session.stream(requests, stages=2, replicas=[1, 1]))
    for out, request in zip(outs, requests):
        assert_close(out["logits"], reference.run(request)["logits"], rtol=RTOL, atol=ATOL)


def test_backpressure_bounds_requests_in_flight(cnn):
    proto, model = cnn
    pulled = 0

    def source():
        nonlocal pulled
        for request in itertools.islice(itertools.cycle(requests_for(proto, 4)), 60):
            pulled += 1
            yield request

    with ei.Session(model, backend="onnxruntime", threads=2) as session:
        stream = session.stream(source(), stages=2, replicas=1, max_in_flight=3)
        delivered = 0
        for _ in stream:
            delivered += 1
            time.sleep(0.002)  # a slow consumer
            assert pulled - delivered <= 3, "the pipeline read ahead past max_in_flight"
        assert delivered == 60


def test_failing_request_raises_at_its_turn_and_stops_the_pipeline():
    proto = zoo.mlp_symbolic_batch(seed=3)
    model = ei.convert(proto)
    engine = FaultyBackend("faulty")
    requests = [{"x": np.full((1, 32), float(i), np.float32)} for i in range(20)]
    requests[7] = {"x": np.full((1, 32), FAIL_MARK, np.float32)}
    with ei.Session(model, backend=[engine, "numpy"], threads=2) as session:
        received = []
        with pytest.raises(BackendError, match="refusing"):
            for out in session.stream(requests, stages=2, replicas=1):
                received.append(out)
        assert len(received) == 7  # every earlier result was delivered, in order
        assert not edgeinfer_threads()
        # the session serves later streams
        assert len(list(session.stream(requests[:5], stages=2, replicas=1))) == 5


def test_bad_feed_in_a_stream_raises_input_error_at_its_turn():
    model = ei.convert(zoo.mlp_symbolic_batch(seed=3))
    requests = [{"x": np.zeros((1, 32), np.float32)}] * 3 + [{"x": np.zeros((1, 31), np.float32)}]
    with ei.Session(model, backend="onnxruntime", threads=2) as session:
        got = []
        with pytest.raises(InputError, match="dim 1 must be 32"):
            for out in session.stream(requests, stages=2, replicas=1):
                got.append(out)
        assert len(got) == 3


def test_consumer_that_stops_reading_or_cancels_leaves_no_thread(cnn):
    proto, model = cnn
    with ei.Session(model, backend="onnxruntime", threads=2) as session:
        stream = session.stream(itertools.cycle(requests_for(proto, 3)), stages=2, replicas=1)
        for _ in range(5):
            next(stream)
        assert edgeinfer_threads()  # workers are alive while the stream is open
        time.sleep(0.05)  # the consumer stalls: workers block on full queues, nothing deadlocks
        stream.close()  # cancellation mid-stream
        assert not edgeinfer_threads()
        abandoned = session.stream(itertools.cycle(requests_for(proto, 3)), stages=2, replicas=1)
        next(abandoned)
        del abandoned  # dropped without close: collected, then shut down
        gc.collect()
        assert not edgeinfer_threads()


def test_session_close_stops_open_streams(cnn):
    proto, model = cnn
    session = ei.Session(model, backend="onnxruntime", threads=2)
    stream = session.stream(itertools.cycle(requests_for(proto, 3)), stages=2, replicas=1)
    next(stream)
    session.close()
    assert not edgeinfer_threads()
    with pytest.raises(ei.EdgeInferError):
        for _ in range(100):
            next(stream)


def test_a_pipeline_closed_before_it_serves_raises_instead_of_waiting(cnn):
    """A closed pipeline has no workers: serving on it must raise SchedulerError, not wait forever
    (a full-suite run once hung when session.close() left a stream's pipeline unable to drain)."""
    import threading

    from edgeinfer.errors import SchedulerError
    from edgeinfer.runtime.stream.pipeline import Pipeline

    proto, model = cnn
    feeds = requests_for(proto, 2)
    with ei.Session(model, backend="onnxruntime", threads=2) as session:
        plan = session.pipeline_plan(feeds[0], stages=2, replicas=1)
        pipeline = Pipeline(plan, max_in_flight=1)
        pipeline.close()
        raised: list[BaseException] = []

        def consume() -> None:
            try:
                list(pipeline.serve(feeds))
            except BaseException as exc:  # noqa: BLE001 - inspected below
                raised.append(exc)

        consumer = threading.Thread(target=consume, daemon=True)
        consumer.start()
        consumer.join(timeout=10)
        assert not consumer.is_alive(), "the closed pipeline waited forever"
    assert len(raised) == 1 and isinstance(raised[0], SchedulerError)
    assert "closed" in str(raised[0])


def test_request_timeout():
    model = ei.convert(zoo.mlp_symbolic_batch(seed=3))
    engine = FaultyBackend("slow", sleep=1.0)
    requests = [{"x": np.zeros((1, 32), np.float32)}, {"x": np.full((1, 32), SLOW_MARK, np.float32)}]
    with ei.Session(model, backend=[engine, "numpy"], threads=2) as session:
        # plan on a fast request first, so planning does not hit the slow one
        list(session.stream(requests[:1], stages=1, replicas=1))
        with pytest.raises(RequestTimeoutError, match="request 1 did not finish within 0.2 s"):
            list(session.stream(requests, stages=1, replicas=1, timeout=0.2))
    assert not edgeinfer_threads()


def test_ten_thousand_requests_with_flat_memory():
    proto = zoo.mlp_symbolic_batch(features=(16, 32, 8), seed=6)
    model = ei.convert(proto)
    rng = np.random.default_rng(0)
    pool = [rng.standard_normal((1, 16)).astype(np.float32) for _ in range(50)]
    expected = [ei.Session(model).run({"x": x})["probs"] for x in pool]
    sizes = {}
    with ei.Session(model, backend="onnxruntime", threads=2) as session:
        tracemalloc.start()
        try:
            stream = session.stream(({"x": pool[i % 50]} for i in range(10_000)), stages=2, replicas=1)
            for index, out in enumerate(stream):
                if index % 997 == 0:  # results matched to their requests
                    assert_close(out["probs"], expected[index % 50], rtol=RTOL, atol=ATOL)
                if index in (2_000, 9_999):
                    gc.collect()
                    sizes[index] = tracemalloc.get_traced_memory()[0]
        finally:
            tracemalloc.stop()
    assert index == 9_999
    assert sizes[9_999] - sizes[2_000] < 256 * 1024, f"memory grew by {sizes[9_999] - sizes[2_000]} bytes"


@pytest.mark.parametrize("stages, replicas, message", [
    (0, "auto", "stages 0: expected a positive integer"),
    (2, [1, 1, 1], "expected one count per stage"),
    ("many", "auto", "stages 'many'"),
    (2, 0, "replicas 0"),
])
def test_bad_stream_options_are_clear_errors(stages, replicas, message):
    model = ei.convert(zoo.mlp_symbolic_batch(seed=3))
    with ei.Session(model, backend="onnxruntime") as session:
        with pytest.raises(BackendError, match=message):
            session.stream([], stages=stages, replicas=replicas)


# -- the planner's pieces -------------------------------------------------------------------------
def test_split_minimises_the_slowest_stage():
    rng = np.random.default_rng(1)
    for _ in range(30):
        costs = list(rng.uniform(0.1, 5.0, int(rng.integers(3, 9))))
        k = int(rng.integers(1, len(costs) + 1))
        ranges = split(costs, k)
        assert len(ranges) == k and ranges[0][0] == 0 and ranges[-1][1] == len(costs)
        got = max(sum(costs[a:b]) for a, b in ranges)
        brute = min(max(sum(costs[a:b]) for a, b in zip((0, *cuts), (*cuts, len(costs))))
                    for cuts in itertools.combinations(range(1, len(costs)), k - 1))
        assert got == pytest.approx(brute)


def test_split_avoids_expensive_cuts():
    costs = [1.0] * 6
    cross = [0.0, 9.0, 9.0, 0.0, 9.0, 9.0]  # cutting anywhere but before node 3 is costly
    assert split(costs, 2, cross) == [(0, 3), (3, 6)]


def test_replicas_go_to_the_bottleneck():
    assert replicate([4.0, 1.0], workers=4) == [3, 1]
    assert replicate([1.0, 1.0], workers=2) == [1, 1]
    assert replicate([2.0], workers=2) == [2]
    assert throughput([4.0, 1.0], [3, 1]) == pytest.approx(0.75)


def test_crossing_bytes_counts_values_live_across_each_cut():
    model = ei.convert(zoo.cnn_residual_depthwise(seed=1))
    graph = model.graph
    cross = crossing_bytes(graph)
    for j in range(1, len(graph.nodes)):
        made_before = {o for n in graph.nodes[:j] for o in n.outputs} | set(graph.input_names)
        read_after = {i for n in graph.nodes[j:] for i in n.inputs} | set(graph.output_names)
        live = made_before & read_after
        expected = sum(int(np.prod([d if isinstance(d, int) else 1 for d in graph.values[n].shape])) * 4
                       for n in live)
        assert cross[j] == expected


def test_replicated_stage_of_a_non_thread_safe_engine_gets_one_executable_per_worker(cnn):
    proto, model = cnn
    engine = FaultyBackend("single", thread_safe=False)
    requests = requests_for(proto, 24, seed=80)
    reference = ei.Session(model, backend="numpy")
    with ei.Session(model, backend=[engine, "numpy"], threads=2) as session:
        outs = list(session.stream(requests, stages=1, replicas=2))
    assert engine.violations == 0
    for out, request in zip(outs, requests):
        assert_close(out["logits"], reference.run(request)["logits"])


def test_stages_overlap_on_different_threads_and_requests_run_one_at_a_time():
    """Evidence that a stream's speed comes from stages working at once, not from batching:
    every stage call sees one request (batch 1), and while stage 1 serves request i, stage 0
    already serves request i + 1 on another thread."""
    from .backends import RecordingBackend

    proto = zoo.mlp_symbolic_batch(seed=8)
    model = ei.convert(proto)
    engine = RecordingBackend(sleep=0.03)
    requests = [{"x": np.full((1, 32), float(i), np.float32)} for i in range(8)]
    with ei.Session(model, backend=[engine, "numpy"], threads=2) as session:
        plan = session.pipeline_plan(requests[0], stages=2, replicas=1)
        first, second = (stage.runner.graph.name for stage in plan.stages)
        engine.intervals.clear()
        outs = list(session.stream(requests, stages=2, replicas=1))
    assert [o["probs"].shape for o in outs] == [(1, 10)] * 8
    calls0 = sorted((s, e, t) for name, t, s, e in engine.intervals if name.startswith(first))
    calls1 = sorted((s, e, t) for name, t, s, e in engine.intervals if name.startswith(second))
    assert len(calls0) == len(calls1) == 8  # one call per request and stage: nothing batched
    overlapping = [(a, b) for a in calls0 for b in calls1 if a[0] < b[1] and b[0] < a[1]]
    assert overlapping, "no stage-0 call ran while a stage-1 call did"
    assert all(a[2] != b[2] for a, b in overlapping)  # on different threads


def test_with_a_slow_link_the_planner_cuts_where_activations_are_small():
    """Stages on other machines (Ray) pay for the bytes crossing a cut: with a slow link the cut
    goes where the activation is smallest (the 4-wide bottleneck), not where time balances."""
    from edgeinfer.runtime.stream.planner import plan_stages
    from edgeinfer.runtime.stream.split import crossing_bytes

    proto = zoo.mlp_symbolic_batch(features=(64, 512, 512, 4, 512, 512, 64), seed=2)
    model = ei.convert(proto)
    feeds = zoo.example_inputs(proto, batch=8)
    with ei.Session(model, backend="onnxruntime", threads=2) as session:
        plan = plan_stages(session.compiled_plan(feeds), feeds, stages=2, replicas=1, measure=False,
                           transfer_bytes_per_second=1e4)
    cut = plan.stages[1].nodes.start
    cross = crossing_bytes(model.graph)
    assert cross[cut] == min(cross[1:])
    assert cross[cut] < max(cross[1:]) / 50
