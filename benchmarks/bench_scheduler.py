"""The scheduler against the engines a user would otherwise run directly, all in one run.

Four measurements, each with every contender timed in interleaved blocks
(``edgeinfer.timing.time_engines``: a few calls per turn after untimed ones, so no engine is
timed beside another engine's spinning threads) so machine noise hits them alike:

1. overhead: edgeinfer's onnxruntime backend against raw onnxruntime on the same ONNX model
   (median latency, batch 1), and likewise the openvino and tflite backends against raw
   OpenVINO and LiteRT;
2. auto: ``Session(backend="auto")`` against every raw engine installed (onnxruntime,
   OpenVINO, and LiteRT on the ``.tflite`` edgeinfer exports), on each model;
3. streams: requests served by the pipeline planner (``Session.stream``, stages and replicas
   chosen by measurement), a pure 2-stage pipeline without replicas, raw onnxruntime run one
   request after another with all threads, and one 1-thread raw onnxruntime session per thread
   serving requests in parallel (each request is one batch-1 inference: nothing is batched);
4. DAG: the DAG-parallel executor against the sequential one on an inception-style net.

Usage::

    python benchmarks/bench_scheduler.py [--models mobilenet_v2 resnet50 transformer]
        [--threads 2] [--rounds 100] [--requests 60] [--json results.json] [--markdown out.md]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import onnx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: devkit/ is not installed

import edgeinfer as ei
from devkit import zoo
from edgeinfer.cli.bench import machine_facts
from edgeinfer.cli.peers import Runner, raw_litert, raw_onnxruntime, raw_openvino
from edgeinfer.format.atomic import atomic_write_bytes
from edgeinfer.timing import time_engines, time_interleaved

MODELS: dict[str, Callable[[], onnx.ModelProto]] = {
    "mobilenet_v2": lambda: zoo.mobilenet_v2(size=224),
    "resnet50": lambda: zoo.resnet50(size=224),
    "transformer": lambda: zoo.transformer_encoder_block(seq=128, d=256, heads=4),  # BERT-mini sized block
}


def medians_ms(runs: dict[str, Callable[[], Any]], rounds: int, warmup: int = 3) -> dict[str, float]:
    times = time_engines(runs, calls=rounds, warmup=warmup)
    return {name: statistics.median(t) * 1000 for name, t in times.items()}


def bench_latency(name: str, proto: onnx.ModelProto, model: ei.Model, feeds: dict, *, threads: int,
                  rounds: int, cache: Path) -> dict[str, Any]:
    raw = {"onnxruntime": raw_onnxruntime(proto, threads)}
    try:
        raw["openvino"] = raw_openvino(proto, threads)
    except ImportError:
        pass
    litert = raw_litert(model, threads)
    if litert is not None:
        raw["litert"] = litert
    backend_of = {"onnxruntime": "onnxruntime", "openvino": "openvino", "litert": "tflite"}
    ours = {engine: ei.Session(model, backend=backend_of[engine], threads=threads) for engine in raw}
    auto = ei.Session(model, backend="auto", threads=threads, options=ei.AutoOptions(cache=cache))
    runs = {f"raw {engine}": (lambda r=r: r(feeds)) for engine, r in raw.items()}
    runs.update({f"edgeinfer {backend_of[engine]}": (lambda s=s: s.run(feeds)) for engine, s in ours.items()})
    runs["edgeinfer auto"] = lambda: auto.run(feeds)
    ms = medians_ms(runs, rounds)
    fastest = min((k for k in ms if k.startswith("raw ")), key=ms.get)
    result = {
        "model": name, "median_ms": ms, "auto_choice": "+".join(auto.auto_choice.backends),
        "auto_measured_ms": auto.auto_choice.median_ms,
        "overhead_vs_raw_onnxruntime": ms["edgeinfer onnxruntime"] / ms["raw onnxruntime"] - 1,
        # each backend against its own engine run directly (LiteRT on the .tflite edgeinfer writes)
        "overhead_vs_raw": {backend_of[e]: ms[f"edgeinfer {backend_of[e]}"] / ms[f"raw {e}"] - 1 for e in raw},
        "fastest_raw": fastest, "auto_vs_fastest_raw": ms["edgeinfer auto"] / ms[fastest] - 1,
    }
    for session in (*ours.values(), auto):
        session.close()
    return result


def parallel_sessions(proto: onnx.ModelProto, workers: int) -> Callable[[list[dict]], None]:
    """``workers`` 1-thread raw onnxruntime sessions, each on its own thread, taking requests
    from a shared list until it is empty."""
    runners = [raw_onnxruntime(proto, 1) for _ in range(workers)]

    def serve(requests: list[dict]) -> None:
        position = iter(range(len(requests)))
        lock = threading.Lock()

        def work(runner: Runner) -> None:
            while True:
                with lock:
                    index = next(position, None)
                if index is None:
                    return
                runner(requests[index])

        threads = [threading.Thread(target=work, args=(r,)) for r in runners]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    return serve


def bench_stream(name: str, proto: onnx.ModelProto, model: ei.Model, *, threads: int, requests: int,
                 rounds: int, cache: Path) -> dict[str, Any]:
    batch = [zoo.example_inputs(proto, seed=s) for s in range(8)]
    stream_requests = [batch[i % len(batch)] for i in range(requests)]
    raw = raw_onnxruntime(proto, threads)
    parallel = parallel_sessions(proto, threads)
    sessions = {
        "edgeinfer stream, planner (onnxruntime)": (ei.Session(model, backend="onnxruntime", threads=threads),
                                                     {"stages": "auto"}),
        "edgeinfer stream, planner (backend=auto)": (ei.Session(model, backend="auto", threads=threads,
                                                                options=ei.AutoOptions(cache=cache)),
                                                      {"stages": "auto"}),
        "edgeinfer stream, 2 stages, no replicas (onnxruntime)": (
            ei.Session(model, backend="onnxruntime", threads=threads), {"stages": 2, "replicas": 1}),
    }
    plans = {label: session.pipeline_plan(batch[0], **choice).describe() for label, (session, choice) in sessions.items()}

    def drain(session: ei.Session, choice: dict) -> None:
        for _ in session.stream(stream_requests, **choice):
            pass

    runs = {"raw onnxruntime sequential": lambda: [raw(f) for f in stream_requests],
            f"raw onnxruntime {threads}x1-thread sessions": lambda: parallel(stream_requests)}
    runs.update({label: (lambda s=session, c=choice: drain(s, c)) for label, (session, choice) in sessions.items()})
    # whole streams, alternating round by round; each is long enough that the previous engine's
    # threads have gone idle, so no settle calls are needed here
    times = time_interleaved(runs, rounds=rounds, warmup=1)
    per_s = {k: requests / statistics.median(v) for k, v in times.items()}
    baseline = per_s["raw onnxruntime sequential"]
    best_raw = max(baseline, per_s[f"raw onnxruntime {threads}x1-thread sessions"])
    result = {"model": name, "requests": requests, "per_s": per_s, "plans": plans,
              "auto_choice": "+".join(sessions["edgeinfer stream, planner (backend=auto)"][0].auto_choice.backends),
              "vs_raw_sequential": {k: v / baseline for k, v in per_s.items() if k.startswith("edgeinfer")},
              "vs_best_raw": {k: v / best_raw for k, v in per_s.items() if k.startswith("edgeinfer")}}
    for session, _ in sessions.values():
        session.close()
    return result


DAG_NETS = ((64, 32), (160, 64))  # inception_net(size, width): small and larger branches


def bench_dag(*, threads: int, rounds: int) -> list[dict[str, Any]]:
    results = []
    for size, width in DAG_NETS:
        proto = zoo.inception_net(size=size, width=width)
        model = ei.convert(proto)
        feeds = zoo.example_inputs(proto)
        sessions = {f"{backend} {executor}": ei.Session(model, backend=backend, threads=threads, executor=executor)
                    for backend in ("onnxruntime", "numpy") for executor in ("sequential", "dag", "auto")}
        ms = medians_ms({k: (lambda s=s, f=feeds: s.run(f)) for k, s in sessions.items()}, rounds)
        results.append({
            "model": f"inception_net(size={size}, width={width})", "median_ms": ms,
            "dag_parts": len(sessions["onnxruntime dag"].plan.parts),
            "auto_chose": {b: sessions[f"{b} auto"].executor for b in ("onnxruntime", "numpy")},
            "dag_speedup": {b: ms[f"{b} sequential"] / ms[f"{b} dag"] for b in ("onnxruntime", "numpy")}})
        for session in sessions.values():
            session.close()
    return results


def markdown(results: dict[str, Any]) -> str:
    lines = [f"threads={results['threads']}, machine: {results['machine']['cpus']} CPUs, "
             f"{results['machine']['processor'] or results['machine']['machine']}", "",
             "| model | raw onnxruntime | raw OpenVINO | raw LiteRT | edgeinfer onnxruntime (overhead) "
             "| edgeinfer auto (choice, vs fastest raw) | every backend vs its raw engine |",
             "|---|---|---|---|---|---|---|"]
    for r in results["latency"]:
        ms = r["median_ms"]

        def cell(key: str, ms=ms) -> str:
            return f"{ms[key]:.2f} ms" if key in ms else "-"

        lines.append(f"| {r['model']} | {cell('raw onnxruntime')} | {cell('raw openvino')} | {cell('raw litert')} "
                     f"| {cell('edgeinfer onnxruntime')} ({r['overhead_vs_raw_onnxruntime']:+.1%}) "
                     f"| {cell('edgeinfer auto')} ({r['auto_choice']}, {r['auto_vs_fastest_raw']:+.1%}) "
                     f"| {', '.join(f'{b} {v:+.1%}' for b, v in r['overhead_vs_raw'].items())} |")
    if results["stream"]:
        labels = list(results["stream"][0]["per_s"])
        lines += ["", "| model (requests/s) | " + " | ".join(labels) + " | best edgeinfer vs raw sequential "
                  "/ vs best raw |", "|---" * (len(labels) + 2) + "|"]
        for r in results["stream"]:
            best = max(r["vs_raw_sequential"], key=r["vs_raw_sequential"].get)
            lines.append(f"| {r['model']} | " + " | ".join(f"{r['per_s'][k]:.1f}" for k in labels)
                         + f" | {r['vs_raw_sequential'][best]:.2f}x / {r['vs_best_raw'][best]:.2f}x |")
    for d in results["dag"]:
        lines += ["", f"DAG executor on {d['model']} ({d['dag_parts']} parts), median ms: "
                  + ", ".join(f"{k} {v:.2f}" for k, v in d["median_ms"].items())
                  + "; dag speed-up " + ", ".join(f"{k} {v:.2f}x" for k, v in d["dag_speedup"].items())
                  + "; executor='auto' chose " + ", ".join(f"{k}: {v}" for k, v in d["auto_chose"].items())]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", choices=sorted(MODELS), default=list(MODELS))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=100, help="timed calls per contender (latency, DAG)")
    parser.add_argument("--requests", type=int, default=60, help="requests per stream round")
    parser.add_argument("--stream-rounds", type=int, default=3)
    parser.add_argument("--skip", nargs="*", default=[], choices=["latency", "stream", "dag"])
    parser.add_argument("--json", type=Path)
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args(argv)
    results: dict[str, Any] = {"threads": args.threads, "machine": machine_facts(), "latency": [], "stream": [],
                               "dag": []}
    with tempfile.TemporaryDirectory() as cache:
        for name in args.models:
            proto = MODELS[name]()
            model = ei.convert(proto)
            feeds = zoo.example_inputs(proto)
            if "latency" not in args.skip:
                print(f"{name}: latency ...", flush=True)
                results["latency"].append(bench_latency(name, proto, model, feeds, threads=args.threads,
                                                        rounds=args.rounds, cache=Path(cache)))
            if "stream" not in args.skip:
                print(f"{name}: stream ...", flush=True)
                results["stream"].append(bench_stream(name, proto, model, threads=args.threads,
                                                      requests=args.requests, rounds=args.stream_rounds,
                                                      cache=Path(cache)))
    if "dag" not in args.skip:
        print("inception: DAG ...", flush=True)
        results["dag"] = bench_dag(threads=args.threads, rounds=args.rounds)
    text = markdown(results)
    print(text)
    for r in results["stream"]:
        for label, plan in r["plans"].items():
            print(f"\n{r['model']}, {label} (auto chose {r['auto_choice']}):\n{plan}")
    if args.json:
        atomic_write_bytes(args.json, json.dumps(results, indent=1, default=str).encode())
    if args.markdown:
        atomic_write_bytes(args.markdown, (text + "\n").encode())


if __name__ == "__main__":
    main()
