"""Streams on live sources: intake on its own thread, each result delivered as soon as it and
every earlier one are done, timeouts that detach a stuck worker, and planning that never
stalls a stream."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import edgeinfer as ei
from devkit import zoo
from devkit.testing import assert_close
from edgeinfer.errors import RequestTimeoutError

from .backends import SLOW_MARK, FaultyBackend, RecordingBackend
from .threads import edgeinfer_threads

WAIT_S = 5.0  # how long a source waits for the previous result before giving up (a failure)


@pytest.fixture(scope="module")
def mlp():
    return ei.convert(zoo.mlp_symbolic_batch(seed=3))


def frames(count: int) -> list[dict[str, np.ndarray]]:
    return [{"x": np.full((1, 32), float(i) / count, np.float32)} for i in range(count)]


@pytest.mark.parametrize("max_in_flight", [1, 4])
def test_live_source_gets_each_result_before_the_next_frame_is_pulled(mlp, max_in_flight):
    """A camera yields a frame, then the next one only later; an idle pipeline must hand the
    result back meanwhile. The source waits (up to WAIT_S) for the previous result before it
    yields the next frame: had the stream pulled ahead before delivering (the old intake on the
    consumer's thread), the wait would time out."""
    requests = frames(12)
    reference = ei.Session(mlp)
    expected = [reference.run(r)["probs"] for r in requests]
    delivered: list[int] = []
    arrived = threading.Condition()
    on_time: list[bool] = []

    def camera():
        for index, frame in enumerate(requests):
            if index:
                with arrived:
                    on_time.append(arrived.wait_for(lambda i=index: len(delivered) >= i, timeout=WAIT_S))
            yield frame

    with ei.Session(mlp, backend="onnxruntime", threads=2) as session:
        for index, out in enumerate(session.stream(camera(), stages=1, replicas=1, max_in_flight=max_in_flight)):
            assert_close(out["probs"], expected[index], name=f"frame {index}")  # in order
            with arrived:
                delivered.append(index)
                arrived.notify_all()
    assert delivered == list(range(12))
    assert on_time == [True] * 11, "a result was held back until a later frame arrived"
    assert not edgeinfer_threads()


def test_a_timeout_detaches_the_stuck_worker_and_close_joins_it(mlp):
    engine = FaultyBackend("slow", sleep=1.5)
    requests = [{"x": np.zeros((1, 32), np.float32)}, {"x": np.full((1, 32), SLOW_MARK, np.float32)},
                {"x": np.zeros((1, 32), np.float32)}]
    session = ei.Session(mlp, backend=[engine, "numpy"], threads=2)
    list(session.stream(requests[:1], stages=1, replicas=1))  # plan on a fast request
    got = []
    with pytest.raises(RequestTimeoutError, match="request 1 did not finish within 0.1 s"):
        for out in session.stream(requests, stages=1, replicas=1, timeout=0.1):
            got.append(out)
    assert len(got) == 1
    # the error came while the stuck call still runs: its worker was detached, not waited for
    assert any(name.startswith("edgeinfer-stage0") for name in edgeinfer_threads())
    assert len(list(session.stream(requests[:1], stages=1, replicas=1))) == 1  # the session still serves
    session.close()  # joins the detached worker before closing what it runs
    assert not edgeinfer_threads()


def test_a_stream_starts_on_the_default_plan_and_switches_to_the_measured_one(mlp):
    """Planning never stalls a stream: the first results come from replicas of the whole graph
    (one worker per core on one single-threaded copy) while the planner measures beside them;
    later requests run on the measured plan."""
    requests = frames(400)
    reference = ei.Session(mlp)
    expected = [reference.run(r)["probs"] for r in requests[:8]]
    served: list[list] = []
    with ei.Session(mlp, backend="onnxruntime", threads=2) as session:
        measured_key = ("auto", "auto", "N=1")

        def source():
            for index, request in enumerate(requests):
                if index == 8:  # wait until the planner is done
                    deadline = time.monotonic() + 120
                    while measured_key not in session.stage_plans and time.monotonic() < deadline:
                        time.sleep(0.01)
                yield request
            served.extend(p.plans for p in session._streams.pipelines())

        outs = list(session.stream(source()))
        default = session.stage_plans[("default", "N=1")]
        assert default.kind == "default" and len(default.stages) == 1 and default.replicas == [2]
        assert default.threads_per_worker == 1
        assert len(default.stages[0].runners) == 1  # the thread-safe copy serves both workers
        measured = session.stage_plans[measured_key]
        assert measured.kind == "measured"
        assert served and served[0][0] is default and served[0][-1] is measured, served
    assert len(outs) == 400
    for index, out in enumerate(outs[:8]):
        assert_close(out["probs"], expected[index], name=f"request {index}")
    assert not edgeinfer_threads()


def test_the_first_request_proves_the_plan_and_nothing_runs_twice(mlp):
    """A fresh session's first stream runs its first request on the session's own compiled plan
    (that run proves the placement before the stream's copy is compiled from it) and delivers
    its result first; the copy starts serving without a warm-up run: every request runs once."""
    engine = RecordingBackend("recording", sleep=0.0)
    requests = frames(6)
    reference = ei.Session(mlp)
    with ei.Session(mlp, backend=[engine, "numpy"], threads=2) as session:
        own = session._runner.parts[0].executable()
        outs = []
        for out in session.stream(requests):
            outs.append(out)
        ended = time.perf_counter()  # the planner starts only once the stream is closed
        with engine.lock:
            ran = [interval for interval in engine.intervals if interval[2] < ended]
        assert len(ran) == len(requests), ran
        assert session._single.proven
        first_thread = ran[0][1]
        assert first_thread == threading.get_ident()  # the consumer's own thread, on the compiled plan
        default = session.stage_plans[("default", "N=1")]
        assert default.stages[0].runners[0].parts[0].executable() is not own
    for index, (out, request) in enumerate(zip(outs, requests)):
        assert_close(out["probs"], reference.run(request)["probs"], name=f"request {index}")
    assert not edgeinfer_threads()


def test_a_single_threaded_session_streams_on_its_own_compiled_plan(mlp):
    """With threads=1 the session's compiled plan is already the single-threaded copy a stream
    would compile: the default plan serves on it."""
    requests = frames(5)
    reference = ei.Session(mlp)
    with ei.Session(mlp, backend="onnxruntime", threads=1) as session:
        outs = list(session.stream(requests))
        default = session.stage_plans[("default", "N=1")]
        assert default.replicas == [1]
        assert default.stages[0].runner.parts[0] is session._runner.parts[0]
    for index, (out, request) in enumerate(zip(outs, requests)):
        assert_close(out["probs"], reference.run(request)["probs"], name=f"request {index}")
    assert not edgeinfer_threads()


def test_a_timeout_covers_the_first_request_too(mlp):
    """The first request of a fresh session proves its plan; a timeout holds for it as for any
    other: the stuck run is detached, and the session joins it when it closes."""
    engine = FaultyBackend("slow", sleep=1.0)
    session = ei.Session(mlp, backend=[engine, "numpy"], threads=2)
    slow = {"x": np.full((1, 32), SLOW_MARK, np.float32)}
    with pytest.raises(RequestTimeoutError, match="request 0 did not finish within 0.1 s"):
        list(session.stream([slow, *frames(2)], timeout=0.1))
    assert "edgeinfer-stage-first" in edgeinfer_threads()  # still inside the engine: detached
    session.close()
    assert not edgeinfer_threads()


def test_plan_first_plans_before_serving(mlp):
    with ei.Session(mlp, backend="onnxruntime", threads=2) as session:
        outs = list(session.stream(frames(6), plan="first", plan_budget=5.0))
        assert len(outs) == 6
        assert list(session.stage_plans) == [("auto", "auto", "N=1")]
