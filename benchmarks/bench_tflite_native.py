"""TFLite corpus models against LiteRT on their original file (issue 22).

For every ``.tflite`` model of the real-model corpus (``tests/real/models_tflite.py``): the
conversion time, the operator count of the original file and of edgeinfer's re-export (and
which operators differ: ``RELU -17`` is an activation the re-export fuses into its producer,
``DENSIFY`` a sparse weight stored dense, ``PAD`` a padding folded into the convolution,
``CUSTOM`` MediaPipe's transposed convolution written as the builtin ``TRANSPOSE_CONV``), the
XNNPACK delegate partitions LiteRT makes of each file, and the median latency of LiteRT on the
original file, LiteRT on the re-exported file, the edgeinfer ``tflite`` backend and
``backend="auto"``, timed interleaved in one process (``edgeinfer.timing.time_engines``),
batch 1, the same thread count everywhere. Ratios are against LiteRT on the original file,
each the median of ``--rounds`` rounds' ratios (min-max after it), then the ratio of the two
contenders' fastest calls over all rounds (other processes only add time, so on a loaded
machine that is the steadier estimate of the engines' own difference); the last row is their
geometric means.

Targets of issue 22: re-export operators = the original's except the ones fused differently
(*ops ok*), re-export latency within 5% of the original's, conversion < 2 s.

    python benchmarks/bench_tflite_native.py [--threads 2] [--calls 20] [--rounds 3] [--only face_detection]
    python benchmarks/bench_tflite_native.py --threads 1 --cpu-time   # calls timed by this thread's CPU time

``--cpu-time`` (one thread: LiteRT then computes on the calling thread) leaves out the time other
processes hold the core, for a loaded machine; a contender computing on threads of its own
(OpenVINO, if auto picks it) is marked ``off-thread``, its ratio not comparable.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import edgeinfer as ei  # noqa: E402
from benchmarks.bench_real import thread_times  # noqa: E402
from edgeinfer.converters.tflite.reader import read_model  # noqa: E402
from edgeinfer.timing import time_engines  # noqa: E402
from tests.real.models_tflite import MODELS  # noqa: E402

# Operators a re-export may have fewer of than the original, because it computes them otherwise:
# activations fused into their producer, sparse weights stored dense, paddings folded into the
# convolution, MediaPipe's custom transposed convolution as the builtin TRANSPOSE_CONV.
FUSED_DIFFERENTLY = {"RELU", "RELU6", "RELU_N1_TO_1", "DENSIFY", "PAD", "CUSTOM"}
WRITTEN_FOR = {"TRANSPOSE_CONV": "CUSTOM"}  # a re-export operator that stands for an original one


def litert_runner(path: str, feeds: list[np.ndarray], threads: int):
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=path, num_threads=threads)
    interpreter.allocate_tensors()
    inputs = [d["index"] for d in interpreter.get_input_details()]
    outputs = [d["index"] for d in interpreter.get_output_details()]

    def run():
        for index, value in zip(inputs, feeds):
            interpreter.set_tensor(index, value)
        interpreter.invoke()
        return [interpreter.get_tensor(i) for i in outputs]

    return run


def operators(path: str) -> Counter:
    return Counter(op.opcode for op in read_model(Path(path).read_bytes()).subgraphs[0].operators)


def delegate_partitions(path: str, threads: int) -> int:
    """How many XNNPACK delegate nodes LiteRT's default interpreter makes of the file (1: the
    whole graph in one; more: operators XNNPACK left to the builtin kernels split it)."""
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=path, num_threads=threads)
    interpreter.allocate_tensors()
    return sum(op["op_name"] == "DELEGATE" for op in interpreter._get_ops_details())


def operator_diff(original: Counter, again: Counter) -> tuple[str, bool]:
    """The operators whose counts differ (``RELU -17``) and whether every difference is one the
    re-export fuses differently (fewer of ``FUSED_DIFFERENTLY``, their builtin replacements)."""
    diff = {op: again.get(op, 0) - original.get(op, 0) for op in set(original) | set(again)}
    diff = {op: d for op, d in sorted(diff.items()) if d}
    ok = all((op in FUSED_DIFFERENTLY and d < 0) or
             (op in WRITTEN_FOR and 0 < d <= -diff.get(WRITTEN_FOR[op], 0)) for op, d in diff.items())
    return " ".join(f"{op} {d:+d}" for op, d in diff.items()) or "same", ok


def geomean(values: list[float]) -> float:
    return math.exp(float(np.mean(np.log(values))))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--calls", type=int, default=20, help="timed calls per contender per round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of interleaved timing (ratios: their median)")
    parser.add_argument("--only", default="", help="substring of the model ids to run")
    parser.add_argument("--cpu-time", action="store_true", help="time calls by this thread's CPU time (--threads 1)")
    args = parser.parse_args()
    if args.cpu_time and args.threads != 1:
        parser.error("--cpu-time needs --threads 1")
    names = ("re-export", "tflite", "auto")
    ratios: dict[str, list[float]] = {name: [] for name in names}
    fastest_ratios: dict[str, list[float]] = {name: [] for name in names}
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"{'model':40s} {'convert s':>9s} {'ops':>4s} {'re-ops':>6s} {'ops ok':>6s} {'xnnpack':>7s} "
          f"{'LiteRT ms':>9s} {'re-export':>22s} {'tflite':>22s} {'auto':>22s}  auto picked; operators that differ")
    with tempfile.TemporaryDirectory() as tmp:
        for entry in MODELS:
            if args.only not in entry.id:
                continue
            path = str(entry.source())
            feeds = [np.ascontiguousarray(f) for f in entry.feeds()]
            start = time.perf_counter()
            model = ei.convert(path)
            convert_s = time.perf_counter() - start
            exported = os.path.join(tmp, entry.id.replace("/", "_") + ".tflite")
            ei.export(model, exported)
            named = dict(zip([i.name for i in model.inputs], feeds))
            original_ops, again_ops = operators(path), operators(exported)
            differ, ops_ok = operator_diff(original_ops, again_ops)
            partitions = f"{delegate_partitions(path, args.threads)}/{delegate_partitions(exported, args.threads)}"
            rounds: dict[str, list[float]] = {name: [] for name in names}
            fastest: dict[str, float] = {}  # each contender's fastest call over all rounds
            base_ms = []
            with ei.Session(model, backend="tflite", threads=args.threads) as tfl, \
                    ei.Session(model, backend="auto", threads=args.threads,
                               options=ei.AutoOptions(cache=False)) as auto:
                runs = {"native": litert_runner(path, feeds, args.threads),
                        "re-export": litert_runner(exported, feeds, args.threads),
                        "tflite": lambda s=tfl, f=named: s.run(f), "auto": lambda s=auto, f=named: s.run(f)}
                shares: dict[str, float] = {}
                for _ in range(args.rounds):
                    times = (thread_times(runs, calls=args.calls, warmup=2, shares=shares) if args.cpu_time
                             else time_engines(runs, calls=args.calls, warmup=2))
                    base = float(np.median(times["native"]))
                    base_ms.append(base * 1e3)
                    for name in names:
                        rounds[name].append(float(np.median(times[name])) / base)
                    for name, samples in times.items():
                        fastest[name] = min(fastest.get(name, math.inf), min(samples))
                picked = ",".join(f"{k}:{v}" for k, v in auto.plan.node_counts().items())
            cells = []
            for name in names:
                ratios[name].append(float(np.median(rounds[name])))
                fastest_ratios[name].append(fastest[name] / fastest["native"])
                cells.append(f"{np.median(rounds[name]):.2f}x ({min(rounds[name]):.2f}-{max(rounds[name]):.2f}) "
                             f"{fastest[name] / fastest['native']:.2f}x"
                             + (" off-thread" if shares.get(name, 1.0) < 0.5 else ""))
            print(f"{entry.id:40s} {convert_s:9.2f} {sum(original_ops.values()):4d} {sum(again_ops.values()):6d} "
                  f"{'yes' if ops_ok else 'NO':>6s} {partitions:>7s} {np.median(base_ms):9.2f} "
                  f"{cells[0]:>22s} {cells[1]:>22s} {cells[2]:>22s}  {picked}; {differ}", flush=True)
    if ratios["auto"]:
        print(f"{'geomean':40s} {'':9s} {'':4s} {'':6s} {'':6s} {'':7s} {'':9s} "
              + " ".join(f"{geomean(ratios[name]):15.2f}x {geomean(fastest_ratios[name]):5.2f}x" for name in names))
    print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
