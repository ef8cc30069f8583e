"""A steady ``Session.run`` is short by construction: the frames of edgeinfer code it passes
through on its way to the engines, counted with ``sys.setprofile``.

Counted: every Python frame of edgeinfer's own code (``edgeinfer`` and the backends installed
as ``edgeinfer.backends``) down to each engine call (an ``Executable``'s ``run``, counted as one
frame; what the engine runs below it is the engine's work, not the runtime's). A one-part
plan passes through at most 4 frames (``Session.run``, the feed check, the executable, one
helper of its own), an N-part sequential plan at most 2 + 2N."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import edgeinfer as ei
import edgeinfer.backends
from devkit import zoo
from edgeinfer.backend import Executable, installed_backends

from .backends import RestrictedBackend

ROOTS = tuple(os.path.join(os.path.realpath(p), "") for p in (os.path.dirname(ei.__file__), *edgeinfer.backends.__path__))
SHORTCUTS = ("_direct", "_recent", "direct_call")  # the old run path's guard attributes


def edgeinfer_frames(call: Callable[[], Any]) -> tuple[Any, list[str]]:
    """``call()``'s result and the edgeinfer frames it passed through, outside the engines."""
    frames: list[str] = []
    inside = 0  # depth below an executable's run (the engine's own work)

    def profile(frame: Any, event: str, arg: Any) -> None:
        nonlocal inside
        if event == "call":
            if inside:
                inside += 1
                return
            code = frame.f_code
            if os.path.realpath(code.co_filename).startswith(ROOTS):
                frames.append(f"{os.path.basename(code.co_filename)}:{code.co_name}")
                if code.co_name in ("run", "run_resident") and isinstance(frame.f_locals.get("self"), Executable):
                    inside = 1
        elif event == "return" and inside:
            inside -= 1

    sys.setprofile(profile)
    try:
        result = call()
    finally:
        sys.setprofile(None)
    return result, frames


@pytest.fixture(scope="module")
def cnn():
    proto = zoo.cnn_residual_depthwise(seed=0)
    return ei.convert(proto), zoo.example_inputs(proto, seed=1)


@pytest.mark.parametrize("backend", [b for b in ("numpy", "onnxruntime", "tflite") if b in installed_backends()])
def test_a_steady_one_part_run_passes_through_at_most_four_frames(cnn, backend):
    model, feeds = cnn
    with ei.Session(model, backend=backend) as session:
        assert len(session.plan.parts) == 1
        first = session.run(feeds)  # the first run proves the plan; later ones are steady
        session.run(feeds)
        steady, frames = edgeinfer_frames(lambda: session.run(feeds))
        direct = session.executable.run(dict(feeds))
        plan = session.compiled_plans[None] if None in session.compiled_plans else \
            next(iter(session.compiled_plans.values()))
        objects = (session, plan, plan.runner, *plan.runner.parts)
    assert len(frames) <= 4, " ".join(frames)
    assert frames[0] == "session.py:run"
    assert not [(type(o).__name__, name) for o in objects for name in SHORTCUTS if hasattr(o, name)]
    assert list(steady) == list(first) == list(direct)
    for name in steady:
        np.testing.assert_array_equal(steady[name], first[name])
        np.testing.assert_array_equal(steady[name], direct[name])


def test_a_steady_n_part_sequential_run_passes_through_at_most_two_plus_two_n_frames(cnn):
    model, feeds = cnn
    reference = ei.Session(model, backend="onnxruntime").run(feeds)
    npu = RestrictedBackend("npu_sim", {"Conv"}, device="cpu")  # Conv on it, the rest on onnxruntime
    with ei.Session(model, backend=[npu, "onnxruntime"]) as session:
        parts = len(session.plan.parts)
        assert parts >= 3 and {p.backend for p in session.plan.parts} == {"npu_sim", "onnxruntime"}
        session.run(feeds)
        steady, frames = edgeinfer_frames(lambda: session.run(feeds))
    assert len(frames) <= 2 + 2 * parts, " ".join(frames)
    for name, value in reference.items():
        np.testing.assert_allclose(steady[name], value, rtol=1e-5, atol=1e-6)


def test_a_plan_per_signature_is_found_in_a_few_frames_more(tmp_path):
    """``backend="auto"`` on a symbolic batch decides per signature: a steady run adds the
    signature and the plan cache's lease (acquire, release) to the one-part path; ``outputs=``
    picks from the results."""
    proto = zoo.mlp_symbolic_batch(seed=1)
    model = ei.convert(proto)
    feeds = zoo.example_inputs(proto, seed=2, batch=3)
    with ei.Session(model, backend="auto", options=ei.AutoOptions(cache=tmp_path)) as session:
        full = session.run(feeds)
        session.run(zoo.example_inputs(proto, seed=3, batch=5))  # a second signature, cached beside it
        session.run(feeds)
        (name,) = list(full)
        picked, frames = edgeinfer_frames(lambda: session.run(feeds, outputs=[name]))
        assert len(session.compiled_plans) == 2
    assert list(picked) == [name]
    np.testing.assert_array_equal(picked[name], full[name])
    assert len(frames) <= 9, " ".join(frames)
