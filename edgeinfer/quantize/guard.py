"""The quality guard run after every static quantization: INT8 against fp32 on held-out samples.

Calibration holds back every ``HOLD_OUT_EVERY``-th sample (at most ``MAX_HELD_OUT``) when it
has enough of them; the guard runs the float and the quantized model on those (or, with too
few samples, on the first calibration samples, and says so) and computes per graph output::

    SQNR = 10 log10( sum(ref^2) / sum((ref - q)^2) )     cosine = <ref, q> / (|ref| |q|)

Below ``MIN_SQNR_DB`` or ``MIN_COSINE`` on any output, a ``QuantizationQualityWarning`` of one
line names the output and the layers with the worst SQNR (``report.layer_errors``), so that a
model whose class scores all became 0 never passes as a success. The figures go into the
model's ``quantization`` metadata either way.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from edgeinfer.ir import Graph
from edgeinfer.quantize.calibrate import run_batches

MIN_SQNR_DB = 15.0
MIN_COSINE = 0.99
HOLD_OUT_EVERY = 5  # with at least this many samples, every 5th is held out of calibration
MAX_HELD_OUT = 8
WORST_LAYERS = 3


class QuantizationQualityWarning(UserWarning):
    """A quantized model's outputs differ from fp32's beyond the guard's thresholds."""


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
    names = float_graph.output_names
    sums = {name: np.zeros(4) for name in names}  # signal, noise, dot, |q|^2
    refs = run_batches(float_graph, names, feeds, backend=backend)
    gots = run_batches(quantized, names, feeds, backend=backend)
    for ref_values, got_values in zip(refs, gots, strict=True):
        for name in names:
            ref = np.asarray(ref_values[name], np.float64).reshape(-1)
            got = np.asarray(got_values[name], np.float64).reshape(-1)
            sums[name] += (ref @ ref, (ref - got) @ (ref - got), ref @ got, got @ got)
    return tuple(OutputQuality(name, *_sqnr_cosine(*sums[name])) for name in names)


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
