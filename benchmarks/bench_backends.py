"""Latency of the numpy backend against onnxruntime on reference architectures.

For each model: build it (``edgeinfer.zoo``), convert it (default passes), open one session
per backend with the same thread count, check both give the same outputs, warm up, then time
the two sessions alternately (the first one switches every round), so that noise from the
machine hits both alike. Reports median and p90 latency per backend and the ratio
numpy / onnxruntime of the medians. Usage::

    python benchmarks/bench_backends.py [--models resnet50 mobilenet_v2 transformer]
        [--threads 2] [--rounds 20] [--warmup 3] [--optimize 2] [--json results.json]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx

import edgeinfer as ei
from edgeinfer import zoo
from edgeinfer.benchmark import time_engines

BACKENDS = ("numpy", "onnxruntime")
MODELS: dict[str, Callable[[], onnx.ModelProto]] = {
    "resnet50": lambda: zoo.resnet50(batch=1, size=224),
    "mobilenet_v2": lambda: zoo.mobilenet_v2(size=224),
    "transformer": lambda: zoo.transformer_encoder_block(seq=128, d=256, heads=4),  # encoder block, 0.8M params
}


def max_relative_difference(got: dict[str, np.ndarray], ref: dict[str, np.ndarray]) -> float:
    worst = 0.0
    for name, value in ref.items():
        scale = max(float(np.abs(value).max()), 1e-12)
        worst = max(worst, float(np.abs(got[name].astype(np.float64) - value).max()) / scale)
    return worst


def bench_model(name: str, *, threads: int, rounds: int, warmup: int, optimize: int = 2) -> dict[str, Any]:
    proto = MODELS[name]()
    start = time.perf_counter()
    model = ei.convert(proto, optimize=optimize)
    convert_s = time.perf_counter() - start
    feeds = zoo.example_inputs(proto, seed=0)
    sessions = {backend: ei.Session(model, backend=backend, threads=threads) for backend in BACKENDS}
    outputs = {backend: session.run(feeds) for backend, session in sessions.items()}
    times = time_engines({backend: functools.partial(sessions[backend].run, feeds) for backend in BACKENDS},
                         calls=rounds, warmup=warmup)
    result: dict[str, Any] = {
        "model": name,
        "nodes": len(model.graph.nodes),
        "parameters": int(sum(a.size for a in model.graph.initializers.values())),
        "convert_s": convert_s,
        "max_rel_diff": max_relative_difference(outputs["numpy"], outputs["onnxruntime"]),
        "numpy_fallback_ops": sessions["numpy"].stats().get("fallback_ops", {}),
    }
    for backend in BACKENDS:
        samples = np.array(times[backend]) * 1e3
        result[backend] = {"median_ms": float(np.median(samples)), "p90_ms": float(np.percentile(samples, 90)),
                           "min_ms": float(samples.min()), "rounds": len(samples)}
    result["ratio_numpy_over_onnxruntime"] = result["numpy"]["median_ms"] / result["onnxruntime"]["median_ms"]
    return result


def print_table(results: list[dict[str, Any]], threads: int) -> None:
    header = (f"{'model':<14}{'numpy med':>11}{'numpy p90':>11}{'ort med':>10}{'ort p90':>10}"
              f"{'numpy/ort':>11}{'max rel diff':>14}  fallback ops")
    print(f"latency in ms, threads={threads}")
    print(header)
    print("-" * len(header))
    for r in results:
        fallback = ", ".join(f"{op} x{n}" for op, n in r["numpy_fallback_ops"].items()) or "-"
        print(f"{r['model']:<14}{r['numpy']['median_ms']:>11.2f}{r['numpy']['p90_ms']:>11.2f}"
              f"{r['onnxruntime']['median_ms']:>10.2f}{r['onnxruntime']['p90_ms']:>10.2f}"
              f"{r['ratio_numpy_over_onnxruntime']:>10.1f}x{r['max_rel_diff']:>14.1e}  {fallback}")


def environment(threads: int) -> dict[str, Any]:
    import onnxruntime

    return {"python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count(),
            "threads": threads, "numpy": np.__version__, "onnxruntime": onnxruntime.__version__,
            "edgeinfer": ei.__version__}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="numpy backend vs onnxruntime latency")
    parser.add_argument("--models", nargs="+", choices=sorted(MODELS), default=list(MODELS))
    parser.add_argument("--threads", type=int, default=2, help="threads per session (default 2)")
    parser.add_argument("--rounds", type=int, default=20, help="timed runs per backend (default 20)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed runs per backend first (default 3)")
    parser.add_argument("--optimize", type=int, default=2, choices=(0, 1, 2),
                        help="optimization level of the converted model (default 2)")
    parser.add_argument("--json", type=Path, help="also write the results as JSON here")
    args = parser.parse_args(argv)
    if args.threads < 1 or args.rounds < 1 or args.warmup < 0:
        parser.error("--threads and --rounds must be positive, --warmup not negative")
    results = []
    for name in args.models:
        results.append(bench_model(name, threads=args.threads, rounds=args.rounds, warmup=args.warmup,
                                   optimize=args.optimize))
        print(f"{name}: done", flush=True)
    print_table(results, args.threads)
    if args.json:
        args.json.write_text(json.dumps({"environment": environment(args.threads), "results": results}, indent=2))


if __name__ == "__main__":
    main()
