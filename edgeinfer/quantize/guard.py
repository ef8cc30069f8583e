"""The quality guard run after every static quantization: INT8 against fp32 on held-out samples.

Calibration holds back every ``HOLD_OUT_EVERY``-th sample (at most ``MAX_HELD_OUT``) unless
fewer than ``MIN_FOR_HOLD_OUT`` are known to come; the guard runs the float and the quantized model on those (or, with too
few samples, on the first calibration samples, and says so) and computes per graph output::

    SQNR = 10 log10( sum(ref^2) / sum((ref - q)^2) )     cosine = <ref, q> / (|ref| |q|)

Below ``MIN_SQNR_DB`` or ``MIN_COSINE`` on any output, a ``QuantizationQualityWarning`` of one
line names the output and the layers with the worst SQNR (``report.layer_errors``), so that a
model whose class scores all became 0 never passes as a success. The figures go into the
model's ``quantization`` metadata either way.

Ops left float between integer ones split the integer chain: each costs a DequantizeLinear
before and a QuantizeLinear after it. PRelu has no integer kernel on onnxruntime (LeakyRelu
has: QLinearLeakyRelu), so a face model with a PRelu after every conv runs INT8 slower than
fp32 (MediaPipe face_landmark: 23 PRelu islands, INT8 1.67x fp32's latency on onnxruntime, one run of
``benchmarks/bench_int8_real.py --latency 30`` on a loaded 2-core machine);
``split_warning`` says so in one line, with the float alternative.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from contextlib import closing
from dataclasses import dataclass

import numpy as np

from edgeinfer.ir import Graph
from edgeinfer.quantize.calibrate import run_batches

MIN_SQNR_DB = 15.0
DEFAULT_QUALITY_FLOOR_DB = 20.0  # quantize()'s default: plain INT8 below it on held-out samples escalates
MIN_COSINE = 0.99
HOLD_OUT_EVERY = 5  # every 5th sample is held out of calibration ...
MIN_FOR_HOLD_OUT = 10  # ... unless fewer samples than this are known to come
MAX_HELD_OUT = 8
WORST_LAYERS = 3


NO_INTEGER_KERNEL = ("PRelu",)  # float between Q/DQ on every engine edgeinfer lowers to
SPLIT_SHARE = 0.25  # islands per quantized layer above which INT8 is likely slower than fp32


class QuantizationQualityWarning(UserWarning):
    """A quantized model's outputs differ from fp32's beyond the guard's thresholds."""


class QuantizationEscalationWarning(UserWarning):
    """Plain INT8 fell below the quality floor: the quantizer kept the noisiest layers float."""


class QuantizationSpeedWarning(UserWarning):
    """Float ops split the integer chain so often that INT8 may be slower than fp32."""


def float_islands(quantized: Graph) -> list[str]:
    """Ops without an integer kernel that sit between a DequantizeLinear and a QuantizeLinear."""
    found = []
    for node in quantized.nodes:
        if node.op_type not in NO_INTEGER_KERNEL or node.domain:
            continue
        source = quantized.producer(node.inputs[0])
        consumers = quantized.consumers(node.outputs[0])
        if source is not None and source.op_type == "DequantizeLinear" and any(
                c.op_type == "QuantizeLinear" for c in consumers):
            found.append(node.name or node.outputs[0])
    return found


def split_warning(quantized: Graph, layers: int) -> str | None:
    """A one-line warning when float islands are a large share of ``layers`` quantized layers."""
    islands = float_islands(quantized)
    if not islands or len(islands) < SPLIT_SHARE * max(layers, 1):
        return None
    kinds = sorted({n.op_type for n in quantized.nodes if (n.name or n.outputs[0]) in set(islands)})
    return (f"{len(islands)} {'/'.join(kinds)} layers stay float between int8 layers (no integer kernel): each "
            f"splits the integer chain with a Dequantize/Quantize pair, so this INT8 model may run slower than "
            f"fp32 (measure with `edgeinfer bench`); weights='fp16' (--weights fp16) keeps it float at half size")


@dataclass(frozen=True)
class OutputQuality:
    output: str
    sqnr_db: float
    cosine: float

    @property
    def ok(self) -> bool:
        return self.sqnr_db >= MIN_SQNR_DB and self.cosine >= MIN_COSINE


@dataclass(frozen=True)
class QualityReport:
    outputs: tuple[OutputQuality, ...]
    samples: int
    held_out: bool  # False: measured on calibration samples (too few to hold any out)
    worst_layers: tuple[tuple[str, float], ...] = ()

    @property
    def ok(self) -> bool:
        return all(o.ok for o in self.outputs)

    def summary(self) -> dict:
        return {"samples": self.samples, "held_out": self.held_out,
                "outputs": {o.output: {"sqnr_db": _rounded(o.sqnr_db), "cosine": round(o.cosine, 6)}
                            for o in self.outputs}}

    def message(self) -> str:
        worst = min(self.outputs, key=lambda o: (o.ok, o.sqnr_db))
        where = "held-out samples" if self.held_out else "calibration samples (too few to hold any out)"
        layers = ", ".join(f"{name} ({_db(sqnr)})" for name, sqnr in self.worst_layers)
        return (f"INT8 quality below {MIN_SQNR_DB:g} dB / cosine {MIN_COSINE:g} on {self.samples} {where}: "
                f"output {worst.output!r} SQNR {_db(worst.sqnr_db)}, cosine {worst.cosine:.4f}"
                + (f"; worst layers: {layers} (keep them float with exclude=/--exclude, or try another method)"
                   if layers else ""))


