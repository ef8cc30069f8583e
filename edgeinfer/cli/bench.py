"""``edgeinfer bench``: measure a model on this device, backend by backend, in one process.

Three phases, so one contender's measurement never disturbs another's:

1. prepare, one contender at a time: compile (a ``Session``, or a raw engine for a peer), the
   first run and the warm-up runs, inside ``PeakRSS`` (``edgeinfer.cli.memory``): the peak
   resident memory each contender added to the process;
   with peers, the original file on its native engine is one of them (the baseline: LiteRT for
   a ``.tflite``, onnxruntime for an ``.onnx``, torch for TorchScript; ``edgeinfer.cli.peers.
   original_file``), and each edgeinfer contender's outputs are checked against its outputs,
   untimed (``compare_outputs``);
2. latency: all contenders timed in interleaved blocks (``edgeinfer.timing.time_engines`` style)
   so machine noise hits them alike;
3. profile, untimed: per-op times from a debug session of the numpy backend, or per-part
   times of a plan with several parts (each part's executable timed on its real inputs).

Streams: the pipeline planner's plan for the session, and its throughput beside the same
session serving the same requests one after another (``executor="ray"`` puts the stages on
Ray actors instead of local threads).
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgeinfer.cli.memory import PeakRSS
from edgeinfer.cli.progress import NoProgress, Progress
from edgeinfer.errors import BackendError, EdgeInferError
from edgeinfer.model import Model
from edgeinfer.runtime.options import RunOptions, session_keywords
from edgeinfer.timing import BLAS_SPIN_S, ENGINE_BLOCK, ENGINE_SETTLE, ENGINE_SETTLE_S, time_interleaved

STREAM_EXECUTORS = ("local", "ray")
# edgeinfer's outputs against the original file's on its native engine: fp32 engines sum in
# different orders, so the bound is relative to each output's largest magnitude
NATIVE_RTOL = 1e-4
NATIVE_ATOL = 1e-5
MEMORY_MODES = ("inline", "isolated")
PROFILE_RUNS = 5
TOP_N = 10


@dataclass
class ProfileRow:
    label: str  # a node ("node 'conv1' (Conv)") or a part ("part 2 on numpy: 14 nodes")
    op: str  # the op type, or the part's backend
    ms: float  # median over the profile runs
    share: float  # of the profiled total


@dataclass
class Profile:
    kind: str  # "op" or "part"
    total_ms: float
    rows: list[ProfileRow]  # every node or part, slowest first
    by_op: dict[str, float] = field(default_factory=dict)  # ms per op type (or backend), slowest first

    def top(self, n: int = TOP_N) -> list[ProfileRow]:
        return self.rows[:n]


@dataclass
class LatencyReport:
    backend: str  # "numpy", "openvino+onnxruntime", "auto", or "raw onnxruntime" for a peer
    compile_s: float
    first_run_ms: float
    ms: dict[str, float]  # min, median, p90, p99, max
    throughput: float  # requests per second at median latency
    plan: str
    auto_choice: list[str] | None = None
    peak_rss_bytes: int | None = None  # peak resident memory added by compile, first and warm-up runs
    memory_method: str = ""
    samples_ms: list[float] = field(default_factory=list)
    profile: Profile | None = None
    peer: bool = False  # a raw engine, not edgeinfer
    runs_on: str = ""  # for a peer: the file it runs
    # per part with int8 products: "part N (backend): int8 <path>", e.g. onnxruntime's exact path
    integer_paths: list[str] = field(default_factory=list)
    native: bool = False  # the original file on its native engine (a peer): the baseline
    vs_native: float | None = None  # median over the baseline's, where there is one
    # an edgeinfer contender's outputs against the baseline's (``compare_outputs``)
    native_check: dict[str, Any] | None = None
    # nodes of an edgeinfer contender's plan on backends it did not name (the partitioner's
    # fallbacks and the runtime's re-partitions, e.g. every node on numpy after a failed compile)
    elsewhere: dict[str, int] = field(default_factory=dict)
    nodes: int = 0
    # what the contender computes in (its plan's decision, or as asked); not "precision": a
    # caller's row keeps its own (bench_zoo's fp32 / int8 model)
    compute_precision: str = "fp32"
    # where not fp32: per output, SQNR and max error over range against an fp32 run of the same feeds
    precision_error: dict[str, dict[str, float | None]] | None = None

    @property
    def label(self) -> str:
        return self.backend + (f" ({'+'.join(self.auto_choice)})" if self.auto_choice else "")


@dataclass
class StreamReport:
    backend: str
    requests: int
    plan: str
    stages: int
    replicas: list[int]
    planning_s: float
    stream_per_s: float
    sequential_per_s: float
    executor: str = "local"
    speedup: float = field(init=False)

    def __post_init__(self) -> None:
        self.speedup = self.stream_per_s / self.sequential_per_s if self.sequential_per_s else float("nan")


def percentiles(seconds: Sequence[float]) -> dict[str, float]:
    ms = np.asarray(seconds) * 1000
    return {"min": float(ms.min()), "median": float(np.median(ms)), "p90": float(np.percentile(ms, 90)),
            "p99": float(np.percentile(ms, 99)), "max": float(ms.max())}


def backend_label(backend: str | list[str]) -> str:
    return backend if isinstance(backend, str) else "+".join(backend)


@dataclass
class _Contender:
    label: str
    run: Callable[[], Any]
    compile_s: float
    first_ms: float
    memory: PeakRSS
    session: Any = None  # an edgeinfer Session
    runs_on: str = ""

    def close(self) -> None:
        if self.session is not None:
            self.session.close()


def steps(backends: Sequence[Any], peers: Sequence[str], runs: int, profile: bool, memory: str = "inline") -> int:
    """How many ``advance`` calls ``latency`` makes, for a progress bar's total (with peers, one
    more for the original file)."""
    raw = len(peers) + (1 if peers else 0)
    isolated = len(backends) + raw if memory == "isolated" else 0
    return len(backends) + raw + runs + (len(backends) if profile else 0) + isolated


def latency(model: Model, backends: Sequence[str | list[str]], feeds: Mapping[str, Any], *, threads: int | None,
            runs: int, warmup: int, peers: Sequence[str] = (), source: str | os.PathLike | None = None,
            profile: bool = True, progress: Progress | None = None, skipped: dict[str, str] | None = None,
            failed: dict[str, str] | None = None, memory: str = "inline", native: bool | None = None,
            **session_options: Any) -> list[LatencyReport]:
    """Compile, memory, first run and interleaved latency of each backend (and raw-engine
    ``peers``, see ``edgeinfer.cli.peers``), with an untimed profile of each backend.

    ``memory="isolated"``: the peak memory of each contender is measured again in a fresh
    process of its own (model, feeds and options sent to it), so no contender pays for or
    profits from what another loaded; the figures replace the in-process ones.

    ``native`` (default: when there are ``peers``): also time ``source`` itself on its native
    engine (``edgeinfer.cli.peers.original_file``), the baseline every report's ``vs_native``
    is measured against, and check each edgeinfer contender's outputs against its own
    (``native_check``); the peer of that engine on that same file is then not timed twice.
    Where there is no original file, the reason is in ``skipped`` under ``peers.ORIGINAL``.

    A peer that cannot run here is left out, its reason in ``skipped`` (peer name -> reason). A
    backend that fails to compile or to run the feeds (an ``EdgeInferError``), or a peer or the
    original file whose engine raises, is left out with its reason in ``failed`` (label -> one
    line) when that dict is given, and the others are timed; without it, or when every
    contender fails, the error is raised.
    ``source``: the user's model file, which a peer of the same format runs directly.
    """
    from edgeinfer.cli import peers as raw
    from edgeinfer.runtime.session import Session

    progress = progress or NoProgress()
    contenders: list[_Contender] = []
    try:
        for backend in backends:
            label = backend_label(backend)
            progress.describe(f"compiling {label}")

            def make(backend=backend) -> tuple[Any, Callable[[], Any]]:
                session = Session(model, **session_keywords(backend=backend, threads=threads, example_feeds=feeds,
                                                            **_options_for(backend, session_options)))
                return session, lambda: session.run(feeds)

            try:
                contenders.append(_prepare(label, make, warmup))
            except EdgeInferError as exc:
                if failed is None:
                    raise
                failed[label] = " ".join(str(exc).split())
            progress.advance()
        baseline = _native_contender(model, feeds, source, threads, warmup, progress, skipped, failed) \
            if (bool(peers) if native is None else native) else None
        if baseline is not None:
            contenders.append(baseline)
        for name in peers:
            if baseline is not None and name == baseline.original.native.peer and source is not None \
                    and baseline.original.path == Path(source):
                progress.advance()
                continue  # the baseline is this engine on this file
            progress.describe(f"compiling raw {name}")
            runs_on: list[str] = []

            def make_peer(name=name, runs_on=runs_on) -> tuple[Any, Callable[[], Any]]:
                runner, where = raw.prepare(name, model, threads, source=source)
                runs_on.append(where)
                return None, lambda: runner(dict(feeds))

            try:
                contender = _prepare(f"raw {name}", make_peer, warmup)
            except raw.PeerUnavailable as exc:
                if skipped is not None:
                    skipped[name] = str(exc)
            except Exception as exc:  # the engine's own error types (LiteRT, onnxruntime, OpenVINO)
                if failed is None:
                    raise
                failed[f"raw {name}"] = engine_error(exc)
            else:
                contender.runs_on = runs_on[0]
                contenders.append(contender)
            progress.advance()
        checks = _check_against(baseline, contenders, model, feeds) if baseline is not None else {}
        if not contenders and failed:
            raise BackendError("every contender failed: " + "; ".join(f"{k}: {v}" for k, v in failed.items()))
        progress.describe("timing (interleaved blocks)")
        # the numpy backend's big GEMMs leave OpenBLAS's workers spinning: settle past them
        numpy_runs = any(c.session is not None and any(p.backend == "numpy" for p in c.session.plan.parts)
                         for c in contenders)
        times = _timed_rounds({c.label: c.run for c in contenders}, runs, progress,
                              settle_s=BLAS_SPIN_S if numpy_runs else ENGINE_SETTLE_S)
        reports = []
        for contender in contenders:
            session = contender.session
            stats = percentiles(times[contender.label])
            choice = session.auto_choice.label.split(",") if session is not None and session.auto_choice is not None \
                else None  # openvino[bf16], numpy for a reduced precision
            report = LatencyReport(
                contender.label, contender.compile_s, contender.first_ms, stats, 1000 / stats["median"],
                session.plan.describe() if session is not None else f"raw engine on {contender.runs_on}", choice,
                contender.memory.increase, contender.memory.method,
                [t * 1000 for t in times[contender.label]], peer=session is None, runs_on=contender.runs_on,
                integer_paths=integer_paths(session) if session is not None else [],
                native=contender is baseline, native_check=checks.get(contender.label))
            if session is not None:
                report.nodes, report.elsewhere = placement(session.plan, backends, contender.label)
            if profile and session is not None:
                progress.describe(f"profiling {contender.label}")
                report.profile = profile_session(session, feeds)
                progress.advance()
            reports.append(report)
        _precision_errors(reports, contenders, model, feeds, threads)
        base = next((r for r in reports if r.native), None)
        for report in reports if base is not None else ():
            report.vs_native = report.ms["median"] / base.ms["median"]
        if memory == "isolated":
            for report in reports:
                progress.describe(f"memory of {report.backend} in a fresh process")
                name = report.backend.removeprefix("raw ") if report.peer and not report.native else None
                backend = next((b for b in backends if backend_label(b) == report.backend), None)
                report.peak_rss_bytes, report.memory_method = isolated_peak_rss(
                    model, dict(feeds), backend=backend, peer=name, threads=threads, warmup=warmup,
                    source=source, session_options=session_options, native=report.native)
                progress.advance()
        return reports
    finally:
        for contender in contenders:
            contender.close()


def _precision_errors(reports: Sequence[LatencyReport], contenders: Sequence[_Contender], model: Model,
                      feeds: Mapping[str, Any], threads: int | None) -> None:
    """Each edgeinfer contender's precision; for those not fp32, their outputs against an fp32
    run of the same feeds (onnxruntime where installed, else numpy), untimed."""
    from edgeinfer.backend import available_backends
    from edgeinfer.cli.precision import computed_precision
    from edgeinfer.runtime.precision import output_errors
    from edgeinfer.runtime.session import Session

    sessions = {c.label: c.session for c in contenders if c.session is not None}
    for report in reports:
        session = sessions.get(report.backend)
        if session is not None:
            report.compute_precision = computed_precision(session)
    reduced = [r for r in reports if r.compute_precision != "fp32"]
    if not reduced:
        return
    engine = "onnxruntime" if "onnxruntime" in available_backends() else "numpy"
    with Session(model, backend=engine, threads=threads) as reference:
        expected = [reference.run(dict(feeds))]
    for report in reduced:
        found = output_errors(expected, [sessions[report.backend].run(dict(feeds))])
        report.precision_error = {name: error.as_json() for name, error in found.items()}


def placement(plan: Any, backends: Sequence[str | list[str]], label: str) -> tuple[int, dict[str, int]]:
    """(nodes in ``plan``, nodes per backend that contender ``label`` did not name); nothing is
    elsewhere for auto, which names no backend."""
    named = next((b for b in backends if backend_label(b) == label), label)
    names = {named} if isinstance(named, str) else set(named)
    elsewhere: dict[str, int] = {}
    for part in plan.parts:
        if "auto" not in names and part.backend not in names:
            elsewhere[part.backend] = elsewhere.get(part.backend, 0) + len(part.nodes)
    return sum(len(part.nodes) for part in plan.parts), elsewhere


def engine_error(exc: BaseException) -> str:
    """One line of an engine's error: its type and first line, shortened."""
    text = " ".join(str(exc).split())
    if isinstance(exc, EdgeInferError):
        return text
    return f"{type(exc).__name__}: {text}"[:400] if text else type(exc).__name__


