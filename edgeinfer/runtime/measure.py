"""Measuring on this machine: the one place the runtime times anything.

``backend="auto"`` (its candidate placements), ``executor="auto"`` (sequential against DAG)
and the stream planner (per-node profile, stage times, candidate pipelines) all decide by
what is timed here, with the same rules:

- a contender is warmed up before it is timed (``warm``: a fresh engine is slower for its
  first calls, allocation and JIT kernels);
- contenders are timed in interleaved rounds whose order alternates
  (``edgeinfer.timing.time_engines``), so load from elsewhere on the machine hits them alike
  and none is timed beside another's spinning threads;
- ``race`` prunes before it times long: one timed call each first drops a contender slower
  than ``probe_factor`` times the best (numpy on a big net costs one call, not seconds of
  warm-up); after a short first round, one slower than ``drop_factor`` times the best is
  dropped and, of more than two left, the slower half (successive halving; never the
  ``protected`` one, nor one within the first rounds' noise of it); the rest are timed within a
  budget, and those that end up near the bar that decides between them (within 5%, or within
  the spread of the rounds) are timed again, pass after pass while they are, within a budget;
- single costs (a node, a stage) are the fastest of a few calls (``best_time``: the least
  disturbed by the machine), throughputs the best of alternating rounds (``best_rates``).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from edgeinfer.backend import Backend, CompileOptions
from edgeinfer.ir import Graph
from edgeinfer.runtime.parts import close_executable, engine_compile
from edgeinfer.timing import BLAS_SPIN_S, ENGINE_BLOCK, time_engines

WARM_S = 0.2  # untimed calls per contender before timing, at most (a big model stops at one)
FIRST_CALLS = 2 * ENGINE_BLOCK  # timed calls per contender in a race's first, pruning round: two rounds
# a contender within this of ``protected`` in the first rounds is timed on: five calls on a loaded 2-core machine
# put PP-OCRv4 rec's TFLite plan (20 ms; onnxruntime 24-34) over onnxruntime's, the halving dropped it, and
# auto's choice flipped between runs (bench_auto_decide.py --load 1)
KEEP_SLACK = 1.25


def warm(run: Callable[[], Any], calls: int = 20, seconds: float = WARM_S) -> None:
    """Untimed calls until ``calls`` are done or ``seconds`` have passed (at least one)."""
    deadline = time.perf_counter() + seconds
    for _ in range(calls):
        run()
        if time.perf_counter() >= deadline:
            return


def best_time(call: Callable[[], Any], repeats: int) -> float:
    """The fastest of ``repeats`` calls, in seconds (the least disturbed by the machine)."""
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - start)
    return best


@dataclass
class Race:
    """What ``race`` measured: seconds per call by contender, and the ones it dropped, with why."""

    times: dict[str, list[float]] = field(default_factory=dict)
    dropped: dict[str, str] = field(default_factory=dict)
    first_ms: dict[str, float] = field(default_factory=dict)  # median of the first round, where there was one

    def medians_ms(self) -> dict[str, float]:
        return {label: statistics.median(samples) * 1000 for label, samples in self.times.items()}


def race(runs: Mapping[str, Callable[[], Any]], *, calls: int = 10, drop_factor: float | None = None,
         protected: str | None = None, budget_s: float | None = None, probe_factor: float | None = None,
         again: Callable[[Mapping[str, list[float]]], Sequence[str] | None] | None = None) -> Race:
    """Time ``runs`` (label -> one call, each already called once) against each other: warm
    each, then interleaved rounds of ``calls`` calls each. ``probe_factor``: first one timed
    call each, dropping a contender slower than that many times the best. With ``drop_factor``
    a first short round drops every contender slower than that many times the best, then the
    slower half of more than two (never ``protected``, nor one within ``KEEP_SLACK`` of it), and
    ``budget_s`` sets the calls of the main round from the first round's times (10 to 60).
    ``again(times)`` may name contenders to time once more (those near the bar that separates
    them): asked again after each pass, up to ``AGAIN_PASSES`` passes and, after the first,
    while they took less than ``budget_s`` together."""
    runs = dict(runs)
    result = Race()
    if probe_factor is not None and len(runs) > 1:
        # one call is noisy: what came within ``probe_factor`` of ``protected`` is timed on
        _drop(runs, probe(runs, probe_factor), probe_factor, protected, result, "one call", slack=probe_factor)
    for run in runs.values():
        warm(run)
    if drop_factor is not None and len(runs) > 1:
        # two interleaved rounds (the order reversed in the second): every call timed counts
        first = time_engines(runs, calls=FIRST_CALLS)
        medians = {label: statistics.median(samples) for label, samples in first.items()}
        result.first_ms = {label: seconds * 1000 for label, seconds in medians.items()}
        _drop(runs, medians, drop_factor, protected, result, "the first rounds", slack=KEEP_SLACK)
        if len(runs) > 2:  # successive halving: the faster half goes on, and whatever may beat ``protected``
            ranked = sorted(runs, key=medians.get)
            for label in ranked[-(len(ranked) // 2):]:
                if label != protected and not _beats(medians, label, protected, KEEP_SLACK):
                    result.dropped[label] = f"{medians[label] * 1000:.2f} ms in the first rounds, in the slower half"
                    runs.pop(label)
        if budget_s is not None:
            per_round = sum(medians[label] for label in runs)
            calls = int(max(10, min(60, budget_s / max(per_round, 1e-6))))
    result.times = time_engines(runs, calls=calls)
    _again(runs, result, again, calls, budget_s)
    return result


AGAIN_PASSES = 4  # passes of ``race``'s re-timing, at most


def _again(runs: Mapping[str, Callable[[], Any]], result: Race, again: Any, calls: int,
           budget_s: float | None) -> None:
    """Time again what ``again(result.times)`` names, adding to its samples, while it names any:
    up to ``AGAIN_PASSES`` passes, and no pass begun once those before took ``budget_s``."""
    start = time.perf_counter()
    for index in range(AGAIN_PASSES if again is not None else 0):
        labels = again(result.times)
        if not labels or (index and budget_s is not None and time.perf_counter() - start >= budget_s):
            return
        for label, samples in time_engines({label: runs[label] for label in labels}, calls=calls).items():
            result.times[label].extend(samples)


REPROBE_MAX_S = 0.5  # a call over the bar but under this is timed again before it drops a contender


def probe(runs: Mapping[str, Callable[[], Any]], factor: float | None = None) -> dict[str, float]:
    """Seconds of one call of each contender (already called once, so not its very first).
    With ``factor``, one over ``factor`` times the best but under ``REPROBE_MAX_S`` is called
    once more after the previous engine's threads stopped spinning (``BLAS_SPIN_S``), and keeps
    the better time: one call right after numpy's OpenBLAS workers measured OpenVINO bf16 at
    102.9 ms, its calls before and after at 8.5-9.0 ms (nudenet 320n)."""
    seconds = {label: best_time(run, 1) for label, run in runs.items()}
    best = min(seconds.values(), default=0.0)
    for label, run in runs.items():
        if factor is not None and factor * best < seconds[label] < REPROBE_MAX_S:
            time.sleep(BLAS_SPIN_S)
            seconds[label] = min(seconds[label], best_time(run, 1))
    return seconds


def _drop(runs: dict[str, Any], seconds: Mapping[str, float], factor: float, protected: str | None,
          result: Race, when: str, slack: float = 1.0) -> None:
    """Drop from ``runs`` every contender over ``factor`` times the best of ``seconds``, except
    ``protected`` and any contender faster than it: auto's native engine, and the candidates that
    could still be chosen over it should the best be refused later (its first result in a fresh
    process too slow: ``aot_compile._runner_up``). One noisy call once dropped such a runner-up
    on a loaded machine, and the choice flipped between the native engine and it
    (``openwakeword/embedding_model``: TFLite 6.2 ms, onnxruntime 8.9, OpenVINO 3.8-5.5); so after one
    call (``slack``) anything under ``slack`` times ``protected`` is kept (PP-OCRv4 rec: TFLite 20 ms,
    onnxruntime 25-30, OpenVINO 12, one call of TFLite over onnxruntime's dropped it)."""
    best = min(seconds[label] for label in runs)
    for label in list(runs):
        if seconds[label] > factor * best and label != protected and not _beats(seconds, label, protected, slack) \
                and len(runs) > 1:
            result.dropped[label] = f"{seconds[label] * 1000:.2f} ms in {when}, over {factor:g}x the best"
            runs.pop(label)


def _beats(seconds: Mapping[str, float], label: str, protected: str | None, slack: float = 1.0) -> bool:
    """Whether ``label`` took less than ``slack`` times ``protected`` (measured alike)."""
    return protected is not None and protected in seconds and seconds[label] < seconds[protected] * slack


def best_rates(rates: Sequence[Callable[[], float]], rounds: int = 2,
               cancelled: Callable[[], None] | None = None) -> list[float]:
    """The best of ``rounds`` measurements of each throughput (``rates[i]()`` measures one:
    requests per second), in rounds whose order alternates so noise hits all alike.
    ``cancelled()`` is called before each measurement (it raises to stop)."""
    best = [0.0] * len(rates)
    for round_ in range(rounds):
        order = range(len(rates)) if round_ % 2 == 0 else reversed(range(len(rates)))
        for index in order:
            if cancelled is not None:
                cancelled()
            best[index] = max(best[index], rates[index]())
    return best


def profile_nodes(graph: Graph, placed: Sequence[str], backends: Mapping[str, Backend],
                  feeds: Mapping[str, Any], *, repeats: int = 3) -> tuple[list[float], dict[str, Any]]:
    """Seconds per node, each compiled alone on its backend with one thread and run on the real
    values the nodes before it produced (best of ``repeats``); also every value computed."""
    env: dict[str, Any] = {**graph.initializers, **feeds}
    costs = []
    options = CompileOptions(threads=1)
    for node, name in zip(graph.nodes, placed):
        sub = graph.subgraph([node], name=f"profile_{node.name or node.outputs[0]}")
        executable = engine_compile(backends[name], sub, options)
        node_feeds = {n: env[n] for n in sub.input_names}
        try:
            outputs = executable.run(node_feeds)  # warm-up, and the values the next nodes read
            costs.append(best_time(lambda e=executable, f=node_feeds: e.run(f), repeats))
        finally:
            close_executable(executable)
        env.update(outputs)
    return costs, env
