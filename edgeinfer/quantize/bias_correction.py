"""Empirical bias correction before INT8 (Nagel et al. 2019, "Data-Free Quantization Through
Weight Equalization and Bias Correction", section 4.2, the empirical variant; OpenVINO NNCF's
``BiasCorrection``).

Rounding a layer's weights (and its input) shifts the mean of its output: with ``W_q = W + dW``
and ``x_q = x + dx``, ``E[y_q - y] = dW E[x] + W E[dx] + ...`` per output channel, a bias the
layer adds that no later op removes. The correction measures the shift on calibration samples
and takes it out of the float bias before the bias is quantized::

    b'[c] = b[c] - mean over samples and positions of (y_q[c] - y[c])

where ``y`` is the layer's float output (before any Relu/Clip the quantizer folds) and ``y_q``
the same tensor in the quantized graph, with every layer upstream quantized *and already
corrected* (sequential, so the upstream error is included, the NNCF way). The corrected layers
are Conv, ConvTranspose and Gemm with a bias the quantizer stores as int32; a bias of zeros,
which the quantizer drops, stays zero (correcting it would add an int32 tensor to the file;
``zero_biases=True`` corrects those too). A channel's shift is taken out only when its mean over
the calibration batches is more than ``SIGNIFICANCE`` standard errors from 0: a late layer with
a 1x1 map sees one value per sample, and fitting its noise lowered held-out SQNR.

The fast variant (``sequential=False``) corrects only what weight rounding adds, ``dW E[x]``
with ``E[x]`` the float input's channel means (one float run, no quantized runs).

Measured (``benchmarks/bench_int8_real.py --variants bc bc_fast``): it helps YOLOv8n and the
PP-OCRv4 detector, leaves the recognizer's characters as they were, and moves the MediaPipe face
models by -3 to +5 dB depending on which calibration crops it saw; on crops that hold a face it
loses faces on the detector (F1 x (1 - error) 0.972-0.974 -> 0.714-0.729) and leaves the
landmarks at 1 - NME 0.985-0.988. So it is opt-in.

Cost: one float run, then one run of the quantized graph per *wave*. A layer's wave is the
number of corrected layers on the longest path from the inputs to it, so the layers of one wave
do not read one another and are measured together. The measuring graph is built once: each
corrected layer's output passes through ``Add(y, delta)`` with ``delta`` a graph input, zero
until its wave has been measured, then the correction (``-shift``).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import closing
from dataclasses import dataclass

import numpy as np

from edgeinfer.errors import InputError
from edgeinfer.ir import Graph, Node, Value
from edgeinfer.ir.infer import infer_types
from edgeinfer.ir.names import fresh_name

CORRECTED_OPS = ("Conv", "ConvTranspose", "Gemm")
BIAS_CORRECTION_SAMPLES = 16  # calibration samples the shifts are measured on
SIGNIFICANCE = 2.0  # a channel's shift is corrected when its mean is this many standard errors from 0


@dataclass(frozen=True)
class CorrectedBias:
    layer: str
    channels: int
    wave: int
    largest_shift: float  # max |mean(y_q - y)| over channels, before correction
    bias_absmax: float  # max |b| before correction

    def summary(self) -> dict:
        return {"layer": self.layer, "channels": self.channels, "wave": self.wave,
                "largest_shift": round(self.largest_shift, 6), "bias_absmax": round(self.bias_absmax, 6)}


@dataclass(frozen=True)
class _Layer:
    index: int  # the node's position in the graph
    node: Node  # in the named graph
    output: str
    bias: str
    channel_axis: int
    channels: int


def correct_biases(graph: Graph, plan_for, feeds: Sequence[dict], *, backend: str | None = None,
                   zero_biases: bool = False, sequential: bool = True,
                   significance: float = SIGNIFICANCE) -> tuple[Graph, list[CorrectedBias]]:
    """``graph`` (prepared, float) with the biases of its quantized Conv/ConvTranspose/Gemm
    layers corrected for the mean shift INT8 adds, and what was corrected. ``plan_for(graph)``
    is the ``QuantPlan`` quantization would make of a graph (the same ranges and options)."""
    from edgeinfer.quantize.qdq import build_qdq_graph

    feeds = list(feeds)
    if not feeds:
        raise InputError("bias correction needs calibration samples: got none")
    named = _named(graph)
    plan = plan_for(named)
    position = {id(node): i for i, node in enumerate(named.nodes)}
    found = [(b.node, b.index) for b in plan.biases]
    if zero_biases:
        by_id = {id(node): node for node in named.nodes}
        found += [(by_id[node_id], index) for node_id, index in plan.dropped_inputs]
    layers = [_layer(named, position[id(node)], node, node.inputs[index]) for node, index in found
              if node.op_type in CORRECTED_OPS and not node.domain and index == 2]
    layers = sorted((layer for layer in layers if layer is not None), key=lambda layer: layer.index)
    if not layers:
        return graph, []
    waves = _waves(named, layers)
    if not sequential:
        shifts = _weight_shifts(named, plan, layers, feeds, backend)
        return _with_corrected_biases(graph, named, layers, {k: _significant(v, significance) for k, v in shifts.items()},
                                      waves)
    float_means = _channel_means(named, layers, feeds, backend, {})
    deltas = {layer.output: np.zeros(_delta_shape(layer, float_means[layer.output][1]), np.float32)
              for layer in layers}
    measuring, raw_outputs, delta_inputs = _measuring_graph(build_qdq_graph(named, plan), layers, deltas)
    shifts: dict[str, np.ndarray] = {}
    for wave in sorted(set(waves.values())):
        members = [layer for layer in layers if waves[layer.output] == wave]
        extra = {delta_inputs[layer.output]: deltas[layer.output] for layer in layers}
        measured = _channel_means(measuring, members, feeds, backend, extra, names=raw_outputs)
        for layer in members:
            shift = _significant(measured[layer.output][0] - float_means[layer.output][0], significance)
            shifts[layer.output] = shift
            deltas[layer.output] = (-shift).astype(np.float32).reshape(deltas[layer.output].shape)
    return _with_corrected_biases(graph, named, layers, shifts, waves)


# -- which layers, in which order -----------------------------------------------------------------
def _named(graph: Graph) -> Graph:
    """``graph`` with every node named (an unnamed node takes its first output's name, the
    quantizer's ``layer_name``), so that its nodes can be found again in the quantized graph."""
    used = {n.name for n in graph.nodes if n.name}
    if len(used) == len(graph.nodes):
        return graph
    taken = set(used)
    nodes = []
    for node in graph.nodes:
        if node.name:
            nodes.append(node)
            continue
        name = node.outputs[0] if node.outputs[0] not in taken else fresh_name(node.outputs[0], taken)
        taken.add(name)
        nodes.append(node.with_(name=name))
    return graph.replace(nodes)


def _layer(graph: Graph, index: int, node: Node, bias: str) -> _Layer | None:
    output = node.outputs[0]
    axis = 1 if node.op_type in ("Conv", "ConvTranspose") else -1
    value = graph.values.get(bias)
    if value is None or value.const is None:
        return None
    return _Layer(index, node, output, bias, axis, int(value.const.size))


def _waves(graph: Graph, layers: list[_Layer]) -> dict[str, int]:
    """Each layer's wave: how many corrected layers lie on the longest path from the inputs."""
    corrected = {layer.index for layer in layers}
    depth: dict[str, int] = {}
    waves: dict[str, int] = {}
    for index, node in enumerate(graph.nodes):
        below = max((depth.get(name, 0) for name in node.inputs if name), default=0)
        if index in corrected:
            waves[node.outputs[0]] = below
            below += 1
        for out in node.outputs:
            if out:
                depth[out] = below
    return waves


# -- measuring -------------------------------------------------------------------------------------
def _channel_means(graph: Graph, layers: list[_Layer], feeds: Sequence[dict], backend: str | None,
                   extra: dict[str, np.ndarray], names: dict[str, str] | None = None
                   ) -> dict[str, tuple[np.ndarray, int]]:
    """Per layer, the mean of its output per channel for each batch of ``feeds`` ([batches,
    channels]), and the output's rank."""
    from edgeinfer.quantize.calibrate import run_batches

    names = names or {layer.output: layer.output for layer in layers}
    means: dict[str, list[np.ndarray]] = {}
    ranks: dict[str, int] = {}
    tensors = [names[layer.output] for layer in layers]
    with closing(run_batches(graph, tensors, ({**f, **extra} for f in feeds), backend=backend,
                             label="correcting biases")) as batches:
        for results in batches:
            for layer in layers:
                data = np.asarray(results[names[layer.output]], np.float64)
                axis = layer.channel_axis % data.ndim
                moved = np.moveaxis(data, axis, 0).reshape(data.shape[axis], -1)
                means.setdefault(layer.output, []).append(moved.mean(axis=1))
                ranks[layer.output] = data.ndim
    return {name: (np.stack(rows), ranks[name]) for name, rows in means.items()}


def _significant(per_batch: np.ndarray, significance: float) -> np.ndarray:
    """The mean of ``per_batch`` shifts [batches, channels], 0 on channels where it is within
    ``significance`` standard errors of 0 (noise a correction would fit, not a bias)."""
    mean = per_batch.mean(axis=0)
    if significance <= 0 or per_batch.shape[0] < 2:
        return mean
    error = per_batch.std(axis=0, ddof=1) / np.sqrt(per_batch.shape[0])
    return np.where(np.abs(mean) > significance * error, mean, 0.0)


def _weight_shifts(graph: Graph, plan, layers: list[_Layer], feeds: Sequence[dict], backend: str | None
                   ) -> dict[str, np.ndarray]:
    """The fast variant: the shift weight rounding alone adds, ``(W_q - W) E[x]`` per output
    channel with ``E[x]`` the float input's channel means (padding ignored), per batch.
    ConvTranspose and Gemm with transA get none."""
    from edgeinfer.quantize.qdq import quantize_values, weight_params, weight_type

    inputs = [_Layer(layer.index, layer.node, layer.node.inputs[0], layer.bias, layer.channel_axis, layer.channels)
              for layer in layers]
    means = _channel_means(graph, inputs, feeds, backend, {})
    qtype = weight_type(plan.options.reduce_range)
    shifts = {}
    for layer in layers:
        node, mean = layer.node, means[layer.node.inputs[0]][0]
        weight = graph.values[node.inputs[1]].const.astype(np.float64)
        axis = plan.weights.get(node.inputs[1], -1)
        params = weight_params(weight, axis, qtype)
        scale = params.scale.astype(np.float64)
        if params.axis is not None and scale.ndim:
            scale = scale.reshape([-1 if i == params.axis else 1 for i in range(weight.ndim)])
        error = quantize_values(weight, params).astype(np.float64) * scale - weight
        shift = _rounding_shift(node, error, mean)
        shifts[layer.output] = np.zeros((mean.shape[0], layer.channels)) if shift is None else shift
    return shifts


def _rounding_shift(node: Node, error: np.ndarray, mean: np.ndarray) -> np.ndarray | None:
    """``error E[x]`` per output channel of a Conv or Gemm (no transA) whose weight moved by
    ``error``, for input channel means ``mean`` [rows, channels] (padding ignored); None for
    another op. [rows, output channels]."""
    if node.op_type == "Conv":
        group = int(node.attrs.get("group", 1))
        summed = error.reshape(error.shape[0], error.shape[1], -1).sum(axis=2)
        per_group = summed.reshape(group, -1, summed.shape[1])
        return np.einsum("gok,ngk->ngo", per_group, mean.reshape(mean.shape[0], group, -1)).reshape(mean.shape[0], -1)
    if node.op_type == "Gemm" and not int(node.attrs.get("transA", 0)):
        return mean @ (error.T if int(node.attrs.get("transB", 0)) else error)
    return None


# -- weights rounded for layers kept float -------------------------------------------------------
ROUNDING_CORRECTED = ("Conv", "Gemm")


def rounding_corrected(graph: Graph, reference: Graph, weights: Sequence[str],
                       means: dict[str, np.ndarray]) -> tuple[Graph, list[str]]:
    """``graph`` with the float bias of each Conv/Gemm that reads one of ``weights`` (rounded in
    ``graph``; ``reference`` holds them unrounded) less the mean shift the rounding adds to its
    output, ``(W_r - W) E[x]``, with ``E[x]`` its float input's channel means (``means``, by
    tensor; calibration records them); and the names of the layers corrected.

    For a layer that computes in float on int8-rounded weights (mixed precision's layers kept
    float) the weights are the only error, so this is the whole expected shift, not an estimate
    beside activation noise as in ``correct_biases`` (padding aside). It matters where an
    output is the small difference of large terms, as MediaPipe's hand landmarks (lite) compute
    their world landmarks from a Gemm whose large bias cancels the sum of inputs with large
    channel means: int8 weights alone (every layer float, GPTQ) reached 13.6 dB there before the
    correction, 22.6 dB with it (``benchmarks/bench_int8_real.py --json``:
    ``int8_weights_ceiling_db``). A bias read by anything else, one of zeros
    (zero biases share one stored tensor; corrected, each would cost its own bytes, as in
    ``correct_biases``), or a layer whose input has no recorded mean, is left as it is."""
    from edgeinfer.quantize.qdq import layer_name

    rounded = set(weights)
    inits = graph.initializers
    corrected = []
    for node in graph.nodes:
        if (node.op_type not in ROUNDING_CORRECTED or node.domain or len(node.inputs) < 3
                or node.inputs[1] not in rounded or node.inputs[0] not in means):
            continue
        bias, original = graph.values.get(node.inputs[2]), reference.values.get(node.inputs[1])
        if (bias is None or bias.const is None or len(bias.uses) != 1 or not np.any(bias.const)
                or original is None or original.const is None):
            continue
        error = inits[node.inputs[1]].astype(np.float64) - original.const.astype(np.float64)
        mean = np.asarray(means[node.inputs[0]], np.float64).reshape(1, -1)
        if node.op_type == "Conv":
            channels = error.shape[1] * int(node.attrs.get("group", 1))
        else:
            channels = error.shape[1] if int(node.attrs.get("transB", 0)) else error.shape[0]
        if mean.shape[1] != channels:
            continue
        shift = _rounding_shift(node, error, mean)
        if shift is None or shift.shape[1] != bias.const.size:
            continue
        inits[node.inputs[2]] = (bias.const.astype(np.float64) - shift.reshape(bias.const.shape)).astype(bias.const.dtype)
        corrected.append(layer_name(node))
    if not corrected:
        return graph, []
    return graph.replace(list(graph.nodes), initializers=inits), corrected


def _delta_shape(layer: _Layer, rank: int) -> tuple[int, ...]:
    shape = [1] * rank
    shape[layer.channel_axis % rank] = layer.channels
    return tuple(shape)


def _measuring_graph(quantized: Graph, layers: list[_Layer], deltas: dict[str, np.ndarray]
                     ) -> tuple[Graph, dict[str, str], dict[str, str]]:
    """The quantized graph with ``Add(raw, delta)`` after each layer (``delta`` a float input),
    the names of the layers' raw outputs, and of their delta inputs."""
    by_name = {node.name: node for node in quantized.nodes if node.name}
    wanted = {layer.node.name: layer for layer in layers}
    taken = set(quantized.values) | {n.name for n in quantized.nodes if n.name}
    raw, delta, inputs, nodes = {}, {}, list(quantized.inputs), []
    missing = [name for name in wanted if name not in by_name]
    if missing:
        raise InputError(f"bias correction: layers {missing[:3]} are not in the quantized graph")
    for node in quantized.nodes:
        layer = wanted.get(node.name)
        if layer is None:
            nodes.append(node)
            continue
        out = node.outputs[0]
        raw[layer.output] = fresh_name(f"{out}_uncorrected", taken)
        delta[layer.output] = fresh_name(f"{out}_bias_delta", taken)
        taken.update((raw[layer.output], delta[layer.output]))
        inputs.append(Value(delta[layer.output], "float32", deltas[layer.output].shape))
        nodes.append(node.with_(outputs=[raw[layer.output], *node.outputs[1:]]))
        nodes.append(Node("Add", [raw[layer.output], delta[layer.output]], [out], name=f"{out}_bias_correction"))
    renamed = {node.outputs[0] for node in nodes if node.op_type == "Add" and node.name.endswith("_bias_correction")}
    infos = [v for v in quantized.value_info() if v.name not in renamed]
    graph = Graph(nodes, inputs, list(quantized.outputs), quantized.initializers, value_info=infos,
                  opset=quantized.opset, name=quantized.name, metadata=quantized.metadata)
    return infer_types(graph), raw, delta


def _with_corrected_biases(graph: Graph, named: Graph, layers: list[_Layer], shifts: dict[str, np.ndarray],
                           waves: dict[str, int]) -> tuple[Graph, list[CorrectedBias]]:
    """``graph`` with each layer's bias minus its shift, under its name (a bias that several
    layers read gets a new constant per layer)."""
    arrays = dict(graph.initializers)
    taken = set(graph.values) | {n.name for n in graph.nodes if n.name}
    nodes = list(graph.nodes)
    done = []
    for layer in layers:
        shift = shifts[layer.output]
        original = graph.nodes[layer.index]
        bias = named.values[layer.bias].const
        beta = float(original.attrs.get("beta", 1.0)) if original.op_type == "Gemm" else 1.0
        if beta == 0.0:
            continue
        corrected = (bias.astype(np.float64) - shift.reshape(bias.shape) / beta).astype(bias.dtype)
        shared = len(graph.values[original.inputs[2]].uses) > 1
        name = fresh_name(f"{layer.bias}_corrected", taken) if shared else original.inputs[2]
        arrays[name] = corrected
        inputs = list(original.inputs)
        inputs[2] = name
        nodes[layer.index] = original.with_(inputs=inputs)
        done.append(CorrectedBias(original.name or original.outputs[0], layer.channels, waves[layer.output],
                                  float(np.abs(shift).max(initial=0.0)), float(np.abs(bias).max(initial=0.0))))
    used = {i for n in nodes for i in n.inputs if i} | set(graph.output_names)
    return graph.replace(nodes, initializers={k: v for k, v in arrays.items() if k in used}), done