@dataclass
class _Baseline(_Contender):
    original: Any = None  # peers.OriginalFile
    engine: Any = None  # peers.NativeRun


def _native_contender(model: Model, feeds: Mapping[str, Any], source: str | os.PathLike | None,
                      threads: int | None, warmup: int, progress: Progress, skipped: dict[str, str] | None,
                      failed: dict[str, str] | None) -> _Baseline | None:
    """The original file on its native engine, prepared like any contender; None, with the reason
    in ``skipped`` (no original file) or ``failed`` (its engine cannot run it)."""
    from edgeinfer.cli import peers as raw

    try:
        original = raw.original_file(source, model)
    except raw.NoOriginalFile as exc:
        if skipped is not None:
            skipped[raw.ORIGINAL] = str(exc)
        progress.advance()
        return None
    label = original.native.label
    progress.describe(f"compiling {label}")
    engines: list[Any] = []
    inputs = dict(feeds)

    def make() -> tuple[Any, Callable[[], Any]]:
        engine = raw.prepare_native(original, model, threads)
        engines.append(engine)
        return None, lambda: engine.run(inputs)

    try:
        contender = _prepare(label, make, warmup)
    except Exception as exc:  # PeerUnavailable, or the engine's own error types
        if failed is None:
            raise
        failed[label] = engine_error(exc)
        progress.advance()
        return None
    progress.advance()
    return _Baseline(label, contender.run, contender.compile_s, contender.first_ms, contender.memory,
                     runs_on=os.fspath(original.path), original=original, engine=engines[0])


