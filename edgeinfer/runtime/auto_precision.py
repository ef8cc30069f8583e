"""``precision="auto" | "bf16" | "fp16"`` inside ``backend="auto"``: the reduced-precision
candidates (``Candidate``), and their check against fp32 before the race (``screen``). The rules
are ``runtime.precision``'s; this module applies them to auto's compiled candidates."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from edgeinfer.runtime import precision as rules

log = logging.getLogger("edgeinfer.runtime.auto")
progress = logging.getLogger("edgeinfer.runtime.auto.progress")


class Candidate(NamedTuple):
    """A priority list of backends and, for a reduced precision, the engine options that set it."""

    names: list[str]
    overrides: Mapping[str, Mapping[str, Any]] = {}  # backend -> engine options over the session's
    precision: str = "fp32"

    @property
    def label(self) -> str:
        if self.precision == "fp32":
            return ",".join(self.names)
        mixed = any(options.get("fp32_nodes") for options in self.overrides.values())
        return ",".join([f"{self.names[0]}[{self.precision}{' mixed' if mixed else ''}]", *self.names[1:]])


def reduced_candidates(lists: Sequence[Sequence[str]], precision: str) -> tuple[list[Candidate], dict[str, str]]:
    """The reduced-precision candidates of the engines in ``lists`` (each alone, with numpy for
    what it cannot run), and why the others are not offered."""
    wanted = rules.REDUCED if precision == "auto" else (precision,)
    engines = [name for names in lists for name in names]
    found, refused = rules.offers(engines, wanted)
    return [Candidate([o.backend, "numpy"], {o.engine: o.options}, o.precision) for o in found], refused


class Screened(NamedTuple):
    errors: dict[str, dict[str, rules.OutputError]]  # label -> output -> figures against fp32
    dropped: dict[str, str]  # label -> the figure that failed
    kept_fp32: dict[str, list[str]]  # mixed label -> the nodes kept fp32, named
    mixed: dict[str, Candidate]  # mixed label -> its candidate (in ``ready``)


def _outputs(runner: Any, samples: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    return [dict(runner.run(dict(sample))) for sample in samples]


def screen(ready: dict[str, Any], candidates: Mapping[str, Candidate], samples: Sequence[Mapping[str, Any]],
           tolerance: rules.Tolerance, *, reference: str, explicit: bool, graph: Any,
           build: Callable[[Candidate], Any], run_graph: Callable[[Any, Candidate], Any]) -> Screened:
    """Check every reduced-precision candidate in ``ready`` (label -> (.., runner at [3], ..))
    against ``reference``'s outputs on ``samples``. One that fails is dropped (``explicit``: kept,
    with a warning), and where its engine keeps nodes in fp32, its mixed form is searched for
    (``build`` compiles a candidate into a ``ready`` entry; ``run_graph(graph, candidate)`` a runner
    of another graph). ``ready`` is updated in place."""
    baseline = _outputs(ready[reference][3], samples)
    errors: dict[str, dict[str, rules.OutputError]] = {}
    dropped: dict[str, str] = {}
    kept: dict[str, list[str]] = {}
    mixed_found: dict[str, Candidate] = {}
    for label in [lb for lb in ready if candidates[lb].precision != "fp32"]:
        found = rules.output_errors(baseline, _outputs(ready[label][3], samples))
        errors[label] = found
        failed = rules.failure(found, tolerance)
        progress.info("%s vs fp32 on %d sample(s): %s%s", label, len(samples), rules.worst(found),
                      f": fails, {failed}" if failed else "")
        if failed is None:
            continue
        if explicit:
            log.warning("precision=%r: %s is outside the tolerance (%s); kept as asked", candidates[label].precision,
                        label, failed)
            continue
        ready.pop(label)[3].close()
        dropped[label] = f"outside the tolerance: {failed}"
        mixed = _mixed(candidates[label], graph, samples, baseline, tolerance, build, run_graph)
        if isinstance(mixed, str):  # why no mixed form holds: the layers tried, the last figure
            dropped[label] += f"; {mixed}"
            continue
        if mixed is None:
            continue
        candidate, entry, found, named = mixed
        ready[candidate.label], mixed_found[candidate.label] = entry, candidate
        errors[candidate.label], kept[candidate.label] = found, named
    return Screened(errors, dropped, kept, mixed_found)


def _mixed(candidate: Candidate, graph: Any, samples: Sequence[Mapping[str, Any]], baseline: list[dict[str, Any]],
           tolerance: rules.Tolerance, build: Callable[[Candidate], Any], run_graph: Callable[[Any, Candidate], Any]):
    """The candidate with the noisiest layers (and what feeds them) kept fp32, one more each
    round, until the outputs hold: (candidate, ready entry, errors, node names); None where the
    engine keeps no node fp32; else why no round held (the layers kept, the last figure)."""
    from edgeinfer.backend import backend_module

    engine = candidate.names[0].partition("@")[0]  # its options' key ("torch" for "torch@cuda:0")
    if not getattr(backend_module(engine), "keeps_fp32_nodes", False):
        return None
    fp32 = Candidate(candidate.names, {}, "fp32")

    def observed(observing: Any, reduced: bool) -> list[dict[str, Any]]:
        runner = run_graph(observing, candidate if reduced else fp32)
        try:
            return _outputs(runner, samples)
        finally:
            runner.close()

    try:
        noisy = rules.noisiest_nodes(graph, observed)
    except Exception as exc:  # noqa: BLE001 - no mixed form when the observed graph cannot run
        why = str(exc).splitlines()[0][:200]
        progress.info("%s: no per-layer noise (%s)", candidate.label, why)
        return f"no mixed form: the per-layer noise could not be measured ({why})"
    kept: list[str] = []
    last = "no layer adds noise"
    for output, _ in noisy[:rules.MIXED_ROUNDS]:
        if output in kept:
            continue
        kept += [name for name in rules.feeding_chain(graph, output) if name not in kept]
        options = {**candidate.overrides[engine], "fp32_nodes": list(kept)}
        mixed = Candidate(candidate.names, {engine: options}, candidate.precision)
        try:
            entry = build(mixed)
        except Exception as exc:  # noqa: BLE001 - a mixed form that does not compile ends the search
            why = str(exc).splitlines()[0][:200]
            progress.info("%s: %s", mixed.label, why)
            return f"no mixed form: {mixed.label} did not compile ({why})"
        found = rules.output_errors(baseline, _outputs(entry[3], samples))
        failed = rules.failure(found, tolerance)
        named = rules.node_names(graph, kept)
        progress.info("%s (fp32: %s): %s%s", mixed.label, ", ".join(named), rules.worst(found),
                      f": fails, {failed}" if failed else "")
        if failed is None:
            return mixed, entry, found, named
        entry[3].close()
        last = f"mixed with fp32 {', '.join(named)}: still {failed}"
    return last
