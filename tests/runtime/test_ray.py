"""Pipeline stages as Ray actors on a local Ray instance (executor="ray")."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import edgeinfer as ei
from devkit import zoo
from devkit.testing import assert_close, parse_model
from edgeinfer.errors import BackendError, SchedulerError

ray = pytest.importorskip("ray")
RTOL, ATOL = 1e-4, 1e-5
# a fresh interpreter finds devkit/ (not installed) as pytest does (pythonpath = ["."])
ROOT_ON_PATH = {**os.environ, "PYTHONPATH": os.pathsep.join(
    [str(Path(__file__).resolve().parents[2]), *filter(None, [os.environ.get("PYTHONPATH")])])}
HALF_CPU = {"num_cpus": 0.5}  # the test machine has 2 cores; actors share them


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def cnn():
    proto = zoo.cnn_residual_depthwise(seed=7)
    model = ei.convert(proto)
    pool = [zoo.example_inputs(proto, seed=s) for s in range(20)]
    local = ei.Session(model, backend="numpy")
    expected = [local.run(feeds)["logits"] for feeds in pool]
    return model, pool, expected


def test_thousand_requests_match_the_local_session_in_order(local_ray, cnn):
    model, pool, expected = cnn
    with ei.Session(model, backend="onnxruntime", executor="ray",
                    options=[ei.StreamOptions(stages=2, replicas=[1, 2]), ei.RayOptions(stage_resources=HALF_CPU)]) as session:
        count = 0
        for index, out in enumerate(session.stream(pool[i % 20] for i in range(1000))):
            assert_close(out["logits"], expected[index % 20], rtol=RTOL, atol=ATOL, name=f"request {index}")
            count += 1
        assert count == 1000
        plan = session.ray_pipeline.plan
        assert len(plan.stages) == 2 and plan.replicas == [1, 2]
        assert_close(session.run(pool[3])["logits"], expected[3], rtol=RTOL, atol=ATOL)


def test_a_killed_actor_is_restarted_and_nothing_is_lost_or_duplicated(local_ray, cnn):
    model, pool, expected = cnn
    with ei.Session(model, backend="onnxruntime", executor="ray",
                    options=[ei.StreamOptions(stages=2, replicas=1), ei.RayOptions(stage_resources=HALF_CPU)]) as session:
        results = []
        for index, out in enumerate(session.stream(pool[i % 20] for i in range(300))):
            results.append(out["logits"])
            if index == 100:
                victim = session.ray_pipeline.actors[1][0]
                old_pid = ray.get(victim.pid.remote())
                ray.kill(victim, no_restart=False)  # dies with requests in flight
        assert len(results) == 300
        for index, got in enumerate(results):
            assert_close(got, expected[index % 20], rtol=RTOL, atol=ATOL, name=f"request {index}")
        assert ray.get(victim.pid.remote()) != old_pid  # a restarted process


def test_backpressure_bounds_requests_in_flight(local_ray, cnn):
    model, pool, _ = cnn
    pulled = 0

    def source():
        nonlocal pulled
        for feeds in itertools.islice(itertools.cycle(pool), 80):
            pulled += 1
            yield feeds

    with ei.Session(model, backend="onnxruntime", executor="ray",
                    options=[ei.StreamOptions(stages=2, replicas=1), ei.RayOptions(stage_resources=HALF_CPU)]) as session:
        delivered = 0
        for _ in session.stream(source(), max_in_flight=4):
            delivered += 1
            assert pulled - delivered <= 4
        assert delivered == 80


def test_a_stage_that_raises_passes_its_error_to_the_caller(local_ray):
    model = ei.convert(parse_model("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[2, 4] x, int64[2] shape) => (float[?, ?] y) { r = Relu(x)  y = Reshape(r, shape) }"""),
        optimize=0)
    good = {"x": np.ones((2, 4), np.float32), "shape": np.array([4, 2], np.int64)}
    bad = {"x": np.ones((2, 4), np.float32), "shape": np.array([3, 3], np.int64)}
    with ei.Session(model, backend="numpy", executor="ray",
                    options=[ei.StreamOptions(stages=2, replicas=1), ei.RayOptions(stage_resources=HALF_CPU)]) as session:
        got = []
        with pytest.raises(ei.EdgeInferError, match="Reshape"):
            for out in session.stream([good, good, bad, good]):
                got.append(out)
        assert len(got) == 2 and got[0]["y"].shape == (4, 2)


