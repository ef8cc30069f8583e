"""How long ``ei.compile(backend="auto")`` takes to decide on a model it has never seen, whether its
choice holds from run to run (on a loaded machine too), and what the choice costs warm against
the model's own engine (issue 38).

For each corpus model (``tests/real``; ``.onnx`` and ``.tflite`` files by default): converted once,
then ``--runs`` times ``ei.compile(model, x.eim, backend="auto", example_feeds=<its real inputs>,
options=AutoOptions(cache=False))``, timed whole (every candidate compiled and raced warm, the
first result weighed in fresh processes where the warm winner is not the native engine:
``runtime.coldstart``). A choice that differs between runs is a flip; it is allowed only where
the runs' own medians put the chosen candidates within 5% of each other.

Then the last compiled file is loaded (``ei.Session(x.eim)``) and timed warm against the native
engine on the original file (onnxruntime on the ``.onnx``, LiteRT's set_tensor / invoke /
get_tensor on the ``.tflite``; ``bench_real.native_runner``), interleaved: in blocks of calls
for a model the native engine runs in under ``--tiny-us`` microseconds (a wake-word head: one
call is too short to time alone), else call by call (``edgeinfer.timing.time_engines``).

``--load N`` keeps N busy processes spinning for the whole run (the "loaded machine" of the
issue); without it nothing else may run. The load average is printed with the table.

    python benchmarks/bench_auto_decide.py [--runs 3] [--threads 2] [--load 1] [--only openwakeword/hey_jarvis ...]
        [--formats onnx tflite] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import edgeinfer as ei  # noqa: E402
from benchmarks.bench_real import native_runner  # noqa: E402
from edgeinfer.timing import time_engines  # noqa: E402
from tests.real.models_onnx import MODELS as ONNX_MODELS  # noqa: E402
from tests.real.models_tflite import MODELS as TFLITE_MODELS  # noqa: E402

CLOSE = 1.05  # a flip between two candidates within 5% of each other is allowed
DECIDE_TARGET_S = 15.0
TINY_BLOCK = 200  # calls per timed block for a model under --tiny-us


def _spin() -> None:
    while True:
        pass


def decide_runs(entry: Any, runs: int, threads: int, folder: Path) -> dict[str, Any]:
    feeds = [np.asarray(f) for f in entry.feeds()]
    kwargs = entry.convert_kwargs(feeds) if callable(entry.convert_kwargs) else dict(entry.convert_kwargs)
    model = ei.convert(entry.source(), **kwargs)
    example = {info.name: f for info, f in zip(model.inputs, feeds, strict=True)}
    path = folder / (entry.id.replace("/", "_") + ".auto.eim")
    found = []
    for _ in range(runs):
        start = time.perf_counter()
        compiled = ei.compile(model, path, backend="auto", threads=threads, example_feeds=example,
                              options=ei.AutoOptions(cache=False))
        auto = compiled.compiled.auto
        found.append({"s": time.perf_counter() - start, "choice": ",".join(compiled.compiled.backends),
                      "warm_winner": ",".join(auto.get("warm_winner", auto["backends"])),
                      "median_ms": auto["median_ms"], "first_result_s": auto.get("first_result_s"),
                      "reason": auto["reason"], "skipped": auto.get("skipped", {})})
    return {"feeds": feeds, "path": path, "runs": found}


def stability(runs: list[dict[str, Any]]) -> str:
    choices = {r["choice"] for r in runs}
    if len(choices) == 1:
        return "same"
    for run in runs:  # every pair of chosen candidates within 5% in every run that timed both
        timed = [run["median_ms"][c] for c in choices if c in run["median_ms"]]
        if len(timed) > 1 and max(timed) > min(timed) * CLOSE:
            return "FLIP"
    return "flip within 5%"


def warm_ratio(entry: Any, path: Path, feeds: list[np.ndarray], threads: int, tiny_us: float) -> dict[str, float]:
    native = native_runner(entry, Path(entry.source()), feeds, threads)
    session = ei.Session(path, threads=threads)
    named = {info.name: f for info, f in zip(session.model.inputs, feeds, strict=True)}
    runs = {"native": native, "auto": lambda: session.run(named)}
    for run in runs.values():
        run()
    start = time.perf_counter()
    for _ in range(20):
        native()
    per_call = (time.perf_counter() - start) / 20
    try:
        if per_call * 1e6 < tiny_us:
            blocks: dict[str, list[float]] = {name: [] for name in runs}
            for index in range(31):
                for name in (list(runs) if index % 2 == 0 else list(runs)[::-1]):
                    run = runs[name]
                    start = time.perf_counter()
                    for _ in range(TINY_BLOCK):
                        run()
                    blocks[name].append((time.perf_counter() - start) / TINY_BLOCK)
            times = blocks
        else:
            times = time_engines(runs, calls=20 if per_call < 0.05 else 8)
    finally:
        session.close()
    medians = {name: statistics.median(samples) for name, samples in times.items()}
    # the median of the rounds' own ratios: a round's two blocks share the machine's state
    ratio = statistics.median(a / n for a, n in zip(times["auto"], times["native"], strict=True))
    return {"native_us": medians["native"] * 1e6, "auto_us": medians["auto"] * 1e6, "ratio": ratio,
            "tiny": per_call * 1e6 < tiny_us}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--load", type=int, default=0, help="busy processes spinning during the whole run")
    parser.add_argument("--formats", nargs="*", default=["onnx", "tflite"])
    parser.add_argument("--only", nargs="*")
    parser.add_argument("--tiny-us", type=float, default=50.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    entries = [e for e in [*ONNX_MODELS, *TFLITE_MODELS] if e.format in args.formats
               and (not args.only or e.id in args.only)]
    spinners = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(args.load)]
    for spinner in spinners:
        spinner.start()
    rows = []
    print(f"load average before: {os.getloadavg()[0]:.2f}; {args.load} busy process(es)", flush=True)
    try:
        with tempfile.TemporaryDirectory(prefix="auto-decide-") as folder:
            for entry in entries:
                try:
                    found = decide_runs(entry, args.runs, args.threads, Path(folder))
                    warm = warm_ratio(entry, found["path"], found["feeds"], args.threads, args.tiny_us)
                except Exception as exc:  # noqa: BLE001 - one model's failure is a row, not the end
                    rows.append({"model": entry.id, "error": str(exc).splitlines()[0][:160] if str(exc) else repr(exc)})
                    print(f"{entry.id}: error {rows[-1]['error']}", flush=True)
                    continue
                row = {"model": entry.id, "format": entry.format, "runs": found["runs"],
                       "stability": stability(found["runs"]), **warm}
                rows.append(row)
                print(_line(row), flush=True)
    finally:
        for spinner in spinners:
            spinner.terminate()
    load = os.getloadavg()[0]
    print(f"\nauto decides, {args.runs} runs, {args.threads} threads, {args.load} busy process(es); "
          f"load average after: {load:.2f}")
    print("| model | decide s (each run) | choice (each run) | stable | warm auto / native |")
    print("|---|---|---|---|---|")
    for row in rows:
        print(_line(row))
    done = [r for r in rows if "error" not in r]
    slowest = max((s["s"] for r in done for s in r["runs"]), default=0.0)
    tiny = [r for r in done if r["tiny"]]
    print(f"\nslowest decision {slowest:.1f} s (target <= {DECIDE_TARGET_S:g} s); "
          f"flips: {sum(r['stability'] == 'FLIP' for r in done)}, within 5%: "
          f"{sum(r['stability'] == 'flip within 5%' for r in done)}; models under {args.tiny_us:g} us: "
          + ", ".join(f"{r['model']} {r['ratio']:.2f}x" for r in tiny))
    if args.json:
        args.json.write_text(json.dumps({"threads": args.threads, "runs": args.runs, "load": args.load,
                                         "load_after": load, "rows": rows}, indent=1, default=str))


def _line(row: dict[str, Any]) -> str:
    if "error" in row:
        return f"| {row['model']} | error: {row['error']} | | | |"
    seconds = " / ".join(f"{r['s']:.1f}" for r in row["runs"])
    choices = " / ".join(r["choice"] + ("" if r["choice"] == r["warm_winner"] else f" (warm: {r['warm_winner']})")
                         for r in row["runs"])
    return (f"| {row['model']} | {seconds} | {choices} | {row['stability']} | {row['ratio']:.2f}x "
            f"({row['auto_us']:.4g} / {row['native_us']:.4g} us) |")


if __name__ == "__main__":
    main()
