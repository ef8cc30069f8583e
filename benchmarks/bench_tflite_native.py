"""TFLite corpus models against LiteRT on their original file (issue 22).

For every ``.tflite`` model of the real-model corpus (``tests/real/models_tflite.py``): the
conversion time, the operator count of the original file and of edgeinfer's re-export, and
the median latency of LiteRT on the original file, LiteRT on the re-exported file, the
edgeinfer ``tflite`` backend and ``backend="auto"``, timed interleaved in one process
(``edgeinfer.timing.time_engines``), batch 1, the same thread count everywhere. Ratios are
against LiteRT on the original file; the last row is their geometric mean.

    python benchmarks/bench_tflite_native.py [--threads 2] [--calls 20] [--only face_detection]
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
from edgeinfer.converters.tflite.reader import read_model  # noqa: E402
from edgeinfer.timing import time_engines  # noqa: E402
from tests.real.models_tflite import MODELS  # noqa: E402


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


def operator_count(path: str) -> int:
    return sum(Counter(op.opcode for op in read_model(Path(path).read_bytes()).subgraphs[0].operators).values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--only", default="", help="substring of the model ids to run")
    args = parser.parse_args()
    rows, ratios = [], {"tflite": [], "auto": [], "re-export": []}
    header = (f"{'model':40s} {'convert s':>9s} {'ops':>4s} {'re-ops':>6s} {'LiteRT ms':>9s} "
              f"{'re-export':>9s} {'tflite':>7s} {'auto':>7s}  auto picked")
    print(header)
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
            with ei.Session(model, backend="tflite", threads=args.threads) as tfl, \
                    ei.Session(model, backend="auto", threads=args.threads, cache=False) as auto:
                runs = {"native": litert_runner(path, feeds, args.threads),
                        "re-export": litert_runner(exported, feeds, args.threads),
                        "tflite": lambda s=tfl, f=named: s.run(f), "auto": lambda s=auto, f=named: s.run(f)}
                times = time_engines(runs, calls=args.calls, warmup=2)
                picked = ",".join(f"{k}:{v}" for k, v in auto.plan.node_counts().items())
            median = {name: float(np.median(samples)) for name, samples in times.items()}
            base = median["native"]
            for name in ratios:
                ratios[name].append(median[name] / base)
            rows.append(entry.id)
            print(f"{entry.id:40s} {convert_s:9.2f} {operator_count(path):4d} {operator_count(exported):6d} "
                  f"{base * 1e3:9.2f} {median['re-export'] / base:8.2f}x {median['tflite'] / base:6.2f}x "
                  f"{median['auto'] / base:6.2f}x  {picked}", flush=True)
    if rows:
        geo = {name: math.exp(np.mean(np.log(values))) for name, values in ratios.items()}
        print(f"{'geomean':40s} {'':9s} {'':4s} {'':6s} {'':9s} {geo['re-export']:8.2f}x {geo['tflite']:6.2f}x "
              f"{geo['auto']:6.2f}x")


if __name__ == "__main__":
    main()
