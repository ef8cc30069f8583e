"""``backend="auto"``: time the candidate placements on this device, keep the fastest, cache it.

Candidates: each installed engine on its own (with numpy for what it cannot run), all of them
in the default priority order when several are installed, and numpy alone; where torch sees
a GPU, torch on it alone and beside a CPU engine (``auto_gpu``). Each candidate is
partitioned and compiled, then timed on feeds of one shape signature (the model's own shapes
when they are static, else the caller's ``example_feeds`` or the first real request of that
signature: never guessed dims) in interleaved blocks (``runtime.measure.race``), so machine noise hits
them alike and no engine is timed beside another's spinning threads; the lowest median wins (the native engine excepted, below). A candidate more than 3x slower than the best after a
first short round is dropped early (numpy on a big convolutional net; never the native engine, below).

The native engine: a model converted from a file remembers its format
(``metadata["source_format"]``), and the engine that runs such files (LiteRT for ``.tflite``,
onnxruntime for ``.onnx``, torch for TorchScript, ``.pt2`` and modules; ``NATIVE_ENGINES``) is
always a candidate. When it takes the whole graph it runs an export equivalent to the file the
user had (the tflite backend's export of an imported ``.tflite`` has the original's operators),
so it is kept unless another candidate is faster by more than ``NATIVE_MARGIN`` (10%), measured
in the same interleaved blocks (``decide``): ``auto`` never ends up slower than the engine the
user already had for a difference that is within timing noise. A native engine that leaves
nodes to numpy is timed as any other candidate (``AutoChoice.native_note`` says why).

A candidate that fails to compile or to run is dropped with its reason. The choice is cached
in a small JSON file keyed by the model's content hash, the shape signature, the device, the
threads, the engine options and the versions of edgeinfer and every engine, so the next load
of the same model here does not measure again. The cache lives in ``$EDGEINFER_CACHE_DIR`` or
``~/.cache/edgeinfer`` (``cache=`` overrides it; ``cache=False`` turns it off); a corrupt cache
file is ignored with a warning and rewritten.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from edgeinfer.backend import installed_backends
from edgeinfer.errors import EdgeInferError
from edgeinfer.format.atomic import atomic_write_bytes
from edgeinfer.model import Model
from edgeinfer.runtime.auto_gpu import accelerator, accelerator_candidates
from edgeinfer.runtime.measure import race

log = logging.getLogger("edgeinfer.runtime.auto")
progress = logging.getLogger("edgeinfer.runtime.auto.progress")  # one INFO line per step (edgeinfer run shows them)
CACHE_FILE = "auto-backends.json"
_ENGINE_DISTRIBUTIONS = ("edgeinfer", "numpy", "onnxruntime", "onnxruntime-gpu", "openvino", "ai-edge-litert",
                         "tflite-runtime")
_TIME_BUDGET_S = 2.0  # timing rounds for all candidates together, after compile
_DROP_FACTOR = 3.0
_PROBE_FACTOR = 2.0  # one timed call each: a candidate over 2x the best is not timed further
_CLOSE = 1.05  # two candidates within 5% are timed again before one is chosen
# another candidate must be this much faster than the native engine on the whole graph. 5% was
# within the noise of 2 threads on 2 shared cores: in a full bench_real run auto took OpenVINO
# over LiteRT on MediaPipe hand_landmark_full, then ran 1.06x (fastest calls 1.15x) the original
# file; a rerun kept LiteRT at 1.00x.
NATIVE_MARGIN = 0.10
NATIVE_ENGINES = {"tflite": "tflite", "onnx": "onnxruntime", "pytorch": "torch"}  # source_format -> backend
RULE = "native-kept-within-10%"  # how the winner is picked; in the cache key, so older choices are measured again


@dataclass
class AutoChoice:
    backends: list[str]  # the winning priority list
    median_ms: dict[str, float] = field(default_factory=dict)  # candidate -> median latency
    skipped: dict[str, str] = field(default_factory=dict)  # candidate -> why it was not timed
    cached: bool = False
    key: str = ""
    native: str | None = None  # the candidate that is the native engine on the whole graph, if one ran
    native_note: str = ""  # why the native engine is no whole-graph candidate, where it is not
    reason: str = ""  # why the winner won (fastest, or the native engine kept within the margin)
    repartitions: dict[str, list[str]] = field(default_factory=dict)  # candidate -> what moved off an engine, why
    # the winner as measured (backends, plan, sequential runner), so Session need not compile it again
    prepared: tuple[Any, Any, Any] | None = field(default=None, repr=False)

    def describe(self) -> str:
        """The winner and why, then every candidate with its median (the native one marked) or
        why it was not timed."""
        lines = [f"auto: {','.join(self.backends)}" + (" (cached)" if self.cached else "")
                 + (f": {self.reason}" if self.reason else "")]
        if self.native_note:
            lines.append(f"  native engine: {self.native_note}")
        winner = ",".join(self.backends)
        for label, ms in sorted(self.median_ms.items(), key=lambda item: item[1]):
            marks = [m for m, on in (("native engine, whole graph", label == self.native),
                                     ("chosen", label == winner)) if on]
            lines.append(f"  {label}: {ms:.3g} ms" + (f" ({'; '.join(marks)})" if marks else ""))
        lines += [f"  {label}: not timed: {why}" for label, why in self.skipped.items()]
        lines += [f"  {label}: re-partitioned: {note}" for label, notes in self.repartitions.items() for note in notes]
        return "\n".join(lines)


def native_engine(model: Model) -> str | None:
    """The backend that runs the model's source format natively (None: unknown or none)."""
    return NATIVE_ENGINES.get(model.metadata.get("source_format", ""))


