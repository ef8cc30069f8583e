"""``backend="auto"``'s measurement: compile every candidate, check the reduced-precision ones
against fp32 (``auto_precision``), race them (``measure.race``) and pick the winner
(``auto_choice.decide``)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from edgeinfer.errors import EdgeInferError
from edgeinfer.model import Model
from edgeinfer.runtime import auto_choice
from edgeinfer.runtime import precision as rules
from edgeinfer.runtime.auto_choice import (
    _DROP_FACTOR,
    _PROBE_FACTOR,
    _TIME_BUDGET_S,
    NATIVE_MARGIN,
    AutoChoice,
)
from edgeinfer.runtime.measure import race

log = logging.getLogger("edgeinfer.runtime.auto")
progress = logging.getLogger("edgeinfer.runtime.auto.progress")


def _native_first(lists: list[list[str]], native: str | None) -> list[list[str]]:
    """``lists`` with the native engine's candidate first (added if absent): it is never skipped as
    placing its nodes as an earlier candidate does."""
    if native is None:
        return lists
    mine = [native, "numpy"] if native != "numpy" else ["numpy"]
    return [mine, *(names for names in lists if names != mine)]


def _compile_candidates(model: Model, entries: list[Any], feeds: dict[str, Any], *, threads: int | None,
                        device: str, fallback: bool, options: Mapping[str, Mapping[str, Any]],
                        native: str | None) -> tuple[dict[str, Any], dict[str, Any], str | None, str]:
    """Compile and run once every candidate (``auto_precision.Candidate``; ``entries[0]`` the native
    one where ``native``). Returns (label -> (names, backends, plan, runner, notes), skipped:
    label -> why, the native candidate's label if it takes the whole graph, the note on it)."""
    native_label = entries[0].label if native is not None else None
    native_note = ""
    ready: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    placements: dict[tuple, str] = {}
    for index, candidate in enumerate(entries, 1):
        label = candidate.label
        progress.info("candidate %d/%d: %s (compile, warm-up)", index, len(entries), label)
        try:
            entry, placement = _compiled(model, candidate, feeds, threads=threads, device=device, fallback=fallback,
                                         options=options, placements=placements)
        except Exception as exc:  # noqa: BLE001 - a candidate that cannot compile or run is dropped
            skipped[label] = (str(exc).splitlines()[0] if str(exc) else type(exc).__name__)[:300]
            continue
        if entry is None:
            skipped[label] = f"places every node as {placements[placement]!r} does"
            continue
        placements[placement] = label
        if label == native_label and any(part[0] != native for part in placement[2:]):  # as placed, before compile
            counts = entry[2].node_counts()
            native_note = (f"{native} takes {counts.get(native, 0)} of {sum(counts.values())} nodes, not the "
                           "whole graph: timed as any other candidate")
            native_label = None
        ready[label] = entry
    if native_label is not None and native_label not in ready:
        native_note = f"{native} could not run the model: {skipped.get(native_label, '')}"
        native_label = None
    return ready, skipped, native_label, native_note


def _compiled(model: Model, candidate: Any, feeds: dict[str, Any], *, threads: int | None, device: str,
              fallback: bool, options: Mapping[str, Mapping[str, Any]], placements: Mapping[tuple, str] = {},
              graph: Any = None) -> tuple[Any, tuple]:
    """``candidate`` compiled on ``graph`` (the model's) and run once: ((names, backends, plan, runner,
    notes), placement), or (None, placement) where ``placements`` has that placement already."""
    from edgeinfer.runtime.compile import compile
    from edgeinfer.runtime.placement import make_backends, make_plan

    graph = model.graph if graph is None else graph
    names = candidate.names
    used = {n.partition("@")[0] for n in names}
    merged = {k: {**v, **candidate.overrides.get(k, {})} for k, v in options.items() if k in used}
    merged.update({k: dict(v) for k, v in candidate.overrides.items() if k not in merged})
    backends = make_backends(names, device=device, fallback=fallback, options=merged)
    on = {b.name: b.device for b in backends}  # torch on the CPU and on the GPU differ
    plan = make_plan(graph, backends)
    placement = (candidate.precision, repr(sorted(candidate.overrides.items())),
                 *((part.backend, on[part.backend], tuple(part.nodes)) for part in plan.parts))
    if placement in placements:
        return None, placement
    notes: list[str] = []
    plan, runner = compile(graph, backends, threads=threads, notes=notes)  # re-partitioned if a part fails
    try:
        runner.run(feeds)  # warm-up; also proves the candidate runs
    except BaseException:
        runner.close()
        raise
    return (names, backends, plan, runner, notes), placement


def measure(model: Model, lists: list[list[str]], feeds: Mapping[str, Any], *, threads: int | None, device: str,
            fallback: bool, options: Mapping[str, Mapping[str, Any]], native: str | None = None,
            budget_s: float | None = None, precision: str = "fp32", samples: list[dict[str, Any]] | None = None,
            tolerance: Any = None) -> AutoChoice:
    """Compile every candidate priority list (and ``native``'s, the engine of the model's source
    format, first), race them on ``feeds`` (``measure.race``: a candidate over ``_DROP_FACTOR``
    times the best after a first short round is dropped, never the native one), return the
    winner by ``decide`` (with its compiled runner in ``prepared``: the caller owns and closes it).
    Reduced-precision candidates are checked against fp32 first (``auto_precision.screen``)."""
    from edgeinfer.runtime.auto_precision import Candidate, reduced_candidates

    feeds = dict(feeds)
    entries = [Candidate(names) for names in _native_first(lists, native)]
    reduced, notes = ([], {}) if precision == "fp32" else reduced_candidates(lists, precision)
    if reduced and not samples and precision == "auto":
        notes.update({c.label: "not offered: no samples: a reduced precision is checked on real inputs (samples= "
                      "or example_feeds), not on random data" for c in reduced})
        reduced = []
    elif reduced and not samples:  # bf16 / fp16 as asked, with nothing to check them on
        log.warning("precision=%r: no samples to check it against fp32 on (samples=): used unchecked", precision)
        notes.update({c.label: "not checked against fp32: no samples" for c in reduced})
    if precision in ("bf16", "fp16") and not reduced:
        raise EdgeInferError(f"precision={precision!r}: no engine among the candidates offers it here: {notes}")
    ready, skipped, native_label, native_note = _compile_candidates(
        model, entries + reduced, feeds, threads=threads, device=device, fallback=fallback, options=options,
        native=native)
    if not ready:
        raise EdgeInferError(f"backend='auto': no candidate could run the model: {skipped}")
    screened = _screen(model, ready, {c.label: c for c in entries + reduced}, feeds, samples, tolerance,
                       precision=precision, native_label=native_label, threads=threads, device=device,
                       fallback=fallback, options=options) if reduced and samples else None
    if precision in ("bf16", "fp16"):  # the fp32 candidates were the reference only
        native_label = None
        for label in [lb for lb in ready if lb in {c.label for c in entries}]:
            ready.pop(label)[3].close()
    if not ready:
        raise EdgeInferError(f"precision={precision!r}: no candidate ran: {skipped}")
    if native_label is not None:
        progress.info("native engine %s takes the whole graph: kept unless another is over %.0f%% faster",
                      native, NATIVE_MARGIN * 100)
    choice, winner = _race(ready, feeds, native_label, budget_s, skipped)
    choice.native_note, choice.precision_notes = native_note, notes
    by_label = {c.label: c for c in entries + reduced}
    if screened is not None:
        choice.errors, choice.kept_fp32 = screened.errors, screened.kept_fp32
        choice.skipped.update(screened.dropped)
        by_label.update(screened.mixed)
    chosen = by_label[winner]
    for label, found in choice.errors.items():  # each checked configuration that lost, and why
        if label != winner:
            lost = choice.skipped.get(label) or (f"{choice.median_ms[label]:.3g} ms, slower" if label in
                                                 choice.median_ms else "not timed")
            kept = choice.kept_fp32.get(label)
            with_fp32 = f" with fp32 {', '.join(kept)}" if kept else ""
            notes[label] = f"{rules.worst(found)}{with_fp32}: {lost}"
    choice.precision, choice.options = chosen.precision, {k: dict(v) for k, v in chosen.overrides.items()}
    return choice


def _race(ready: dict[str, Any], feeds: dict[str, Any], native_label: str | None, budget_s: float | None,
          skipped: dict[str, str]) -> tuple[AutoChoice, str]:
    """Time ``ready``'s runners (``measure.race``), close all but the winner's: (choice, winner label)."""
    runners = {label: entry[3] for label, entry in ready.items()}
    try:
        timed = race({label: (lambda r=r: r.run(feeds)) for label, r in runners.items()}, drop_factor=_DROP_FACTOR,
                     protected=native_label, budget_s=_TIME_BUDGET_S if budget_s is None else budget_s,
                     probe_factor=_PROBE_FACTOR,
                     again=lambda times: auto_choice.decisive(times, native_label))
    except BaseException:
        for runner in runners.values():
            runner.close()
        raise
    skipped.update(timed.dropped)
    medians = timed.medians_ms()
    progress.info("timed %s", ", ".join(f"{label} ({ms:.3g} ms)" for label, ms in sorted(medians.items(),
                                                                                        key=lambda item: item[1])))
    winner, reason = auto_choice.decide(medians, native_label)
    for label, runner in runners.items():
        if label != winner:
            runner.close()
    log.info("backend='auto' timings (median ms): %s -> %s (%s)", medians, winner, reason)
    names, backends, plan, runner, _ = ready[winner]
    return AutoChoice(names, median_ms=medians, skipped=skipped, native=native_label, reason=reason,
                      repartitions={label: e[4] for label, e in ready.items() if e[4]},
                      prepared=(backends, plan, runner)), winner


def _screen(model: Model, ready: dict[str, Any], candidates: dict[str, Any], feeds: dict[str, Any],
            samples: list[dict[str, Any]] | None, tolerance: Any, *, precision: str, native_label: str | None,
            threads: int | None, device: str, fallback: bool, options: Mapping[str, Mapping[str, Any]]) -> Any:
    """``auto_precision.screen`` on ``ready``, against the native candidate (else the first fp32 one)."""
    from edgeinfer.runtime.auto_precision import screen
    from edgeinfer.runtime.compile import compile
    from edgeinfer.runtime.placement import make_backends
    from edgeinfer.runtime.precision import tolerance_of

    fp32 = [label for label in ready if candidates[label].precision == "fp32"]
    if not fp32:
        raise EdgeInferError(f"precision={precision!r}: no fp32 candidate ran to check against")
    reference = native_label if native_label in ready else fp32[0]
    def build(candidate: Any) -> Any:
        return _compiled(model, candidate, feeds, threads=threads, device=device, fallback=fallback,
                         options=options)[0]

    def run_graph(graph: Any, candidate: Any) -> Any:
        overrides = {k: {**options.get(k, {}), **v} for k, v in candidate.overrides.items()}
        backends = make_backends(candidate.names, device=device, fallback=fallback, options=overrides)
        return compile(graph, backends, threads=threads)[1]

    return screen(ready, candidates, samples or [], tolerance_of(tolerance), reference=reference,
                  explicit=precision != "auto", graph=model.graph, build=build, run_graph=run_graph)

