"""Latency of the tflite backend against onnxruntime on the same models, in one run.

For each model: build it (``edgeinfer.zoo``), convert it (default passes) and, for the
``-int8`` variants, quantize it (static INT8 with int8 activations, calibrated on 8 seeded
samples). One session per backend with the same thread count runs the same IR: the tflite
backend exports it to a .tflite flatbuffer (XNNPACK kernels by default; full-integer ops for
the INT8 model), onnxruntime runs the ONNX export (QDQ fused into its integer kernels). The
sessions are timed alternately (``edgeinfer.benchmark.time_engines``: interleaved blocks). Reports median
and p90 latency per backend, the ratio tflite / onnxruntime of the medians, the .tflite size
and the largest difference between the two backends' outputs, relative to the output's range.
Usage::

    python benchmarks/bench_tflite.py [--models mobilenet_v2 mobilenet_v2-int8 resnet50 transformer]
        [--threads 2] [--rounds 20] [--warmup 3] [--op-resolver auto|builtin] [--json results.json]
"""

from __future__ import annotations

import argparse
import functools
import json
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from bench_backends import environment, max_relative_difference

import edgeinfer as ei
from edgeinfer import zoo
from edgeinfer.benchmark import time_engines

BACKENDS = ("tflite", "onnxruntime")
MODELS: dict[str, Callable[[], onnx.ModelProto]] = {
    "mobilenet_v2": lambda: zoo.mobilenet_v2(size=224),
    "resnet50": lambda: zoo.resnet50(batch=1, size=224),
    "transformer": lambda: zoo.transformer_encoder_block(seq=128, d=256, heads=4),
}
VARIANTS = [*MODELS, *(f"{name}-int8" for name in MODELS)]
CALIBRATION_SAMPLES = 8


def build(variant: str) -> tuple[ei.Model, dict[str, np.ndarray]]:
    name, _, quantized = variant.partition("-")
    proto = MODELS[name]()
    model = ei.convert(proto, optimize=2)
    if quantized:
        calibration = [zoo.example_inputs(proto, seed=100 + seed) for seed in range(CALIBRATION_SAMPLES)]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = ei.quantize(model, calibration, activations="int8")
    return model, zoo.example_inputs(proto, seed=0)


def bench_variant(variant: str, *, threads: int, rounds: int, warmup: int, op_resolver: str) -> dict[str, Any]:
    from edgeinfer.format.tflite import export_tflite

    model, feeds = build(variant)
    engine = {"tflite": {"op_resolver": op_resolver}, "onnxruntime": {}}
    sessions = {backend: ei.Session(model, backend=backend, threads=threads, **engine[backend])
                for backend in BACKENDS}
    outputs = {backend: session.run(feeds) for backend, session in sessions.items()}
    times = time_engines({backend: functools.partial(sessions[backend].run, feeds) for backend in BACKENDS},
                         calls=rounds, warmup=warmup)
    result: dict[str, Any] = {
        "model": variant,
        "nodes": len(model.graph.nodes),
        "tflite_bytes": len(export_tflite(model.graph)),
        "max_rel_diff": max_relative_difference(outputs["tflite"], outputs["onnxruntime"]),
        "op_resolver": op_resolver,
    }
    for backend in BACKENDS:
        samples = np.array(times[backend]) * 1e3
        result[backend] = {"median_ms": float(np.median(samples)), "p90_ms": float(np.percentile(samples, 90)),
                           "min_ms": float(samples.min()), "rounds": len(samples)}
    result["ratio_tflite_over_onnxruntime"] = result["tflite"]["median_ms"] / result["onnxruntime"]["median_ms"]
    return result


def print_table(results: list[dict[str, Any]], threads: int) -> None:
    header = (f"{'model':<20}{'tflite med':>12}{'tflite p90':>12}{'ort med':>10}{'ort p90':>10}"
              f"{'tflite/ort':>12}{'.tflite MB':>12}{'max rel diff':>14}")
    print(f"latency in ms, threads={threads}, tflite op_resolver={results[0]['op_resolver'] if results else '-'}")
    print(header)
    print("-" * len(header))
    for r in results:
        print(f"{r['model']:<20}{r['tflite']['median_ms']:>12.2f}{r['tflite']['p90_ms']:>12.2f}"
              f"{r['onnxruntime']['median_ms']:>10.2f}{r['onnxruntime']['p90_ms']:>10.2f}"
              f"{r['ratio_tflite_over_onnxruntime']:>11.2f}x{r['tflite_bytes'] / 1e6:>12.2f}{r['max_rel_diff']:>14.1e}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="tflite backend vs onnxruntime latency")
    parser.add_argument("--models", nargs="+", choices=VARIANTS, default=["mobilenet_v2", "mobilenet_v2-int8",
                                                                          "transformer", "resnet50"])
    parser.add_argument("--threads", type=int, default=2, help="threads per session (default 2)")
    parser.add_argument("--rounds", type=int, default=20, help="timed runs per backend (default 20)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed runs per backend first (default 3)")
    parser.add_argument("--op-resolver", default="auto", choices=("auto", "builtin"),
                        help="tflite kernels: auto (XNNPACK, default) or builtin")
    parser.add_argument("--json", type=Path, help="also write the results as JSON here")
    args = parser.parse_args(argv)
    if args.threads < 1 or args.rounds < 1 or args.warmup < 0:
        parser.error("--threads and --rounds must be positive, --warmup not negative")
    results = []
    for variant in args.models:
        results.append(bench_variant(variant, threads=args.threads, rounds=args.rounds, warmup=args.warmup,
                                     op_resolver=args.op_resolver))
        print(f"{variant}: done", flush=True)
    print_table(results, args.threads)
    if args.json:
        import ai_edge_litert

        env = {**environment(args.threads), "ai_edge_litert": getattr(ai_edge_litert, "__version__", "?")}
        args.json.write_text(json.dumps({"environment": env, "results": results}, indent=2))


if __name__ == "__main__":
    main()
