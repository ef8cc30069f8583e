"""Click commands and options for quantization, registered by ``edgeinfer/cli.py``:

- ``quantize_command``: ``edgeinfer quantize MODEL --calib DIR -o model.int8.eim [...]``
- ``quantize_options``: a decorator for ``convert`` adding ``--quantize int8|dynamic|fp16``
  and the calibration options; the decorated function receives them as one keyword
  ``quantization`` (None when ``--quantize`` is not given), which ``apply_quantization``
  applies to the converted model.
"""

from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import Any

import click

from edgeinfer.cli.support import LazyChoice, LibraryDefault, handle_errors
from edgeinfer.errors import InputError

_CALIBRATION_KEYS = ("calib", "calib_random", "calib_limit", "method", "activations", "per_tensor", "mean",
                     "std", "size", "layout", "exclude", "float_weights", "weight_rounding")


def _floats(text: str | None, what: str) -> tuple[float, ...] | None:
    if text is None:
        return None
    try:
        return tuple(float(v) for v in text.replace(" ", "").split(","))
    except ValueError as exc:
        raise InputError(f"--{what} {text!r}: expected comma-separated numbers, e.g. 0.485,0.456,0.406") from exc


def _size(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    parts = text.lower().split("x")
    if len(parts) not in (1, 2) or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise InputError(f"--size {text!r}: expected HxW (e.g. 224x224) or one number")
    return (int(parts[0]), int(parts[-1]))


# The library's calibration names, spelled here so that `--help` imports no framework (the
# quantize package pulls in onnx: a second of startup); tests/test_cli.py checks they match.
CALIBRATION_METHODS = ("entropy", "minmax", "mse", "percentile")
DEFAULT_METHOD = "mse"


def _calibration_methods() -> list[str]:
    return list(CALIBRATION_METHODS)


def _default_method() -> str:
    return DEFAULT_METHOD


def _calibration_options(fn):
    options = [
        click.option("--calib", type=click.Path(path_type=Path),
                     help="Calibration data: a folder of .npy/.npz files (keys = input names) or images."),
        click.option("--calib-random", type=click.IntRange(0), default=0, metavar="N",
                     help="Calibrate on N random samples instead (testing only: ranges will not fit real data)."),
        click.option("--calib-limit", type=click.IntRange(1), help="Use at most this many calibration samples."),
        click.option("--method", type=LazyChoice(_calibration_methods), cls=LibraryDefault,
                     library_default=_default_method, help="How calibration turns histograms into ranges."),
        click.option("--activations", type=click.Choice(["uint8", "int8", "float"]), default="uint8", show_default=True,
                     help="Activation type: uint8 asymmetric or int8 symmetric; float: weight-only int8 (every "
                          "layer float on int8 weights, about a quarter of the fp32 file, fp32's speed)."),
        click.option("--per-tensor", is_flag=True, help="One weight scale per tensor instead of per channel."),
        click.option("--mean", help="Image preprocessing: per-channel mean (on [0,1] RGB), e.g. 0.485,0.456,0.406."),
        click.option("--std", help="Image preprocessing: per-channel std, e.g. 0.229,0.224,0.225."),
        click.option("--size", help="Image preprocessing: resize to HxW (default: the input's size)."),
        click.option("--layout", type=click.Choice(["NCHW", "NHWC"]),
                     help="Image preprocessing: the input's layout (default: guessed from where it has 3 channels)."),
        click.option("--exclude", multiple=True, metavar="LAYER", help="Keep this layer in float (repeatable)."),
        click.option("--float-weights", type=click.Choice(["int8", "float32"]),
                     help="How the layers kept float store their Conv/Gemm/MatMul weights: int8 with a scale per "
                          "channel (float compute) or float32. Default: int8 for the layers --min-sqnr or "
                          "--max-accuracy-drop keep float, float32 for --exclude alone."),
        click.option("--weight-rounding", type=click.Choice(["nearest", "gptq"]),
                     help="How int8 weights are rounded: to the nearest step, or by GPTQ (each rounding error "
                          "compensated in the weights left, on calibration samples; the same bytes). "
                          "Default: gptq with --min-sqnr, nearest otherwise."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def _quantize(model, mode: str, *, calib: Path | None, calib_random: int, calib_limit: int | None, method: str,
              activations: str, per_tensor: bool, mean: str | None, std: str | None, size: str | None,
              layout: str | None, exclude: tuple[str, ...], float_weights: str | None = None,
              weight_rounding: str | None = None, quiet: bool = False, **extra: Any):
    from edgeinfer.cli.progress import step_reporter
    from edgeinfer.quantize import quantize

    if mode == "int8" and calib is None and not calib_random:
        raise InputError("static int8 quantization needs calibration data: --calib DIR "
                         "(or --calib-random N to test with random data)")
    if calib is not None and calib_random:
        raise InputError("give either --calib or --calib-random, not both")
    method = method if method is not None else _default_method()
    with step_reporter("quantizing", quiet=quiet) as steps:
        return quantize(model, calib, method, mode="dynamic" if mode == "dynamic" else "static",
                        weights="fp16" if mode == "fp16" else "int8", activations=activations,
                        per_channel=not per_tensor, exclude=exclude, random_samples=calib_random, limit=calib_limit,
                        progress=steps, size=_size(size), mean=_floats(mean, "mean"), std=_floats(std, "std"),
                        layout=layout, float_weights=float_weights, weight_rounding=weight_rounding, **extra)


def quantize_options(fn):
    """Add ``--quantize`` and the calibration options to a command (``convert``)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        settings = {key: kwargs.pop(key) for key in _CALIBRATION_KEYS}
        mode = kwargs.pop("quantize")
        kwargs["quantization"] = None if mode is None else {"mode": mode, **settings}
        return fn(*args, **kwargs)

    wrapper = _calibration_options(wrapper)
    return click.option("--quantize", type=click.Choice(["int8", "dynamic", "fp16"]),
                        help="Quantize after conversion: static int8 (needs --calib), dynamic int8, "
                             "or fp16 weight storage.")(wrapper)


FEW_SAMPLES = 16


def _warn_few_samples(model) -> None:
    """Ranges from a handful of samples rarely describe real inputs: say so (static int8 only)."""
    import json
    import warnings

    count = json.loads(model.metadata.get("quantization", "{}")).get("calibration_samples")
    if count is not None and count < FEW_SAMPLES:
        warnings.warn(f"calibrated on {count} sample(s): ranges from fewer than {FEW_SAMPLES} rarely describe "
                      "real inputs; give more with --calib", UserWarning, stacklevel=2)


def apply_quantization(model, quantization: dict[str, Any] | None, *, quiet: bool = False):
    """The model ``convert`` should save: ``model`` itself, or quantized per ``--quantize``
    (with a calibration progress bar unless ``quiet``)."""
    if quantization is None:
        return model
    settings = dict(quantization)
    quantized = _quantize(model, settings.pop("mode"), quiet=quiet, **settings)
    _warn_few_samples(quantized)
    return quantized


@click.command("quantize")
@click.argument("model_path", metavar="MODEL", type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(path_type=Path), required=True, help="The .eim file to write.")
@click.option("--mode", type=click.Choice(["static", "dynamic", "weight_only"]), default="static", show_default=True,
              help="static: calibrated int8 activations; dynamic: activations quantized at run time; "
                   "weight_only: int4/int8 MatMul/Gemm weights in blocks, float compute (big models).")
@click.option("--weights", "weight_format", type=click.Choice(["int8", "int4", "fp16"]), default="int8",
              show_default=True, help="int8 quantization, int4 weight-only blocks, or fp16 weight storage "
                                      "(float compute).")
@click.option("--block-size", type=click.Choice(["16", "32", "64", "128", "256"]), default="32", show_default=True,
              help="weight_only: weights along K per scale.")
@click.option("--zero-points", is_flag=True, help="weight_only: a zero point per block (asymmetric).")
@_calibration_options
@click.option("--max-accuracy-drop", type=click.FloatRange(0), metavar="P",
              help="Keep the most sensitive layers float until top-1 drops at most P points (needs --eval).")
@click.option("--min-sqnr", type=float, metavar="DB",
              help="Mixed precision: keep the noisiest layers float until every output's SQNR vs fp32 reaches DB.")
@click.option("--quality-floor", metavar="DB|off",
              help="Static int8: where plain INT8's worst output (or part of a concatenated output) on held-out "
                   "samples is below DB (default 20), keep the noisiest layers float until it reaches DB; "
                   "'off' keeps plain INT8.")
@click.option("--equalize", is_flag=True,
              help="Cross-layer equalization before calibrating (per-channel ranges moved into the next Conv).")
@click.option("--bias-correction", is_flag=True,
              help="Correct each Conv/Gemm bias for the mean shift INT8 adds, measured on calibration samples.")
@click.option("--eval", "evaluation", type=click.Path(path_type=Path),
              help="Labelled evaluation set: an .npz with the input array(s) (by input name) and 'labels'.")
@click.option("--report", type=click.Path(path_type=Path),
              help="Print a per-layer SQNR/cosine table and write its plot to this .png.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar; print only the line saying what was written.")
@handle_errors
def quantize_command(model_path: Path, output: Path, mode: str, weight_format: str, block_size: str,
                     zero_points: bool, max_accuracy_drop: float | None, min_sqnr: float | None,
                     quality_floor: str | None, equalize: bool,
                     bias_correction: bool, evaluation: Path | None, report: Path | None, quiet: bool, **calibration: Any) -> None:
    """Quantize MODEL (.eim or any convertible model) and write an .eim file.

    Example: edgeinfer quantize model.eim --calib images/ --mean 0.485,0.456,0.406 --std 0.229,0.224,0.225 -o model.int8.eim
    """
    from edgeinfer.api import load_any

    if output.suffix.lower() != ".eim":
        raise InputError(f"-o {output}: expected a path ending in .eim")
    if report is not None and report.suffix.lower() != ".png":
        raise InputError(f"--report {report}: expected a path ending in .png")
    if max_accuracy_drop is not None and evaluation is None:
        raise InputError("--max-accuracy-drop needs a labelled evaluation set: --eval FILE.npz")
    from edgeinfer.engine_logs import quiet_onnxruntime

    quiet_onnxruntime()
    model = load_any(model_path)
    extra: dict[str, Any] = {}
    if max_accuracy_drop is not None:
        extra = {"max_accuracy_drop": max_accuracy_drop, "evaluation": _load_evaluation(evaluation, model)}
    from edgeinfer.cli.progress import step_reporter

    if (min_sqnr is not None or equalize or bias_correction) and (mode != "static" or weight_format != "int8"):
        raise InputError("--min-sqnr, --equalize and --bias-correction apply to static int8 quantization "
                         "(--mode static --weights int8)")
    if quality_floor is not None:
        extra["quality_floor"] = _quality_floor(quality_floor)
    extra.update({"min_sqnr": min_sqnr} if min_sqnr is not None else {}, **({"equalize": True} if equalize else {}),
                 **({"bias_correction": True} if bias_correction else {}))
    if weight_format == "int4" or mode == "weight_only":
        quantized = _weight_only(model, model_path, weight_format, int(block_size), zero_points, quiet, calibration)
    else:
        kind = "fp16" if weight_format == "fp16" else ("dynamic" if mode == "dynamic" else "int8")
        quantized = _quantize(model, kind, quiet=quiet, **calibration, **extra)
        _warn_few_samples(quantized)
    with step_reporter(f"writing {output.name}", quiet=quiet) as steps:
        quantized.save(output, progress=steps)
    from edgeinfer.format.sizes import size_breakdown

    before = sum(a.nbytes for a in model.graph.initializers.values())
    after = size_breakdown(output).tensors  # as stored: int8-stored float weights count their int8 bytes
    click.echo(f"wrote {output} ({output.stat().st_size:,} bytes): weights {after:,} bytes, "
               f"{after / max(before, 1):.3f}x of {before:,}")
    _echo_mixed_precision(quantized)
    if report is not None:
        _write_report(model, quantized, calibration, report)


def _weight_only(model, model_path: Path, weight_format: str, block_size: int, zero_points: bool, quiet: bool,
                 calibration: dict[str, Any]):
    """``--mode weight_only`` / ``--weights int4``: no calibration; a step per weight stream."""
    from edgeinfer.cli.progress import step_reporter
    from edgeinfer.quantize import quantize

    if weight_format == "fp16":
        raise InputError("--weights fp16 with --mode weight_only: weight-only quantization is int4 or int8")
    if calibration["calib"] is not None or calibration["calib_random"]:
        raise InputError("weight-only quantization (--weights int4 / --mode weight_only) needs no calibration "
                         "data: drop --calib / --calib-random")
    with step_reporter(f"quantizing {model_path.name}", quiet=quiet) as steps:
        return quantize(model, mode="weight_only", weights=weight_format, block_size=block_size,
                        zero_points=zero_points, exclude=calibration["exclude"], progress=steps)


def _quality_floor(text: str) -> float | None:
    if text.strip().lower() == "off":
        return None
    try:
        return float(text)
    except ValueError:
        raise InputError(f"--quality-floor {text!r}: expected a number of dB or 'off'") from None


def _echo_mixed_precision(model) -> None:
    import json

    summary = json.loads(model.metadata.get("quantization", "{}"))
    if summary.get("activations") == "float":
        click.echo("weight-only INT8: every layer computes in float (fp32's speed) on int8 weights")
    escalated = summary.get("escalated")
    if escalated:
        reason = escalated["reason"]
        click.echo(f"quality floor: plain INT8 output {reason['output']} was {reason['sqnr_db']} dB (< "
                   f"{reason['floor_db']:g} dB) on held-out samples; escalated to mixed precision, held-out worst "
                   f"now {escalated['held_out_worst_db']} dB, {escalated['float_flops_share']:.0%} of FLOPs in float")
    mixed = summary.get("mixed_precision")
    if mixed:
        click.echo(f"mixed precision: {mixed['float_layers']} layers kept float, {mixed['quantized_layers']} int8; "
                   f"SQNR {mixed['sqnr_db']} dB on {mixed['samples']} calibration samples (target {mixed['min_sqnr_db']:g}"
                   f" dB{'' if mixed['met'] else ', NOT met'})")


def _load_evaluation(path: Path, model) -> tuple[dict, Any]:
    import numpy as np

    try:
        with np.load(path, allow_pickle=False) as archive:
            arrays = {key: archive[key] for key in archive.files}
    except (ValueError, OSError, EOFError) as exc:
        raise InputError(f"--eval {path}: not a readable .npz file ({exc})") from exc
    if "labels" not in arrays:
        raise InputError(f"--eval {path}: expected an array 'labels', found {sorted(arrays)}")
    labels = arrays.pop("labels")
    names = model.graph.input_names
    if len(names) == 1 and len(arrays) == 1:
        arrays = {names[0]: next(iter(arrays.values()))}
    if sorted(arrays) != sorted(names):
        raise InputError(f"--eval {path}: expected arrays {names} and 'labels', found {sorted(arrays)} and 'labels'")
    return arrays, labels


def _write_report(model, quantized, calibration: dict[str, Any], path: Path) -> None:
    import json
    from itertools import islice

    from edgeinfer.quantize.data import open_source
    from edgeinfer.quantize.report import format_table, layer_errors
    from edgeinfer.quantize.static import prepare_graph

    summary = json.loads(quantized.metadata.get("quantization", "{}"))
    if summary.get("mode") != "static":
        raise InputError("--report describes static int8 models (per-layer activation error)")
    float_graph = prepare_graph(model.graph)
    layers = [n.name or n.outputs[0] for n in quantized.graph.nodes]
    feeds = list(islice(open_source(calibration["calib"], float_graph, random_samples=calibration["calib_random"],
                                    size=_size(calibration["size"]), mean=_floats(calibration["mean"], "mean"),
                                    std=_floats(calibration["std"], "std"), layout=calibration["layout"]), 8))
    rows = sorted(layer_errors(float_graph, quantized.graph, layers, feeds), key=lambda row: row.sqnr_db)
    click.echo(format_table(rows, title=f"per-layer error vs fp32 on {len(feeds)} sample(s), worst first"))
    exact = sum(1 for row in rows if math.isinf(row.sqnr_db))
    if exact:
        click.echo(f"inf: {exact} layer(s) whose int8 output equals the float one exactly on these samples "
                   "(no rounding error: e.g. a max-pool, reshape or concat of values already on the int8 grid)")
    plot_worst(rows, path, title=f"INT8 error per layer: the worst {min(len(rows), WORST)} of {len(rows)}")
    click.echo(f"wrote {path}")


WORST = 30


def plot_worst(rows, path: Path, *, title: str) -> None:
    """A PNG of the ``WORST`` layers with the lowest SQNR, one labelled horizontal bar each (with
    its cosine), worst at the top: about 900x1200 px, legible without zooming."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    from edgeinfer.format.atomic import atomic_write_bytes

    shown = [row for row in rows if not math.isinf(row.sqnr_db)][:WORST] or rows[:WORST]
    figure = Figure(figsize=(9, 0.32 * len(shown) + 1.6), layout="constrained")
    axes = figure.subplots()
    positions = list(range(len(shown)))[::-1]
    values = [min(row.sqnr_db, 99.0) for row in shown]
    axes.barh(positions, values, color="#4c72b0")
    axes.set_yticks(positions, [f"{row.layer} ({row.op_type})" for row in shown], fontsize=8)
    for y, row, value in zip(positions, shown, values):
        axes.text(value, y, f" {value:.1f} dB, cos {row.cosine:.4f}", va="center", fontsize=7)
    axes.set_xlabel("SQNR vs fp32 (dB, higher is better; about 6 dB per bit)")
    axes.set_xlim(0, max(values, default=1) * 1.35 + 1)
    axes.set_title(title, fontsize=10)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100)
    atomic_write_bytes(path, buffer.getvalue())
