"""The default guard's second step: plain INT8 fell below the quality floor on held-out samples,
so the quantizer escalates by itself to mixed precision and says what that cost.

``quantize(model, samples)`` measures plain INT8 against fp32 on the held-out samples, every
output and every part of an output that concatenates parts of different magnitude
(``guard.output_quality``). Where the worst is below ``quality_floor`` (20 dB by default), this
module runs the same search ``min_sqnr=quality_floor`` runs (``sensitivity.quantize_to_sqnr``:
GPTQ-rounded weights, the noisiest layers kept float with int8-stored weights), measures the
result on the held-out samples again (the guard warns if it is still poor), and records in the
model's ``quantization`` metadata under ``escalated``:

- why: the output (or part) and its SQNR, and the floor;
- which layers stayed float, and how many of how many;
- what it cost: the ``.eim`` size against plain INT8's and fp32's, and the share of the model's FLOPs that
  now run in float (an estimate of the speed given up: float layers between integer ones also
  add a DequantizeLinear/QuantizeLinear pair each; measure with ``edgeinfer bench``).

A ``QuantizationEscalationWarning`` of one line says the same.

Measured (``benchmarks/bench_int8_real.py`` has the task metrics): NudeNet's YOLOv8n with 7
calibration photos x 4 views, plain INT8 class scores 11 dB on held-out views, boxes 31 dB.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from edgeinfer.ir.cost import node_flops
from edgeinfer.model import Model
from edgeinfer.quantize.guard import QuantizationEscalationWarning
from edgeinfer.quantize.static import Calibration

SHOWN_LAYERS = 4  # layers named in the warning; the metadata lists them all


def escalated(model: Model, plain: Model, calibration: Calibration, reference: Calibration,
              worst: tuple[str, float], quality_floor: float, *, data: Any, source: Mapping[str, Any],
              method: str, activations: str, per_channel: bool, exclude: Sequence[str], reduce_range: bool,
              backend: str | None, float_weights: str) -> Model:
    """The mixed-precision model that meets ``quality_floor`` where ``plain`` (INT8 with the
    guard's figures) did not; ``worst`` is plain's worst (output, dB)."""
    from edgeinfer.quantize import calibration_feeds, guarded, sensitivity_feeds
    from edgeinfer.quantize.sensitivity import quantize_to_sqnr

    searched = calibration
    if per_channel:
        from edgeinfer.quantize.gptq import GPTQ_SAMPLES, with_gptq_weights

        searched = with_gptq_weights(calibration, calibration_feeds(calibration, data, min(GPTQ_SAMPLES,
                                                                                          calibration.samples), **source),
                                     backend=backend, reduce_range=reduce_range)
    result = quantize_to_sqnr(model, searched, quality_floor, feeds=sensitivity_feeds(calibration, data, **source),
                              method=method, activations=activations, per_channel=per_channel, exclude=list(exclude),
                              reduce_range=reduce_range, backend=backend, float_weights=float_weights)
    mixed = guarded(result.model, reference, backend)
    record = _record(model, plain, mixed, result.kept_float, worst, quality_floor, result.within_budget)
    summary = json.loads(mixed.metadata.get("quantization", "{}"))
    summary["escalated"] = record
    metadata = dict(mixed.metadata)
    metadata["quantization"] = json.dumps(summary, sort_keys=True)
    warnings.warn(_message(record), QuantizationEscalationWarning, stacklevel=3)
    return Model(mixed.graph, metadata)


def _file_bytes(*models: Model) -> list[int]:
    """The size of each model's ``.eim`` as saved (narrow and int8-stored weights as the file
    holds them, which the arrays in memory do not show)."""
    import tempfile

    sizes = []
    with tempfile.TemporaryDirectory(prefix="edgeinfer_sizes_") as folder:
        for index, model in enumerate(models):
            path = Path(folder) / f"{index}.eim"
            model.save(path)
            sizes.append(path.stat().st_size)
            path.unlink()
    return sizes


def _record(model: Model, plain: Model, mixed: Model, kept: Sequence[str], worst: tuple[str, float],
            floor: float, met: bool) -> dict[str, Any]:
    graph = model.graph
    flops = {node.name or node.outputs[0]: node_flops(node, graph) for node in graph.nodes}
    total = sum(flops.values()) or 1.0
    quality = json.loads(mixed.metadata.get("quantization", "{}")).get("quality", {}).get("outputs", {})
    after = min((float(f["sqnr_db"]) for f in quality.values()), default=float("nan"))
    plain_layers = int(json.loads(plain.metadata.get("quantization", "{}")).get("layers", 0))
    mixed_bytes, plain_bytes, float_bytes = _file_bytes(mixed, plain, model)
    return {"reason": {"output": worst[0], "sqnr_db": round(worst[1], 2), "floor_db": floor},
            "met": bool(met), "held_out_worst_db": round(after, 2),
            "float_layers": len(kept), "quantizable_layers": plain_layers, "kept_float": list(kept),
            "file_bytes": mixed_bytes, "plain_int8_file_bytes": plain_bytes, "fp32_file_bytes": float_bytes,
            "float_flops_share": round(sum(flops.get(name, 0.0) for name in kept) / total, 4)}


def _message(record: Mapping[str, Any]) -> str:
    reason = record["reason"]
    named = ", ".join(record["kept_float"][:SHOWN_LAYERS])
    more = f" and {record['float_layers'] - SHOWN_LAYERS} more" if record["float_layers"] > SHOWN_LAYERS else ""
    size = record["file_bytes"] / max(record["plain_int8_file_bytes"], 1)
    fp32 = record["file_bytes"] / max(record["fp32_file_bytes"], 1)
    return (f"plain INT8 output {reason['output']!r} reached {reason['sqnr_db']:.1f} dB on held-out samples, below "
            f"the {reason['floor_db']:g} dB floor: escalated to mixed precision, {record['float_layers']} of "
            f"{record['quantizable_layers']} layers float ({named}{more}); held-out worst now "
            f"{record['held_out_worst_db']:.1f} dB; file {size:.2f}x plain INT8's ({fp32:.2f}x fp32's), "
            f"{record['float_flops_share']:.0%} of FLOPs in float (quality_floor=None keeps plain INT8)")
