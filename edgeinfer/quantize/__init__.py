"""Post-training quantization: static INT8 (calibrated QDQ), dynamic INT8, FP16 weights.

    import edgeinfer as ei
    from edgeinfer.quantize import quantize
    int8 = quantize(ei.convert("model.onnx", optimize=2), "calib_images/", method="mse",
                    mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))
    int8.save("model.int8.eim")

Modules: ``histogram`` (one histogram per tensor), ``methods`` (minmax, percentile, entropy,
mse), ``data`` (calibration sources), ``calibrate`` (the float run), ``rules`` + ``qdq`` (the
QDQ inserter), ``static``, ``dynamic``, ``fp16``, ``sensitivity`` (per-layer sensitivity,
accuracy budget), ``report`` (per-layer SQNR/cosine, PNG plot), ``cli`` (click commands).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from edgeinfer.errors import InputError
from edgeinfer.model import Model
from edgeinfer.progress import Steps
from edgeinfer.quantize.dynamic import quantize_dynamic
from edgeinfer.quantize.fp16 import fp16_weights
from edgeinfer.quantize.guard import DEFAULT_QUALITY_FLOOR_DB, MIN_SQNR_DB
from edgeinfer.quantize.methods import CALIBRATION_METHODS
from edgeinfer.quantize.static import (
    DEFAULT_METHOD,
    FLOAT_WEIGHTS,
    Calibration,
    calibrate,
    int8_weights_only,
    quantize_static,
)

WEIGHT_ROUNDINGS = ("nearest", "gptq")

MODES = ("static", "dynamic", "weight_only")
WEIGHT_FORMATS = ("int8", "int4", "fp16")


def quantize(model: Model, calibration_data: Any = None, method: str = DEFAULT_METHOD, *,
             mode: str = "static", weights: str = "int8", activations: str = "uint8",
             per_channel: bool = True, exclude: Iterable[str] = (), random_samples: int = 0,
             limit: int | None = None, backend: str | None = None, progress: Steps | None = None,
             size: Sequence[int] | None = None, mean: Sequence[float] | None = None,
             std: Sequence[float] | None = None, max_accuracy_drop: float | None = None,
             evaluation: tuple[Any, Any] | Callable[[Model], float] | None = None,
             reduce_range: bool = False, block_size: int = 32, zero_points: bool = False,
             quantize_outputs: bool = False, equalize: bool = False, min_sqnr: float | None = None,
             layout: str | None = None, bias_correction: bool = False, float_weights: str | None = None,
             weight_rounding: str | None = None, quality_floor: float | None = DEFAULT_QUALITY_FLOOR_DB) -> Model:
    """Quantize ``model``.

    - ``weights="int8"``, ``mode="static"``: calibrate on ``calibration_data`` (samples, a
      folder of .npy/.npz files or images, or None with ``random_samples`` > 0, which warns)
      and insert QDQ with ranges from ``method`` (one of minmax, percentile, entropy, mse).
      Images are resized to ``size``, normalized by ``mean``/``std`` and laid out as ``layout``
      ("NCHW" or "NHWC"; default: guessed from where the input has 3 channels).
    - ``mode="dynamic"``: int8 MatMul/Gemm weights, activations quantized at run time.
    - ``weights="fp16"``: float16 weight storage, float compute; no calibration.
    - ``mode="weight_only"`` (implied by ``weights="int4"``): int4 or int8 MatMul/Gemm weights
      in blocks of ``block_size`` along K with a scale (and with ``zero_points`` a zero point)
      per block, float compute (onnxruntime's MatMulNBits); for big models, no calibration.
      The weights are streamed one at a time in slabs (a mapped model's float weights are
      never resident at once).

    ``progress`` (an ``edgeinfer.progress.Steps``) is told each long step: calibration in
    samples, weight-only quantization in float bytes. Nothing here prints; the command line
    renders it. Every Session opened on the way (calibration, GPTQ, the quality guard,
    per-layer errors, sensitivity) is closed before this returns.

    With ``max_accuracy_drop`` and ``evaluation`` (``(inputs, labels)`` for top-1 accuracy in
    percent, or a callable ``model -> metric``), the most sensitive layers stay float until
    the metric is within the budget of fp32 (static mode).

    ``activations="float"`` (static int8): weight-only INT8 for any network
    (``static.int8_weights_only``): every layer float, every Conv/ConvTranspose/Gemm/MatMul
    weight int8 with one scale per output channel (GPTQ-rounded on the calibration samples by
    default), its bias corrected for the rounding's mean shift and stored as float16 values, as
    are PReLU slopes; about a quarter of the float32 file, the float model's compute and speed.
    The layers in ``exclude`` keep float32 weights. Where INT8 activations cost a task too much
    and its file must stay small (RapidOCR's orientation classifier: 0.28x fp32 for an
    orientation probability within 1% of fp32's, ``benchmarks/bench_int8_real.py --variants
    weights_only``). Not with ``min_sqnr``, ``max_accuracy_drop``, ``bias_correction``,
    ``quantize_outputs`` (no activation is quantized), ``reduce_range`` (no integer kernel to
    spare) or ``per_channel=False``.

    ``reduce_range=True`` (static and dynamic int8) stores 7-bit weights (-63..63) in int8: the
    trade of speed for accuracy on x86 CPUs without VNNI. There onnxruntime's fast uint8 x int8
    kernels add pairs of products in int16 and saturate on full-range weights, so edgeinfer's
    onnxruntime backend computes those exactly with uint8 weights instead, at 1.3-1.45x the INT8
    latency (issue 21's AVX2 measurement); 7-bit weights cannot saturate and keep the fast
    kernels, exactly, for one bit of weight precision (1.0-2.4 dB output SQNR on MobileNetV2 and
    ResNet-50, ``benchmarks/bench_int8_exact_path.py``). Elsewhere (VNNI, ARM) it only costs the bit.

    ``equalize=True`` (static) first applies cross-layer equalization (``equalize.py``: per-channel
    scales moved between a layer's output channels and the next Conv's input channels, the same
    function in float) with channel ranges measured on the first calibration samples.

    ``min_sqnr`` (dB, static): mixed precision to a task-agnostic target. The layers adding the
    most noise stay float until every output's SQNR against fp32 on the first calibration samples
    reaches ``min_sqnr`` (``sensitivity.quantize_to_sqnr``); which layers, and why, is in the
    model's ``quantization`` metadata under ``mixed_precision``. A target not reached warns.

    ``float_weights`` (static): how the Conv/ConvTranspose/Gemm/MatMul weights of the layers kept
    float are stored: ``"int8"`` (rounded to int8 with one scale per output channel, float
    compute, int8 bytes in the file: a mixed-precision model stays near the INT8 size) or
    ``"float32"``. Default: int8 for the layers ``min_sqnr`` or ``max_accuracy_drop`` keep float
    (their search measures with the rounded weights), float32 for those named in ``exclude``
    alone.

    ``quality_floor`` (dB, static, default ``DEFAULT_QUALITY_FLOOR_DB``): the default guard. Plain
    INT8 is measured against fp32 on held-out samples, every output (and every part of an output
    that concatenates parts of different magnitude, as a detector's boxes and class scores);
    where one falls below the floor, the quantizer escalates by itself to the mixed precision
    that ``min_sqnr=quality_floor`` gives (GPTQ-rounded weights, the noisiest layers kept float
    on int8-stored weights), warns once (``QuantizationEscalationWarning``) with which layers
    stayed float and what they cost in file size and in the share of FLOPs left float, and
    records it in the ``quantization`` metadata under ``escalated``. ``None`` keeps plain INT8
    whatever its quality (the guard still warns below ``guard.MIN_SQNR_DB``). Not with
    ``bias_correction`` or ``quantize_outputs``, which ask for plain INT8.

    ``bias_correction=True`` (static): each quantized Conv/ConvTranspose/Gemm bias is corrected for
    the mean shift INT8 adds to its output channels (``bias_correction.py``, Nagel et al.'s
    empirical bias correction), measured layer after layer on the first ``BIAS_CORRECTION_SAMPLES``
    calibration samples (none of the held-out ones); the same bytes. Not with ``min_sqnr`` or
    ``max_accuracy_drop``. Off by default: on the corpus models (``benchmarks/bench_int8_real.py
    --variants bc``) it raised YOLOv8n and PP-OCRv4 det but lowered the MediaPipe face models
    with 8 calibration samples (README, "Mixed precision").

    ``weight_rounding="gptq"`` (static): the Conv/Gemm/MatMul weights are rounded to the same
    int8 grid by GPTQ (``gptq.py``; Frantar et al. 2023) instead of to the nearest step: column
    by column, each rounding error compensated in the columns left through the inverse Hessian
    of the layer's inputs on the first ``GPTQ_SAMPLES`` calibration samples, so that the layer's
    output moves least. The same bytes; the quantized and the int8-stored float layers alike (a
    layer kept with float32 weights gets the float model's). Default (None): ``"gptq"`` with
    ``min_sqnr`` and per-channel weights, ``"nearest"`` otherwise. Measured on the five corpus
    vision models (``benchmarks/bench_int8_real.py --variants mixed mixed_nearest gptq``): with
    ``min_sqnr`` it met the task targets of the OCR pair and both face models on all four
    backends at 0.262-0.299x fp32 (YOLOv8n too since it is scored by mAP50 on 24 views: 0.998-0.999
    at 36 dB; the README's table), where nearest rounding needed wide
    weights for the OCR models and left the face detector at 0.988; for plain INT8 it moved the five models' worst-backend metrics by -0.014 (PP-OCRv4
    det) to +0.008 (the face detector), so nearest stays the default there.

    Every static quantization ends with the quality guard (``guard.py``): INT8 against fp32
    on held-out calibration samples, per output SQNR and cosine, in the model's
    ``quantization`` metadata; below 15 dB or 0.99 a ``QuantizationQualityWarning`` names the
    worst layers. The ops writing graph outputs stay float unless ``quantize_outputs``.
    """
    if isinstance(progress, bool):  # the old flag: a progress bar printed by the library
        if progress:
            warnings.warn("quantize(progress=True) is deprecated and shows nothing: library code never prints; "
                          "pass an edgeinfer.progress.Steps (edgeinfer.cli.progress.step_reporter renders one)",
                          DeprecationWarning, stacklevel=2)
        progress = None
    if weights not in WEIGHT_FORMATS:
        raise InputError(f"weights {weights!r}: expected one of {WEIGHT_FORMATS}")
    if weight_rounding is not None and (weight_rounding not in WEIGHT_ROUNDINGS or (
            weight_rounding != "nearest" and (mode != "static" or weights != "int8"))):
        raise InputError(f"weight_rounding={weight_rounding!r}: expected one of {WEIGHT_ROUNDINGS} "
                         f"(gptq with static int8 quantization; got mode={mode!r}, weights={weights!r})")
    if mode not in MODES:
        raise InputError(f"quantization mode {mode!r}: expected one of {MODES}")
    if not isinstance(model, Model):
        raise InputError(f"quantize: expected an edgeinfer Model, got {type(model).__name__}")
    if float_weights is not None and (float_weights not in FLOAT_WEIGHTS or mode != "static" or weights != "int8"):
        raise InputError(f"float_weights={float_weights!r}: expected one of {FLOAT_WEIGHTS}, with static int8 "
                         f"quantization (got mode={mode!r}, weights={weights!r})")
    weights_only = activations == "float"
    if weights_only:
        conflicts = {name: value for name, value, given in (
            ("min_sqnr", min_sqnr, min_sqnr is not None),
            ("max_accuracy_drop", max_accuracy_drop, max_accuracy_drop is not None),
            ("bias_correction", bias_correction, bias_correction), ("quantize_outputs", quantize_outputs, quantize_outputs),
            ("reduce_range", reduce_range, reduce_range), ("float_weights", float_weights, float_weights == "float32"),
            ("per_channel", per_channel, not per_channel)) if given}
        if mode != "static" or weights != "int8" or conflicts:
            raise InputError("activations='float' is weight-only static int8 (every layer float on int8 weights, one "
                             "scale per output channel): expected mode='static', weights='int8' and none of min_sqnr, "
                             "max_accuracy_drop, bias_correction, quantize_outputs, reduce_range, "
                             f"float_weights='float32', per_channel=False; got mode={mode!r}, weights={weights!r}"
                             + "".join(f", {name}={value!r}" for name, value in conflicts.items()))
    if weights == "fp16":
        return fp16_weights(model)
    if weights == "int4" or mode == "weight_only":
        if mode == "dynamic":
            raise InputError(f"weights={weights!r} with mode='dynamic': int4 weights are weight-only; "
                             "use mode='weight_only'")
        from edgeinfer.quantize.weight_only import quantize_weight_only

        return quantize_weight_only(model, bits=4 if weights == "int4" else 8, block_size=block_size,
                                    zero_points=zero_points, exclude=exclude,
                                    progress=progress)
    if mode == "dynamic":
        if calibration_data is not None:
            warnings.warn("dynamic quantization needs no calibration data; it is ignored", stacklevel=2)
        return quantize_dynamic(model, per_channel=per_channel, exclude=exclude, reduce_range=reduce_range)
    source = dict(random_samples=random_samples, size=size, mean=mean, std=std, layout=layout)
    if equalize:
        model = equalized(model, calibration_data, backend=backend, **source)
    calibration = calibrate(model, calibration_data, limit=limit, backend=backend, progress=progress,
                            hold_out=True, **source)
    searched = min_sqnr is not None or max_accuracy_drop is not None
    reference = calibration  # the guard's: its graph is the float model
    if weight_rounding is None:
        weight_rounding = "gptq" if (min_sqnr is not None or weights_only) and per_channel else "nearest"
    if weight_rounding == "gptq":
        if not per_channel:
            raise InputError("weight_rounding='gptq' rounds on one scale per output channel: expected "
                             "per_channel=True, found per_channel=False")
        from edgeinfer.quantize.gptq import GPTQ_SAMPLES, with_gptq_weights

        calibration = with_gptq_weights(calibration, calibration_feeds(
            calibration, calibration_data, min(GPTQ_SAMPLES, calibration.samples), **source),
            backend=backend, reduce_range=reduce_range)
    if weights_only:
        return guarded(int8_weights_only(model, calibration, float32_weights=exclude, method=method), reference, backend)
    float_weights = float_weights or ("int8" if searched else "float32")
    if bias_correction and searched:
        raise InputError("bias_correction applies to plain static quantization, not with min_sqnr or max_accuracy_drop")
    if min_sqnr is not None:
        if max_accuracy_drop is not None:
            raise InputError("min_sqnr and max_accuracy_drop are two targets for the same search: give one")
        from edgeinfer.quantize.sensitivity import quantize_to_sqnr

        result = quantize_to_sqnr(model, calibration, min_sqnr, feeds=sensitivity_feeds(calibration, calibration_data,
                                  **source), method=method, activations=activations, per_channel=per_channel,
                                  exclude=list(exclude), reduce_range=reduce_range, backend=backend,
                                  float_weights=float_weights)
        if not result.within_budget:
            warnings.warn(f"SQNR target {min_sqnr:g} dB not met: {result.final_metric:.1f} dB with "
                          f"{len(result.kept_float)} layers in float", stacklevel=2)
        return guarded(result.model, reference, backend)
    if max_accuracy_drop is None:
        correction = {}
        if bias_correction:
            from edgeinfer.quantize.bias_correction import BIAS_CORRECTION_SAMPLES

            correction = {"bias_correction": True, "backend": backend,
                          "bias_correction_feeds": calibration_feeds(calibration, calibration_data,
                                                                     min(BIAS_CORRECTION_SAMPLES, calibration.samples),
                                                                     **source)}
        escalate = quality_floor is not None and not bias_correction and not quantize_outputs
        plain = guarded(quantize_static(model, calibration, method=method, activations=activations,
                                        per_channel=per_channel, exclude=exclude, reduce_range=reduce_range,
                                        quantize_outputs=quantize_outputs, float_weights=float_weights,
                                        **correction),
                        reference, backend, warn=not escalate)
        worst = _worst_output(plain)
        if not escalate or worst is None or worst[1] >= quality_floor:
            if escalate and worst is not None and worst[1] < MIN_SQNR_DB:  # the warning guarded held back
                guarded(plain, reference, backend)
            return plain
        from edgeinfer.quantize.escalate import escalated

        return escalated(model, plain, calibration, reference, worst, quality_floor, data=calibration_data,
                         source=source, method=method, activations=activations, per_channel=per_channel,
                         exclude=list(exclude), reduce_range=reduce_range, backend=backend,
                         float_weights=float_weights or "int8")
    if evaluation is None:
        raise InputError("max_accuracy_drop needs a labelled evaluation set (evaluation=(inputs, labels))")
    from edgeinfer.quantize.sensitivity import quantize_within_budget, top1_metric

    metric = evaluation if callable(evaluation) else top1_metric(*evaluation, backend=backend)
    feeds = sensitivity_feeds(calibration, calibration_data, **source)
    result = quantize_within_budget(model, calibration, metric, max_accuracy_drop, feeds=feeds, method=method,
                                    activations=activations, per_channel=per_channel, exclude=list(exclude),
                                    reduce_range=reduce_range, backend=backend, float_weights=float_weights)
    if not result.within_budget:
        warnings.warn(f"accuracy budget {max_accuracy_drop} not met: fp32 {result.float_metric:.3f}, best "
                      f"{result.final_metric:.3f} with {len(result.kept_float)} layers in float", stacklevel=2)
    return guarded(result.model, reference, backend)


def _worst_output(quantized: Model) -> tuple[str, float] | None:
    """(output, SQNR dB) of the guard's worst output of ``quantized``, or None if unmeasured."""
    import json

    outputs = json.loads(quantized.metadata.get("quantization", "{}")).get("quality", {}).get("outputs", {})
    found = [(name, float(figures["sqnr_db"])) for name, figures in outputs.items()]
    return min(found, key=lambda item: item[1]) if found else None


def guarded(quantized: Model, calibration: Calibration, backend: str | None = None, *, warn: bool = True) -> Model:
    """``quantized`` with the quality guard's figures in its metadata (warning when poor,
    unless ``warn`` is False)."""
    import json

    from edgeinfer.quantize.guard import QuantizationSpeedWarning, check_quality, split_warning

    summary = json.loads(quantized.metadata.get("quantization", "{}"))
    slow = split_warning(quantized.graph, int(summary.get("layers", 0)))
    if slow is not None:
        warnings.warn(slow, QuantizationSpeedWarning, stacklevel=3)
    feeds = calibration.held_out or calibration.first
    if not feeds:
        return quantized
    layers = [node.name or node.outputs[0] for node in quantized.graph.nodes]
    report = check_quality(calibration.graph, quantized.graph, layers, feeds, held_out=bool(calibration.held_out),
                           backend=backend, warn=warn)
    summary["quality"] = report.summary()
    metadata = dict(quantized.metadata)
    metadata["quantization"] = json.dumps(summary, sort_keys=True)
    return Model(quantized.graph, metadata)


def equalized(model: Model, calibration_data: Any, *, backend: str | None = None, **source: Any) -> Model:
    """``model`` (prepared for quantization) after cross-layer equalization, with channel ranges
    from the first calibration samples; what was rescaled is in ``metadata["equalization"]``."""
    import json
    from itertools import islice

    from edgeinfer.quantize.data import open_source
    from edgeinfer.quantize.equalize import EQUALIZATION_SAMPLES, equalize
    from edgeinfer.quantize.static import prepare_graph

    graph = prepare_graph(model.graph)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # random data warns once, at calibration
        feeds = list(islice(open_source(calibration_data, graph, **source), EQUALIZATION_SAMPLES))
    graph, pairs = equalize(graph, feeds, backend=backend)
    metadata = dict(model.metadata)
    metadata["equalization"] = json.dumps({"pairs": len(pairs), "rescaled": [p.summary() for p in pairs]},
                                          sort_keys=True)
    return Model(graph, metadata)


def calibration_feeds(calibration: Calibration, calibration_data: Any, count: int, **source: Any) -> list:
    """The first ``count`` samples calibration used: every ``HOLD_OUT_EVERY``-th is skipped when
    calibration held samples out (those are the guard's, unseen by any fitting)."""
    from itertools import islice

    from edgeinfer.quantize.data import open_source
    from edgeinfer.quantize.guard import HOLD_OUT_EVERY

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # random data already warned once, at calibration
        samples = open_source(calibration_data, calibration.graph, **source)
        if calibration.held_out:
            samples = (s for i, s in enumerate(samples, 1) if i % HOLD_OUT_EVERY)
        return list(islice(samples, count))


def sensitivity_feeds(calibration: Calibration, calibration_data: Any, count: int = 8, **source: Any) -> list:
    """The first ``count`` calibration batches, to measure per-layer sensitivity on."""
    from itertools import islice

    from edgeinfer.quantize.data import open_source

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # random data already warned once, at calibration
        return list(islice(open_source(calibration_data, calibration.graph, **source), count))


__all__ = ["CALIBRATION_METHODS", "Calibration", "calibrate", "fp16_weights", "quantize", "quantize_dynamic",
           "quantize_static"]