def decide(medians: Mapping[str, float], native: str | None = None,
           margin: float = NATIVE_MARGIN) -> tuple[str, str]:
    """The winner of ``medians`` (candidate -> median, one set of interleaved blocks) and why:
    the fastest, except that ``native`` (the native engine on the whole graph) is kept unless
    the fastest is more than ``margin`` faster than it."""
    fastest = min(medians, key=medians.get)
    if native is None or native not in medians or native == fastest:
        why = "the native engine, fastest" if native == fastest else "fastest"
        return fastest, why
    ratio = medians[native] / medians[fastest] if medians[fastest] > 0 else float("inf")
    if ratio > 1 + margin:
        return fastest, (f"fastest, {ratio:.2f}x faster than the native engine {native} "
                         f"(over the {margin:.0%} margin)")
    return native, (f"the native engine, kept: {fastest} is only {ratio:.3f}x faster "
                    f"(within the {margin:.0%} margin)")


def _decisive_pair(medians: Mapping[str, float], native: str | None) -> tuple[str, str] | None:
    """The two candidates to time again before deciding, when their medians sit near the bar that
    separates them (the fastest vs the native one at ``1 + NATIVE_MARGIN``, else the two leaders at 1)."""
    ranked = sorted(medians, key=medians.get)
    if len(ranked) < 2:
        return None
    if native in medians:
        if ranked[0] == native:
            return None
        ratio, bar, pair = medians[native] / max(medians[ranked[0]], 1e-12), 1 + NATIVE_MARGIN, (ranked[0], native)
    else:
        ratio, bar, pair = medians[ranked[1]] / max(medians[ranked[0]], 1e-12), 1.0, (ranked[0], ranked[1])
    return pair if bar / _CLOSE <= ratio < bar * _CLOSE else None


def _native_first(lists: list[list[str]], native: str | None) -> list[list[str]]:
    """``lists`` with the native engine's candidate first (added if absent): it is never skipped as
    placing its nodes as an earlier candidate does."""
    if native is None:
        return lists
    mine = [native, "numpy"] if native != "numpy" else ["numpy"]
    return [mine, *(names for names in lists if names != mine)]


def candidates(installed: list[str]) -> list[list[str]]:
    engines = [name for name in installed if name != "numpy"]
    found = [[name, "numpy"] for name in engines]
    if len(engines) > 1:
        found.append([*engines, "numpy"])
    found.append(["numpy"])
    return found


def _versions() -> dict[str, str]:
    versions = {}
    for name in _ENGINE_DISTRIBUTIONS:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return versions


def cache_key(model: Model, *, threads: int | None, device: str, fallback: bool,
              options: Mapping[str, Any], signature: Any = "static") -> str:
    facts = {"model": model.graph.content_hash(), "signature": str(signature), "threads": threads, "rule": RULE,
             "native": native_engine(model),
             "device": device, "fallback": fallback,
             "options": repr(sorted((k, sorted(dict(v).items())) for k, v in options.items())),
             "versions": _versions(), "machine": platform.machine(), "cpus": os.cpu_count(),
             "accelerator": accelerator()}
    return hashlib.sha256(json.dumps(facts, sort_keys=True, default=str).encode()).hexdigest()


