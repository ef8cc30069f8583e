"""Throughput of pipeline stages on Ray actors against the local pipeline and one raw
onnxruntime session, on the same requests in the same run (alternating rounds).

A local Ray instance is started (as a laptop or a single board would); on a real cluster
pass ``--address ray://head:10001`` (see the README's Ray section). Usage::

    python benchmarks/bench_ray.py [--model mobilenet_v2] [--requests 200] [--stages 2]
        [--threads 2] [--rounds 3] [--json results.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import ray
from bench_scheduler import MODELS, raw_onnxruntime  # the sibling script (benchmarks/ is sys.path[0])

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: devkit/ is not installed

import edgeinfer as ei
from devkit import zoo
from edgeinfer.cli.bench import machine_facts
from edgeinfer.format.atomic import atomic_write_bytes
from edgeinfer.timing import time_interleaved


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=sorted(MODELS), default="mobilenet_v2")
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--stages", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--address", default=None, help="a running Ray cluster (default: start a local one)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)

    proto = MODELS[args.model]()
    model = ei.convert(proto)
    pool = [zoo.example_inputs(proto, seed=s) for s in range(8)]
    requests = [pool[i % len(pool)] for i in range(args.requests)]
    if args.address is None:
        ray.init(num_cpus=args.threads, include_dashboard=False, log_to_driver=False, configure_logging=False)
    else:
        ray.init(address=args.address, log_to_driver=False, configure_logging=False)
    raw = raw_onnxruntime(proto, args.threads)
    local = ei.Session(model, backend="onnxruntime", threads=args.threads,
                       options=ei.StreamOptions(stages=args.stages, replicas=1))
    on_ray = ei.Session(model, backend="onnxruntime", threads=args.threads, executor="ray",
                        options=ei.StreamOptions(stages=args.stages, replicas=1))
    on_ray.run(pool[0])  # start the actors (planning and compiling are not timed)
    local.pipeline_plan(pool[0], stages=args.stages, replicas=1)

    def drain(session: ei.Session) -> None:
        for _ in session.stream(requests):
            pass

    runs = {"raw onnxruntime, one session": lambda: [raw(f) for f in requests],
            "edgeinfer local pipeline": lambda: drain(local),
            "edgeinfer Ray pipeline": lambda: drain(on_ray)}
    times = time_interleaved(runs, rounds=args.rounds, warmup=1)
    per_s = {name: args.requests / statistics.median(t) for name, t in times.items()}
    result = {"model": args.model, "requests": args.requests, "stages": args.stages, "threads": args.threads,
              "per_s": per_s, "ray_plan": on_ray.ray_pipeline.plan.describe(), "machine": machine_facts(),
              "ray_vs_local": per_s["edgeinfer Ray pipeline"] / per_s["edgeinfer local pipeline"],
              "ray_vs_raw": per_s["edgeinfer Ray pipeline"] / per_s["raw onnxruntime, one session"]}
    on_ray.close()
    local.close()
    ray.shutdown()
    for name, value in per_s.items():
        print(f"{name:<32} {value:8.1f} requests/s")
    print(f"Ray / local pipeline {result['ray_vs_local']:.2f}x, Ray / raw onnxruntime {result['ray_vs_raw']:.2f}x")
    print(result["ray_plan"])
    if args.json:
        atomic_write_bytes(args.json, json.dumps(result, indent=1, default=str).encode())


if __name__ == "__main__":
    main()