def output_quality(float_graph: Graph, quantized: Graph, feeds: Sequence[dict], *,
                   backend: str | None = None) -> tuple[OutputQuality, ...]:
    """SQNR and cosine of every graph output over ``feeds``. An output that concatenates parts
    whose fp32 magnitudes differ by ``PART_RATIO`` or more (a detector head: boxes in pixels
    beside class probabilities) is measured part by part (``output0[:, 4:84]``): measured whole,
    the loud part hides what happens to the quiet one (YOLOv8n: 31 dB whole, 11 dB its scores)."""
    names = float_graph.output_names
    parts = {name: concat_parts(float_graph, name) for name in names}
    sums = {(name, part): np.zeros(4) for name in names for part in [None, *parts[name]]}
    with closing(run_batches(float_graph, names, feeds, backend=backend)) as refs, \
            closing(run_batches(quantized, names, feeds, backend=backend)) as gots:
        for ref_values, got_values in zip(refs, gots, strict=True):
            for name in names:
                for part in (None, *parts[name]):
                    ref = np.asarray(_part(ref_values[name], part), np.float64).reshape(-1)
                    got = np.asarray(_part(got_values[name], part), np.float64).reshape(-1)
                    sums[name, part] += (ref @ ref, (ref - got) @ (ref - got), ref @ got, got @ got)
    found = []
    for name in names:
        powers = [sums[name, part][0] / max(_part_size(part), 1) for part in parts[name]]
        if parts[name] and min(powers) * PART_RATIO**2 <= max(powers):
            found += [OutputQuality(_part_label(name, part), *_sqnr_cosine(*sums[name, part])) for part in parts[name]]
        else:
            found.append(OutputQuality(name, *_sqnr_cosine(*sums[name, None])))
    return tuple(found)


PART_RATIO = 10.0  # RMS ratio between the parts of a concatenated output at which they are measured apart


def concat_parts(graph: Graph, output: str) -> tuple[tuple[int, int, int], ...]:
    """(axis, start, stop) of each input of the Concat that makes ``output``, where every
    extent along the axis is static; () otherwise."""
    node = graph.producer(output)
    if node is None or node.op_type != "Concat" or node.domain or len(node.inputs) < 2:
        return ()
    rank = len(graph.values[output].shape or ()) if graph.values[output].shape is not None else None
    if not rank:
        return ()
    axis = int(node.attrs.get("axis", 0)) % rank
    found, start = [], 0
    for name in node.inputs:
        shape = graph.values[name].shape if name in graph.values else None
        if shape is None or len(shape) != rank or not isinstance(shape[axis], int):
            return ()
        found.append((axis, start, start + shape[axis]))
        start += shape[axis]
    return tuple(found)


def _part(array: np.ndarray, part: tuple[int, int, int] | None) -> np.ndarray:
    if part is None:
        return array
    axis, start, stop = part
    return np.take(array, np.arange(start, stop), axis=axis)


def _part_size(part: tuple[int, int, int] | None) -> int:
    return 1 if part is None else part[2] - part[1]


def _part_label(name: str, part: tuple[int, int, int]) -> str:
    axis, start, stop = part
    return f"{name}[{', '.join([':'] * axis + [f'{start}:{stop}'])}]"


def _sqnr_cosine(signal: float, noise: float, dot: float, power: float) -> tuple[float, float]:
    sqnr = math.inf if noise == 0 else 10.0 * math.log10(max(signal, 1e-30) / noise)
    cosine = dot / math.sqrt(signal * power) if signal > 0 and power > 0 else float(noise == 0)
    return sqnr, cosine


def check_quality(float_graph: Graph, quantized: Graph, layers: Sequence[str], feeds: Sequence[dict], *,
                  held_out: bool, backend: str | None = None, warn: bool = True) -> QualityReport:
    """Measure ``quantized`` against ``float_graph`` on ``feeds``; warn (one line) when poor."""
    feeds = list(feeds)
    report = QualityReport(output_quality(float_graph, quantized, feeds, backend=backend), len(feeds), held_out)
    if report.ok:
        return report
    from edgeinfer.quantize.report import layer_errors

    rows = layer_errors(float_graph, quantized, layers, feeds[:4], backend=backend)
    worst = sorted(rows, key=lambda r: r.sqnr_db)[:WORST_LAYERS]
    report = QualityReport(report.outputs, report.samples, held_out, tuple((r.layer, r.sqnr_db) for r in worst))
    if warn:
        warnings.warn(report.message(), QuantizationQualityWarning, stacklevel=3)
    return report


def _db(value: float) -> str:
    return "inf dB" if math.isinf(value) else f"{value:.1f} dB"


def _rounded(value: float) -> float | str:
    return "inf" if math.isinf(value) else round(value, 3)
