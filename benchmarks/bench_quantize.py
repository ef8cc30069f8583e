"""INT8 post-training quantization: latency on onnxruntime and accuracy on real data.

For MobileNetV2 and ResNet-50 (``devkit.zoo``, realistic BatchNorm statistics) at batch 1,
in one run, with the same thread count and on the onnxruntime backend:

- ``fp32``: the converted model without optimization passes;
- ``fp32-opt``: the same after edgeinfer's passes (level 2: BN folding, activation fusion);
- ``ei-int8``: edgeinfer's static INT8 model (QDQ, per-channel weights, uint8 activations);
- ``ort-int8``: the model quantized by ``onnxruntime.quantization.quantize_static`` (QDQ,
  per-channel, uint8 activations, int8 weights, its default MinMax calibration), given the
  BN-folded fp32 graph and the same calibration samples.

Outputs are checked to be non-degenerate (they vary across inputs) and each variant's SQNR
against fp32 is printed. Variants are timed in interleaved rounds (order alternating) and
compared by median. Then a CNN trained on scikit-learn's digits (tests/quantize/digits_model.py)
gives top-1 accuracy on the held-out split for fp32, edgeinfer int8 (every method) and
quantize_static. Usage::

    python benchmarks/bench_quantize.py [--models mobilenet_v2 resnet50] [--threads 1]
        [--rounds 15] [--calibration 8] [--json results.json]
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: devkit/ is not installed

import edgeinfer as ei
from devkit import zoo
from edgeinfer.ir.onnx_io import graph_to_model
from edgeinfer.quantize.methods import CALIBRATION_METHODS
from edgeinfer.quantize.static import DEFAULT_METHOD, calibrate, quantize_static
from edgeinfer.timing import time_interleaved

MODELS = {"mobilenet_v2": lambda: zoo.mobilenet_v2(size=224), "resnet50": lambda: zoo.resnet50(size=224)}
TARGET_SPEEDUP = {"mobilenet_v2": 2.0, "resnet50": 2.5}
VARIANTS = ("fp32", "fp32-opt", "ei-int8", "ort-int8")


def ort_quantize_static(model: ei.Model, samples: list[dict[str, np.ndarray]], folder: Path) -> ei.Model:
    """onnxruntime's quantize_static (QDQ, per-channel, U8S8) of ``model``'s graph."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.samples = iter(samples)

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.samples, None)

    source, target = folder / "fp32.onnx", folder / "ort_int8.onnx"
    onnx.save(graph_to_model(model.graph), source)
    logging.getLogger().setLevel(logging.ERROR)  # its advice to run pre-processing
    quantize_static(str(source), str(target), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    return ei.convert(target, optimize=0)


def sqnr_db(reference: np.ndarray, got: np.ndarray) -> float:
    noise = float(np.sum((reference.astype(np.float64) - got) ** 2))
    return float("inf") if noise == 0 else 10 * np.log10(float(np.sum(reference.astype(np.float64) ** 2)) / noise)


def bench_model(name: str, *, threads: int, rounds: int, calibration: int) -> dict[str, Any]:
    proto = MODELS[name]()
    samples = [zoo.example_inputs(proto, seed=seed) for seed in range(1, calibration + 1)]
    optimized = ei.convert(proto, optimize=2)
    started = time.perf_counter()
    int8 = quantize_static(optimized, calibrate(optimized, samples))
    quantize_s = time.perf_counter() - started
    with tempfile.TemporaryDirectory() as folder:
        ort_int8 = ort_quantize_static(ei.convert(proto, optimize=1), samples, Path(folder))
    models = {"fp32": ei.convert(proto, optimize=0), "fp32-opt": optimized, "ei-int8": int8, "ort-int8": ort_int8}
    sessions = {k: ei.Session(m, backend="onnxruntime", threads=threads) for k, m in models.items()}
    checks = [zoo.example_inputs(proto, seed=1000 + i) for i in range(4)]
    outputs = {k: [s.run(f)["logits"] for f in checks] for k, s in sessions.items()}
    reference = np.concatenate(outputs["fp32"])
    spread = float(reference.std(axis=0).mean())
    if spread < 1e-3 or not np.isfinite(reference).all():
        raise SystemExit(f"{name}: degenerate fp32 outputs (std across inputs {spread:.3g}); not timing")
    quality = {k: sqnr_db(reference, np.concatenate(v)) for k, v in outputs.items()}
    feeds = checks[0]
    times = time_interleaved({variant: functools.partial(sessions[variant].run, feeds) for variant in VARIANTS},
                             rounds=rounds, warmup=2)
    median = {k: float(np.median(v)) * 1000 for k, v in times.items()}
    return {"model": name, "threads": threads, "rounds": rounds, "median_ms": median,
            "sqnr_db_vs_fp32": quality, "output_std_across_inputs": spread, "edgeinfer_quantize_s": quantize_s,
            "speedup_vs_fp32": {k: median["fp32"] / median[k] for k in VARIANTS}}


def digits_accuracy() -> dict[str, float]:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "quantize"))
    from digits_model import digits_task, top1

    task = digits_task()
    batches = [{"image": task.train_x[i:i + 64]} for i in range(0, 512, 64)]
    optimized = ei.convert(task.model, optimize=2)
    calibration = calibrate(optimized, batches)

    def accuracy(model: ei.Model) -> float:
        return top1(ei.Session(model, backend="onnxruntime").run({"image": task.test_x})["logits"], task.test_y)

    result = {"fp32": accuracy(optimized)}
    for method in sorted(CALIBRATION_METHODS):
        result[f"ei-int8 {method}"] = accuracy(quantize_static(optimized, calibration, method=method))
    with tempfile.TemporaryDirectory() as folder:
        result["ort-int8 minmax"] = accuracy(ort_quantize_static(ei.convert(task.model, optimize=1), batches,
                                                                 Path(folder)))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calibration", type=int, default=8, help="calibration samples per model")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    results = []
    for name in args.models:
        r = bench_model(name, threads=args.threads, rounds=args.rounds, calibration=args.calibration)
        results.append(r)
        med, speed, quality = r["median_ms"], r["speedup_vs_fp32"], r["sqnr_db_vs_fp32"]
        print(f"\n{name} (batch 1, {args.threads} thread(s), {args.rounds} interleaved rounds, medians)")
        for variant in VARIANTS:
            print(f"  {variant:9s} {med[variant]:8.2f} ms  x{speed[variant]:5.2f} vs fp32  "
                  f"SQNR {quality[variant]:6.1f} dB")
        print(f"  ei-int8 vs ort-int8: x{med['ort-int8'] / med['ei-int8']:.2f} (>= 1 means edgeinfer is faster); "
              f"fp32-opt vs fp32: x{speed['fp32-opt']:.2f}; target ei-int8 >= x{TARGET_SPEEDUP[name]}: "
              f"{'met' if speed['ei-int8'] >= TARGET_SPEEDUP[name] else 'NOT met'}")
    accuracy = digits_accuracy()
    print(f"\ndigits top-1 on the held-out split (default method: {DEFAULT_METHOD})")
    for key, value in accuracy.items():
        print(f"  {key:22s} {value:6.2f} %")
    if args.json:
        args.json.write_text(json.dumps({"models": results, "digits_top1": accuracy}, indent=2))


if __name__ == "__main__":
    main()
