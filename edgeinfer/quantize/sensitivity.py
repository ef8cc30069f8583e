"""Per-layer sensitivity and accuracy control.

Sensitivity of a layer: quantize that layer alone (every other layer stays float) and
measure the SQNR of the model outputs against fp32 on a few inputs; the lower, the more the
layer alone hurts. Accuracy control quantizes everything, measures the metric on a labelled
set, and while the drop exceeds the budget keeps the next most sensitive layer in float.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import closing
from dataclasses import dataclass, field

import numpy as np

from edgeinfer.errors import InputError
from edgeinfer.model import Model
from edgeinfer.quantize.calibrate import default_backend
from edgeinfer.quantize.report import sqnr_db
from edgeinfer.quantize.static import (
    Calibration,
    quantizable_layers,
    quantize_static,
    recurrent_layers,
    weighted_layers,
)

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
    from edgeinfer.runtime.session import Session

    with Session(model, backend=backend) as session:
        return [np.concatenate([session.run(f)[name].reshape(-1) for f in feeds])
                for name in session.model.graph.output_names]


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
        from edgeinfer.runtime.session import Session

        feeds = inputs if isinstance(inputs, dict) else {model.graph.input_names[0]: inputs}
        count = len(next(iter(feeds.values())))
        if count != len(labels):
            raise InputError(f"evaluation set: {count} inputs but {len(labels)} labels")
        first = model.graph.output_names[0]
        with Session(model, backend=backend or default_backend()) as session:
            logits = [session.run({k: v[i:i + batch] for k, v in feeds.items()})[first]
                      for i in range(0, count, batch)]
        return float(np.mean(np.argmax(np.concatenate(logits), axis=-1) == labels) * 100.0)

    return metric


def quantize_within_budget(model: Model, calibration: Calibration, metric: Metric, max_drop: float, *,
                           feeds: Sequence[dict], method: str, activations: str = "uint8",
                           per_channel: bool = True, exclude: Sequence[str] = (), reduce_range: bool = False,
                           backend: str | None = None, float_weights: str = "int8") -> AccuracyResult:
    """Quantize, then keep the most sensitive layers in float until ``metric`` drops at most
    ``max_drop`` (same unit as the metric, e.g. percentage points) below fp32. The weights of
    the layers kept float are stored as ``float_weights`` (``quantize_static``)."""
    if max_drop < 0:
        raise InputError(f"max accuracy drop {max_drop}: expected a non-negative number")
    options = dict(method=method, activations=activations, per_channel=per_channel, reduce_range=reduce_range)
    float_metric = metric(Model(calibration.graph))
    kept = list(exclude)
    quantized = quantize_static(model, calibration, exclude=kept, float_weights=float_weights, **options)
    first = score = metric(quantized)
    result = AccuracyResult(quantized, float_metric, first, score, list(kept))
    if float_metric - score <= max_drop:
        return result
    if float_weights == "int8":  # every layer float with int8 weights: the best a search can reach with them
        everything = quantizable_layers(calibration, activations=activations, per_channel=per_channel)
        ceiling = quantize_static(model, calibration, exclude=everything, float_weights="int8", **options)
        if float_metric - metric(ceiling) > max_drop:
            float_weights = "float32"
    result.sensitivity = layer_sensitivity(model, calibration, feeds, backend=backend, **options)
    for entry in result.sensitivity:
        if entry.layer in kept:
            continue
        kept.append(entry.layer)
        quantized = quantize_static(model, calibration, exclude=kept, float_weights=float_weights, **options)
        score = metric(quantized)
        if float_metric - score <= max_drop:
            break
    result.model, result.final_metric, result.kept_float = quantized, score, kept
    result.within_budget = float_metric - score <= max_drop
    return result


# -- mixed precision to an SQNR target ------------------------------------------------------------
NOISE_ROUNDS = 4  # noise-guided rounds before the graph-order search
ROUND_SHARE = 0.5  # a round keeps float every layer adding at least this share of the worst one's noise
MAX_PER_ROUND = 4
WEIGHT_MARGIN_DB = 3.0  # int8 weights of the float layers may take at most half the noise a target allows


@dataclass(frozen=True)
class LayerNoise:
    """What a quantized layer reads (its worst activation input) and writes, against fp32."""

    layer: str
    op_type: str
    input_sqnr_db: float
    output_sqnr_db: float
    inputs_from: tuple[str, ...] = ()  # the layers whose quantized outputs it reads

    @property
    def added_noise(self) -> float:
        """Relative noise power the layer adds: 10^(-out/10) - 10^(-in/10)."""
        return 10.0 ** (-self.output_sqnr_db / 10.0) - 10.0 ** (-self.input_sqnr_db / 10.0)

    def summary(self) -> dict:
        return {"layer": self.layer, "op": self.op_type, "input_sqnr_db": _rounded_db(self.input_sqnr_db),
                "output_sqnr_db": _rounded_db(self.output_sqnr_db), "with_inputs_of": list(self.inputs_from)}


def layer_noise(float_graph, quantized, feeds: Sequence[dict], *, backend: str | None = None) -> list[LayerNoise]:
    """Per quantized layer of ``quantized``, the SQNR of its worst activation input and of its
    output against ``float_graph`` on ``feeds``: one run of each model, every tensor observed.
    Most noise added first."""
    from edgeinfer.quantize.calibrate import run_batches
    from edgeinfer.quantize.qdq import layer_name
    from edgeinfer.quantize.report import observed_tensors

    pairs: dict[str, tuple[str, str]] = {}  # key -> (float tensor, quantized tensor)
    reads: dict[str, list[str]] = {}
    sources: dict[str, list[str]] = {}
    layers = []
    for node in quantized.nodes:
        if node.op_type in ("QuantizeLinear", "DequantizeLinear") or node.domain:
            continue
        activation_inputs = [_quantized_source(quantized, name) for name in node.inputs if name]
        activation_inputs = [a for a in activation_inputs if a is not None and a[0] in float_graph.values]
        if not activation_inputs:
            continue
        name = layer_name(node)
        layers.append(name)
        reads[name] = []
        for source, seen in activation_inputs:
            pairs[f"in:{seen}"] = (source, seen)
            reads[name].append(f"in:{seen}")
        producers = [float_graph.producer(source) for source, _ in activation_inputs]
        sources[name] = [layer_name(p) for p in producers if p is not None]
    observed = {layer: (op, ref, seen) for layer, op, ref, seen in observed_tensors(float_graph, quantized, layers)}
    for layer, (_, ref, seen) in observed.items():
        pairs[f"out:{layer}"] = (ref, seen)
    sums = {key: np.zeros(2) for key in pairs}
    feeds = list(feeds)
    with closing(run_batches(float_graph, sorted({r for r, _ in pairs.values()}), feeds, backend=backend)) as refs, \
            closing(run_batches(quantized, sorted({s for _, s in pairs.values()}), feeds, backend=backend)) as gots:
        for ref_values, got_values in zip(refs, gots, strict=True):
            for key, (ref, seen) in pairs.items():
                a = np.asarray(ref_values[ref], np.float64).reshape(-1)
                b = np.asarray(got_values[seen], np.float64).reshape(-1)
                sums[key] += (a @ a, (a - b) @ (a - b))
    db = {key: (np.inf if noise == 0 else 10.0 * np.log10(max(signal, 1e-30) / noise)) for key, (signal, noise) in sums.items()}
    rows = [LayerNoise(layer, op, min((db[k] for k in reads[layer]), default=np.inf), db[f"out:{layer}"],
                       tuple(sources[layer])) for layer, (op, _, _) in observed.items()]
    return sorted(rows, key=lambda r: -r.added_noise)


def _quantized_source(graph, name: str) -> tuple[str, str] | None:
    """(float tensor, tensor the reader sees) for an activation input: through Q -> DQ to the
    float tensor quantized, or the tensor itself when it is float; None for constants."""
    value = graph.values.get(name)
    if value is None or value.const is not None:
        return None
    producer = graph.producer(name)
    if producer is not None and producer.op_type == "DequantizeLinear":
        quantize = graph.producer(producer.inputs[0])
        if quantize is None or quantize.op_type != "QuantizeLinear":
            return None  # a weight or bias behind its DequantizeLinear
        return quantize.inputs[0].removesuffix("_prequant"), name
    return (name, name) if value.dtype == "float32" else None


def quantize_to_sqnr(model: Model, calibration: Calibration, min_sqnr: float, *, feeds: Sequence[dict],
                     method: str, activations: str = "uint8", per_channel: bool = True, exclude: Sequence[str] = (),
                     reduce_range: bool = False, backend: str | None = None,
                     noise_rounds: int = NOISE_ROUNDS, prune: bool = False,
                     float_weights: str = "int8") -> AccuracyResult:
    """Quantize, then keep layers in float until every output's SQNR against fp32 on ``feeds``
    is at least ``min_sqnr`` dB: the task-agnostic accuracy budget, in two stages.

    1. Up to ``noise_rounds`` rounds: quantize with the current float set, measure every layer's
       input and output SQNR in one run (``layer_noise``) and keep float the layer adding the
       most noise (and those adding at least half as much, at most ``MAX_PER_ROUND``), with the
       layers whose quantized outputs it reads, so that the tensor it reads stays float too.
    2. Where that is not enough: the fewest leading layers (graph order) kept float on top of
       those, by bisection. Noise added early is amplified by everything after it: on the
       PP-OCRv4 detector, uniform input noise of half an 8-bit step alone costs 1.8% of the
       text-mask IoU, and quantizing its first conv alone leaves 10 dB.
    3. With ``prune``, once the target is met: each layer kept float by the stages above
       (largest weights first) is quantized again where the target still holds without it.
       Both stages keep whole groups float (a layer with its inputs' layers, a prefix of the
       graph). Off by default: it spends the margin the stages leave over ``feeds``, and 8
       calibration samples do not stand for unseen inputs. Measured, 23 dB target on 8 crops,
       held-out crops on onnxruntime: MediaPipe face detector 46 -> 26 float layers, 0.415x ->
       0.357x fp32, 23.4 -> 20.2 dB; face landmarks 50 -> 22 float, 0.442x -> 0.316x, but 14.2
       -> 9.3 dB for a 1.2 dB loss on the search samples.

    Each step costs one quantization and one run of ``feeds``. The metric is the worst output
    SQNR (``float_metric`` is inf); the float layers and why are in the model's ``quantization``
    metadata under ``mixed_precision``. The float layers' Conv/Gemm/MatMul weights are stored as
    ``float_weights`` (``quantize_static``): int8 by default, so that the file stays near the
    INT8 size, and every step measures the outputs with those rounded weights. Where int8 weights
    alone (every layer float) come within ``WEIGHT_MARGIN_DB`` of the target, each weighted
    layer's int8 weights (an LSTM/GRU/RNN's too: never quantized, int8-stored) are measured alone
    (one step per layer), and the fewest layers whose
    weights cost the most output noise per byte keep float32 weights (bisection over that order),
    stored as float16 where float16 holds them to ``static.FLOAT16_MIN_DB``. Where float16 values
    of every wide weight (every layer float) miss the target and margin, each layer's float16
    weights are measured alone too, and the fewest layers whose float16 values cost the most noise
    per byte keep exact float32 weights (the same bisection). Every step measures with those values.
    The graph-order rule before it gave every layer of the digits CNN float32 weights, whose
    loudest weights are its last layer's (``tests/quantize/test_digits.py`` checks the order and
    that fewer than all layers are chosen)."""
    import json

    if not np.isfinite(min_sqnr):
        raise InputError(f"min_sqnr {min_sqnr}: expected a finite number of dB")
    backend = backend or default_backend()
    options = dict(method=method, activations=activations, per_channel=per_channel, reduce_range=reduce_range,
                   float_weights=float_weights, float32_weights_as="float16")

    def attempt(kept: Sequence[str]) -> tuple[Model, float]:
        from edgeinfer.quantize.guard import output_quality

        quantized = quantize_static(model, calibration, exclude=list(kept), **options)
        return quantized, min(q.sqnr_db for q in output_quality(calibration.graph, quantized.graph, feeds,
                                                                backend=backend))

    kept = list(exclude)
    reasons: list[dict] = []
    quantized, score = attempt(kept)
    first, steps = score, 1
    ceiling, float16_db, whole, exact = None, None, [], []
    if score < min_sqnr and float_weights == "int8":
        # every layer float with int8 weights: the best any search can reach with them. Within
        # WEIGHT_MARGIN_DB of the target (weight rounding alone would take over half the noise the
        # target allows), the layers whose int8 weights cost most output noise per byte keep
        # float32 weights: the fewest of them, in that order, by bisection
        everything = quantizable_layers(calibration, activations=activations, per_channel=per_channel)
        ceiling = attempt(everything)[1]
        steps += 1
        if ceiling < min_sqnr + WEIGHT_MARGIN_DB:
            weighted = weighted_layers(calibration.graph) + recurrent_layers(calibration.graph)
            # each layer's int8 weights alone (every other weight exactly float32, every layer float):
            # float16 values there would add their own noise floor to every figure and rank the
            # layers by size instead
            alone = {}
            options["float32_weights_as"] = "float32"
            for layer in weighted:
                options["float32_weights"] = [other for other in weighted if other != layer]
                alone[layer] = attempt(everything)[1]
            # float16 values of every wide weight: where even they (every layer float) miss the
            # target and margin, the network is that sensitive (RapidOCR's orientation classifier:
            # 34.5 dB on its search samples; recorded as float16_weights_db), and the layers whose
            # float16 weights alone cost most output noise per byte keep exact float32 weights
            # (one of its 38 wide layers): the fewest of them, in that order, by bisection
            options["float32_weights"] = weighted
            options["float32_weights_as"] = "float16"
            float16_db = attempt(everything)[1]
            steps += len(weighted) + 1
            sizes = _constant_bytes(calibration.graph, weighted)
            exact: list[str] = []
            float16_alone: dict[str, float] = {}

            def fewest(alone_db: dict[str, float], option: str) -> list[str]:
                """The shortest prefix of ``weighted`` by noise per byte (``alone_db``) that, set as
                ``option``, reaches the target and margin (every layer float), by bisection."""
                nonlocal steps
                order = sorted(weighted, key=lambda layer: -_noise_power(alone_db[layer]) / max(sizes[layer], 1))
                low, high = 0, len(order)  # order[:low] misses, order[:high] (all: float32 weights) holds
                while high - low > 1:
                    middle = (low + high) // 2
                    options[option] = order[:middle]
                    steps += 1
                    if attempt(everything)[1] >= min_sqnr + WEIGHT_MARGIN_DB:
                        high = middle
                    else:
                        low = middle
                options[option] = order[:high]
                return order[:high]

            if float16_db < min_sqnr + WEIGHT_MARGIN_DB:
                for layer in weighted:
                    options["exact_float32_weights"] = [other for other in weighted if other != layer]
                    float16_alone[layer] = attempt(everything)[1]
                steps += len(weighted)
                exact = fewest(float16_alone, "exact_float32_weights")
            whole = fewest(alone, "float32_weights")
            exact = [layer for layer in exact if layer in whole]
            stored = ("stored as float16 where float16 holds them" if not float16_alone else
                      f"stored as float16 but for {len(exact)} whose float16 values alone cost the most "
                      "output noise per byte: float16 values of every weight miss the target and margin")
            reasons.append({"layers": whole, "stored_as": "float16", "exact_float32": exact,
                            **({"float16_weights_alone_db": {layer: _rounded_db(float16_alone[layer]) for layer in exact}}
                               if float16_alone else {}),
                            "int8_weights_alone_db": {layer: _rounded_db(alone[layer]) for layer in whole},
                            "reason": f"float32 weights: with int8 weights every layer float reaches "
                                      f"{_rounded_db(ceiling)} dB, less than {WEIGHT_MARGIN_DB:g} dB over the "
                                      "target; these layers, whose int8 weights alone cost the most output "
                                      f"noise per weight byte, keep float weights when kept float ({stored})"})
    for _ in range(noise_rounds):
        if score >= min_sqnr:
            break
        noise = [row for row in layer_noise(calibration.graph, quantized.graph, feeds, backend=backend)
                 if row.layer not in kept and row.added_noise > 0]
        if not noise:
            break
        for row in [r for r in noise if r.added_noise >= ROUND_SHARE * noise[0].added_noise][:MAX_PER_ROUND]:
            reasons.append({**row.summary(), "reason": "most noise added"})
            kept.extend(name for name in (row.layer, *row.inputs_from) if name not in kept)
        quantized, score = attempt(kept)
        steps += 1
    if score < min_sqnr:
        leading = [name for name in quantizable_layers(calibration, activations=activations, per_channel=per_channel)
                   if name not in kept]
        low, high, best = 0, len(leading), None  # leading[:low] fails, leading[:high] is all of them
        while high - low > 1 or best is None:
            middle = high if best is None else (low + high) // 2
            candidate, candidate_score = attempt(kept + leading[:middle])
            steps += 1
            if candidate_score >= min_sqnr or best is None:
                best = (middle, candidate, candidate_score)
                if candidate_score < min_sqnr:
                    break  # even every layer float misses it (float rounding of the outputs): stop
                high = middle
            else:
                low = middle
        count, quantized, score = best
        if count:
            reasons.append({"layers": leading[:count], "reason": "leading layers (noise there is amplified most)"})
            kept.extend(leading[:count])
    if prune and score >= min_sqnr:
        returned = []
        for name in _by_weight_size(calibration.graph, [k for k in kept if k not in exclude]):
            candidate, candidate_score = attempt([k for k in kept if k != name])
            steps += 1
            if candidate_score >= min_sqnr:
                kept.remove(name)
                returned.append(name)
                quantized, score = candidate, candidate_score
        if returned:
            reasons.append({"layers": returned, "reason": "quantized again: the target holds without them float"})
    summary = json.loads(quantized.metadata.get("quantization", "{}"))
    summary["mixed_precision"] = {"min_sqnr_db": min_sqnr, "sqnr_db": _rounded_db(score), "met": score >= min_sqnr,
                                  "int8_sqnr_db": _rounded_db(first), "samples": len(feeds), "steps": steps,
                                  "float_weights": float_weights, "float32_weight_layers": len(whole),
                                  "exact_float32_weight_layers": len(exact),
                                  **({} if ceiling is None else {"int8_weights_ceiling_db": _rounded_db(ceiling)}),
                                  **({} if float16_db is None else {"float16_weights_db": _rounded_db(float16_db)}),
                                  "float_layers": len(kept), "quantized_layers": int(summary.get("layers", 0)),
                                  "kept_float": kept, "reasons": reasons}
    metadata = dict(quantized.metadata)
    metadata["quantization"] = json.dumps(summary, sort_keys=True)
    result = AccuracyResult(Model(quantized.graph, metadata), np.inf, first, score, kept)
    result.within_budget = score >= min_sqnr
    return result


def _by_weight_size(graph, layers: Sequence[str]) -> list[str]:
    """``layers`` by the constant bytes their nodes read, largest first (ties in given order)."""
    sizes = _constant_bytes(graph, layers)
    return sorted(layers, key=sizes.__getitem__, reverse=True)


def _constant_bytes(graph, layers: Sequence[str]) -> dict[str, int]:
    """The constant bytes each layer's node reads (0 for a name that is no node)."""
    from edgeinfer.quantize.qdq import layer_name

    nodes = {layer_name(n): n for n in graph.nodes}
    initializers = graph.initializers
    return {layer: sum(initializers[name].nbytes for name in nodes[layer].inputs if name in initializers)
            if layer in nodes else 0 for layer in layers}


def _noise_power(db: float) -> float:
    """Relative noise power of an SQNR in dB (0 for inf)."""
    return 0.0 if not np.isfinite(db) else 10.0 ** (-db / 10.0)


def _rounded_db(value: float) -> float | str:
    return "inf" if not np.isfinite(value) else round(float(value), 2)