def _check_against(baseline: _Baseline, contenders: Sequence[_Contender], model: Model,
                   feeds: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Each edgeinfer contender's outputs against the original file's, one untimed run each."""
    from edgeinfer.cli import peers as raw

    expected = raw.ordered_outputs(model, baseline.engine, baseline.engine.run(dict(feeds)))
    names = [info.name for info in model.outputs]
    return {c.label: compare_outputs(names, expected, c.session.run(feeds))
            for c in contenders if c.session is not None}


def compare_outputs(names: Sequence[str], expected: Sequence[np.ndarray],
                    got: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """The largest error of ``got`` against ``expected`` (the original file's outputs, in the order
    of ``names``), over the output where it is largest against its tolerance,
    ``NATIVE_RTOL`` x its largest magnitude + ``NATIVE_ATOL``; ``within_tolerance`` for every
    output. ``max_abs_error`` is None where an output has NaN that the other has not."""
    if len(expected) != len(names):
        return {"within_tolerance": False, "output": None, "max_abs_error": None, "tolerance": None,
                "note": f"the original file gives {len(expected)} outputs, the model {len(names)}"}
    worst: dict[str, Any] | None = None
    within = True
    for name, want in zip(names, expected, strict=True):
        want, have = np.asarray(want), np.asarray(got[name])
        if want.shape != have.shape:
            return {"within_tolerance": False, "output": name, "max_abs_error": None, "tolerance": None,
                    "note": f"shape {have.shape}, the original file's {want.shape}"}
        want64, have64 = want.astype(np.float64), have.astype(np.float64)
        gap = np.where(np.isnan(want64) & np.isnan(have64), 0.0, np.abs(have64 - want64))
        error = float(gap.max(initial=0.0))
        magnitude = np.abs(want64[np.isfinite(want64)])
        tolerance = NATIVE_RTOL * float(magnitude.max(initial=0.0)) + NATIVE_ATOL
        ok = bool(error <= tolerance)  # False for NaN
        within = within and ok
        score = error / tolerance if np.isfinite(error) else float("inf")
        if worst is None or score > worst["score"]:
            worst = {"score": score, "output": name, "max_abs_error": error if np.isfinite(error) else None,
                     "tolerance": tolerance}
    if worst is None:
        return {"within_tolerance": True, "output": None, "max_abs_error": 0.0, "tolerance": NATIVE_ATOL}
    worst.pop("score")
    return {"within_tolerance": within, **worst}


def _options_for(backend: str | list[str], session_options: Mapping[str, Any]) -> dict[str, Any]:
    """``session_options`` with ``backend_options`` kept to the engines this contender uses (a
    tflite delegate goes to the tflite contenders and auto, not to numpy)."""
    options = dict(session_options)
    if options.get("backend_options"):
        names = {backend} if isinstance(backend, str) else set(backend)
        kept = {k: v for k, v in options["backend_options"].items() if k in names or "auto" in names}
        options["backend_options"] = kept or None
    return options


def _prepare(label: str, make: Callable[[], tuple[Any, Callable[[], Any]]], warmup: int) -> _Contender:
    """Compile, first run and warm-up runs of one contender, alone, with its peak memory."""
    with PeakRSS() as memory:
        start = time.perf_counter()
        session, run = make()
        compile_s = time.perf_counter() - start
        start = time.perf_counter()
        try:
            run()
            first_ms = (time.perf_counter() - start) * 1000
            for _ in range(warmup):
                run()
        except BaseException:
            if session is not None:
                session.close()
            raise
    return _Contender(label, run, compile_s, first_ms, memory, session)


def isolated_peak_rss(model: Model, feeds: dict[str, Any], *, backend: Any, peer: str | None, threads: int | None,
                      warmup: int, source: str | os.PathLike | None = None,
                      session_options: Mapping[str, Any] | None = None, native: bool = False) -> tuple[int, str]:
    """(peak RSS increase, method) of compile, first run and ``warmup`` runs of one contender,
    in a fresh Python process (spawned, not forked: it starts with nothing loaded); ``native``:
    the original file ``source`` on its native engine."""
    import multiprocessing
    import tempfile
    from concurrent.futures import ProcessPoolExecutor

    from edgeinfer.errors import BackendError

    context = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="edgeinfer-memory-") as folder:
        path = os.path.join(folder, "model.eim")  # the child loads it as a user would
        model.save(path)
        with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
            job = pool.submit(_child_peak_rss, path, feeds, backend, peer, threads, warmup,
                              None if source is None else os.fspath(source), dict(session_options or {}), native)
            try:
                increase, method = job.result()
            except Exception as exc:  # the child's error, or the child died
                what = "the original file" if native else peer or backend_label(backend)
                raise BackendError(f"memory of {what} in a fresh process failed: {exc}") from exc
    return increase, f"{method}, in a fresh process"


def _child_peak_rss(path: str, feeds: dict[str, Any], backend: Any, peer: str | None, threads: int | None,
                    warmup: int, source: str | None, session_options: dict[str, Any],
                    native: bool = False) -> tuple[int, str]:
    from edgeinfer.api import load

    model = load(path)
    if native:
        from edgeinfer.cli import peers as raw

        def make() -> tuple[Any, Callable[[], Any]]:
            engine = raw.prepare_native(raw.original_file(source, model), model, threads)
            return None, lambda: engine.run(feeds)
    elif peer is not None:
        from edgeinfer.cli import peers as raw

        def make() -> tuple[Any, Callable[[], Any]]:
            runner, _ = raw.prepare(peer, model, threads, source=source)
            return None, lambda: runner(dict(feeds))
    else:
        from edgeinfer.runtime.session import Session

        def make() -> tuple[Any, Callable[[], Any]]:
            session = Session(model, **session_keywords(backend=backend, threads=threads, example_feeds=feeds,
                                                        **_options_for(backend, session_options)))
            return session, lambda: session.run(feeds)

    contender = _prepare("child", make, warmup)
    contender.close()
    return contender.memory.increase, contender.memory.method


def _timed_rounds(runs: Mapping[str, Callable[[], Any]], calls: int, progress: Progress, *,
                  settle_s: float = ENGINE_SETTLE_S) -> dict[str, list[float]]:
    """About ``calls`` timed calls per contender, in blocks (``edgeinfer.timing.time_engines``:
    no engine is timed beside another's spinning threads), interleaved in chunks of an even
    number of rounds (so the order still alternates), advancing the progress bar between chunks,
    never inside a timed call."""
    rounds = max(2, -(-calls // ENGINE_BLOCK))
    chunk = max(2, 2 * (rounds // 40))
    times: dict[str, list[float]] = {name: [] for name in runs}
    done = 0
    while done < rounds:
        count = min(chunk, rounds - done)
        timed = time_interleaved(runs, rounds=count, block=ENGINE_BLOCK, settle=ENGINE_SETTLE, settle_s=settle_s)
        for name, samples in timed.items():
            times[name].extend(samples)
        done += count
        progress.advance(min(count * ENGINE_BLOCK, calls))
    return {name: samples[:calls] for name, samples in times.items()}  # exactly --runs each


def profile_session(session: Any, feeds: Mapping[str, Any], runs: int = PROFILE_RUNS) -> Profile | None:
    """Where the time goes: per op for a whole-model numpy plan (a debug session of the same
    model), per part for a plan with several parts; None for one part of another engine,
    which reports no per-op times."""
    parts = session.plan.parts
    if len(parts) > 1:
        return _part_profile(session, feeds, runs)
    if parts and parts[0].backend == "numpy":
        return _op_profile(session, feeds, runs)
    return None


def _op_profile(session: Any, feeds: Mapping[str, Any], runs: int) -> Profile | None:
    from edgeinfer.runtime.session import Session

    samples: dict[str, list[float]] = {}
    ops: dict[str, str] = {}
    with Session(session.model, backend="numpy", threads=session.threads, options=RunOptions(debug=True)) as debug:
        for _ in range(runs):
            debug.run(feeds)
            for label, seconds, _shapes in debug.stats().get("node_timings") or []:
                samples.setdefault(label, []).append(seconds * 1000)
                ops[label] = label.rsplit("(", 1)[-1].rstrip(")")
    if not samples:
        return None
    return _profile("op", {label: statistics.median(ms) for label, ms in samples.items()}, ops)


def _part_profile(session: Any, feeds: Mapping[str, Any], runs: int) -> Profile:
    """Each part's executable timed on the values the parts before it produced."""
    # Session keeps its compiled parts on its runner; timing them there compiles nothing again.
    compiled = session.compiled_plan(feeds).runner.parts
    samples: dict[str, list[float]] = {}
    backends: dict[str, str] = {}
    checked = session.check_feeds(feeds)
    for _ in range(runs):
        env = dict(checked)
        for index, part in enumerate(compiled):
            label = f"part {index} on {part.part.backend}: {len(part.part.nodes)} nodes"
            start = time.perf_counter()
            env.update(part.run(env))
            samples.setdefault(label, []).append((time.perf_counter() - start) * 1000)
            backends[label] = part.part.backend
    return _profile("part", {label: statistics.median(ms) for label, ms in samples.items()}, backends)


def _profile(kind: str, median_ms: dict[str, float], groups: dict[str, str]) -> Profile:
    total = sum(median_ms.values())
    rows = [ProfileRow(label, groups[label], ms, ms / total if total else 0.0)
            for label, ms in sorted(median_ms.items(), key=lambda kv: -kv[1])]
    by_op: dict[str, float] = {}
    for row in rows:
        by_op[row.op] = by_op.get(row.op, 0.0) + row.ms
    return Profile(kind, total, rows, dict(sorted(by_op.items(), key=lambda kv: -kv[1])))


def stream(model: Model, backend: str | list[str], feeds: Mapping[str, Any], *, threads: int | None,
           requests: int, stages: int | str, replicas: Any = "auto", executor: str = "local",
           **session_options: Any) -> StreamReport:
    """Throughput of ``requests`` copies of ``feeds`` through the planned pipeline, beside the same
    session running them one after another (each figure the better of two alternating runs).

    ``executor``: ``"local"`` (stages on threads of this process) or ``"ray"`` (stages on Ray
    actors: ``Session(executor="ray")``, which raises its own error where Ray is missing)."""
    from edgeinfer.errors import InputError
    from edgeinfer.runtime.session import Session

    if executor not in STREAM_EXECUTORS:
        raise InputError(f"stream executor {executor!r}: expected one of {', '.join(STREAM_EXECUTORS)}")
    if executor == "ray":
        session_options = {**session_options, "executor": "ray"}
    label = backend_label(backend)
    # the pipeline's shape is the session's (Ray builds its actors from it)
    with Session(model, **session_keywords(backend=backend, threads=threads, stages=stages, replicas=replicas,
                                           **session_options)) as session:
        start = time.perf_counter()
        plan = session.pipeline_plan(feeds)  # the stream below reuses it
        planning = time.perf_counter() - start

        def pipelined() -> None:
            for _ in session.stream(feeds for _ in range(requests)):
                pass

        def sequential() -> None:
            for _ in range(requests):
                session.run(feeds)

        times = time_interleaved({"stream": pipelined, "sequential": sequential}, rounds=2, warmup=1)
    return StreamReport(label, requests, plan.describe(), len(plan.stages), list(plan.replicas), planning,
                        requests / min(times["stream"]), requests / min(times["sequential"]), executor)


def peer_ratios(reports: Sequence[LatencyReport]) -> dict[str, dict[str, float]]:
    """Median latency of each edgeinfer contender over each peer's (above 1: edgeinfer is slower)."""
    peers = [r for r in reports if r.peer]
    return {r.backend: {p.backend: r.ms["median"] / p.ms["median"] for p in peers} for r in reports if not r.peer}


def native_summary(reports: Sequence[LatencyReport], failed: Mapping[str, str] | None = None,
                   skipped: Mapping[str, str] | None = None) -> dict[str, Any] | None:
    """The original file on its native engine: what ran, each edgeinfer contender's median over
    its median (``ratios``) and its outputs against it (``outputs``); or why there is no such
    row (``failed``: the engine could not run it; ``none``: no original file). None when it was
    not asked for."""
    from edgeinfer.cli.peers import ORIGINAL

    base = next((r for r in reports if r.native), None)
    if base is not None:
        ours = [r for r in reports if not r.peer]
        return {"label": base.backend, "runs_on": base.runs_on, "median_ms": base.ms["median"],
                "ratios": {r.backend: r.vs_native for r in ours}, "outputs": {r.backend: r.native_check for r in ours}}
    label = next((k for k in failed or {} if k.endswith(f"({ORIGINAL})")), None)
    if label is not None:
        return {"label": label, "failed": failed[label]}
    if skipped and ORIGINAL in skipped:
        return {"label": None, "none": skipped[ORIGINAL]}
    return None


def machine_facts() -> dict[str, Any]:
    from importlib import metadata

    versions = {}
    for name in ("edgeinfer", "numpy", "onnx", "onnxruntime", "openvino", "ai-edge-litert", "tflite-runtime",
                 "torch", "tensorflow", "tensorflow-cpu", "opencv-python-headless", "ray"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    facts = {"machine": platform.machine(), "processor": platform.processor() or _cpu_model(),
             "system": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count(),
             "versions": versions}
    total = _total_memory()
    if total:
        facts["memory_bytes"] = total
    return facts


def _cpu_model() -> str:
    """The CPU's name from /proc/cpuinfo (Linux, Android), where platform.processor() is empty."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Hardware", "Processor", "cpu model"):
                    return value.strip()
    except OSError:
        pass
    return ""


def _total_memory() -> int | None:
    try:
        import psutil

        return int(psutil.virtual_memory().total)
    except ImportError:
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def integer_paths(session: Any) -> list[str]:
    """How each part of ``session``'s plan computes int8 products, where its backend says
    (onnxruntime: natively exact, exact through uint8 weights, 7-bit, or saturating)."""
    from edgeinfer.backend import part_note

    notes = ((number, part, part_note(part.backend, part.graph)) for number, part in enumerate(session.plan.parts))
    return [f"part {number} ({part.backend}): {note}" for number, part, note in notes if note]


def as_json(latency_reports: Sequence[LatencyReport], stream_report: StreamReport | Sequence[StreamReport] | None,
            *, skipped_peers: Mapping[str, str] | None = None, settings: Mapping[str, Any] | None = None,
            failed: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Every figure; ``failed`` (backends that could not run, with why) only when there are some."""
    streams = [stream_report] if isinstance(stream_report, StreamReport) else list(stream_report or [])
    document = {"machine": machine_facts(), "settings": dict(settings or {}),
                "latency": [asdict(r) for r in latency_reports],
                "peer_ratios": peer_ratios(latency_reports), "skipped_peers": dict(skipped_peers or {}),
                "native": native_summary(latency_reports, failed, skipped_peers),
                "stream": asdict(streams[0]) if len(streams) == 1 else [asdict(s) for s in streams] or None}
    if failed:
        document["failed"] = dict(failed)
    return document


def plot(reports: Sequence[LatencyReport], path: str | os.PathLike, *, title: str = "") -> None:
    """A PNG: latency distribution per contender, and the profile of the first contender that has
    one (top ops or parts). Written atomically; matplotlib's Agg backend, no display needed."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    from edgeinfer.format.atomic import atomic_write_bytes

    profiled = next((r for r in reports if r.profile is not None and r.profile.rows), None)
    figure = Figure(figsize=(13 if profiled else 7, max(3.5, 0.55 * len(reports) + 1.8)), layout="constrained")
    axes = figure.subplots(1, 2 if profiled else 1, squeeze=False)[0]
    labels = [r.label for r in reports]
    box = axes[0]
    samples = [r.samples_ms for r in reports]
    try:
        box.boxplot(samples, orientation="horizontal", whis=(1, 99))
    except TypeError:  # matplotlib before 3.10
        box.boxplot(samples, vert=False, whis=(1, 99))
    box.set_yticks(range(1, len(reports) + 1), labels)
    box.invert_yaxis()
    box.set_xlabel("latency per request, ms (box: quartiles, whiskers: p1-p99)")
    if max(r.ms["max"] for r in reports) > 20 * min(r.ms["min"] for r in reports):
        box.set_xscale("log")
    box.set_title("latency distribution")
    if profiled is not None:
        rows = profiled.profile.top(TOP_N)
        bars = axes[1]
        bars.barh(range(len(rows)), [row.ms for row in rows], color="tab:orange")
        bars.set_yticks(range(len(rows)), [_short(row.label) for row in rows], fontsize=8)
        bars.invert_yaxis()
        bars.set_xlabel("median ms per run (untimed profile run)")
        bars.set_title(f"slowest {'ops' if profiled.profile.kind == 'op' else 'parts'}: {profiled.label}")
    if title:
        figure.suptitle(title)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=110)
    atomic_write_bytes(path, buffer.getvalue())


def _short(label: str, width: int = 48) -> str:
    return label if len(label) <= width else label[:width - 3] + "..."
