"""edgeinfer.timing: interleaved rounds, blocks, and settling by calls and by time."""

from __future__ import annotations

import pytest

from edgeinfer import timing


class FakeClock:
    """perf_counter that advances only when a contender runs (each call costs ``step`` s)."""

    def __init__(self, step: float):
        self.now, self.step = 0.0, step

    def __call__(self) -> float:
        return self.now

    def run(self, log: list[str], name: str):
        def call() -> None:
            self.now += self.step
            log.append(name)
        return call


@pytest.fixture
def clock(monkeypatch):
    fake = FakeClock(step=0.004)
    monkeypatch.setattr(timing.time, "perf_counter", fake)
    return fake


def test_rounds_alternate_order_and_time_every_block_call(clock):
    log: list[str] = []
    times = timing.time_interleaved({"a": clock.run(log, "a"), "b": clock.run(log, "b")},
                                       rounds=4, block=3, settle=1)
    assert log == ["a"] * 4 + ["b"] * 4 + ["b"] * 4 + ["a"] * 4 + ["a"] * 4 + ["b"] * 4 + ["b"] * 4 + ["a"] * 4
    assert {name: len(samples) for name, samples in times.items()} == {"a": 12, "b": 12}
    assert all(sample == pytest.approx(clock.step) for samples in times.values() for sample in samples)


def test_settle_lasts_at_least_settle_s(clock):
    log: list[str] = []
    timing.time_interleaved({"a": clock.run(log, "a")}, rounds=1, block=2, settle=2, settle_s=0.05)
    # 0.05 s of untimed 4 ms calls is 13 calls (the count alone asked for 2), then the timed block
    assert len(log) == 13 + 2


def test_settle_count_wins_when_calls_are_slow(monkeypatch):
    slow = FakeClock(step=0.1)
    monkeypatch.setattr(timing.time, "perf_counter", slow)
    log: list[str] = []
    timing.time_interleaved({"a": slow.run(log, "a")}, rounds=1, block=1, settle=3, settle_s=0.05)
    assert len(log) == 3 + 1


def test_time_engines_settles_by_time_and_returns_exactly_calls(clock):
    log: list[str] = []
    times = timing.time_engines({"a": clock.run(log, "a"), "b": clock.run(log, "b")}, calls=12, warmup=1)
    assert {name: len(samples) for name, samples in times.items()} == {"a": 12, "b": 12}
    rounds = -(-12 // timing.ENGINE_BLOCK)
    settle_calls = -(-round(timing.ENGINE_SETTLE_S * 1000) // round(clock.step * 1000))
    per_turn = max(timing.ENGINE_SETTLE, settle_calls) + timing.ENGINE_BLOCK
    assert log.count("a") == 1 + rounds * per_turn
