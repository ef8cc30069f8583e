"""Latency of the tflite backend against onnxruntime on the same models, in one run.

For each model: build it (``devkit.zoo``), convert it (default passes) and, for the
``-int8`` variants, quantize it (static INT8 with int8 activations, calibrated on 8 seeded
samples). One session per backend with the same thread count runs the same IR: the tflite
backend exports it to a .tflite flatbuffer (XNNPACK kernels by default; full-integer ops for
the INT8 model), onnxruntime runs the ONNX export (QDQ fused into its integer kernels). The
sessions are timed alternately (``edgeinfer.timing.time_engines``: interleaved blocks). Reports median
and p90 latency per backend, the ratio tflite / onnxruntime of the medians, the .tflite size
and the largest difference between the two backends' outputs, relative to the output's range.
Usage::

    python benchmarks/bench_tflite.py [--models mobilenet_v2 mobilenet_v2-int8 resnet50 transformer]
        [--threads 2] [--rounds 20] [--warmup 3] [--op-resolver auto|builtin] [--json results.json]
"""

from __future__ import annotations

import functools
import json
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from bench_backends import (
    environment,
    latency_summary,
    max_relative_difference,
    parse_timing_args,
    timing_parser,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: devkit/ is not installed

import edgeinfer as ei
from devkit import zoo
from edgeinfer.timing import time_engines

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
            model = ei.quantize(model, calibration, activations="int8", quality_floor=None)  # plain INT8
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
        result[backend] = latency_summary(times[backend])
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
    parser = timing_parser("tflite backend vs onnxruntime latency", VARIANTS,
                           ["mobilenet_v2", "mobilenet_v2-int8", "transformer", "resnet50"], "backend")
    parser.add_argument("--op-resolver", default="auto", choices=("auto", "builtin"),
                        help="tflite kernels: auto (XNNPACK, default) or builtin")
    args = parse_timing_args(parser, argv)
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
