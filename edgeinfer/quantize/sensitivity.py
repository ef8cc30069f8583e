"""Per-layer sensitivity and accuracy control.

Sensitivity of a layer: quantize that layer alone (every other layer stays float) and
measure the SQNR of the model outputs against fp32 on a few inputs; the lower, the more the
layer alone hurts. Accuracy control quantizes everything, measures the metric on a labelled
set, and while the drop exceeds the budget keeps the next most sensitive layer in float.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from edgeinfer.errors import InputError
from edgeinfer.model import Model
from edgeinfer.quantize.calibrate import default_backend
from edgeinfer.quantize.report import sqnr_db
from edgeinfer.quantize.static import Calibration, quantizable_layers, quantize_static

Metric = Callable[[Model], float]


@dataclass(frozen=True)
class LayerSensitivity:
    layer: str
    output_sqnr_db: float


@dataclass
class AccuracyResult:
    model: Model
    float_metric: float
    quantized_metric: float  # of the first, fully quantized model
    final_metric: float
    kept_float: list[str] = field(default_factory=list)
    sensitivity: list[LayerSensitivity] = field(default_factory=list)
    within_budget: bool = True


def _outputs(model: Model, feeds: Sequence[dict], backend: str) -> list[np.ndarray]:
    from edgeinfer.session import Session

    session = Session(model, backend=backend)
    return [np.concatenate([session.run(f)[name].reshape(-1) for f in feeds]) for name in session.model.graph.output_names]


def layer_sensitivity(model: Model, calibration: Calibration, feeds: Sequence[dict], *, method: str,
                      activations: str = "uint8", per_channel: bool = True, reduce_range: bool = False,
                      backend: str | None = None) -> list[LayerSensitivity]:
    """Output SQNR with each layer quantized alone, most sensitive (lowest SQNR) first."""
    backend = backend or default_backend()
    layers = quantizable_layers(calibration, activations=activations, per_channel=per_channel)
    reference = _outputs(Model(calibration.graph), feeds, backend)
    results = []
    for layer in layers:
        alone = quantize_static(model, calibration, method=method, activations=activations,
                                per_channel=per_channel, reduce_range=reduce_range,
                                exclude=[other for other in layers if other != layer])
        got = _outputs(alone, feeds, backend)
        worst = min(sqnr_db(r, g) for r, g in zip(reference, got, strict=True))
        results.append(LayerSensitivity(layer, worst))
    return sorted(results, key=lambda s: s.output_sqnr_db)


def top1_metric(inputs: dict[str, np.ndarray] | np.ndarray, labels: np.ndarray, *, backend: str | None = None,
                batch: int = 256) -> Metric:
    """Top-1 accuracy (percent) of a model's first output on a labelled set."""
    labels = np.asarray(labels).reshape(-1)

    def metric(model: Model) -> float:
        from edgeinfer.session import Session

        session = Session(model, backend=backend or default_backend())
        feeds = inputs if isinstance(inputs, dict) else {model.graph.input_names[0]: inputs}
        count = len(next(iter(feeds.values())))
        if count != len(labels):
            raise InputError(f"evaluation set: {count} inputs but {len(labels)} labels")
        first = model.graph.output_names[0]
        logits = [session.run({k: v[i:i + batch] for k, v in feeds.items()})[first] for i in range(0, count, batch)]
        return float(np.mean(np.argmax(np.concatenate(logits), axis=-1) == labels) * 100.0)

    return metric


def quantize_within_budget(model: Model, calibration: Calibration, metric: Metric, max_drop: float, *,
                           feeds: Sequence[dict], method: str, activations: str = "uint8",
                           per_channel: bool = True, exclude: Sequence[str] = (), reduce_range: bool = False,
                           backend: str | None = None) -> AccuracyResult:
    """Quantize, then keep the most sensitive layers in float until ``metric`` drops at most
    ``max_drop`` (same unit as the metric, e.g. percentage points) below fp32."""
    if max_drop < 0:
        raise InputError(f"max accuracy drop {max_drop}: expected a non-negative number")
    options = dict(method=method, activations=activations, per_channel=per_channel, reduce_range=reduce_range)
    float_metric = metric(Model(calibration.graph))
    kept = list(exclude)
    quantized = quantize_static(model, calibration, exclude=kept, **options)
    first = score = metric(quantized)
    result = AccuracyResult(quantized, float_metric, first, score, list(kept))
    if float_metric - score <= max_drop:
        return result
    result.sensitivity = layer_sensitivity(model, calibration, feeds, backend=backend, **options)
    for entry in result.sensitivity:
        if entry.layer in kept:
            continue
        kept.append(entry.layer)
        quantized = quantize_static(model, calibration, exclude=kept, **options)
        score = metric(quantized)
        if float_metric - score <= max_drop:
            break
    result.model, result.final_metric, result.kept_float = quantized, score, kept
    result.within_budget = float_metric - score <= max_drop
    return result
