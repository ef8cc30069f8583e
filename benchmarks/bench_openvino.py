"""Latency of the OpenVINO backend against raw OpenVINO and the onnxruntime backend.

For each model: build it (``devkit.zoo``), convert it (``--optimize``, default 2), and
prepare three contenders with the same thread count, batch 1:

- ``ov_backend``: ``ei.Session(model, backend="openvino")`` (lowered, exported, compiled);
- ``ov_raw``: the zoo's ONNX model read and compiled by OpenVINO directly, with the
  properties the backend uses (latency hint, the thread count, fp32 precision), run through
  one ``InferRequest``;
- ``ort_backend``: ``ei.Session(model, backend="onnxruntime")``.

It checks that the three give the same outputs, warms up, then times them in interleaved
rounds (``edgeinfer.timing.time_engines``: interleaved blocks), and reports median and p90 latency, the
backend's overhead over raw OpenVINO and the ratio OpenVINO backend / onnxruntime backend of
the medians. Usage::

    python benchmarks/bench_openvino.py [--models resnet50 mobilenet_v2 transformer]
        [--threads 2] [--rounds 20] [--warmup 3] [--optimize 2] [--json results.json]
"""

from __future__ import annotations

import functools
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from bench_backends import (  # the sibling script (benchmarks/ is sys.path[0])
    add_optimize_argument,
    latency_summary,
    max_relative_difference,
    parse_timing_args,
    timing_parser,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: devkit/ is not installed

import edgeinfer as ei
from devkit import zoo
from edgeinfer.cli.peers import raw_openvino
from edgeinfer.format.atomic import atomic_write_bytes
from edgeinfer.timing import time_engines

CONTENDERS = ("ov_backend", "ov_raw", "ort_backend")
MODELS: dict[str, Callable[[], onnx.ModelProto]] = {
    "resnet50": lambda: zoo.resnet50(batch=1, size=224),
    "mobilenet_v2": lambda: zoo.mobilenet_v2(size=224),
    # BERT-mini sized encoder block: hidden 256, 4 heads, sequence 128
    "transformer": lambda: zoo.transformer_encoder_block(seq=128, d=256, heads=4),
}


def bench_model(name: str, *, threads: int, rounds: int, warmup: int, optimize: int) -> dict[str, Any]:
    proto = MODELS[name]()
    model = ei.convert(proto, optimize=optimize)
    feeds = zoo.example_inputs(proto, seed=0)
    start = time.perf_counter()
    ov_session = ei.Session(model, backend="openvino", threads=threads)
    compile_s = time.perf_counter() - start
    runs = {
        "ov_backend": functools.partial(ov_session.run, feeds),
        "ov_raw": functools.partial(raw_openvino(proto, threads), feeds),
        "ort_backend": functools.partial(ei.Session(model, backend="onnxruntime", threads=threads).run, feeds),
    }
    outputs = {contender: run() for contender, run in runs.items()}
    times = time_engines(runs, calls=rounds, warmup=warmup)
    result: dict[str, Any] = {
        "model": name,
        "parameters": int(sum(a.size for a in model.graph.initializers.values())),
        "ov_backend_compile_s": compile_s,
        "max_rel_diff_vs_ov_raw": max(max_relative_difference(outputs[c], outputs["ov_raw"])
                                      for c in ("ov_backend", "ort_backend")),
    }
    for contender in CONTENDERS:
        result[contender] = latency_summary(times[contender])
    median = {contender: result[contender]["median_ms"] for contender in CONTENDERS}
    result["backend_overhead_vs_raw_pct"] = 100.0 * (median["ov_backend"] / median["ov_raw"] - 1.0)
    result["ratio_ov_backend_over_ort_backend"] = median["ov_backend"] / median["ort_backend"]
    return result


def print_table(results: list[dict[str, Any]], threads: int) -> None:
    header = (f"{'model':<14}{'ov backend':>12}{'ov raw':>10}{'ort backend':>13}{'overhead':>10}"
              f"{'ov/ort':>8}{'max rel diff':>14}")
    print(f"median latency in ms (p90 in the JSON), batch 1, threads={threads}")
    print(header)
    print("-" * len(header))
    for r in results:
        print(f"{r['model']:<14}{r['ov_backend']['median_ms']:>12.2f}{r['ov_raw']['median_ms']:>10.2f}"
              f"{r['ort_backend']['median_ms']:>13.2f}{r['backend_overhead_vs_raw_pct']:>9.1f}%"
              f"{r['ratio_ov_backend_over_ort_backend']:>8.2f}{r['max_rel_diff_vs_ov_raw']:>14.1e}")


def environment(threads: int) -> dict[str, Any]:
    import onnxruntime
    import openvino

    return {"python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count(),
            "threads": threads, "numpy": np.__version__, "onnxruntime": onnxruntime.__version__,
            "openvino": openvino.__version__, "edgeinfer": ei.__version__}


def main(argv: list[str] | None = None) -> None:
    parser = timing_parser("OpenVINO backend vs raw OpenVINO vs onnxruntime backend latency", sorted(MODELS),
                           list(MODELS), "contender")
    add_optimize_argument(parser)
    args = parse_timing_args(parser, argv)
    results = []
    for name in args.models:
        results.append(bench_model(name, threads=args.threads, rounds=args.rounds, warmup=args.warmup,
                                   optimize=args.optimize))
        print(f"{name}: done", flush=True)
    print_table(results, args.threads)
    if args.json:
        document = {"environment": environment(args.threads), "results": results}
        atomic_write_bytes(args.json, json.dumps(document, indent=2).encode())


if __name__ == "__main__":
    main()
