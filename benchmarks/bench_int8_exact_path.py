"""INT8 on CPUs whose u8 x s8 kernels saturate: what the exact paths cost, and what 7-bit weights buy.

For MobileNetV2 and ResNet-50 (``devkit.zoo``) at batch 1, edgeinfer's static INT8 model
(QDQ, per-channel int8 weights, uint8 activations), lowered as the onnxruntime backend lowers
it, run by raw onnxruntime sessions in one process, timed in interleaved rounds:

- ``fp32``: the float model (edgeinfer's passes applied);
- ``native``: int8 weights as quantized: onnxruntime's u8 x s8 kernels (exact only with VNNI;
  ``saturation`` below says how far they are off here);
- ``rewrite``: int8 weights as uint8 with zero point + 128 (``int8.exact_weights``, what the
  backend does where the probe saturates): u8 x u8 kernels, exact on every CPU;
- ``option``: onnxruntime's ``session.x64quantprecision=1`` (its own s8 -> u8 weight rewrite,
  effective at optimization level extended/all, and on x86 only);
- ``7bit``: ``reduce_range=True`` weights on the native kernels, exact on every CPU.

With ``--engine openvino``, the same model through the OpenVINO backend's executables:
``fp32``, ``native``, ``rewrite`` (``exact_weights(..., int8_activations=True)``, what the
OpenVINO backend does where its probe saturates: the rewritten nodes run float32 kernels),
``lpt_off`` (OpenVINO's internal ``LP_TRANSFORMS_MODE=False``: the whole model float) and ``7bit``.

Printed per model: median ms, speed against fp32, output SQNR against fp32, and the largest
difference between the ``rewrite`` and ``option`` outputs ("equal results"), and between
``native`` and ``rewrite`` (zero where the native kernels are exact). On a CPU with VNNI the
native kernels do not saturate and ``rewrite``/``option`` show what the exact path costs on
one without (onnxruntime applies the option there too: its check is that its u8 x u8 and
u8 x s8 dispatches differ, which they do on every x86 CPU). Usage::

    python benchmarks/bench_int8_exact_path.py [--models mobilenet_v2 resnet50] [--size 160]
        [--threads 2] [--rounds 15] [--calibration 4] [--engine onnxruntime|openvino] [--json results.json]
"""

from __future__ import annotations

import argparse
import functools
import json
import platform
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: devkit/ is not installed

import edgeinfer as ei
from devkit import zoo
from edgeinfer.backends.onnxruntime import int8
from edgeinfer.backends.onnxruntime.lowerings import lower_graph
from edgeinfer.ir.onnx_io import graph_to_model
from edgeinfer.quantize.static import calibrate, quantize_static
from edgeinfer.timing import time_interleaved

MODELS = {"mobilenet_v2": zoo.mobilenet_v2, "resnet50": zoo.resnet50}
VARIANTS = ("fp32", "native", "rewrite", "option", "7bit")
OPENVINO_VARIANTS = ("fp32", "native", "rewrite", "lpt_off", "7bit")


def session(graph: ei.Graph, threads: int, config: dict[str, str] | None = None) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3
    for key, value in (config or {}).items():
        options.add_session_config_entry(key, value)
    model = graph_to_model(graph)
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def sqnr_db(reference: np.ndarray, got: np.ndarray) -> float:
    noise = float(np.sum((reference.astype(np.float64) - got) ** 2))
    return float("inf") if noise == 0 else 10 * np.log10(float(np.sum(reference.astype(np.float64) ** 2)) / noise)


def openvino_runner(graph: ei.Graph, threads: int, config: dict[str, Any] | None = None) -> Any:
    """``run(None, feeds)`` on the OpenVINO backend's executable, as an onnxruntime session is called."""
    from edgeinfer.backend import CompileOptions
    from edgeinfer.backends.openvino.backend import OpenVinoBackend

    executable = OpenVinoBackend(device="cpu", config=config or {}).compile(graph, CompileOptions(threads=threads))
    return lambda _, feeds: list(executable.run(feeds).values())


