"""Timing that is fair to every contender on a noisy machine: interleaved rounds.

Each round runs every contender in turn, and the order reverses every other round, so load from
elsewhere on the machine hits all of them alike. Used by the scripts in ``benchmarks/``, by
``edgeinfer bench`` and by ``backend="auto"``.

Engines keep worker threads that spin for a while after a call (onnxruntime's intra-op pool,
OpenVINO's TBB arena, OpenBLAS): on a machine with few cores, the next contender then runs
beside a spinning pool and looks slower than it is (measured on 2 cores: OpenVINO 3.4 ms alone,
7.0 ms when every call alternates with onnxruntime; ``benchmarks/bench_timing_effects.py``). ``block`` calls per turn, after
untimed ones (``settle`` calls and at least ``settle_s`` seconds of them), let the previous
engine's threads go idle before anything is timed, while the rounds still alternate. The
settling is counted in time as well as in calls because the spinning lasts a time, not a
number of calls: after a switch between two onnxruntime sessions of a 1.1 ms encoder, the new
one ran at 1.4-2.2 ms for its first ~16 calls, about 27 ms, against 1.17 ms steady
(``bench_timing_effects.py --only switch``), so two settle calls left most turns timed beside the other session's spinning
workers, and identical sessions then measured up to 60% apart.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

ENGINE_BLOCK = 5  # calls per turn when contenders are different engines
ENGINE_SETTLE = 2
ENGINE_SETTLE_S = 0.05  # seconds of untimed calls per turn, at least (see above)
# OpenBLAS's worker threads spin for 2**28 cycles (its default THREAD_TIMEOUT) after a
# multi-threaded call: 120 ms of CPU measured here (``bench_timing_effects.py --only blas``).
# Comparisons with the numpy backend, whose big GEMMs use them, settle this long.
BLAS_SPIN_S = 0.15


def time_interleaved(runs: Mapping[str, Callable[[], object]], *, rounds: int, warmup: int = 0,
                     block: int = 1, settle: int = 0, settle_s: float = 0.0) -> dict[str, list[float]]:
    """Seconds per call of each ``runs`` entry over ``rounds`` interleaved rounds; in each
    round every contender makes untimed calls (``settle`` of them, and more until ``settle_s``
    seconds have passed), then ``block`` timed ones."""
    names = list(runs)
    for _ in range(warmup):
        for name in names:
            runs[name]()
    times: dict[str, list[float]] = {name: [] for name in names}
    for index in range(rounds):
        for name in names if index % 2 == 0 else names[::-1]:
            run = runs[name]
            _settle(run, settle, settle_s)
            for _ in range(block):
                start = time.perf_counter()
                run()
                times[name].append(time.perf_counter() - start)
    return times


def _settle(run: Callable[[], object], calls: int, seconds: float) -> None:
    deadline = time.perf_counter() + seconds
    done = 0
    while done < calls or (seconds > 0 and time.perf_counter() < deadline):
        run()
        done += 1


def time_engines(runs: Mapping[str, Callable[[], object]], *, calls: int, warmup: int = 0,
                 settle_s: float = ENGINE_SETTLE_S) -> dict[str, list[float]]:
    """``time_interleaved`` for contenders that are different engines: ``calls`` timed calls
    each, in blocks of ``ENGINE_BLOCK`` after ``ENGINE_SETTLE`` untimed ones lasting at least
    ``settle_s`` (longer for a contender whose threads spin longer, e.g. OpenBLAS's,
    ``BLAS_SPIN_S``)."""
    rounds = max(2, -(-calls // ENGINE_BLOCK))
    times = time_interleaved(runs, rounds=rounds, warmup=warmup, block=ENGINE_BLOCK, settle=ENGINE_SETTLE,
                             settle_s=settle_s)
    return {name: samples[:max(calls, 1)] for name, samples in times.items()}
