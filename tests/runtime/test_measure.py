"""``measure.race``'s pruning: contenders whose calls take known times (sleeps far apart, so the
outcome does not hang on the machine's noise)."""

from __future__ import annotations

import time

from edgeinfer.runtime.measure import race


def _contender(seconds: float, calls: list[str], label: str):
    def run():
        calls.append(label)
        time.sleep(seconds)
    return run


def test_one_call_each_drops_a_contender_over_twice_the_best_before_any_warm_up():
    calls: list[str] = []
    runs = {label: _contender(s, calls, label) for label, s in (("fast", 0.001), ("slow", 0.014), ("native", 0.005))}
    result = race(runs, drop_factor=3.0, probe_factor=2.0, protected="native", budget_s=0.05)
    # one call, one more after other engines' threads stopped spinning (under REPROBE_MAX_S), then
    # dropped: no warm-up, no rounds
    assert calls.count("slow") == 2
    assert "one call" in result.dropped["slow"] and "native" not in result.dropped
    assert set(result.times) == {"fast", "native"}


def test_a_call_past_the_bar_is_timed_again_before_it_drops_a_contender():
    """One slow call (another engine's threads still spinning) does not drop a fast contender."""
    from edgeinfer.runtime import measure

    calls: list[str] = []
    spikes = iter([0.03])  # its first timed call is 30x its others

    def spiky() -> None:
        calls.append("spiky")
        time.sleep(next(spikes, 0.001))

    runs = {"spiky": spiky, "steady": _contender(0.001, calls, "steady")}
    seconds = measure.probe(runs, factor=2.0)
    assert calls.count("spiky") == 2 and seconds["spiky"] < 2 * seconds["steady"] + 0.005
    big = {"slow": _contender(measure.REPROBE_MAX_S * 1.2, calls, "slow"), "fast": _contender(0.001, calls, "fast")}
    measure.probe(big, factor=2.0)
    assert calls.count("slow") == 1  # a call of seconds is not repeated: no noise doubles it


def test_the_slower_half_of_more_than_two_goes_after_the_first_round():
    calls: list[str] = []
    spec = (("a", 0.0010), ("b", 0.0014), ("c", 0.0018), ("d", 0.0026))  # all within 3x of the best
    result = race({label: _contender(s, calls, label) for label, s in spec}, drop_factor=3.0, probe_factor=4.0,
                  budget_s=0.05)
    assert set(result.times) == {"a", "b"}
    assert all("slower half" in result.dropped[label] for label in ("c", "d"))
    medians = result.medians_ms()
    assert medians["a"] < medians["b"]


def test_a_contender_faster_than_the_protected_one_is_never_pruned():
    """Far over the best but faster than the native engine: kept through the one-call probe and
    the halving (auto's runner-up, should the best start too slowly); over twice the native engine
    after one call, dropped there."""
    calls: list[str] = []
    spec = (("best", 0.001), ("runner_up", 0.004), ("native", 0.006), ("slow", 0.016))
    result = race({label: _contender(s, calls, label) for label, s in spec}, drop_factor=3.0, probe_factor=2.0,
                  protected="native", budget_s=0.05)
    assert set(result.times) == {"best", "runner_up", "native"}
    assert "one call" in result.dropped["slow"]


def test_the_protected_contender_survives_the_halving():
    calls: list[str] = []
    spec = (("a", 0.0010), ("b", 0.0012), ("native", 0.0025))
    result = race({label: _contender(s, calls, label) for label, s in spec}, drop_factor=3.0, probe_factor=4.0,
                  protected="native", budget_s=0.05)
    assert "native" in result.times and "native" not in result.dropped


def test_the_users_budget_reaches_autos_race(monkeypatch):
    import numpy as np
    import pytest

    import edgeinfer as ei
    from devkit import zoo
    from edgeinfer.errors import BackendError
    from edgeinfer.runtime import auto_race, measure

    seen = []

    def spy(runs, **kwargs):
        seen.append(kwargs["budget_s"])
        return measure.race(runs, **kwargs)

    monkeypatch.setattr(auto_race, "race", spy)
    model = ei.convert(zoo.mlp_symbolic_batch())
    feeds = {"x": np.ones((2, model.inputs[0].shape[1]), np.float32)}
    with ei.Session(model, backend="auto", options=[ei.AutoOptions(cache=False, budget_s=0.25),
                                                    ei.RunOptions(example_feeds=feeds)]) as session:
        session.run(feeds)
    assert seen == [0.25]
    with pytest.raises(BackendError, match="budget_s"):
        ei.AutoOptions(budget_s=0)


def test_the_cold_start_race_stops_when_the_two_files_are_apart():
    from edgeinfer.runtime.coldstart import _settled

    assert _settled({"auto": [0.40], "native": [0.20]})  # one round, far apart: decided
    assert not _settled({"auto": [0.21], "native": [0.20]})  # within the margin: more rounds
    assert not _settled({"auto": [0.40, 0.19], "native": [0.20, 0.21]})  # overlapping rounds


def test_the_runner_up_is_the_fastest_other_candidate_over_autos_margin_against_the_native_engine():
    from types import SimpleNamespace

    from edgeinfer.runtime.aot_compile import _runner_up

    medians = {"openvino,numpy": 1.0, "tflite,numpy": 1.2, "torch,numpy": 1.3, "onnxruntime,numpy": 1.5}
    choice = SimpleNamespace(backends=["openvino", "numpy"], native="onnxruntime,numpy", median_ms=medians)
    assert _runner_up(choice) == "tflite,numpy"
    close = SimpleNamespace(backends=["openvino", "numpy"], native="onnxruntime,numpy",
                            median_ms={**medians, "tflite,numpy": 1.45, "torch,numpy": 1.44})
    assert _runner_up(close) is None  # within 10% of the native engine: none


def test_a_contender_within_the_first_rounds_noise_of_the_protected_one_is_timed_on():
    """Slower than the native engine by less than ``KEEP_SLACK`` in the first rounds: kept through
    the halving (five calls on a loaded machine put a faster runner-up over the native engine)."""
    from edgeinfer.runtime.measure import KEEP_SLACK

    calls: list[str] = []
    spec = (("a", 0.0015), ("native", 0.0025), ("near", 0.0025 * (1 + (KEEP_SLACK - 1) / 3)), ("far", 0.0029 * KEEP_SLACK))
    result = race({label: _contender(s, calls, label) for label, s in spec}, drop_factor=3.0, probe_factor=4.0,
                  protected="native", budget_s=0.05)
    assert set(result.times) == {"a", "native", "near"}
    assert "slower half" in result.dropped["far"]


def test_what_again_names_is_timed_pass_after_pass_until_it_names_nothing():
    from edgeinfer.runtime.measure import AGAIN_PASSES

    calls: list[str] = []
    runs = {label: _contender(0.0005, calls, label) for label in ("x", "y", "z")}
    asked: list[int] = []

    def again(times):
        asked.append(len(times["x"]))
        return ("x", "y") if len(asked) < 3 else None

    result = race(runs, calls=10, again=again)
    assert asked == [10, 20, 30]  # each pass adds its calls to the samples the next question sees
    assert (len(result.times["x"]), len(result.times["y"]), len(result.times["z"])) == (30, 30, 10)
    always = race(runs, calls=10, again=lambda times: ("x", "z"))
    assert len(always.times["x"]) == 10 * (1 + AGAIN_PASSES) and len(always.times["y"]) == 10  # bounded
