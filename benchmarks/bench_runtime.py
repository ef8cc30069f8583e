"""The runtime's targets (issue 20), side by side in one run.

1. live: a live source at 20 and 60 frames per second; added latency per frame = result time
   minus capture time minus the model's own run time (median of the raw session), median and p99;
2. first stream: the first ``stream()`` call of a fresh Session on 200 requests (planning
   included: it serves on the compiled plan's runner, then replicas, while the planner
   measures), then a second call (steady state), against raw onnxruntime run sequentially with
   all threads and as one 1-thread session per thread, measured before and after in each of
   three rounds (ratios per round, medians reported);
3. overhead: ``Session.run`` over the raw onnxruntime session on the same model (median);
4. partition: a 5,000-node graph with 2,500 backend alternations.

Usage::

    python benchmarks/bench_runtime.py [--threads 2] [--requests 200] [--frames 60] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
from onnx import TensorProto, helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: devkit/ is not installed

import edgeinfer as ei
from devkit import zoo
from edgeinfer.backend import Backend, get_backend
from edgeinfer.cli.bench import machine_facts
from edgeinfer.cli.peers import raw_onnxruntime
from edgeinfer.scheduler import make_backends, make_plan
from edgeinfer.timing import time_engines


def live(model: ei.Model, proto: Any, fps: float, frames: int, threads: int) -> dict[str, float]:
    feeds = zoo.example_inputs(proto)
    raw = raw_onnxruntime(proto, threads)
    for _ in range(20):
        raw(feeds)
    own = statistics.median(_timed(lambda: raw(feeds)) for _ in range(50))
    captured: list[float] = []

    def camera():
        start = time.perf_counter()
        for index in range(frames):
            wake = start + index / fps
            pause = wake - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
            captured.append(time.perf_counter())
            yield feeds

    added = []
    with ei.Session(model, backend="onnxruntime", threads=threads) as session:
        session.run(feeds)
        list(session.stream([feeds] * 8, stages=1, replicas=1))  # plan it once: the live stream measures delivery
        for index, _ in enumerate(session.stream(camera(), stages=1, replicas=1)):
            added.append(time.perf_counter() - captured[index] - own)
    ms = np.asarray(added[5:]) * 1000  # the first frames warm the workers
    return {"fps": fps, "frames": frames, "model_ms": own * 1000, "added_median_ms": float(np.median(ms)),
            "added_p99_ms": float(np.percentile(ms, 99))}


def _timed(call) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def first_stream(model: ei.Model, proto: Any, requests: int, threads: int, rounds: int = 3) -> dict[str, Any]:
    """``rounds`` rounds, each: raw onnxruntime both ways, a fresh Session's first stream, its
    second stream (after the planner), raw again. Each round's ratios use that round's better
    raw rate (the machine's load drifts between rounds); the medians over rounds are reported."""
    pool = [zoo.example_inputs(proto, seed=s) for s in range(8)]
    batch = [pool[i % len(pool)] for i in range(requests)]
    sequential = raw_onnxruntime(proto, threads)
    singles = [raw_onnxruntime(proto, 1) for _ in range(threads)]

    def parallel() -> None:
        def serve(worker: int) -> None:
            for feeds in batch[worker::threads]:
                singles[worker](feeds)
        workers = [threading.Thread(target=serve, args=(w,)) for w in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()

    for feeds in pool:
        sequential(feeds)
        for single in singles:
            single(feeds)
    label = f"raw onnxruntime {threads}x1-thread sessions"
    per_round: list[dict[str, float]] = []
    plans: dict[str, str] = {}
    for _ in range(rounds):
        rates: dict[str, float] = {}

        def raw_pass(rates: dict[str, float] = rates) -> None:
            rates["raw onnxruntime sequential"] = max(rates.get("raw onnxruntime sequential", 0.0),
                                                      requests / _timed(lambda: [sequential(f) for f in batch]))
            rates[label] = max(rates.get(label, 0.0), requests / _timed(parallel))

        raw_pass()
        start = time.perf_counter()
        session = ei.Session(model, backend="onnxruntime", threads=threads)
        built = time.perf_counter()
        for _ in session.stream(batch):
            pass
        end = time.perf_counter()
        rates["edgeinfer first stream() (construction + planning included)"] = requests / (end - start)
        rates["edgeinfer first stream() (planning included)"] = requests / (end - built)
        deadline = time.monotonic() + 60  # the planner goes on after the first stream: wait for its plan
        while not any(key[0] == "auto" for key in session.stage_plans) and time.monotonic() < deadline:
            time.sleep(0.05)
        rates["edgeinfer second stream()"] = max(requests / _timed(lambda s=session: list(s.stream(batch)))
                                                 for _ in range(2))
        raw_pass()
        plans = {str(k): p.describe() for k, p in session.stage_plans.items()}
        session.close()
        best_raw = max(rates["raw onnxruntime sequential"], rates[label])
        rates["first_vs_best_raw"] = rates["edgeinfer first stream() (planning included)"] / best_raw
        rates["first_with_construction_vs_best_raw"] = \
            rates["edgeinfer first stream() (construction + planning included)"] / best_raw
        rates["steady_vs_best_raw"] = rates["edgeinfer second stream()"] / best_raw
        per_round.append(rates)
    median = {key: statistics.median(r[key] for r in per_round) for key in per_round[0]}
    return {"requests": requests, "rounds": per_round, "per_s": {k: v for k, v in median.items() if "_vs_" not in k},
            "first_vs_best_raw": median["first_vs_best_raw"],
            "first_with_construction_vs_best_raw": median["first_with_construction_vs_best_raw"],
            "steady_vs_best_raw": median["steady_vs_best_raw"], "plans": plans}


def overhead(model: ei.Model, proto: Any, threads: int, rounds: int) -> dict[str, float]:
    feeds = zoo.example_inputs(proto)
    raw = raw_onnxruntime(proto, threads)
    with ei.Session(model, backend="onnxruntime", threads=threads) as session:
        executable = session.executable  # the compiled engine alone: what the runtime's layers add
        checked = session._check_feeds(feeds)
        times = time_engines({"raw onnxruntime": lambda: raw(feeds), "Session.run": lambda: session.run(feeds),
                              "its executable.run": lambda: executable.run(checked)}, calls=rounds, warmup=5)
    medians = {name: statistics.median(t) * 1000 for name, t in times.items()}
    return {**{f"{k} median_ms": v for k, v in medians.items()},
            "overhead": medians["Session.run"] / medians["raw onnxruntime"] - 1,
            "layers_overhead": medians["Session.run"] / medians["its executable.run"] - 1}


class _Npu(Backend):
    """Takes every op but Sigmoid (partitioning only calls ``supports``)."""

    name = "npu"

    def __init__(self) -> None:
        self.inner = get_backend("numpy")

    def supports(self, node, graph):
        return "no Sigmoid here" if node.op_type == "Sigmoid" else None

    def compile(self, graph, options):
        return self.inner.compile(graph, options)


def partition(blocks: int) -> dict[str, float]:
    nodes, prev = [], "x"
    for i in range(blocks):
        nodes += [helper.make_node("Relu", [prev], [f"a{i}"]), helper.make_node("Sigmoid", [f"a{i}"], [f"b{i}"]),
                  helper.make_node("Tanh", [f"a{i}"], [f"c{i}"]), helper.make_node("Add", [f"b{i}", f"c{i}"], [f"d{i}"])]
        prev = f"d{i}"
    graph = helper.make_graph(nodes, "alternating", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info(prev, TensorProto.FLOAT, [1, 4])])
    ir = ei.convert(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), optimize=0).graph
    backends = [_Npu(), *make_backends(["numpy"])]
    start = time.perf_counter()
    plan = make_plan(ir, backends)
    return {"nodes": len(ir.nodes), "parts": len(plan.parts), "seconds": time.perf_counter() - start}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--frames", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    light = zoo.mobilenet_v2(size=96, width_mult=0.5, classes=100)
    light_model = ei.convert(light)
    tiny = zoo.mlp_symbolic_batch(seed=3)
    tiny_model = ei.convert(tiny)
    results: dict[str, Any] = {"machine": machine_facts(), "threads": args.threads}
    results["partition"] = partition(1250)
    print(f"partition: {results['partition']['nodes']} nodes -> {results['partition']['parts']} parts in "
          f"{results['partition']['seconds']:.2f} s", flush=True)
    results["live"] = [live(tiny_model, tiny, fps, args.frames, args.threads) for fps in (20, 60)]
    for r in results["live"]:
        print(f"live {r['fps']:.0f} fps (model {r['model_ms']:.3f} ms): added latency median "
              f"{r['added_median_ms']:.2f} ms, p99 {r['added_p99_ms']:.2f} ms", flush=True)
    results["overhead"] = overhead(light_model, light, args.threads, args.rounds)
    print(f"run overhead over raw onnxruntime: {results['overhead']['overhead']:+.1%}, over its own executable "
          f"{results['overhead']['layers_overhead']:+.1%} ({results['overhead']})", flush=True)
    results["first_stream"] = first_stream(light_model, light, args.requests, args.threads)
    first = results["first_stream"]
    for label, rate in first["per_s"].items():
        print(f"  {label}: {rate:.1f} requests/s")
    print(f"median of {len(first['rounds'])} rounds: first stream {first['first_vs_best_raw']:.2f}x the better raw baseline "
          f"({first['first_with_construction_vs_best_raw']:.2f}x with the Session's construction), steady "
          f"{first['steady_vs_best_raw']:.2f}x")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