def bench_model(name: str, *, size: int, threads: int, rounds: int, calibration: int,
                engine: str = "onnxruntime") -> dict[str, Any]:
    proto = MODELS[name](size=size)
    samples = [zoo.example_inputs(proto, seed=seed) for seed in range(1, calibration + 1)]
    fp32 = ei.convert(proto, optimize=2)
    calibrated = calibrate(fp32, samples)
    full = quantize_static(fp32, calibrated, method="minmax").graph
    seven = quantize_static(fp32, calibrated, method="minmax", reduce_range=True).graph
    if engine == "openvino":  # the backend lowers the graph itself; its exact path also rewrites under int8 activations
        variants = OPENVINO_VARIANTS
        rewritten, labels = int8.exact_weights(full, int8_activations=True)
        runs = {"fp32": openvino_runner(fp32.graph, threads), "native": openvino_runner(full, threads),
                "rewrite": openvino_runner(rewritten, threads),
                "lpt_off": openvino_runner(full, threads, {"LP_TRANSFORMS_MODE": False}),
                "7bit": openvino_runner(seven, threads)}
    else:
        variants = VARIANTS
        full, seven = lower_graph(full), lower_graph(seven)
        rewritten, labels = int8.exact_weights(full)
        runs = {k: s.run for k, s in {"fp32": session(lower_graph(fp32.graph), threads), "native": session(full, threads),
                                      "rewrite": session(rewritten, threads),
                                      "option": session(full, threads, {"session.x64quantprecision": "1"}),
                                      "7bit": session(seven, threads)}.items()}
    checks = [zoo.example_inputs(proto, seed=1000 + i) for i in range(3)]
    outputs = {k: np.concatenate([run(None, f)[0] for f in checks]) for k, run in runs.items()}
    feeds = checks[0]
    times = time_interleaved({k: functools.partial(run, None, feeds) for k, run in runs.items()},
                             rounds=rounds, warmup=2)
    median = {k: float(np.median(v)) * 1000 for k, v in times.items()}
    other = variants[3]  # the engine's other exact path: onnxruntime's option, OpenVINO without its LPT
    return {"model": name, "engine": engine, "size": size, "threads": threads, "rounds": rounds,
            "rewritten_weights": len(labels), "variants": list(variants),
            "median_ms": median, "speed_vs_fp32": {k: median["fp32"] / median[k] for k in variants},
            "sqnr_db_vs_fp32": {k: sqnr_db(outputs["fp32"], outputs[k]) for k in variants},
            f"rewrite_vs_{other}_max_abs": float(np.abs(outputs["rewrite"] - outputs[other]).max()),
            "saturation_max_abs": float(np.abs(outputs["native"] - outputs["rewrite"]).max())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--size", type=int, default=160, help="input height and width")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calibration", type=int, default=4, help="calibration samples per model")
    parser.add_argument("--engine", choices=("onnxruntime", "openvino"), default="onnxruntime")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    print(f"{platform.machine()}, onnxruntime {ort.__version__}: probe {int8.probe_value()} "
          f"(exact {int8.EXACT_PRODUCT}), integer path here: {int8.integer_path()}")
    results = []
    for name in args.models:
        r = bench_model(name, size=args.size, threads=args.threads, rounds=args.rounds, calibration=args.calibration,
                        engine=args.engine)
        results.append(r)
        print(f"\n{name} {args.size}x{args.size} (batch 1, {args.threads} thread(s), {args.rounds} interleaved "
              f"rounds, medians; {r['rewritten_weights']} weights rewritten)")
        for variant in r["variants"]:
            print(f"  {variant:8s} {r['median_ms'][variant]:8.2f} ms  x{r['speed_vs_fp32'][variant]:5.2f} vs fp32  "
                  f"SQNR {r['sqnr_db_vs_fp32'][variant]:6.1f} dB")
        med, other = r["median_ms"], r["variants"][3]
        print(f"  exact path cost: rewrite x{med['rewrite'] / med['native']:.2f}, {other} "
              f"x{med[other] / med['native']:.2f} of native latency; rewrite vs {other} outputs differ by at most "
              f"{r[f'rewrite_vs_{other}_max_abs']:.3g}; native vs exact by {r['saturation_max_abs']:.3g}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
