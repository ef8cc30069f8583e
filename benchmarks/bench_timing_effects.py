"""The machine effects behind the scheduler's design choices and its reported limits, measured.

1. ``interleave``: OpenVINO on MobileNetV2 alone, with every call alternating with onnxruntime,
   and in blocks (``edgeinfer.timing.time_engines``): why engines are timed in blocks.
2. ``scaling``: per model, onnxruntime at 2 intra-op threads and every engine at 1: the
   ceiling of any 2-core stream speed-up that overlaps batch-1 requests,
   2 * t(onnxruntime, 2 threads) / t(fastest engine, 1 thread).
3. ``split``: onnxruntime on an inception-style net as one session and as the DAG executor's
   branch parts run one after another on one thread, and onnxruntime's own ORT_PARALLEL mode:
   what cutting a graph at its forks costs that engine.
4. ``concurrent``: two numpy executables run in two threads against one after another (BLAS
   kept at one thread while executables are alive).
5. ``switch``: two identical onnxruntime sessions on the encoder block; after a stretch of
   calls on one, the other's first calls, one by one: how long the first session's spinning
   workers slow the next engine (why ``time_engines`` settles for a time, not a call count).
8. ``blas``: CPU time OpenBLAS's worker threads burn during half a second after one GEMM on two
   BLAS threads (their spin before sleeping), and the encoder's FFN GEMM (128x256 @ 256x1024)
   on one BLAS thread, on two, and cut into row blocks over two Python threads.
9. ``ufunc_threads``: the numpy backend's GELU on a 128x1024 block, cut into 2/4/8 chunks, on
   one thread and shared with a helper thread (``parallel_for``).
7. ``pinning``: two 1-thread OpenVINO executables of the encoder block served from two Python
   threads, compiled as for one session (OpenVINO pins its threads to cores) and as for
   pipeline replicas (``busy_wait=False``: pinning off), against one alone (requests/s).
6. ``variance``: several identical onnxruntime sessions on the encoder block, timed in blocks
   over repeated rounds, with two settle calls per turn (the old rule) and with the time-based
   settle: how far apart identical contenders land at 1-2 ms on this machine.

Usage::

    python benchmarks/bench_timing_effects.py [--only interleave scaling split concurrent switch variance pinning blas ufunc_threads]
        [--calls 40] [--json effects.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: devkit/ is not installed

import edgeinfer as ei
from devkit import zoo
from edgeinfer.backend import CompileOptions, get_backend
from edgeinfer.cli.bench import machine_facts
from edgeinfer.cli.peers import raw_litert, raw_onnxruntime, raw_openvino
from edgeinfer.format.atomic import atomic_write_bytes
from edgeinfer.runtime import placement
from edgeinfer.runtime.compile import compile, compile_parts
from edgeinfer.runtime.executors import SequentialExecutor
from edgeinfer.timing import ENGINE_BLOCK, ENGINE_SETTLE, time_engines, time_interleaved


def median_ms(samples: list[float]) -> float:
    return round(statistics.median(samples) * 1000, 3)


def interleave(calls: int) -> dict[str, float]:
    proto = zoo.mobilenet_v2()
    feeds = zoo.example_inputs(proto)
    ov, onnxrt = raw_openvino(proto, 2), raw_onnxruntime(proto, 2)
    runs = {"openvino": lambda: ov(feeds), "onnxruntime": lambda: onnxrt(feeds)}
    alone = time_interleaved({"openvino": runs["openvino"]}, rounds=calls, warmup=3)
    per_call = time_interleaved(runs, rounds=calls, warmup=3)
    blocks = time_engines(runs, calls=calls, warmup=3)
    return {"openvino alone": median_ms(alone["openvino"]),
            "openvino, calls alternating with onnxruntime": median_ms(per_call["openvino"]),
            "openvino, blocks (time_engines)": median_ms(blocks["openvino"])}


def scaling(calls: int) -> dict[str, Any]:
    """Per model: raw onnxruntime at 2 threads and every raw engine at 1 thread. No stream of
    batch-1 requests on 2 cores can beat 2 / (the fastest 1-thread time) requests per second
    (each request needs at least that much of one core), so against onnxruntime at 2 threads the
    ceiling of any overlap is 2 * t(onnxruntime, 2 threads) / t(fastest engine, 1 thread)."""
    models = {"mobilenet_v2": zoo.mobilenet_v2(), "resnet50": zoo.resnet50(),
              "transformer": zoo.transformer_encoder_block(seq=128, d=256, heads=4)}
    result: dict[str, Any] = {}
    for name, proto in models.items():
        feeds = zoo.example_inputs(proto)
        runners = {"onnxruntime 2 threads": raw_onnxruntime(proto, 2), "onnxruntime 1 thread": raw_onnxruntime(proto, 1)}
        try:
            runners["openvino 1 thread"] = raw_openvino(proto, 1)
        except ImportError:
            pass
        litert = raw_litert(ei.convert(proto), 1)
        if litert is not None:
            runners["litert 1 thread"] = litert
        times = time_engines({label: (lambda r=r, f=feeds: r(f)) for label, r in runners.items()}, calls=calls, warmup=3)
        ms = {label: median_ms(samples) for label, samples in times.items()}
        fastest = min((label for label in ms if label.endswith("1 thread")), key=ms.get)
        ms["onnxruntime 2-thread speed-up"] = round(ms["onnxruntime 1 thread"] / ms["onnxruntime 2 threads"], 2)
        ms["stream ceiling vs onnxruntime at 2 threads"] = round(2 * ms["onnxruntime 2 threads"] / ms[fastest], 2)
        result[name] = ms
    return result


def split(calls: int) -> dict[str, float]:
    proto = zoo.inception_net(size=160, width=64)
    model = ei.convert(proto)
    feeds = zoo.example_inputs(proto)
    backends = placement.make_backends(["onnxruntime", "numpy"])
    _, whole = compile(model.graph, backends, threads=1)
    parts_plan = placement.make_plan(model.graph, backends, branches=True)
    parts = SequentialExecutor(model.graph, compile_parts(parts_plan, backends, threads=1))
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = 1, 2
    options.execution_mode = ort.ExecutionMode.ORT_PARALLEL
    parallel_session = ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
    sequential = raw_onnxruntime(proto, 2)
    times = time_engines({
        "one session, 1 thread": lambda: whole.run(feeds),
        f"{len(parts_plan.parts)} branch parts one after another, 1 thread": lambda: parts.run(feeds),
        "raw onnxruntime, 2 intra-op threads": lambda: sequential(feeds),
        "raw onnxruntime ORT_PARALLEL, 2 inter-op threads": lambda: parallel_session.run(None, feeds)},
        calls=calls, warmup=3)
    return {name: median_ms(samples) for name, samples in times.items()}


def concurrent(calls: int) -> dict[str, float]:
    proto = zoo.cnn_residual_depthwise(size=96, channels=64)
    model = ei.convert(proto)
    feeds = zoo.example_inputs(proto)
    numpy_backend = get_backend("numpy")
    first, second = (numpy_backend.compile(model.graph, CompileOptions(threads=1)) for _ in range(2))

    def after_another() -> None:
        first.run(feeds)
        second.run(feeds)

    def side_by_side() -> None:
        helper = threading.Thread(target=second.run, args=(feeds,))
        helper.start()
        first.run(feeds)
        helper.join()

    times = time_interleaved({"one after another": after_another, "two threads": side_by_side},
                             rounds=calls, warmup=2)
    return {f"two numpy runs, {name}": median_ms(samples) for name, samples in times.items()}


def switch(calls: int, switches: int = 40) -> dict[str, Any]:
    proto = zoo.transformer_encoder_block(seq=128, d=256, heads=4)
    feeds = zoo.example_inputs(proto)
    first, second = raw_onnxruntime(proto, 2), raw_onnxruntime(proto, 2)
    for _ in range(5):
        first(feeds)
        second(feeds)
    rows = []
    for _ in range(switches):
        for _ in range(20):
            first(feeds)
        row = []
        for _ in range(calls):
            start = time.perf_counter()
            second(feeds)
            row.append(time.perf_counter() - start)
        rows.append(row)
    by_call = [median_ms([row[i] for row in rows]) for i in range(calls)]
    steady = statistics.median(by_call[calls // 2:])
    disturbed = [i for i, value in enumerate(by_call) if value > 1.1 * steady]
    return {"ms of the second session's call i after the switch (median over switches)": by_call,
            "steady ms": steady, "last call over 10% above steady": max(disturbed, default=-1),
            "ms until then": round(sum(by_call[:max(disturbed, default=-1) + 1]), 1)}


def variance(calls: int, sessions: int = 3, repeats: int = 3) -> dict[str, Any]:
    proto = zoo.transformer_encoder_block(seq=128, d=256, heads=4)
    model = ei.convert(proto)
    feeds = zoo.example_inputs(proto)
    same = [ei.Session(model, backend="onnxruntime", threads=2) for _ in range(sessions)]
    runs = {f"session {i}": (lambda s=s: s.run(feeds)) for i, s in enumerate(same)}
    result: dict[str, Any] = {}
    rules = {"2 settle calls per turn": {"settle_s": 0.0}, "time_engines (settle by time)": {}}
    for rule, settle in rules.items():
        medians: dict[str, list[float]] = {name: [] for name in runs}
        for _ in range(repeats):
            if settle:
                times = time_interleaved(runs, rounds=max(2, -(-calls // ENGINE_BLOCK)), warmup=2, block=ENGINE_BLOCK,
                                         settle=ENGINE_SETTLE, **settle)
            else:
                times = time_engines(runs, calls=calls, warmup=2)
            for name, samples in times.items():
                medians[name].append(median_ms(samples))
        every = [m for values in medians.values() for m in values]
        result[rule] = {"medians per session and round (ms)": medians, "lowest": min(every),
                        "highest": max(every), "spread": round(max(every) / min(every) - 1, 3)}
    return result


def pinning(calls: int, requests: int = 300) -> dict[str, float]:
    proto = zoo.transformer_encoder_block(seq=128, d=256, heads=4)
    model = ei.convert(proto)
    feeds = zoo.example_inputs(proto)
    openvino = get_backend("openvino")
    result: dict[str, float] = {}
    for label, busy_wait in (("pinned (one session)", True), ("unpinned (replicas)", False)):
        pair = [openvino.compile(model.graph, CompileOptions(threads=1, busy_wait=busy_wait)) for _ in range(2)]
        for executable in pair:
            for _ in range(5):
                executable.run(feeds)

        def serve(executable) -> None:
            for _ in range(requests):
                executable.run(feeds)

        start = time.perf_counter()
        serve(pair[0])
        result[f"{label}: one alone, requests/s"] = round(requests / (time.perf_counter() - start), 1)
        threads = [threading.Thread(target=serve, args=(e,)) for e in pair]
        start = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        result[f"{label}: two in two threads, requests/s"] = round(2 * requests / (time.perf_counter() - start), 1)
    return result


def _cpu_ticks_of_other_threads() -> int:
    me = str(threading.get_native_id())
    total = 0
    for tid in os.listdir("/proc/self/task"):
        if tid == me:
            continue
        with open(f"/proc/self/task/{tid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime + stime, in clock ticks
    return total


def blas(calls: int) -> dict[str, float]:
    from edgeinfer.backends.numpy import parallel

    a = np.random.default_rng(0).standard_normal((128, 256), dtype=np.float32)
    b = np.random.default_rng(1).standard_normal((256, 1024), dtype=np.float32)
    out = np.empty((128, 1024), np.float32)
    result: dict[str, float] = {}
    parallel.hold_blas()
    try:
        if os.path.isdir("/proc/self/task"):
            with parallel.use_workers(2), parallel._blas_threads(2):
                np.matmul(a, b, out=out)
            before = _cpu_ticks_of_other_threads()
            time.sleep(0.5)
            ticks = _cpu_ticks_of_other_threads() - before
            result["ms of CPU other threads used in the 0.5 s after a 2-thread GEMM"] = ticks * 1000 / os.sysconf("SC_CLK_TCK")
        blocks = parallel.split(128, 2)

        def rows() -> None:
            parallel.parallel_for(2, lambda i: np.matmul(a[slice(*blocks[i])], b, out=out[slice(*blocks[i])]))

        def two_blas() -> None:
            with parallel._blas_threads(2):
                np.matmul(a, b, out=out)

        with parallel.use_workers(2):
            times = time_interleaved({"1 BLAS thread": lambda: np.matmul(a, b, out=out), "2 BLAS threads": two_blas,
                                      "row blocks on 2 Python threads": rows}, rounds=calls * 5, warmup=5, block=5)
    finally:
        parallel.release_blas()
    result.update({f"FFN GEMM ms, {name}": median_ms(samples) for name, samples in times.items()})
    return result


def ufunc_threads(calls: int) -> dict[str, float]:
    from edgeinfer.backends.numpy import parallel
    from edgeinfer.backends.numpy.kernels.fused import apply_activation

    source = np.random.default_rng(0).standard_normal((128, 1024), dtype=np.float32)
    block = source.copy()
    runs = {}
    for chunks in (2, 4, 8):
        ranges = parallel.split(128, chunks)
        for count in (1, 2):
            def run(ranges=ranges, count=count) -> None:
                np.copyto(block, source)  # fresh values: GELU applied again and again reaches denormals
                with parallel.use_workers(count):
                    parallel.parallel_for(len(ranges), lambda i: apply_activation(block[slice(*ranges[i])], "Gelu", ()))
            runs[f"{chunks} chunks, {count} thread(s)"] = run
    times = time_interleaved(runs, rounds=calls * 5, warmup=5, block=5)
    return {f"GELU 128x1024 us, {name}": round(statistics.median(samples) * 1e6, 1) for name, samples in times.items()}


EFFECTS = {"interleave": interleave, "scaling": scaling, "split": split, "concurrent": concurrent,
           "switch": switch, "variance": variance, "pinning": pinning, "blas": blas, "ufunc_threads": ufunc_threads}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="+", choices=list(EFFECTS), default=list(EFFECTS))
    parser.add_argument("--calls", type=int, default=40, help="timed calls per contender")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    results: dict[str, Any] = {"machine": machine_facts()}
    for name in args.only:
        start = time.perf_counter()
        results[name] = EFFECTS[name](args.calls)
        print(f"{name} ({time.perf_counter() - start:.0f} s): {json.dumps(results[name])}", flush=True)
    if args.json:
        atomic_write_bytes(args.json, json.dumps(results, indent=1, default=str).encode())


if __name__ == "__main__":
    main()
