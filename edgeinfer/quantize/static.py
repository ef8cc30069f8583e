"""Static INT8 post-training quantization: calibrate once, quantize with any method.

    calibration = calibrate(model, samples)                  # one histogram per tensor
    int8 = quantize_static(model, calibration, method="entropy")

The graph is first brought to standard ONNX ops: the fused ``edgeinfer`` ops the level-2
passes create (FusedConv, FusedGemm, FusedMatMul) are lowered back to Conv/Gemm/MatMul plus
their activation, which is exactly the form onnxruntime's QDQ fusions recognise (a Relu or
Clip after a quantized op is then absorbed by the QuantizeLinear that follows it). Other
``edgeinfer`` ops (LayerNormalization, Attention, Gelu) stay as they are, in float.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from edgeinfer.errors import InputError
from edgeinfer.ir import EDGEINFER_DOMAIN, Graph
from edgeinfer.ir.infer import infer_types
from edgeinfer.model import Model
from edgeinfer.quantize.calibrate import collect_histograms
from edgeinfer.quantize.data import Feeds, open_source, sample_count
from edgeinfer.quantize.histogram import DEFAULT_BINS, TensorHistogram
from edgeinfer.quantize.methods import CALIBRATION_METHODS, activation_type, calibration_range
from edgeinfer.quantize.qdq import StaticOptions, build_qdq_graph, plan_quantization, weights_summary

LOWERED_FOR_QUANTIZATION = ("FusedConv", "FusedGemm", "FusedMatMul")
DEFAULT_METHOD = "entropy"


def prepare_graph(graph: Graph) -> Graph:
    """``graph`` with fused conv/gemm/matmul ops lowered to standard ops (types inferred)."""
    from edgeinfer.ir.lowering import lower_node

    if not any(n.domain == EDGEINFER_DOMAIN and n.op_type in LOWERED_FOR_QUANTIZATION for n in graph.nodes):
        return graph
    taken = set(graph.values) | {n.name for n in graph.nodes if n.name}
    nodes, inits = [], graph.initializers
    for node in graph.nodes:
        lowered = None
        if node.domain == EDGEINFER_DOMAIN and node.op_type in LOWERED_FOR_QUANTIZATION:
            lowered = lower_node(node, graph, taken)
        if lowered is None:
            nodes.append(node)
        else:
            nodes.extend(lowered.nodes)
            inits.update(lowered.initializers)
    return infer_types(graph.replace(nodes, initializers=inits))


@dataclass
class Calibration:
    """The histograms of one calibration run over a prepared graph; ranges for any method."""

    graph: Graph
    histograms: dict[str, TensorHistogram]
    samples: int

    def ranges(self, method: str, activation: str = "uint8", **options: float) -> dict[str, tuple[float, float]]:
        qtype = activation_type(activation)
        return {name: calibration_range(hist, method, qtype, **options)
                for name, hist in self.histograms.items() if hist.samples}


def calibrate(model: Model | Graph, data: Any = None, *, random_samples: int = 0,
              limit: int | None = None, backend: str | None = None, bins: int = DEFAULT_BINS,
              progress: bool = False, size: Sequence[int] | None = None,
              mean: Sequence[float] | None = None, std: Sequence[float] | None = None) -> Calibration:
    """Run the float model over ``data`` (samples, a folder, or None with ``random_samples``)
    and keep one histogram per float activation. ``limit`` caps the number of batches."""
    graph = prepare_graph(_graph_of(model))
    feeds = open_source(data, graph, size=size, mean=mean, std=std, random_samples=random_samples)
    counted = _Counted(feeds, limit)
    known = sample_count(data, random_samples)
    total = min(limit, known) if limit is not None and known is not None else (limit if known is None else known)
    histograms = collect_histograms(graph, counted, backend=backend, bins=bins, progress=progress, total=total)
    return Calibration(graph, histograms, counted.count)


def quantize_static(model: Model | Graph, calibration: Calibration, *, method: str = DEFAULT_METHOD,
                    activations: str = "uint8", per_channel: bool = True, exclude: Iterable[str] = (),
                    method_options: Mapping[str, float] | None = None, reduce_range: bool = False) -> Model:
    """The QDQ int8 model of ``model`` with ranges from ``calibration`` by ``method``;
    ``reduce_range``: 7-bit weights (see ``edgeinfer.quantize.quantize``)."""
    if method not in CALIBRATION_METHODS:
        raise InputError(f"calibration method {method!r}: expected one of {sorted(CALIBRATION_METHODS)}")
    source = model if isinstance(model, Model) else Model(model)
    graph = calibration.graph
    if set(_graph_of(model).input_names) != set(graph.input_names):
        raise InputError("calibration was collected on a different model: its inputs "
                         f"{graph.input_names} differ from {_graph_of(model).input_names}")
    ranges = calibration.ranges(method, activations, **dict(method_options or {}))
    options = StaticOptions(activation_type(activations), per_channel, frozenset(exclude), reduce_range)
    plan = plan_quantization(graph, ranges, options)
    summary = {"mode": "static", "method": method, "activations": activations,
               "weights": weights_summary(per_channel, reduce_range),
               "layers": len(plan.layers), "excluded": sorted(options.exclude),
               "calibration_samples": calibration.samples}
    quantized = build_qdq_graph(graph, plan, summary)
    quantized.verify()
    metadata = dict(source.metadata)
    metadata["quantization"] = json.dumps(summary, sort_keys=True)
    return Model(quantized, metadata)


def quantizable_layers(calibration: Calibration, *, activations: str = "uint8", per_channel: bool = True,
                       method: str = "minmax") -> list[str]:
    """The layer names a full quantization would quantize (the units of sensitivity analysis)."""
    ranges = calibration.ranges(method, activations)
    options = StaticOptions(activation_type(activations), per_channel)
    return plan_quantization(calibration.graph, ranges, options).layers


def _graph_of(model: Model | Graph) -> Graph:
    if isinstance(model, Model):
        return model.graph
    if isinstance(model, Graph):
        return model
    raise InputError(f"quantize: expected an edgeinfer Model or Graph, got {type(model).__name__}")


class _Counted:
    """An iterable of feeds that counts what it yields and stops after ``limit``."""

    def __init__(self, feeds: Iterable[Feeds], limit: int | None):
        if limit is not None and limit < 1:
            raise InputError(f"calibration limit {limit}: expected a positive number of samples")
        self.feeds, self.limit, self.count = feeds, limit, 0

    def __iter__(self):
        for feeds in self.feeds:
            if self.limit is not None and self.count >= self.limit:
                return
            self.count += 1
            yield feeds