def test_a_plan_the_cluster_cannot_place_is_refused(local_ray, cnn):
    model, pool, _ = cnn
    with ei.Session(model, backend="onnxruntime", executor="ray",
                    options=[ei.StreamOptions(stages=3, replicas=1), ei.RayOptions(stage_resources={"num_cpus": 1})]) as session:
        with pytest.raises(SchedulerError, match="need CPU 3 \\(cluster has 2\\)"):
            session.run(pool[0])


def test_bad_ray_options_are_clear_errors(cnn):
    model, _, _ = cnn
    with pytest.raises(BackendError, match="ray_options: unknown key"), pytest.warns(DeprecationWarning):
        ei.Session(model, executor="ray", ray_options={"num_gpus": 1})  # the deprecated keyword, checked
    with pytest.raises(BackendError, match="Backend objects cannot travel"):
        from .backends import FaultyBackend

        ei.Session(model, backend=[FaultyBackend(), "numpy"], executor="ray")


def test_without_ray_the_error_says_how_to_install_it(cnn, monkeypatch):
    model, _, _ = cnn
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray now fails
    with pytest.raises(BackendError, match=r"pip install 'edgeinfer\[ray\]'"):
        ei.Session(model, executor="ray")


def test_a_session_that_started_ray_leaves_no_ray_process_behind(tmp_path):
    """In a fresh interpreter: Session starts a local Ray instance, serves, closes; then no Ray
    process of it is left."""
    script = textwrap.dedent("""
        import psutil, ray
        import edgeinfer as ei
        from devkit import zoo
        proto = zoo.mlp_symbolic_batch(seed=1)
        feeds = zoo.example_inputs(proto)
        session = ei.Session(ei.convert(proto), backend="onnxruntime", executor="ray", stages=2, replicas=1,
                             stage_resources={"num_cpus": 0.5}, ray_options={"ray_init": {"num_cpus": 2}})
        assert len(list(session.stream([feeds] * 20))) == 20
        children = psutil.Process().children(recursive=True)
        assert children, "ray started no process"
        session.close()
        session.close()
        gone, alive = psutil.wait_procs(children, timeout=30)
        assert not ray.is_initialized()
        print("LEFT", [p.pid for p in alive])
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path, env=ROOT_ON_PATH)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "LEFT []" in done.stdout, done.stdout


def test_the_driver_compiles_no_stage_and_leaves_a_ray_it_did_not_start_running(local_ray, cnn, monkeypatch):
    from edgeinfer.runtime.stream import stages

    def no_compiling(*args, **kwargs):
        raise AssertionError("the driver compiled a stage it hands to an actor")

    monkeypatch.setattr(stages, "compile", no_compiling)
    model, pool, expected = cnn
    with ei.Session(model, backend="onnxruntime", executor="ray",
                    options=[ei.StreamOptions(stages=2, replicas=1), ei.RayOptions(stage_resources=HALF_CPU)]) as session:
        for index, out in enumerate(session.stream(pool[:6])):
            assert_close(out["logits"], expected[index], rtol=RTOL, atol=ATOL)
        assert session.compiled_plans[None].runner is None  # no local copy of the model either
    assert ray.is_initialized()  # the caller's Ray instance stays up


def test_sessions_sharing_a_ray_instance_keep_it_until_the_last_one_closes(tmp_path):
    """In a fresh interpreter: the first session starts Ray, a second one joins it; closing the
    first must not kill the second's actors; the last one out shuts the instance down."""
    script = textwrap.dedent("""
        import ray
        import edgeinfer as ei
        from devkit import zoo
        proto = zoo.mlp_symbolic_batch(seed=1)
        feeds = zoo.example_inputs(proto)
        options = dict(backend="onnxruntime", executor="ray", stages=1, replicas=1,
                       stage_resources={"num_cpus": 0.5}, ray_options={"ray_init": {"num_cpus": 2}})
        from edgeinfer.runtime.options import session_keywords
        first = ei.Session(ei.convert(proto), **session_keywords(**options))
        assert len(list(first.stream([feeds] * 5))) == 5
        second = ei.Session(ei.convert(proto), **session_keywords(**options))
        assert len(list(second.stream([feeds] * 5))) == 5
        first.close()
        assert ray.is_initialized()
        assert len(list(second.stream([feeds] * 5))) == 5, "the second session lost its actors"
        second.close()
        print("SHUTDOWN", not ray.is_initialized())
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path, env=ROOT_ON_PATH)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "SHUTDOWN True" in done.stdout, done.stdout