def cache_dir(cache: str | os.PathLike | bool | None) -> Path | None:
    if cache is False:
        return None
    if cache not in (None, True):
        return Path(cache)
    env = os.environ.get("EDGEINFER_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "edgeinfer"


def _read_cache(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        log.warning("auto backend cache %s is unreadable (%s); measuring again", path, exc)
        return {}
    return data if isinstance(data, dict) else {}


def _cached_choice(entry: Any, installed: list[str], key: str) -> AutoChoice | None:
    if not isinstance(entry, dict):
        return None
    names = entry.get("backends")
    if not isinstance(names, list) or not names or \
            not all(isinstance(n, str) and n.partition("@")[0] in installed for n in names):  # "torch@cuda:0"
        return None
    medians = entry.get("median_ms")
    medians = {k: float(v) for k, v in medians.items() if isinstance(v, (int, float))} \
        if isinstance(medians, dict) else {}
    native, reason = entry.get("native"), entry.get("reason")
    return AutoChoice(names, median_ms=medians, cached=True, key=key,
                      native=native if isinstance(native, str) else None,
                      reason=reason if isinstance(reason, str) else "")


def choose_backends(model: Model, feeds: Mapping[str, Any], *, threads: int | None, device: str, fallback: bool,
                    options: Mapping[str, Mapping[str, Any]], cache: str | os.PathLike | bool | None,
                    signature: Any = "static", budget_s: float | None = None) -> AutoChoice:
    """The fastest candidate on ``feeds`` (real feeds of one ``signature``), from the disk cache
    when this model, signature, machine and settings were measured before."""
    installed = installed_backends()
    key = cache_key(model, threads=threads, device=device, fallback=fallback, options=options,
                    signature=signature)
    folder = cache_dir(cache)
    path = folder / CACHE_FILE if folder is not None else None
    if path is not None:
        hit = _cached_choice(_read_cache(path).get(key), installed, key)
        if hit is not None:
            return hit
    native = native_engine(model)
    lists = candidates(installed) + accelerator_candidates(installed, device, options)
    choice = measure(model, lists, feeds, threads=threads, device=device, fallback=fallback,
                     options=options, native=native if native in installed else None, budget_s=budget_s)
    choice.key = key
    if path is not None:
        _write_cache(path, key, choice)
    return choice


def _write_cache(path: Path, key: str, choice: AutoChoice) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        data = _read_cache(path)
        data[key] = {"backends": choice.backends, "median_ms": choice.median_ms, "native": choice.native,
                     "reason": choice.reason}
        atomic_write_bytes(path, json.dumps(data, indent=1, sort_keys=True).encode())
    except (OSError, EdgeInferError) as exc:  # a cache that cannot be written only costs time later
        log.warning("auto backend cache %s could not be written: %s", path, exc)


def _compile_candidates(model: Model, lists: list[list[str]], feeds: dict[str, Any], *, threads: int | None,
                        device: str, fallback: bool, options: Mapping[str, Mapping[str, Any]],
                        native: str | None) -> tuple[dict[str, Any], dict[str, Any], str | None, str]:
    """Compile and run once every candidate (``lists[0]`` the native one where ``native``).
    Returns (label -> (names, backends, plan, runner), skipped: label -> why, the native
    candidate's label if it takes the whole graph, the note on the native engine)."""
    from edgeinfer.runtime.compile import compile
    from edgeinfer.runtime.placement import make_backends, make_plan

    native_label = ",".join(lists[0]) if native is not None else None
    native_note = ""
    ready: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    placements: dict[tuple, str] = {}
    for index, names in enumerate(lists, 1):
        label = ",".join(names)
        progress.info("candidate %d/%d: %s (compile, warm-up)", index, len(lists), label)
        runner = None
        try:
            backends = make_backends(names, device=device, fallback=fallback,
                                     options={k: v for k, v in options.items() if k in {n.partition("@")[0] for n in names}})
            plan = make_plan(model.graph, backends)
            on = {b.name: b.device for b in backends}  # torch on the CPU and on the GPU differ
            placement = tuple((part.backend, on[part.backend], tuple(part.nodes)) for part in plan.parts)
            if label == native_label and any(part.backend != native for part in plan.parts):
                counts = plan.node_counts()
                native_note = (f"{native} takes {counts.get(native, 0)} of {sum(counts.values())} nodes, not the "
                               "whole graph: timed as any other candidate")
                native_label = None
            if placement in placements:
                skipped[label] = f"places every node as {placements[placement]!r} does"
                continue
            placements[placement] = label
            notes: list[str] = []
            plan, runner = compile(model.graph, backends, threads=threads, notes=notes)  # re-partitioned if a part fails
            runner.run(feeds)  # warm-up; also proves the candidate runs
        except Exception as exc:  # noqa: BLE001 - a candidate that cannot compile or run is dropped
            if runner is not None:
                runner.close()
            skipped[label] = (str(exc).splitlines()[0] if str(exc) else type(exc).__name__)[:300]
            continue
        ready[label] = (names, backends, plan, runner, notes)
    if native_label is not None and native_label not in ready:
        native_note = f"{native} could not run the model: {skipped.get(native_label, '')}"
        native_label = None
    return ready, skipped, native_label, native_note


def measure(model: Model, lists: list[list[str]], feeds: Mapping[str, Any], *, threads: int | None, device: str,
            fallback: bool, options: Mapping[str, Mapping[str, Any]], native: str | None = None,
            budget_s: float | None = None) -> AutoChoice:
    """Compile every candidate priority list (and ``native``'s, the engine of the model's source
    format, first), race them on ``feeds`` (``measure.race``: a candidate over ``_DROP_FACTOR``
    times the best after a first short round is dropped, never the native one), return the
    winner by ``decide`` (with its compiled runner in ``prepared``: the caller owns and closes it)."""
    feeds = dict(feeds)
    ready, skipped, native_label, native_note = _compile_candidates(
        model, _native_first(lists, native), feeds, threads=threads, device=device, fallback=fallback,
        options=options, native=native)
    if native_label is not None:
        progress.info("native engine %s takes the whole graph: kept unless another is over %.0f%% faster",
                      native, NATIVE_MARGIN * 100)
    if not ready:
        raise EdgeInferError(f"backend='auto': no candidate could run the model: {skipped}")
    runners = {label: entry[3] for label, entry in ready.items()}
    try:
        timed = race({label: (lambda r=r: r.run(feeds)) for label, r in runners.items()}, drop_factor=_DROP_FACTOR,
                     protected=native_label, budget_s=_TIME_BUDGET_S if budget_s is None else budget_s,
                     probe_factor=_PROBE_FACTOR,
                     again=lambda medians: _decisive_pair(medians, native_label))
    except BaseException:
        for runner in runners.values():
            runner.close()
        raise
    skipped.update(timed.dropped)
    medians = timed.medians_ms()
    progress.info("timed %s", ", ".join(f"{label} ({ms:.3g} ms)" for label, ms in sorted(medians.items(),
                                                                                        key=lambda item: item[1])))
    winner, reason = decide(medians, native_label)
    for label, runner in runners.items():
        if label != winner:
            runner.close()
    log.info("backend='auto' timings (median ms): %s -> %s (%s)", medians, winner, reason)
    names, backends, plan, runner, _ = ready[winner]
    return AutoChoice(names, median_ms=medians, skipped=skipped, native=native_label, native_note=native_note,
                      reason=reason, repartitions={label: e[4] for label, e in ready.items() if e[4]},
                      prepared=(backends, plan, runner))


def choose_executor(model: Model, backends: list, feeds: Mapping[str, Any], *, threads: int | None,
                    debug: bool = False, rounds: int = 10) -> tuple[str, Any, Any, dict[str, float]]:
    """``executor="auto"``: build the sequential and the DAG-parallel runner, time them
    interleaved on ``feeds`` (one signature's real feeds), keep the faster. Cutting a graph at its forks pays where
    the engine leaves cores idle inside one branch (numpy), and can cost where it does not
    (onnxruntime re-lays tensors out at every cut), so it is measured, not assumed.
    Returns (executor name, plan, runner, median ms of each)."""
    from edgeinfer.runtime.compile import compile

    built = {}
    excluded: dict[int, dict[str, str]] = {}  # parts that failed to compile, for both
    try:
        for name in ("sequential", "dag"):
            built[name] = compile(model.graph, backends, executor=name, threads=threads, debug=debug,
                                  excluded=excluded)
    except BaseException:
        for _, runner in built.values():
            runner.close()
        raise
    if len(built["dag"][0].parts) == len(built["sequential"][0].parts):  # nothing runs side by side
        built.pop("dag")[1].close()
        return "sequential", *built["sequential"], {}
    feeds = dict(feeds)
    progress.info("executor: timing sequential and dag")
    medians = race({name: (lambda r=runner: r.run(feeds)) for name, (_, runner) in built.items()},
                   calls=rounds).medians_ms()
    winner = min(medians, key=medians.get)
    for name, (_, runner) in built.items():
        if name != winner:
            runner.close()
    log.info("executor='auto' timings (median ms): %s -> %s", medians, winner)
    return winner, *built[winner], medians
