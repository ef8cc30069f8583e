"""Latency of the numpy backend against onnxruntime on reference architectures.

For each model: build it (``devkit.zoo``), convert it (default passes), open one session
per backend with the same thread count, check both give the same outputs, warm up, then time
the two sessions alternately (the first one switches every round), so that noise from the
machine hits both alike. Reports median and p90 latency per backend and the ratio
numpy / onnxruntime of the medians. Usage::

    python benchmarks/bench_backends.py [--models resnet50 mobilenet_v2 transformer]
        [--threads 2] [--rounds 20] [--warmup 3] [--optimize 2] [--json results.json] [--floor]

``--floor`` also estimates, per convolutional model, the least time a numpy backend could take: for every
Conv/FusedConv/Gemm/Add node, only the numpy calls it cannot avoid, each timed alone on the
node's real shapes (median of repeats) and summed: the GEMM alone with BLAS at ``threads``
threads (no im2col copy); for a depthwise conv, the copy of its taps into columns and the
batched GEMV, at one thread and divided by ``threads`` (a perfect split); one in-place ufunc
pass over the output for a bias/activation epilogue or an Add, also divided by ``threads``.
Other nodes (pools, reshapes) count as free. The ratio floor / onnxruntime (same run) bounds
what any numpy kernel work could reach.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: devkit/ is not installed

import edgeinfer as ei
from devkit import zoo
from edgeinfer.ir import Graph
from edgeinfer.timing import BLAS_SPIN_S, time_engines

BACKENDS = ("numpy", "onnxruntime")
MODELS: dict[str, Callable[[], onnx.ModelProto]] = {
    "resnet50": lambda: zoo.resnet50(batch=1, size=224),
    "mobilenet_v2": lambda: zoo.mobilenet_v2(size=224),
    "transformer": lambda: zoo.transformer_encoder_block(seq=128, d=256, heads=4),  # encoder block, 0.8M params
}


def latency_summary(seconds: Sequence[float]) -> dict[str, float]:
    """Median, p90 and min in ms of timed calls, and how many there were."""
    samples = np.asarray(seconds) * 1e3
    return {"median_ms": float(np.median(samples)), "p90_ms": float(np.percentile(samples, 90)),
            "min_ms": float(samples.min()), "rounds": len(samples)}


def timing_parser(description: str, models: Sequence[str], default: Sequence[str], per: str) -> argparse.ArgumentParser:
    """The options every latency script here takes (``per``: what one timed contender is)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--models", nargs="+", choices=list(models), default=list(default))
    parser.add_argument("--threads", type=int, default=2, help=f"threads per {per} (default 2)")
    parser.add_argument("--rounds", type=int, default=20, help=f"timed runs per {per} (default 20)")
    parser.add_argument("--warmup", type=int, default=3, help=f"untimed runs per {per} first (default 3)")
    parser.add_argument("--json", type=Path, help="also write the results as JSON here")
    return parser


def add_optimize_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--optimize", type=int, default=2, choices=(0, 1, 2),
                        help="optimization level of the converted model (default 2)")


