"""Timing that is fair to every contender on a noisy machine: interleaved rounds.

Each round runs every contender once, and the order reverses every other round, so load from
elsewhere on the machine hits all of them alike. Used by the scripts in ``benchmarks/``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping


def time_interleaved(runs: Mapping[str, Callable[[], object]], *, rounds: int,
                     warmup: int = 0) -> dict[str, list[float]]:
    """Seconds per call of each ``runs`` entry over ``rounds`` interleaved rounds."""
    names = list(runs)
    for _ in range(warmup):
        for name in names:
            runs[name]()
    times: dict[str, list[float]] = {name: [] for name in names}
    for index in range(rounds):
        for name in names if index % 2 == 0 else names[::-1]:
            start = time.perf_counter()
            runs[name]()
            times[name].append(time.perf_counter() - start)
    return times
