"""Latency of fp32 (no passes) against optimized fp32 (``--optimize 2``), per backend.

The claim being checked: fusion never makes a model slower. For each model of
``devkit.zoo`` and each backend (onnxruntime, numpy), the unoptimized and the optimized
graph are compiled once, checked to give the same outputs, warmed up, then timed
alternately (the one that goes first switches every round), so machine noise hits both
alike. Reports median and p90 per variant and the speedup = median(fp32) / median(optimized);
a speedup below 1 beyond the noise is a regression. Usage::

    python benchmarks/bench_optimize.py [--models resnet50 mobilenet_v2 transformer]
        [--backends onnxruntime numpy] [--threads 2] [--rounds 20] [--warmup 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: devkit/ is not installed

import edgeinfer as ei
from devkit import zoo
from devkit.testing import assert_close
from edgeinfer.timing import time_interleaved

MODELS: dict[str, Callable[[], onnx.ModelProto]] = {
    "resnet50": lambda: zoo.resnet50(batch=1, size=224),
    "mobilenet_v2": lambda: zoo.mobilenet_v2(size=224),
    "transformer": lambda: zoo.transformer_encoder_block(seq=128, d=256, heads=4),
}
VARIANTS = {"fp32": 0, "optimized": 2}  # name -> optimization level


def bench_model(name: str, backends: list[str], threads: int, rounds: int, warmup: int) -> list[dict[str, Any]]:
    source = MODELS[name]()
    feeds = zoo.example_inputs(source)
    models = {variant: ei.convert(source, optimize=level) for variant, level in VARIANTS.items()}
    rows = []
    for backend in backends:
        sessions = {variant: ei.Session(model, backend=backend, threads=threads) for variant, model in models.items()}
        reference = sessions["fp32"].run(feeds)
        optimized = sessions["optimized"].run(feeds)
        for output, value in reference.items():
            # fp32 reassociation (folded BN, fused epilogues) over a deep net: 1e-4 relative
            assert_close(optimized[output], value, rtol=1e-4, atol=1e-4, name=f"{name}/{backend}/{output}")
        times = time_interleaved({name: functools.partial(session.run, feeds) for name, session in sessions.items()},
                                 rounds=rounds, warmup=warmup)
        medians = {v: float(np.median(t)) for v, t in times.items()}
        rows.append({
            "model": name, "backend": backend,
            "nodes": {v: len(m.graph.nodes) for v, m in models.items()},
            "median_ms": {v: 1e3 * m for v, m in medians.items()},
            "p90_ms": {v: 1e3 * float(np.percentile(t, 90)) for v, t in times.items()},
            "speedup": medians["fp32"] / medians["optimized"],
        })
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--backends", nargs="+", default=["onnxruntime", "numpy"])
    parser.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()
    results = []
    print(f"{'model':14s} {'backend':12s} {'nodes':>11s} {'fp32 ms':>9s} {'opt ms':>9s} {'p90 fp32/opt':>15s} "
          f"{'speedup':>8s}")
    for name in args.models:
        for row in bench_model(name, args.backends, args.threads, args.rounds, args.warmup):
            results.append(row)
            nodes, med, p90 = row["nodes"], row["median_ms"], row["p90_ms"]
            print(f"{name:14s} {row['backend']:12s} {nodes['fp32']:5d}->{nodes['optimized']:<5d} "
                  f"{med['fp32']:9.2f} {med['optimized']:9.2f} {p90['fp32']:7.2f}/{p90['optimized']:<7.2f} "
                  f"{row['speedup']:7.2f}x", flush=True)
    if args.json:
        meta = {"machine": platform.machine(), "python": platform.python_version(), "threads": args.threads,
                "rounds": args.rounds}
        with open(args.json, "w") as handle:
            json.dump({"meta": meta, "results": results}, handle, indent=2)


if __name__ == "__main__":
    main()