def parse_timing_args(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    args = parser.parse_args(argv)
    if args.threads < 1 or args.rounds < 1 or args.warmup < 0:
        parser.error("--threads and --rounds must be positive, --warmup not negative")
    return args


def max_relative_difference(got: dict[str, np.ndarray], ref: dict[str, np.ndarray]) -> float:
    worst = 0.0
    for name, value in ref.items():
        scale = max(float(np.abs(value).max()), 1e-12)
        worst = max(worst, float(np.abs(got[name].astype(np.float64) - value).max()) / scale)
    return worst


def bench_model(name: str, *, threads: int, rounds: int, warmup: int, optimize: int = 2,
                floor: bool = False) -> dict[str, Any]:
    proto = MODELS[name]()
    start = time.perf_counter()
    model = ei.convert(proto, optimize=optimize)
    convert_s = time.perf_counter() - start
    feeds = zoo.example_inputs(proto, seed=0)
    sessions = {backend: ei.Session(model, backend=backend, threads=threads) for backend in BACKENDS}
    outputs = {backend: session.run(feeds) for backend, session in sessions.items()}
    # settle past OpenBLAS's spinning workers, so onnxruntime is not timed beside them
    times = time_engines({backend: functools.partial(sessions[backend].run, feeds) for backend in BACKENDS},
                         calls=rounds, warmup=warmup, settle_s=BLAS_SPIN_S)
    result: dict[str, Any] = {
        "model": name,
        "nodes": len(model.graph.nodes),
        "parameters": int(sum(a.size for a in model.graph.initializers.values())),
        "convert_s": convert_s,
        "max_rel_diff": max_relative_difference(outputs["numpy"], outputs["onnxruntime"]),
        "numpy_fallback_ops": sessions["numpy"].stats().get("fallback_ops", {}),
    }
    for backend in BACKENDS:
        result[backend] = latency_summary(times[backend])
    result["ratio_numpy_over_onnxruntime"] = result["numpy"]["median_ms"] / result["onnxruntime"]["median_ms"]
    if floor and (estimate := floor_estimate(model, threads)) is not None:
        result["floor"] = estimate
        result["floor"]["ratio_over_onnxruntime"] = result["floor"]["total_ms"] / result["onnxruntime"]["median_ms"]
    return result


def _median_ms(call: Callable[[], Any], repeats: int = 15) -> float:
    call()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        samples.append(time.perf_counter() - start)
    return float(np.median(samples)) * 1e3


def _node_floor_ms(graph: Graph, node, threads: int, rng: np.random.Generator) -> tuple[str, float] | None:
    """(what was timed, ms) of the unavoidable numpy work of one node, or None if it has none."""
    from numpy.lib.stride_tricks import sliding_window_view
    from threadpoolctl import threadpool_limits

    out_shape = graph.values[node.outputs[0]].shape
    if not all(isinstance(d, int) for d in out_shape):
        return None
    out = np.ones(out_shape, dtype=np.float32)
    if node.op_type == "Add":
        other = np.ones(out_shape, dtype=np.float32)
        return "add", _median_ms(lambda: np.add(out, other, out=out)) / threads
    if node.op_type not in ("Conv", "FusedConv", "Gemm"):
        return None
    weight = graph.initializers.get(node.inputs[1])
    if weight is None:
        return None
    epilogue = 0.0
    if (len(node.inputs) > 2 and node.inputs[2]) or node.attrs.get("activation"):
        epilogue = _median_ms(lambda: np.maximum(out, 0, out=out)) / threads
    if node.op_type == "Gemm":
        a = rng.standard_normal((out_shape[0], weight.shape[1 if node.attrs.get("transB") else 0]), dtype=np.float32)
        b = rng.standard_normal(weight.shape, dtype=np.float32)
        b = b.T if node.attrs.get("transB") else b
        with threadpool_limits(threads, user_api="blas"):
            return "gemm", _median_ms(lambda: np.matmul(a, b)) + epilogue
    channels = graph.values[node.inputs[0]].shape[1]
    group = int(node.attrs.get("group", 1))
    length = int(np.prod(out_shape[2:]))
    if group == channels and weight.shape[1] == 1 and weight.ndim == 4:  # depthwise 2-D
        kh, kw = weight.shape[2:]
        sy, sx = node.attrs.get("strides", (1, 1))
        x = rng.standard_normal((out_shape[1], (out_shape[2] - 1) * sy + kh, (out_shape[3] - 1) * sx + kw),
                                dtype=np.float32)
        windows = sliding_window_view(x, (kh, kw), axis=(1, 2))[:, ::sy, ::sx]  # [C, Ho, Wo, kh, kw]
        taps = weight.reshape(weight.shape[0], 1, kh * kw)
        columns = np.empty((weight.shape[0], kh * kw, length), dtype=np.float32)
        result = np.empty((weight.shape[0], 1, length), dtype=np.float32)

        def core() -> None:
            columns.reshape(weight.shape[0], kh, kw, *out_shape[2:])[...] = windows.transpose(0, 3, 4, 1, 2)
            np.matmul(taps, columns, out=result)

        with threadpool_limits(1, user_api="blas"):
            return "depthwise", _median_ms(core) / threads + epilogue
    flat = weight.reshape(weight.shape[0], -1)
    cols = rng.standard_normal((flat.shape[1], length), dtype=np.float32)
    result = np.empty((flat.shape[0], length), dtype=np.float32)
    with threadpool_limits(threads, user_api="blas"):
        return "gemm", _median_ms(lambda: np.matmul(flat, cols, out=result)) + epilogue


def floor_estimate(model: ei.Model, threads: int) -> dict[str, Any] | None:
    """The summed floor of a model's nodes (see the module docstring), by kind of work; None
    for a model without convolutions (its MatMul, Attention and normalization nodes are not
    covered)."""
    if not any(node.op_type in ("Conv", "FusedConv") for node in model.graph.nodes):
        return None
    rng = np.random.default_rng(0)
    by_kind: dict[str, float] = {}
    for node in model.graph.nodes:
        timed = _node_floor_ms(model.graph, node, threads, rng)
        if timed is not None:
            by_kind[timed[0]] = by_kind.get(timed[0], 0.0) + timed[1]
    return {"total_ms": sum(by_kind.values()), "by_kind_ms": by_kind}


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
    for r in results:
        if "floor" in r:
            kinds = ", ".join(f"{kind} {ms:.2f}" for kind, ms in sorted(r["floor"]["by_kind_ms"].items()))
            print(f"{r['model']}: numpy floor {r['floor']['total_ms']:.2f} ms ({kinds}) = "
                  f"{r['floor']['ratio_over_onnxruntime']:.1f}x onnxruntime's median")


def environment(threads: int) -> dict[str, Any]:
    import onnxruntime

    return {"python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count(),
            "threads": threads, "numpy": np.__version__, "onnxruntime": onnxruntime.__version__,
            "edgeinfer": ei.__version__}


def main(argv: list[str] | None = None) -> None:
    parser = timing_parser("numpy backend vs onnxruntime latency", sorted(MODELS), list(MODELS), "backend")
    add_optimize_argument(parser)
    parser.add_argument("--floor", action="store_true",
                        help="also time the unavoidable numpy calls of each node alone and sum them")
    args = parse_timing_args(parser, argv)
    results = []
    for name in args.models:
        results.append(bench_model(name, threads=args.threads, rounds=args.rounds, warmup=args.warmup,
                                   optimize=args.optimize, floor=args.floor))
        print(f"{name}: done", flush=True)
    print_table(results, args.threads)
    if args.json:
        args.json.write_text(json.dumps({"environment": environment(args.threads), "results": results}, indent=2))


if __name__ == "__main__":
    main()
