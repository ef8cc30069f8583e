"""The QDQ inserter: plan which tensors are quantized (``QuantPlan`` + the rules in
``rules.py``), compute scales and zero points, and build the QuantizeLinear/DequantizeLinear
graph.

Representation (what every backend runs: onnxruntime fuses the patterns into its integer
kernels, the numpy backend runs QuantizeLinear/DequantizeLinear and the ops between them):

    activation T:  producer -> T -> QuantizeLinear -> T_quantized -> DequantizeLinear -> T_dequantized -> consumers
    weight W:      W_quantized (int8 initializer) -> DequantizeLinear(axis) -> W_dequantized -> op
    bias B:        B_quantized (int32 initializer, scale x_scale * w_scale, zp 0) -> DequantizeLinear -> op

A Conv's weight DequantizeLinear has no zero point (symmetric int8: 0 is the default;
onnxruntime still fuses QLinearConv, but not QGemm, so other weights keep theirs), a Conv bias
of zeros is dropped, and every bias scale is declared in the graph's ``weight_products``
metadata as ``x_scale * w_scale`` (computed as that float32 product), which the ``.eim`` file
stores as two references instead of its bytes. With int8 weights at 0.25x by construction, these
per-channel tensors were what kept small INT8 models above 0.30x their fp32 file (MediaPipe's
face detector: 0.338x, now 0.298x; ``benchmarks/bench_int8_real.py --sizes``).

A graph output keeps its name: the producer writes ``T_prequant`` and the DequantizeLinear
writes ``T``. Weight scales are raised where a bias would overflow int32 with
``x_scale * w_scale`` (the adjustment TFLite and onnxruntime make), and to ``SCALE_FLOOR``
(and ``SCALE_FLOOR / x_scale`` for a bias's sake): a channel of near-zero weights would
otherwise get a subnormal scale (2.55e-42 on a PP-OCR recognizer) whose reciprocal overflows.
Such a channel's weights round to 0 either way. Every weight scale is then rounded up onto the
float16 grid (``ir.weights.float16_grid_scale``: a step at most 2**-11 coarser), which the
``.eim`` (version 3.2) stores in 2 bytes, a layer's with a bias or without.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from edgeinfer.errors import UnsupportedOpError
from edgeinfer.ir import Graph, Node, Value
from edgeinfer.ir.infer import infer_types
from edgeinfer.ir.names import fresh_name
from edgeinfer.ir.weights import float16_grid_scale, with_live_stored_weights, with_weight_products
from edgeinfer.quantize.methods import INT8, INT8_7BIT, INT32_BIAS, UINT8, QuantType, quant_params
from edgeinfer.quantize.rules import QUANTIZERS, SAME_AS_INPUT

FLOAT_TYPES = ("float32",)
REMOVABLE_ACTIVATIONS = ("Relu", "Clip")
DATA_MOVEMENT = ("Transpose", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity")  # values unchanged
WEIGHT_TYPE = INT8
PER_CHANNEL_OPSET = 13  # QuantizeLinear/DequantizeLinear gained ``axis`` in opset 13
SCALE_FLOOR = 1e-30  # smallest weight/bias scale written: normal in float32, with room below


def layer_name(node: Node) -> str:
    """How quantization names a node (exclusion lists, reports): its name, else its first output."""
    return node.name or node.outputs[0]


@dataclass(frozen=True)
class StaticOptions:
    activation_type: QuantType = UINT8
    per_channel: bool = True
    exclude: frozenset[str] = frozenset()  # layer names kept in float
    reduce_range: bool = False  # 7-bit weights (INT8_7BIT)
    quantize_outputs: bool = False  # the ops writing graph outputs quantize them too


@dataclass
class TensorParams:
    scale: np.ndarray
    zero_point: np.ndarray
    qtype: QuantType
    axis: int | None = None


@dataclass
class _Bias:
    node: Node
    index: int
    bias: str
    activation: str
    weight: str


@dataclass
class QuantPlan:
    """What the rules decided: activations, shared parameters, weights, biases, folds."""

    graph: Graph
    ranges: Mapping[str, tuple[float, float]]
    options: StaticOptions
    activations: dict[str, None] = field(default_factory=dict)  # ordered set
    shared: dict[str, str] = field(default_factory=dict)  # output -> input whose params it reuses
    weights: dict[str, int] = field(default_factory=dict)  # weight -> axis (or -1 for per-tensor)
    weight_uses: dict[tuple[int, int], str] = field(default_factory=dict)  # (node id, input) -> weight
    biases: list[_Bias] = field(default_factory=list)
    dropped_inputs: set[tuple[int, int]] = field(default_factory=set)  # (node id, input): a zero bias
    conv_weights: dict[str, bool] = field(default_factory=dict)  # weight -> read by Conv nodes only
    renamed: dict[str, str] = field(default_factory=dict)  # producer output -> folded activation's output
    dropped: set[int] = field(default_factory=set)  # ids of folded activation nodes
    layers: list[str] = field(default_factory=list)
    folded: dict[str, str] = field(default_factory=dict)  # activation layer -> layer it folded into

    @property
    def opset(self) -> int:
        return self.graph.opset.get("", 1)

    # -- questions rules ask ----------------------------------------------------------------
    def is_constant(self, name: str) -> bool:
        value = self.graph.values.get(name)
        return value is not None and value.const is not None

    def is_float(self, name: str) -> bool:
        value = self.graph.values.get(name)
        if value is None:
            return False
        dtype = value.dtype if value.const is None else str(value.const.dtype)
        return dtype in FLOAT_TYPES

    def has_range(self, name: str) -> bool:
        return self._current(name) in self.ranges or self.is_constant(name)

    def is_quantized(self, name: str) -> bool:
        name = self._current(name)
        return name in self.activations or name in self.shared

    def can_quantize_activation(self, name: str) -> bool:
        return bool(name) and self.is_float(name) and self.has_range(name)

    def can_quantize_weight(self, name: str, axis: int) -> bool:
        value = self.graph.values.get(name)
        if value is None or value.const is None or not self.is_float(name) or value.const.ndim < 2:
            return False
        known = self.weights.get(name)
        return known is None or known == self._axis(axis)

    def can_quantize_bias(self, name: str, weight: str, axis: int) -> bool:
        """A constant float bias with one value per output channel of ``weight``."""
        value = self.graph.values.get(name)
        if value is None or value.const is None or not self.is_float(name):
            return False
        channels = self.graph.values[weight].const.shape[axis]
        return value.const.size == channels and max(value.const.shape, default=1) == channels

    def magnitude(self, name: str) -> float:
        """The largest |value| of ``name`` (its calibrated range, or a constant's data)."""
        name = self._current(name)
        value = self.graph.values.get(name)
        if value is not None and value.const is not None:
            return float(np.abs(value.const).max(initial=0.0))
        lo, hi = self.ranges[name]
        return max(abs(float(lo)), abs(float(hi)))

    def range_ratio(self, names: list[str]) -> float:
        """How many times the widest range of ``names`` spans the narrowest (inf with a zero one)."""
        magnitudes = [self.magnitude(n) for n in names]
        smallest, largest = min(magnitudes), max(magnitudes)
        if largest == 0.0:
            return 1.0
        return largest / smallest if smallest > 0 else np.inf

    def reaches_graph_output(self, name: str) -> bool:
        """Whether ``name`` is a graph output, or becomes one through data movement alone (the
        Transpose back to NHWC or the Reshape after a converted model's last Conv): the op
        writing it is then a graph output's final op, whose result stays float. Quantizing it
        would clip the output to its calibrated range (a face score that was negative on every
        calibration photo read 0.0 on a held-out face)."""
        outputs, pending, seen = set(self.graph.output_names), [name], set()
        while pending:
            name = pending.pop()
            if name in outputs:
                return True
            if name in seen or name not in self.graph.values:
                continue
            seen.add(name)
            pending.extend(node.outputs[0] for node, index in self.graph.values[name].uses
                           if index == 0 and not node.domain and node.op_type in DATA_MOVEMENT)
        return False

    def pads_with_zero(self, node: Node) -> bool:
        if node.attrs.get("mode", "constant") != "constant":
            return True
        fill = node.inputs[2] if len(node.inputs) > 2 else ""
        value = self.graph.values.get(fill) if fill else None
        return not fill or (value is not None and value.const is not None and not np.any(value.const))

    # -- decisions ----------------------------------------------------------------------------
    def activation(self, name: str) -> None:
        name = self._current(name)
        if name not in self.shared:
            self.activations.setdefault(name, None)

    def same_as(self, output: str, source: str) -> None:
        if output in self.graph.output_names and not self.options.quantize_outputs:
            return
        if self.is_float(output):
            self.shared[output] = self._current(source)

    def share_concat_inputs(self, node: Node) -> None:
        """The inputs of a quantized Concat that only it reads, each quantized with its own
        range, take the Concat's output parameters (its range covers theirs: no clipping). Not
        an input whose producer folded a Relu/Clip: its own range performs that clamp."""
        out = self._current(node.outputs[0])
        if out not in self.activations:
            return  # a float output (a graph output): the inputs keep their own parameters
        for name in node.inputs:
            value = self.graph.values.get(name)
            if (name in self.activations and name not in self.renamed.values() and value is not None
                    and len(value.uses) == 1 and name not in self.graph.output_names
                    and name not in self.graph.input_names):
                del self.activations[name]
                self.shared[name] = out

    def weight(self, node: Node, index: int, axis: int) -> None:
        name = node.inputs[index]
        self.weights[name] = self._axis(axis)
        self.weight_uses[(id(node), index)] = name
        self.conv_weights[name] = node.op_type == "Conv" and self.conv_weights.get(name, True)

    def bias(self, node: Node, index: int, activation: str, weight: str) -> None:
        """Quantize bias ``index`` to int32; a bias of zeros is dropped instead (Conv's optional
        last input: the same sums, and no int32 tensor and scale to store)."""
        if index == len(node.inputs) - 1 and node.op_type in ("Conv", "ConvTranspose") \
                and not np.any(self.graph.values[node.inputs[index]].const):
            self.dropped_inputs.add((id(node), index))
            return
        self.biases.append(_Bias(node, index, node.inputs[index], self._current(activation), weight))

    def output(self, node: Node, index: int) -> None:
        """Quantize output ``index``, folding a Relu/Clip that follows it when that is exact; a
        graph output stays float unless ``quantize_outputs``."""
        name = node.outputs[index]
        float_graph_output = not self.options.quantize_outputs
        folded = self._fold_activation(node, name, float_graph_output)
        if folded is not None:
            name = folded
        if float_graph_output and self.reaches_graph_output(name):
            return
        if self.has_range(name):
            self.activations.setdefault(name, None)

    def _fold_activation(self, node: Node, name: str, float_graph_output: bool) -> str | None:
        if self.options.activation_type.symmetric:
            return None  # a symmetric range keeps negatives: the clamp must stay
        value = self.graph.values[name]
        if len(value.uses) != 1 or name in self.graph.output_names:
            return None
        consumer = value.uses[0][0]
        if consumer.op_type not in REMOVABLE_ACTIVATIONS or consumer.domain or layer_name(consumer) in self.options.exclude:
            return None
        out = consumer.outputs[0]
        if out not in self.ranges or (float_graph_output and self.reaches_graph_output(out)):
            return None
        if consumer.op_type == "Clip" and not self._clip_starts_at_or_below_zero(consumer):
            return None
        self.renamed[name] = out
        self.dropped.add(id(consumer))
        self.folded[layer_name(consumer)] = layer_name(node)
        return out

    def _clip_starts_at_or_below_zero(self, node: Node) -> bool:
        if "min" in node.attrs:
            return float(node.attrs["min"]) <= 0
        lo = node.inputs[1] if len(node.inputs) > 1 else ""
        if not lo:
            return True
        value = self.graph.values.get(lo)
        return value is not None and value.const is not None and float(value.const.reshape(-1)[0]) <= 0

    def _current(self, name: str) -> str:
        return self.renamed.get(name, name)

    def _axis(self, axis: int) -> int:
        return axis if self.options.per_channel else -1


def plan_quantization(graph: Graph, ranges: Mapping[str, tuple[float, float]], options: StaticOptions) -> QuantPlan:
    """Run the rules over ``graph`` in order and return what they decided."""
    plan = QuantPlan(graph, ranges, options)
    for node in graph.nodes:
        if id(node) in plan.dropped or layer_name(node) in options.exclude:
            continue
        rule = QUANTIZERS.lookup(node.op_type, domain=node.domain, version=graph.opset.get(node.domain, 1))
        if rule is not None and rule(node, plan) and node.op_type not in SAME_AS_INPUT:
            plan.layers.append(layer_name(node))
    return plan


# -- parameters -------------------------------------------------------------------------------
def activation_params(plan: QuantPlan) -> dict[str, TensorParams]:
    qtype = plan.options.activation_type
    params: dict[str, TensorParams] = {}
    for name in plan.activations:
        value = plan.graph.values.get(name)
        if value is not None and value.const is not None:
            lo, hi = float(value.const.min()), float(value.const.max())
        else:
            lo, hi = plan.ranges[name]
        scale, zero_point = quant_params(lo, hi, qtype)
        params[name] = TensorParams(np.asarray(scale, np.float32), zero_point, qtype)
    for name in plan.shared:
        source = name
        while source in plan.shared:
            source = plan.shared[source]
        params[name] = params[source]
    return params


def weight_params(array: np.ndarray, axis: int, qtype: QuantType = WEIGHT_TYPE) -> TensorParams:
    """Symmetric int8 scales, per channel along ``axis`` (or per tensor with axis -1), onto
    ``qtype``'s range (``INT8_7BIT`` for 7-bit weights)."""
    data = array.astype(np.float64)
    if axis < 0:
        absmax = np.abs(data).max(initial=0.0)
    else:
        other = tuple(i for i in range(data.ndim) if i != axis)
        absmax = np.abs(data).max(axis=other, initial=0.0)
    scale = float16_grid_scale(np.where(absmax > 0, np.maximum(absmax / qtype.qmax, SCALE_FLOOR), 1.0))
    zero_point = np.zeros(scale.shape, qtype.dtype)
    return TensorParams(scale, zero_point, qtype, None if axis < 0 else axis)


def weight_type(reduce_range: bool) -> QuantType:
    return INT8_7BIT if reduce_range else WEIGHT_TYPE


def weights_summary(per_channel: bool, reduce_range: bool) -> str:
    """How a quantized model's metadata names its weights: ``int8 per-channel`` and the like."""
    return f"int8 {'per-channel' if per_channel else 'per-tensor'}" + (" 7-bit" if reduce_range else "")


def _raise_weight_scales_for_bias(plan: QuantPlan, acts: dict[str, TensorParams],
                                  weights: dict[str, TensorParams]) -> None:
    limit = float(INT32_BIAS.qmax)
    for bias in plan.biases:
        data = np.abs(plan.graph.values[bias.bias].const.astype(np.float64).reshape(-1))
        w = weights[bias.weight]
        x_scale = float(acts[bias.activation].scale)
        smallest = np.maximum(data * 1.0001 / limit, SCALE_FLOOR)
        needed = smallest / x_scale
        w.scale = float16_grid_scale(np.maximum(w.scale.astype(np.float64), needed if w.scale.ndim else needed.max()))


def quantize_values(array: np.ndarray, params: TensorParams) -> np.ndarray:
    scale, zero_point = params.scale.astype(np.float64), params.zero_point.astype(np.float64)
    if params.axis is not None and scale.ndim:
        shape = [1] * array.ndim
        shape[params.axis] = -1
        scale, zero_point = scale.reshape(shape), zero_point.reshape(shape)
    q = np.rint(array.astype(np.float64) / scale) + zero_point
    return np.clip(q, params.qtype.qmin, params.qtype.qmax).astype(params.qtype.dtype)


# -- graph construction -------------------------------------------------------------------------
class _Builder:
    def __init__(self, graph: Graph):
        self.graph = graph
        self.taken = set(graph.values) | {n.name for n in graph.nodes if n.name}
        self.initializers: dict[str, np.ndarray] = {}
        self.types: list[Value] = []

    def fresh(self, base: str) -> str:
        return fresh_name(base, self.taken)

    def const(self, base: str, array: np.ndarray) -> str:
        name = self.fresh(base)
        self.initializers[name] = array
        return name

    def params(self, base: str, params: TensorParams) -> tuple[str, str]:
        return self.const(f"{base}_scale", params.scale), self.const(f"{base}_zero_point", params.zero_point)

    def dequantize(self, source: str, output: str, scale: str, zero_point: str, axis: int | None) -> Node:
        attrs = {} if axis is None else {"axis": axis}
        inputs = [source, scale, zero_point] if zero_point else [source, scale]
        return Node("DequantizeLinear", inputs, [output], attrs,
                    name=self.fresh(f"{output}_DequantizeLinear"))

    def quantize(self, source: str, output: str, scale: str, zero_point: str) -> Node:
        return Node("QuantizeLinear", [source, scale, zero_point], [output],
                    name=self.fresh(f"{output}_QuantizeLinear"))


def build_qdq_graph(graph: Graph, plan: QuantPlan, metadata: Mapping[str, object] | None = None) -> Graph:
    """The quantized graph ``plan`` describes."""
    per_channel_needed = plan.options.per_channel and any(axis >= 0 for axis in plan.weights.values())
    if per_channel_needed and plan.opset < PER_CHANNEL_OPSET:
        raise UnsupportedOpError(f"per-channel weights need QuantizeLinear/DequantizeLinear with an axis "
                                 f"(opset >= {PER_CHANNEL_OPSET}); graph {graph.name!r} has opset {plan.opset}. "
                                 "Quantize per tensor (per_channel=False, --per-tensor) or upgrade the model")
    acts = activation_params(plan)
    qtype = weight_type(plan.options.reduce_range)
    weights = {name: weight_params(graph.values[name].const, axis, qtype) for name, axis in plan.weights.items()}
    _raise_weight_scales_for_bias(plan, acts, weights)
    builder = _Builder(graph)
    outputs = set(graph.output_names)

    # Every quantized activation (own or shared parameters) gets one Q/DQ pair after its producer.
    param_names: dict[int, tuple[str, str]] = {}
    dq_name: dict[str, str] = {}
    pre_name: dict[str, str] = {}
    for name, params in acts.items():
        key = id(params)
        if key not in param_names:
            param_names[key] = builder.params(name, params)
        dq_name[name] = name if name in outputs else builder.fresh(f"{name}_dequantized")
        if name in outputs:
            pre_name[name] = builder.fresh(f"{name}_prequant")

    def qdq_pair(name: str) -> list[Node]:
        params = acts[name]
        scale, zero_point = param_names[id(params)]
        source = pre_name.get(name, name)
        quantized = builder.fresh(f"{name}_quantized")
        builder.types += [Value(quantized, params.qtype.name, graph.values[name].shape if name in graph.values else None)]
        if name in graph.values and graph.values[name].const is not None:
            builder.initializers[quantized] = quantize_values(graph.values[name].const, params)
            return [builder.dequantize(quantized, dq_name[name], scale, zero_point, None)]
        return [builder.quantize(source, quantized, scale, zero_point),
                builder.dequantize(quantized, dq_name[name], scale, zero_point, None)]

    # Weights and biases: quantized initializers behind a DequantizeLinear, one per consumer input.
    weight_dq: dict[str, str] = {}
    weight_scale: dict[str, str] = {}
    uses: dict[tuple[int, int], str] = {}
    prelude: dict[int, list[Node]] = {}
    for (node_id, index), name in plan.weight_uses.items():
        if name not in weight_dq:
            params = weights[name]
            q_name = builder.const(f"{name}_quantized", quantize_values(graph.values[name].const, params))
            if plan.conv_weights.get(name):  # symmetric: the zero point 0 is omitted (onnxruntime still fuses)
                scale, zero_point = builder.const(f"{name}_scale", params.scale), ""
            else:  # its QGemm fusion wants the zero point
                scale, zero_point = builder.params(name, params)
            weight_scale[name] = scale
            weight_dq[name] = builder.fresh(f"{name}_dequantized")
            prelude.setdefault(node_id, []).append(
                builder.dequantize(q_name, weight_dq[name], scale, zero_point, params.axis))
        uses[(node_id, index)] = weight_dq[name]
    for node_id, index in plan.dropped_inputs:
        uses[(node_id, index)] = ""
    products: dict[str, tuple[str, str]] = {}  # bias scale -> (x scale, w scale): stored as a product
    for bias in plan.biases:
        node_prelude, dq = _bias_nodes(builder, graph, bias, acts, weights)
        products[node_prelude[0].inputs[1]] = (param_names[id(acts[bias.activation])][0], weight_scale[bias.weight])
        prelude.setdefault(id(bias.node), []).extend(node_prelude)
        uses[(id(bias.node), bias.index)] = dq

    nodes: list[Node] = []
    for name in acts:
        value = graph.values.get(name)
        if value is not None and (name in graph.input_names or value.const is not None):
            nodes.extend(qdq_pair(name))
    for node in graph.nodes:
        if id(node) in plan.dropped:
            continue
        nodes.extend(prelude.get(id(node), []))
        new_inputs = []
        for index, name in enumerate(node.inputs):
            replaced = uses.get((id(node), index))
            if replaced is None and name:
                current = plan.renamed.get(name, name)
                replaced = dq_name.get(current, current)
            new_inputs.append(name if replaced is None else replaced)
        while new_inputs and not new_inputs[-1] and (id(node), len(new_inputs) - 1) in uses:
            new_inputs.pop()  # a dropped trailing optional input (a zero bias)
        new_outputs = [plan.renamed.get(o, o) for o in node.outputs]
        new_outputs = [pre_name.get(o, o) for o in new_outputs]
        attrs = node.attrs
        if node.op_type == "Gemm" and (id(node), 2) in uses and (id(node), 2) not in plan.weight_uses:
            attrs = {**node.attrs, "beta": 1.0}  # the quantized bias already carries beta
        changed = new_inputs != list(node.inputs) or new_outputs != list(node.outputs) or attrs is not node.attrs
        nodes.append(node.with_(inputs=new_inputs, outputs=new_outputs, attrs=attrs) if changed else node)
        for out in node.outputs:
            current = plan.renamed.get(out, out)
            if current in acts:
                nodes.extend(qdq_pair(current))

    still_used = {i for n in nodes for i in n.inputs if i} | outputs
    initializers = {n: a for n, a in graph.initializers.items() if n in still_used}
    initializers.update(builder.initializers)
    produced = {o for n in nodes for o in n.outputs if o}
    infos = [v.typed_like() for v in graph.value_info() if v.name in produced]
    infos += [graph.values[name].typed_like(pre) for name, pre in pre_name.items()]
    infos += [v for v in builder.types if v.name in produced]
    meta = with_weight_products(with_live_stored_weights(graph.metadata, initializers), products)
    if metadata is not None:
        meta["quantization"] = json.dumps(dict(metadata), sort_keys=True)
    quantized = Graph(nodes, list(graph.inputs), list(graph.outputs), initializers, value_info=infos,
                      opset=graph.opset, name=graph.name, metadata=meta)
    return infer_types(quantized)


def _bias_nodes(builder: _Builder, graph: Graph, bias: _Bias, acts: dict[str, TensorParams],
                weights: dict[str, TensorParams]) -> tuple[list[Node], str]:
    data = graph.values[bias.bias].const
    beta = float(bias.node.attrs.get("beta", 1.0)) if bias.node.op_type == "Gemm" else 1.0
    flat = data.astype(np.float64).reshape(-1) * beta  # Gemm's beta moves into the bias (beta becomes 1)
    scale = np.multiply(acts[bias.activation].scale, weights[bias.weight].scale, dtype=np.float32)  # one rounding
    params = TensorParams(scale, np.zeros(scale.shape, np.int32), INT32_BIAS, 0 if scale.ndim else None)
    q_name = builder.const(f"{bias.bias}_quantized", quantize_values(flat, params))
    s_name = builder.const(f"{bias.bias}_scale", params.scale)
    dq = builder.fresh(f"{bias.bias}_dequantized")
    return [builder.dequantize(q_name, dq, s_name, "", params.axis)], dq  # zero point 0: omitted
