"""Quantization closes what it opens and prints nothing.

Calibration, GPTQ, bias correction, equalization, the quality guard, the mixed-precision search
and per-layer sensitivity each run the model through Sessions; every one of them is closed
before ``quantize`` returns (a Session holds an engine, its threads and its memory, so one left
open per sensitivity layer grew a long search without bound). Progress goes to the
``edgeinfer.progress.Steps`` the caller passes; the library itself never writes to the
terminal."""

from __future__ import annotations

import threading
from contextlib import contextmanager

import numpy as np
import pytest

import edgeinfer as ei
from devkit import zoo
from devkit.testing import assert_close
from edgeinfer.quantize.report import layer_errors
from edgeinfer.quantize.sensitivity import layer_sensitivity, top1_metric
from edgeinfer.quantize.static import calibrate
from edgeinfer.runtime.session import Session


@pytest.fixture
def opened(monkeypatch) -> list[Session]:
    """Every Session constructed while the test runs."""
    sessions: list[Session] = []
    original = Session.__init__

    def recording(self, *args, **kwargs):
        sessions.append(self)
        original(self, *args, **kwargs)

    monkeypatch.setattr(Session, "__init__", recording)
    return sessions


@pytest.fixture(scope="module")
def cnn():
    proto = zoo.cnn_residual_depthwise(size=16)
    return ei.convert(proto), [zoo.example_inputs(proto, seed=seed) for seed in range(8)]


def _threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.is_alive()}


class _Recorder:
    """A ``Steps`` that keeps what it was told."""

    def __init__(self) -> None:
        self.steps: list[tuple[str, int | None, str, int]] = []

    @contextmanager
    def step(self, label, total, unit="bytes", size=None):
        record = [label, total, unit, 0]

        class _Step:
            def advance(self, amount: int = 1) -> None:
                record[3] += amount

        yield _Step()
        self.steps.append(tuple(record))


@pytest.mark.parametrize("options", [
    {},
    {"min_sqnr": 35.0},
    {"bias_correction": True},
    {"equalize": True},
    {"activations": "float"},
], ids=["guarded", "mixed_gptq", "bias_correction", "equalize", "weights_only"])
def test_quantize_closes_every_session_it_opens_and_leaves_no_thread(cnn, opened, capfd, options):
    model, samples = cnn
    before = _threads()
    quantized = ei.quantize(model, samples, **options)
    assert opened, "quantization ran no Session: the test would prove nothing"
    still_open = [s for s in opened if not s._closed]
    assert not still_open, f"{len(still_open)} of {len(opened)} Sessions left open by quantize({options})"
    assert _threads() <= before, f"threads left running: {sorted(t.name for t in _threads() - before)}"
    out, err = capfd.readouterr()
    assert out == "" and err == "", f"quantize printed: {(out + err)[:300]!r}"
    # numerics before and after: the quantized model still computes the float model's answer
    with ei.Session(model, backend="numpy") as ref, ei.Session(quantized, backend="numpy") as got:
        feeds = samples[0]
        assert_close(got.run(feeds)["logits"], ref.run(feeds)["logits"], rtol=0.2, atol=0.2,
                     name="int8 logits vs fp32")  # INT8 on 16x16 random weights: within 0.2


def test_sensitivity_and_layer_errors_close_their_sessions(cnn, opened):
    model, samples = cnn
    calibration = calibrate(model, samples)
    ranked = layer_sensitivity(model, calibration, samples[:2], method="minmax")
    assert ranked and all(np.isfinite(r.output_sqnr_db) or r.output_sqnr_db == np.inf for r in ranked)
    quantized = ei.quantize(model, samples)
    rows = layer_errors(model.graph, quantized.graph, [r.layer for r in ranked[:3]], samples[:2])
    assert rows
    labels = np.zeros(2, np.int64)
    inputs = np.concatenate([s["input"] for s in samples[:2]])
    assert 0.0 <= top1_metric(inputs, labels, batch=1)(model) <= 100.0
    assert [s for s in opened if not s._closed] == []


def test_calibration_progress_goes_to_the_steps_given_and_nothing_is_printed(cnn, capfd):
    model, samples = cnn
    recorder = _Recorder()
    ei.quantize(model, samples, progress=recorder)
    (label, total, unit, done), *_ = [s for s in recorder.steps if s[0] == "calibrating"]
    assert unit == "samples" and done == total  # every calibration sample counted
    assert capfd.readouterr() == ("", "")
    with pytest.warns(DeprecationWarning, match="library code never prints"):
        ei.quantize(model, samples, progress=True)
    assert capfd.readouterr() == ("", "")
