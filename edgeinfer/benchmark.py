"""Timing that is fair to every contender on a noisy machine: interleaved rounds.

Each round runs every contender in turn, and the order reverses every other round, so load from
elsewhere on the machine hits all of them alike. Used by the scripts in ``benchmarks/``, by
``edgeinfer bench`` and by ``backend="auto"``.

Engines keep worker threads that spin for a while after a call (onnxruntime's intra-op pool,
OpenVINO's TBB arena, OpenBLAS): on a machine with few cores, the next contender then runs
beside a spinning pool and looks slower than it is (measured on 2 cores: OpenVINO 3.4 ms alone,
7.0 ms when every call alternates with onnxruntime; ``benchmarks/bench_timing_effects.py``). ``block`` calls per turn, after ``settle``
untimed ones, let the previous engine's threads go idle before anything is timed, while the
rounds still alternate. Compare engines with ``block >= 5, settle >= 1``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

ENGINE_BLOCK = 5  # calls per turn when contenders are different engines
ENGINE_SETTLE = 2


def time_interleaved(runs: Mapping[str, Callable[[], object]], *, rounds: int, warmup: int = 0,
                     block: int = 1, settle: int = 0) -> dict[str, list[float]]:
    """Seconds per call of each ``runs`` entry over ``rounds`` interleaved rounds; in each
    round every contender makes ``settle`` untimed calls, then ``block`` timed ones."""
    names = list(runs)
    for _ in range(warmup):
        for name in names:
            runs[name]()
    times: dict[str, list[float]] = {name: [] for name in names}
    for index in range(rounds):
        for name in names if index % 2 == 0 else names[::-1]:
            run = runs[name]
            for _ in range(settle):
                run()
            for _ in range(block):
                start = time.perf_counter()
                run()
                times[name].append(time.perf_counter() - start)
    return times


def time_engines(runs: Mapping[str, Callable[[], object]], *, calls: int, warmup: int = 0) -> dict[str, list[float]]:
    """``time_interleaved`` for contenders that are different engines: ``calls`` timed calls
    each, in blocks of ``ENGINE_BLOCK`` after ``ENGINE_SETTLE`` untimed ones."""
    rounds = max(2, -(-calls // ENGINE_BLOCK))
    times = time_interleaved(runs, rounds=rounds, warmup=warmup, block=ENGINE_BLOCK, settle=ENGINE_SETTLE)
    return {name: samples[:max(calls, 1)] for name, samples in times.items()}
