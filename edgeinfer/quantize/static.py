"""Static INT8 post-training quantization: calibrate once, quantize with any method.

    calibration = calibrate(model, samples)                  # one histogram per tensor
    int8 = quantize_static(model, calibration, method="mse")   # the default, chosen on real models

The graph is first brought to standard ONNX ops: the fused ``edgeinfer`` ops the level-2
passes create (FusedConv, FusedGemm, FusedMatMul) are lowered back to Conv/Gemm/MatMul plus
their activation, which is exactly the form onnxruntime's QDQ fusions recognise (a Relu or
Clip after a quantized op is then absorbed by the QuantizeLinear that follows it). Other
``edgeinfer`` ops (LayerNormalization, Attention, Gelu) stay as they are, in float.

Weights stored as float16 behind a ``Cast`` (constant folding keeps that Cast, so that the
file stays narrow) are widened to float32 constants first and what they feed (the layout
Transposes of a TFLite import) is folded, so that the quantizer sees every weight as a
constant: otherwise an "INT8" model of an fp16-weight file keeps all its weights in float.
Weights that are already float32 constants whose storage is narrow (``weight_storage``
metadata) are plain constants to the quantizer.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edgeinfer.errors import InputError
from edgeinfer.ir import EDGEINFER_DOMAIN, Graph
from edgeinfer.ir.infer import infer_types
from edgeinfer.model import Model
from edgeinfer.passes.rules import rebuild
from edgeinfer.progress import Steps
from edgeinfer.quantize.bias_correction import CORRECTED_OPS, ROUNDING_CORRECTED, rounding_corrected
from edgeinfer.quantize.calibrate import collect_histograms
from edgeinfer.quantize.data import Feeds, open_source, sample_count
from edgeinfer.quantize.guard import HOLD_OUT_EVERY, MAX_HELD_OUT, MIN_FOR_HOLD_OUT
from edgeinfer.quantize.histogram import DEFAULT_BINS, ChannelMean, TensorHistogram, ValueGrid
from edgeinfer.quantize.methods import CALIBRATION_METHODS, activation_type, calibration_range
from edgeinfer.quantize.qdq import (
    StaticOptions,
    build_qdq_graph,
    layer_name,
    plan_quantization,
    weights_summary,
)

LOWERED_FOR_QUANTIZATION = ("FusedConv", "FusedGemm", "FusedMatMul")
FLOAT32_TYPE = 1  # onnx.TensorProto.FLOAT
# Chosen by measured task quality (benchmarks/bench_int8_real.py, one run on a loaded 2-core machine):
# mean rank of the worst-backend task metric over YOLOv8n, PP-OCRv4 det and rec, MediaPipe face
# detector and landmarks: mse 1.8, minmax 2.2, entropy 3.0, percentile 3.0. mse is the only method
# at least as good as onnxruntime's quantize_static on all five; entropy was the worst on the
# recognizer (character agreement 0.37 vs 0.96) and the face detector (6.3 vs 16.5 dB).
DEFAULT_METHOD = "mse"
FLOAT_WEIGHTS = ("float32", "int8")  # how the weights of the layers kept float are stored


def prepare_graph(graph: Graph) -> Graph:
    """``graph`` with float16-stored weights widened and fused conv/gemm/matmul ops lowered to
    standard ops (types inferred)."""
    from edgeinfer.ir.lowering import lower_node

    graph = widen_cast_weights(graph)
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


def widen_cast_weights(graph: Graph) -> Graph:
    """``graph`` with every ``Cast`` of a float16/bfloat16 constant to float32 replaced by the
    float32 constant, and the constant ops it fed folded (a weight's layout Transpose)."""
    from edgeinfer.passes.fold_constants import fold_constants

    widened: dict[str, np.ndarray] = {}
    for node in graph.nodes:
        if node.op_type != "Cast" or node.domain or not node.inputs or node.outputs[0] in graph.output_names:
            continue
        source = graph.values.get(node.inputs[0])
        if (source is not None and source.const is not None and source.dtype in ("float16", "bfloat16")
                and int(node.attrs.get("to", 0)) == FLOAT32_TYPE):
            widened[node.outputs[0]] = source.const.astype(np.float32)
    if not widened:
        return graph
    nodes = [n for n in graph.nodes if not (n.op_type == "Cast" and n.outputs[0] in widened)]
    kept = [v for v in graph.value_info() if v.name not in widened]
    widened_graph = infer_types(rebuild(graph, nodes, {**graph.initializers, **widened}, kept))
    folded = fold_constants(widened_graph).graph
    used = {i for n in folded.nodes for i in n.inputs if i} | set(folded.output_names)
    return folded.replace(initializers={k: v for k, v in folded.initializers.items() if k in used})


@dataclass
class Calibration:
    """The histograms of one calibration run over a prepared graph; ranges for any method."""

    graph: Graph
    histograms: dict[str, TensorHistogram]
    samples: int
    held_out: list[Feeds] = field(default_factory=list)  # samples calibration did not see
    first: list[Feeds] = field(default_factory=list)  # the first calibration samples (guard fallback)
    # the graph quantization takes its weights from, where they were rounded beforehand (GPTQ,
    # ``gptq.with_gptq_weights``); ``graph`` stays the float reference every measurement compares with
    rounded_graph: Graph | None = None
    weight_rounding: dict = field(default_factory=dict)  # how rounded_graph's weights were rounded
    # the float input's mean per channel of each Conv/Gemm with a constant weight, by tensor name:
    # what the bias correction of the int8-rounded weights of layers kept float needs
    input_means: dict[str, np.ndarray] = field(default_factory=dict)
    # the graph inputs whose every calibration value lay on one 8-bit grid through 0 (pixels:
    # ``x / 255``, ``x - 128``), as ``(step, first level, last level)`` (``histogram.ValueGrid``)
    input_grids: dict[str, tuple[float, int, int]] = field(default_factory=dict)

    def ranges(self, method: str, activation: str = "uint8", **options: float) -> dict[str, tuple[float, float]]:
        """Each tensor's range by ``method``; a graph input on a grid (``input_grids``) gets the
        range whose quantization step is the grid's and whose zero point is on it, so that it
        is quantized exactly: ``method``'s range would round every pixel again (ddddocr's
        recognizer, ``x / 255`` of pixels 9-244: mse chose a step of 1/266.5)."""
        qtype = activation_type(activation)
        ranges = {name: calibration_range(hist, method, qtype, **options)
                  for name, hist in self.histograms.items() if hist.samples}
        for name, grid in self.input_grids.items():
            exact = grid_range(grid, qtype)
            if exact is not None and name in ranges:
                ranges[name] = exact
        return ranges


def grid_range(grid: tuple[float, int, int], qtype) -> tuple[float, float] | None:
    """The range whose ``quant_params`` step is the grid's ``step`` with the zero point on the
    grid, holding every level from ``first`` to ``last`` and 0; None where ``qtype`` cannot
    (more levels than it has, or too far from 0). uint8: the 256 levels start at 0 for data
    that never goes below it, end at 0 for data never above it, else are centered on the data."""
    step, first, last = grid
    span = qtype.qmax - qtype.qmin
    if qtype.symmetric:
        half = span // 2
        return (-half * step, half * step) if max(-first, last) <= half else None
    low_min, low_max = max(last - span, -span), min(first, 0)
    if low_min > low_max:
        return None
    low = 0 if first >= 0 else -span if last <= 0 else round((first + last - span) / 2)
    low = min(max(low, low_min), low_max)
    return low * step, (low + span) * step


def calibrate(model: Model | Graph, data: Any = None, *, random_samples: int = 0,
              limit: int | None = None, backend: str | None = None, bins: int = DEFAULT_BINS,
              progress: Steps | None = None, size: Sequence[int] | None = None,
              mean: Sequence[float] | None = None, std: Sequence[float] | None = None,
              hold_out: bool = False, layout: str | None = None) -> Calibration:
    """Run the float model over ``data`` (samples, a folder, or None with ``random_samples``)
    and keep one histogram per float activation. ``limit`` caps the number of batches. With
    ``hold_out``, every ``HOLD_OUT_EVERY``-th sample is kept apart for the quality guard, unless
    the data is known to hold fewer than ``MIN_FOR_HOLD_OUT`` samples (then every one calibrates).
    Images are resized to ``size``, normalized by ``mean``/``std`` and laid out as ``layout``
    ("NCHW" or "NHWC"; default: guessed from where the input has 3 channels)."""
    graph = prepare_graph(_graph_of(model))
    feeds = open_source(data, graph, size=size, mean=mean, std=std, random_samples=random_samples, layout=layout)
    known = sample_count(data, random_samples)
    total = min(limit, known) if limit is not None and known is not None else (limit if known is None else known)
    counted = _Counted(feeds, limit, hold_out and (total is None or total >= MIN_FOR_HOLD_OUT), keep_first=hold_out)
    means = {name: ChannelMean(axis) for name, axis in _bias_layer_inputs(graph).items()}
    grids = {name: ValueGrid() for name in graph.input_names if graph.values[name].dtype in ("float32", "float16")}
    histograms = collect_histograms(graph, counted, backend=backend, bins=bins, progress=progress, total=total,
                                    means=means, grids=grids)
    input_means = {name: mean.mean for name, mean in means.items() if mean.mean is not None}
    input_grids = {name: grid.grid for name, grid in grids.items() if grid.grid is not None}
    return Calibration(graph, histograms, counted.count, counted.held_out, counted.first, input_means=input_means,
                       input_grids=input_grids)


def _bias_layer_inputs(graph: Graph) -> dict[str, int]:
    """The float inputs of the Conv and Gemm (no transA) nodes with a constant weight and bias,
    with their channel axis (1 for Conv, -1 for Gemm)."""
    inputs: dict[str, int] = {}
    for node in graph.nodes:
        if node.op_type not in ROUNDING_CORRECTED or len(node.inputs) < 3 or _weight_axis(node, graph) is None:
            continue
        if node.op_type == "Gemm" and int(node.attrs.get("transA", 0)):
            continue
        bias, source = graph.values.get(node.inputs[2]), graph.values.get(node.inputs[0])
        if bias is not None and bias.const is not None and source is not None and source.const is None:
            inputs[node.inputs[0]] = 1 if node.op_type == "Conv" else -1
    return inputs


def quantize_static(model: Model | Graph, calibration: Calibration, *, method: str = DEFAULT_METHOD,
                    activations: str = "uint8", per_channel: bool = True, exclude: Iterable[str] = (),
                    method_options: Mapping[str, float] | None = None, reduce_range: bool = False,
                    quantize_outputs: bool = False, bias_correction: bool = False,
                    bias_correction_feeds: Sequence[Feeds] | None = None, backend: str | None = None,
                    correct_zero_biases: bool = False, sequential_correction: bool = True,
                    float_weights: str = "float32", float32_weights: Iterable[str] = (),
                    float32_weights_as: str = "float32", exact_float32_weights: Iterable[str] = ()) -> Model:
    """The QDQ int8 model of ``model`` with ranges from ``calibration`` by ``method``;
    ``reduce_range``: 7-bit weights (see ``edgeinfer.quantize.quantize``).

    ``bias_correction``: the biases of the quantized Conv/ConvTranspose/Gemm layers are first
    corrected for the mean shift INT8 adds (``bias_correction.py``), measured on
    ``bias_correction_feeds`` (default: the first calibration samples, ``calibration.first``)
    on ``backend``.

    ``exclude`` names layers (node names, or a node's first output) kept float; a name that
    is no layer of the model is an error. The ops writing graph outputs keep a float output
    unless ``quantize_outputs``. ``float_weights="int8"``: the Conv/ConvTranspose/Gemm/MatMul
    layers of ``exclude`` keep float activations but their weights are rounded to int8 (one
    symmetric scale per output channel) and stored so (``edgeinfer.ir.weights.int8_rounded``):
    float compute on int8 bytes. So are the W and R weights of the LSTM/GRU/RNN layers, which are
    never quantized (``recurrent_layers``; one scale per gate row). Those also in
    ``float32_weights`` keep float32 weights, stored
    as float16 with ``float32_weights_as="float16"`` where float16 holds a weight to
    ``FLOAT16_MIN_DB`` (``float16_float_weights``: half the bytes, the same float32 compute)
    and the layer is not in ``exact_float32_weights`` (kept float32 even then). The
    float bias of such a Conv/Gemm loses the mean shift the rounding adds to its output, from the
    input channel means calibration recorded (``bias_correction.rounding_corrected``; a
    calibration without them, ``input_means={}``, corrects nothing), and is then stored as
    float16 values where its weights are int8 or float16 ones (``float16_float_biases``), as are
    the slopes of the PRelu layers that compute in float (``float16_float_slopes``)."""
    if method not in CALIBRATION_METHODS:
        raise InputError(f"calibration method {method!r}: expected one of {sorted(CALIBRATION_METHODS)}")
    if float_weights not in FLOAT_WEIGHTS:
        raise InputError(f"float_weights {float_weights!r}: expected one of {FLOAT_WEIGHTS}")
    if float32_weights_as not in ("float32", "float16"):
        raise InputError(f"float32_weights_as {float32_weights_as!r}: expected 'float32' or 'float16'")
    source = model if isinstance(model, Model) else Model(model)
    graph = calibration.graph if calibration.rounded_graph is None else calibration.rounded_graph
    if set(_graph_of(model).input_names) != set(graph.input_names):
        raise InputError("calibration was collected on a different model: its inputs "
                         f"{graph.input_names} differ from {_graph_of(model).input_names}")
    exclude = _layer_names(frozenset(exclude), graph, _graph_of(model))
    ranges = calibration.ranges(method, activations, **dict(method_options or {}))
    options = StaticOptions(activation_type(activations), per_channel, exclude, reduce_range, quantize_outputs)
    rounded: list[str] = []
    whole = _layer_names(frozenset(float32_weights), graph, _graph_of(model)) if float_weights == "int8" else None
    if calibration.rounded_graph is not None:  # float32 weights are the float model's, not the rounded ones
        graph = with_weights_of(graph, calibration.graph, options.exclude if whole is None else options.exclude & whole)
    rounding_corrections: list[str] = []
    narrowed: list[str] = []
    narrowed_biases: list[str] = []
    narrowed_slopes: list[str] = []
    if whole is not None:
        kept_float = options.exclude | frozenset(recurrent_layers(graph))
        graph, rounded = int8_float_weights(graph, kept_float - whole)
        exact = _layer_names(frozenset(exact_float32_weights), graph, _graph_of(model)) & whole
        if float32_weights_as == "float16":
            graph, narrowed = float16_float_weights(graph, (kept_float & whole) - exact)
        graph, rounding_corrections = rounding_corrected(graph, calibration.graph, rounded, calibration.input_means)
        # float16 biases where the weights are int8 or float16 values, after the rounding correction
        narrow_weights = kept_float - whole if float32_weights_as == "float32" else kept_float - exact
        graph, narrowed_biases = float16_float_biases(graph, narrow_weights)
        # the PRelu layers computing in float: kept float, or never quantized (the plan leaves them)
        computed_in_float = frozenset(layer_name(n) for n in graph.nodes) - frozenset(
            plan_quantization(graph, ranges, options).layers)
        graph, narrowed_slopes = float16_float_slopes(graph, computed_in_float)
    corrected: list | None = None
    if bias_correction:
        from edgeinfer.quantize.bias_correction import correct_biases

        feeds = list(calibration.first if bias_correction_feeds is None else bias_correction_feeds)
        if not feeds:
            raise InputError("bias_correction needs calibration samples: give bias_correction_feeds, or "
                             "calibrate with hold_out=True (which keeps the first samples)")
        graph, corrected = correct_biases(graph, lambda g: plan_quantization(g, ranges, options), feeds,
                                          backend=backend, zero_biases=correct_zero_biases,
                                          sequential=sequential_correction)
        samples_used = len(feeds)
    plan = plan_quantization(graph, ranges, options)
    summary = {"mode": "static", "method": method, "activations": activations,
               "weights": weights_summary(per_channel, reduce_range),
               "layers": len(plan.layers), "excluded": sorted(options.exclude),
               "quantize_outputs": quantize_outputs,
               "calibration_samples": calibration.samples}
    if calibration.rounded_graph is not None:
        summary["weight_rounding"] = dict(calibration.weight_rounding)
    if rounded:
        summary["float_layer_weights"] = {"format": "int8", "weights": len(rounded),
                                          "biases_corrected": len(rounding_corrections)}
    if narrowed:
        summary["float16_stored_weights"] = len(narrowed)
    if narrowed_biases:
        summary["float16_stored_biases"] = len(narrowed_biases)
    if narrowed_slopes:
        summary["float16_stored_slopes"] = len(narrowed_slopes)
    if corrected is not None:
        summary["bias_correction"] = {"layers": len(corrected), "samples": samples_used,
                                      "waves": 1 + max((c.wave for c in corrected), default=-1),
                                      "largest_shift": round(max((c.largest_shift for c in corrected), default=0.0), 6)}
    quantized = build_qdq_graph(graph, plan, summary)
    quantized.verify()
    metadata = dict(source.metadata)
    metadata["quantization"] = json.dumps(summary, sort_keys=True)
    return Model(quantized, metadata)


def int8_weights_only(model: Model | Graph, calibration: Calibration, *, float32_weights: Iterable[str] = (),
                      method: str = DEFAULT_METHOD) -> Model:
    """Weight-only INT8 for any network: every layer float, every Conv/ConvTranspose/Gemm/MatMul
    weight (an LSTM/GRU/RNN's too) rounded to int8 with one scale per output channel and stored
    so (``float_weights="int8"``: about a quarter of the float32 bytes), the float layers'
    biases and PReLU slopes as float16 values; the compute and its speed are the float model's.
    ``calibration`` rounds the weights (GPTQ where it was made by ``gptq.with_gptq_weights``) and
    gives the input means that correct each bias for its rounding; ``float32_weights`` keep
    float32 weights. The summary says ``"activations": "float"`` and counts the float layers
    (``float_layers``) rather than naming them. The best output SQNR int8
    weights allow (the mixed-precision search's ``int8_weights_ceiling_db``): where it is enough
    for a task, the smallest file that keeps it."""
    everything = set(quantizable_layers(calibration)) | set(weighted_layers(calibration.graph)) \
        | set(recurrent_layers(calibration.graph))
    quantized = quantize_static(model, calibration, method=method, exclude=sorted(everything), float_weights="int8",
                                float32_weights=float32_weights)
    summary = json.loads(quantized.metadata["quantization"])
    # every layer is float: their count, not every name (a small model's file would carry them)
    summary.update(activations="float", float_layers=len(summary.pop("excluded")),
                   float32_weights=sorted(_layer_names(frozenset(float32_weights), calibration.graph, _graph_of(model))))
    text = json.dumps(summary, sort_keys=True)
    graph = quantized.graph
    graph.metadata = {**graph.metadata, "quantization": text}
    return Model(graph, {**quantized.metadata, "quantization": text})


def with_weights_of(graph: Graph, reference: Graph, layers: frozenset[str]) -> Graph:
    """``graph`` whose weights were rounded beforehand (GPTQ), with the weights (input 1) of the
    weighted layers among ``layers`` as ``reference`` holds them."""
    names = {node.inputs[1] for node in graph.nodes
             if layer_name(node) in layers and _weight_axis(node, graph) is not None}
    originals = {name: reference.values[name].const for name in names
                 if name in reference.values and reference.values[name].const is not None}
    if not originals:
        return graph
    inits = graph.initializers
    inits.update(originals)
    return graph.replace(list(graph.nodes), initializers=inits)


def int8_float_weights(graph: Graph, layers: frozenset[str]) -> tuple[Graph, list[str]]:
    """``graph`` with the constant weights of the Conv/ConvTranspose/Gemm/MatMul nodes among
    ``layers`` rounded to int8 per output channel and declared int8-stored; and their names. A
    weight is left as it is when something else reads it (another input, another op) or its
    readers disagree on the channel axis."""
    from edgeinfer.ir.weights import int8_rounded, with_int8_stored_weights

    axes = _layer_weights(graph, layers)
    if not axes:
        return graph, []
    inits = graph.initializers
    inits.update({name: int8_rounded(inits[name], axis) for name, axis in axes.items()})
    rounded = graph.replace(list(graph.nodes), initializers=inits)
    rounded.metadata = with_int8_stored_weights(rounded.metadata, axes)
    return rounded, sorted(axes)


FLOAT16_MIN_DB = 60.0  # a weight is stored as float16 when its float16 values keep this SQNR


def float16_float_weights(graph: Graph, layers: frozenset[str]) -> tuple[Graph, list[str]]:
    """``graph`` with the constant weights of the Conv/ConvTranspose/Gemm/MatMul nodes among
    ``layers`` rounded to float16 values and declared float16-stored (``ir.weights``: the file
    keeps 2 bytes a weight, every engine gets float32); and their names. A weight float16 does
    not hold (a value over its range, or an SQNR of the round trip under ``FLOAT16_MIN_DB``, as
    from tiny values that underflow) stays float32; one already stored narrow is unchanged."""
    return _float16_stored(graph, _layer_weights(graph, layers))


def float16_float_biases(graph: Graph, layers: frozenset[str]) -> tuple[Graph, list[str]]:
    """``graph`` with the constant float32 biases (input 2) of the Conv/ConvTranspose/Gemm nodes
    among ``layers`` rounded to float16 values and declared float16-stored, where only such
    nodes read them and float16 holds them (as ``float16_float_weights``); and their names.
    Each bias moves by under 2**-11 of itself; where a large bias cancels large input means (the
    world-landmark Gemm of MediaPipe's hand landmarks) that still shows at the output, which is
    why the mixed-precision search measures every candidate with them."""
    return _float16_stored(graph, _float_constant_inputs(graph, layers, CORRECTED_OPS, 2))


def float16_float_slopes(graph: Graph, layers: frozenset[str]) -> tuple[Graph, list[str]]:
    """``graph`` with the constant float32 slopes (input 1) of the PRelu nodes among ``layers``
    rounded to float16 values and declared float16-stored, where only such nodes read them and
    float16 holds them; and their names. A negative input's output moves by under 2**-11 of
    itself, a rounding the float layers' int8 weights dwarf; the search measures it with them."""
    return _float16_stored(graph, _float_constant_inputs(graph, layers, ("PRelu",), 1))


def _float_constant_inputs(graph: Graph, layers: frozenset[str], ops: tuple[str, ...], index: int) -> set[str]:
    """The constant float32 inputs ``index`` of the ``ops`` nodes among ``layers`` that only such
    nodes read, at that input."""
    names = set()
    for node in graph.nodes:
        if layer_name(node) not in layers or node.domain or node.op_type not in ops or len(node.inputs) <= index:
            continue
        value = graph.values.get(node.inputs[index])
        if (value is None or value.const is None or value.const.dtype != np.float32
                or any(layer_name(user) not in layers or user.op_type not in ops or at != index
                       for user, at in value.uses)):
            continue
        names.add(value.name)
    return names


def _float16_stored(graph: Graph, names) -> tuple[Graph, list[str]]:
    """``graph`` with the float32 initializers ``names`` rounded to float16 values and declared
    float16-stored, those float16 holds to ``FLOAT16_MIN_DB``; and the names rounded."""
    from edgeinfer.ir.weights import with_stored_weights
    from edgeinfer.quantize.report import sqnr_db

    inits = graph.initializers
    narrowed = {}
    for name in sorted(names):
        weight = inits[name]
        with np.errstate(over="ignore"):
            narrow = weight.astype(np.float16).astype(np.float32)
        if not np.all(np.isfinite(narrow)):
            continue
        if sqnr_db(weight, narrow) >= FLOAT16_MIN_DB:
            narrowed[name] = narrow
    if not narrowed:
        return graph, []
    inits.update(narrowed)
    result = graph.replace(list(graph.nodes), initializers=inits)
    result.metadata = with_stored_weights(result.metadata, sorted(narrowed))
    return result, sorted(narrowed)


def _layer_weights(graph: Graph, layers: frozenset[str]) -> dict[str, int]:
    """The constant float32 weights of the weighted nodes among ``layers`` (input 1 of a
    Conv/ConvTranspose/Gemm/MatMul, inputs 1 and 2 of an LSTM/GRU/RNN) with their channel axis,
    where every reader is such a node reading it at that input on that axis."""
    axes: dict[str, int] = {}
    for node in graph.nodes:
        if layer_name(node) not in layers:
            continue
        for index, axis in _weight_axes(node, graph).items():
            weight = graph.values[node.inputs[index]]
            readers = {_weight_axes(user, graph).get(at) for user, at in weight.uses}
            if readers == {axis} and weight.const.dtype == np.float32 and np.all(np.isfinite(weight.const)):
                axes[weight.name] = axis
    return axes


RECURRENT_OPS = frozenset({"LSTM", "GRU", "RNN"})


def _weight_axes(node, graph: Graph) -> dict[int, int]:
    """``{input index: channel axis}`` of a node's constant float weights that can be stored as
    int8: a weighted layer's weight (``_weight_axis``), or a recurrent layer's input and
    recurrence weights W and R ([directions, gates x hidden, K]: one scale per gate row, shared
    by the directions)."""
    if node.domain:
        return {}
    if node.op_type in RECURRENT_OPS:
        return {index: 1 for index in (1, 2) if len(node.inputs) > index
                and (value := graph.values.get(node.inputs[index])) is not None
                and value.const is not None and value.const.ndim == 3}
    axis = _weight_axis(node, graph)
    return {} if axis is None else {1: axis}


def weighted_layers(graph: Graph) -> list[str]:
    """The layers of ``graph`` with a constant Conv/ConvTranspose/Gemm/MatMul weight, in graph order."""
    return [layer_name(n) for n in graph.nodes if _weight_axis(n, graph) is not None]


def recurrent_layers(graph: Graph) -> list[str]:
    """The LSTM/GRU/RNN layers of ``graph`` with constant weights, in graph order: never
    quantized (float compute), their weights stored as int8 with ``float_weights="int8"``."""
    return [layer_name(n) for n in graph.nodes if n.op_type in RECURRENT_OPS and _weight_axes(n, graph)]


def _weight_axis(node, graph: Graph) -> int | None:
    """The output-channel axis of a weighted node's constant weight (input 1); -1 for one scale
    (a grouped ConvTranspose); None for another op or a weight that is no float matrix."""
    weight = graph.values.get(node.inputs[1]) if len(node.inputs) > 1 else None
    if node.domain or weight is None or weight.const is None or weight.const.ndim < 2:
        return None
    if node.op_type == "Conv":
        return 0
    if node.op_type == "ConvTranspose":
        return 1 if int(node.attrs.get("group", 1)) == 1 else -1
    if node.op_type == "Gemm":
        return 0 if int(node.attrs.get("transB", 0)) else 1
    if node.op_type == "MatMul":
        return weight.const.ndim - 1
    return None


def quantizable_layers(calibration: Calibration, *, activations: str = "uint8", per_channel: bool = True,
                       method: str = "minmax") -> list[str]:
    """The layer names a full quantization would quantize (the units of sensitivity analysis)."""
    ranges = calibration.ranges(method, activations)
    options = StaticOptions(activation_type(activations), per_channel)
    return plan_quantization(calibration.graph, ranges, options).layers


def _layer_names(names: frozenset[str], *graphs: Graph) -> frozenset[str]:
    """``names`` as layer names (``qdq.layer_name``: a node's name, else its first output): a
    node's output stands for its node. Every name must name a node (or a node's output) of one
    of ``graphs``; the first graph's nodes win (the prepared graph the plan is made on)."""
    if not names:
        return names
    known: dict[str, str] = {}
    for g in graphs:  # node names before outputs: a node named like another's output is that node
        known.update((n.name, n.name) for n in g.nodes if n.name and n.name not in known)
    for g in graphs:
        for n in g.nodes:
            for name in n.outputs:
                if name:
                    known.setdefault(name, layer_name(n))
    unknown = sorted(names - set(known))
    if unknown:
        import difflib

        hints = [h for name in unknown for h in difflib.get_close_matches(name, known, n=1)]
        raise InputError(f"exclude {unknown}: no such layer in the model (expected node names"
                         + (f"; did you mean {hints}?" if hints else ", e.g. from --report's table") + ")")
    return frozenset(known[name] for name in names)


def _graph_of(model: Model | Graph) -> Graph:
    if isinstance(model, Model):
        return model.graph
    if isinstance(model, Graph):
        return model
    raise InputError(f"quantize: expected an edgeinfer Model or Graph, got {type(model).__name__}")


class _Counted:
    """An iterable of feeds that counts what it yields and stops after ``limit``; with
    ``hold_out``, every ``HOLD_OUT_EVERY``-th sample goes to ``held_out`` instead (at most
    ``MAX_HELD_OUT``); with ``keep_first``, the first ones yielded are kept in ``first``."""

    def __init__(self, feeds: Iterable[Feeds], limit: int | None, hold_out: bool = False, keep_first: bool = False):
        if limit is not None and limit < 1:
            raise InputError(f"calibration limit {limit}: expected a positive number of samples")
        self.feeds, self.limit, self.count, self.hold_out, self.keep_first = feeds, limit, 0, hold_out, keep_first
        self.held_out: list[Feeds] = []
        self.first: list[Feeds] = []

    def __iter__(self):
        seen = 0
        for feeds in self.feeds:
            if self.limit is not None and seen >= self.limit:
                return
            seen += 1
            if self.hold_out and seen % HOLD_OUT_EVERY == 0 and len(self.held_out) < MAX_HELD_OUT:
                self.held_out.append(feeds)
                continue
            self.count += 1
            if self.keep_first and len(self.first) < MAX_HELD_OUT:
                self.first.append(feeds)
            yield feeds
