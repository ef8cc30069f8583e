"""Cross-layer equalization before INT8 (Nagel et al. 2019, "Data-Free Quantization Through
Weight Equalization and Bias Correction"), extended to the per-channel affine ops of PP-LCNet.

One per-tensor activation scale cannot serve channels that span -181..176 beside channels
within +-3 (the PP-OCRv4 detector's ``p2o.Conv.2``): the small ones round to a few steps. A
positive per-channel scale ``s`` moves range from the activation into the weights that read
it, exactly::

    x'[c] = x[c] / s[c]        W_B'[:, c] = W_B[:, c] * s[c]        (B's output unchanged)

``x'`` is made by the op that writes the channel (the *absorber*) and carried through the ops
between, each of which commutes with a positive per-channel scale:

- absorbers: ``Conv`` (``W_A[c] /= s[c]``, ``b_A[c] /= s[c]``; any group), ``BatchNormalization``
  (scale and bias ``/= s``), else the furthest ``Mul`` by a constant on the path (``k /= s``);
- carried through: ``Relu``, ``LeakyRelu``, ``PRelu``, ``MaxPool``, ``Identity`` (positive
  homogeneous: ``f(x / s) = f(x) / s``), ``Mul`` by a constant (unchanged) and ``Add`` of a
  constant (``k /= s``);
- the reader ``B``: a ``Conv`` with a constant weight (group 1, grouped or depthwise).

Every tensor from the absorber's output to ``B``'s input must have that one reader, so that
nothing else sees the scaled channel. The scale balances the two ranges: with ``r_x[c]`` the
channel's range and ``r_B[c] = max |W_B[:, c]|``, ``s[c] = sqrt(r_x[c] / r_B[c])`` makes both
``sqrt(r_x[c] r_B[c])``. ``r_x`` is measured on calibration samples when they are given
(per-channel maxima of the float run); data-free (Nagel's rule), ``r_x[c] = max |W_A[c]|``
where the absorber is a Conv and the path holds only positive-homogeneous ops.

The equalized graph computes the same function in float (up to float rounding); quantizing
it then spends the per-tensor activation scale on channels of similar range.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from contextlib import closing
from dataclasses import dataclass

import numpy as np

from edgeinfer.ir import Graph, Node
from edgeinfer.ir.infer import infer_types
from edgeinfer.ir.names import fresh_name

HOMOGENEOUS = ("Relu", "LeakyRelu", "PRelu", "MaxPool", "Identity")
SCALE_LIMITS = (1e-4, 1e4)  # no channel is scaled further than this (a dead channel keeps s = 1)
MAX_CHAIN = 8  # ops walked back from the reader
EQUALIZATION_SAMPLES = 8  # calibration samples the channel ranges are measured on


@dataclass(frozen=True)
class EqualizedPair:
    absorber: str  # the node whose output channels were divided by the scale
    reader: str  # the Conv whose input channels were multiplied by it
    tensor: str  # the reader's input
    channels: int
    range_before: float  # largest channel range of the reader's input
    range_after: float
    data_free: bool

    def summary(self) -> dict:
        return {"absorber": self.absorber, "reader": self.reader, "channels": self.channels,
                "range_before": round(self.range_before, 4), "range_after": round(self.range_after, 4),
                "data_free": self.data_free}


@dataclass(frozen=True)
class _Pair:
    reader: Node
    chain: tuple[Node, ...]  # from the reader's producer back to the absorber (the last one)
    channels: int


def equalization_pairs(graph: Graph) -> list[_Pair]:
    """Every (absorber -> carried ops -> Conv) path the transform applies to, in graph order."""
    pairs = []
    for node in graph.nodes:
        channels = _reader_channels(graph, node)
        if channels is None:
            continue
        chain = _chain_to_absorber(graph, node.inputs[0], channels)
        if chain is not None:
            pairs.append(_Pair(node, chain, channels))
    return pairs


def channel_ranges(graph: Graph, tensors: Sequence[str], feeds: Iterable[dict], *,
                   backend: str | None = None) -> dict[str, np.ndarray]:
    """The largest |value| per channel (axis 1) of each of ``tensors`` over ``feeds``."""
    from edgeinfer.quantize.calibrate import run_batches

    ranges: dict[str, np.ndarray] = {}
    with closing(run_batches(graph, list(tensors), feeds, backend=backend, label="equalizing")) as batches:
        for results in batches:
            for name in tensors:
                data = np.abs(np.asarray(results[name], np.float64))
                per_channel = data.max(axis=tuple(i for i in range(data.ndim) if i != 1))
                ranges[name] = per_channel if name not in ranges else np.maximum(ranges[name], per_channel)
    return ranges


def equalize(graph: Graph, feeds: Sequence[dict] | None = None, *, strength: float = 0.5,
             backend: str | None = None) -> tuple[Graph, list[EqualizedPair]]:
    """``graph`` with every equalization pair rescaled, and what was done. With ``feeds``
    (calibration samples) the channel ranges are measured; without, Nagel's data-free rule
    applies to Conv -> positive-homogeneous ops -> Conv paths only."""
    pairs = equalization_pairs(graph)
    if not pairs:
        return graph, []
    measured = channel_ranges(graph, [p.reader.inputs[0] for p in pairs], feeds, backend=backend) if feeds else {}
    arrays = dict(graph.initializers)
    taken = set(graph.values) | {n.name for n in graph.nodes if n.name}
    replaced: dict[tuple[int, int], str] = {}  # (node id, input index) -> new constant
    done = []

    def current(node: Node, index: int) -> np.ndarray:
        return arrays[replaced.get((id(node), index), node.inputs[index])]

    def put(node: Node, index: int, array: np.ndarray) -> None:
        name = fresh_name(f"{node.inputs[index]}_equalized", taken)
        arrays[name] = array.astype(np.float32)
        replaced[(id(node), index)] = name

    for pair in pairs:
        reader, absorber = pair.reader, pair.chain[-1]
        weight = current(reader, 1)
        group = int(reader.attrs.get("group", 1))
        reader_range = _input_channel_absmax(weight, group)
        tensor = reader.inputs[0]
        data_free = tensor not in measured
        if data_free:
            if absorber.op_type != "Conv" or any(n.op_type not in HOMOGENEOUS for n in pair.chain[:-1]):
                continue
            source_range = np.abs(current(absorber, 1).astype(np.float64)).reshape(pair.channels, -1).max(axis=1)
        else:
            source_range = measured[tensor]
        scale = _balancing_scale(source_range, reader_range, strength)
        if np.allclose(scale, 1.0):
            continue
        put(reader, 1, _scale_input_channels(weight, scale, group))
        for node in pair.chain:
            if node.op_type != "Mul" or node is absorber:  # a Mul carried through commutes with the scale
                _absorb(node, scale, pair.channels, current, put, graph)
        done.append(EqualizedPair(absorber.name or absorber.outputs[0], reader.name or reader.outputs[0], tensor,
                                  pair.channels, float(np.max(source_range)),
                                  float(np.max(source_range / scale)), data_free))
    if not done:
        return graph, []
    nodes = []
    for node in graph.nodes:
        inputs = [replaced.get((id(node), i), name) for i, name in enumerate(node.inputs)]
        nodes.append(node.with_(inputs=inputs) if inputs != list(node.inputs) else node)
    used = {i for n in nodes for i in n.inputs if i} | set(graph.output_names)
    initializers = {k: v for k, v in arrays.items() if k in used}
    return infer_types(graph.replace(nodes, initializers=initializers)), done


# -- matching ---------------------------------------------------------------------------------
def _reader_channels(graph: Graph, node: Node) -> int | None:
    """The input channel count of a Conv whose weight is constant (None: not a reader)."""
    if node.op_type != "Conv" or node.domain or len(node.inputs) < 2:
        return None
    weight = graph.values.get(node.inputs[1])
    if weight is None or weight.const is None or weight.const.ndim < 3 or weight.const.dtype != np.float32:
        return None
    return int(weight.const.shape[1]) * int(node.attrs.get("group", 1))


def _single_reader(graph: Graph, name: str) -> bool:
    value = graph.values.get(name)
    return value is not None and value.const is None and len(value.uses) == 1 and name not in graph.output_names


def _chain_to_absorber(graph: Graph, tensor: str, channels: int) -> tuple[Node, ...] | None:
    """The ops from ``tensor``'s producer back to the absorber (last). A Mul by a constant is
    carried through when a Conv or BatchNormalization further up can absorb the scale (so that
    every tensor between them is equalized); otherwise the furthest such Mul absorbs it."""
    chain: list[Node] = []
    furthest_mul = None
    while len(chain) < MAX_CHAIN:
        if not _single_reader(graph, tensor):
            break
        node = graph.producer(tensor)
        if node is None or node.domain:
            break
        chain.append(node)
        if node.op_type in ("Conv", "BatchNormalization"):
            return tuple(chain) if _absorbs(graph, node, channels) else _at(chain, furthest_mul)
        if node.op_type in HOMOGENEOUS and _carries(graph, node, channels):
            tensor = node.inputs[0]
        elif node.op_type in ("Add", "Mul") and _constant_operand(graph, node, channels) is not None:
            furthest_mul = len(chain) - 1 if node.op_type == "Mul" else furthest_mul
            tensor = node.inputs[1 - _constant_operand(graph, node, channels)]
        else:
            break
    return _at(chain, furthest_mul)


def _at(chain: list[Node], end: int | None) -> tuple[Node, ...] | None:
    return None if end is None else tuple(chain[:end + 1])


def _carries(graph: Graph, node: Node, channels: int) -> bool:
    if node.op_type == "PRelu":
        return _per_channel_constant(graph, node.inputs[1], channels)
    return len([o for o in node.outputs if o]) == 1


def _absorbs(graph: Graph, node: Node, channels: int) -> bool:
    if node.op_type == "Conv":
        weight = graph.values.get(node.inputs[1])
        bias = graph.values.get(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] else None
        return (weight is not None and weight.const is not None and weight.const.dtype == np.float32
                and weight.const.shape[0] == channels and (bias is None or bias.const is not None))
    if node.op_type == "BatchNormalization":
        return len(node.inputs) == 5 and all(_per_channel_constant(graph, n, channels) for n in node.inputs[1:3])
    return False


def _constant_operand(graph: Graph, node: Node, channels: int) -> int | None:
    """Which input of a binary op is a constant that broadcasts per channel (axis 1 of rank 4)."""
    for index in (1, 0):
        name = node.inputs[index] if len(node.inputs) == 2 else ""
        other = graph.values.get(node.inputs[1 - index]) if name else None
        value = graph.values.get(name) if name else None
        if value is None or value.const is None or value.const.dtype != np.float32 or other is None:
            continue
        if other.const is None and other.shape is not None and len(other.shape) == 4 and value.const.ndim <= 4:
            shape = (1,) * (4 - value.const.ndim) + value.const.shape
            if shape[1] in (1, channels) and shape[0] == 1:
                return index
    return None


def _per_channel_constant(graph: Graph, name: str, channels: int) -> bool:
    value = graph.values.get(name)
    return value is not None and value.const is not None and value.const.size in (1, channels)


# -- the transform ------------------------------------------------------------------------------
def _input_channel_absmax(weight: np.ndarray, group: int) -> np.ndarray:
    """max |W[:, c]| per input channel c of a (grouped) Conv weight [C_out, C_in / group, ...]."""
    out_channels, per_group = weight.shape[0], weight.shape[1]
    grouped = np.abs(weight.astype(np.float64)).reshape(group, out_channels // group, per_group, -1)
    return grouped.max(axis=(1, 3)).reshape(-1)


def _scale_input_channels(weight: np.ndarray, scale: np.ndarray, group: int) -> np.ndarray:
    out_channels, per_group = weight.shape[0], weight.shape[1]
    grouped = weight.astype(np.float64).reshape(group, out_channels // group, per_group, -1)
    return (grouped * scale.reshape(group, 1, per_group, 1)).reshape(weight.shape)


def _balancing_scale(source_range: np.ndarray, reader_range: np.ndarray, strength: float = 0.5) -> np.ndarray:
    live = (source_range > 0) & (reader_range > 0)
    scale = np.ones_like(source_range, dtype=np.float64)
    scale[live] = source_range[live] ** strength / reader_range[live] ** (1.0 - strength)
    return np.clip(scale, *SCALE_LIMITS)


def _absorb(node: Node, scale: np.ndarray, channels: int, current, put, graph: Graph) -> None:
    """Divide what ``node`` contributes to its output channels by ``scale`` (nothing for ops
    that commute with it)."""
    per_channel = scale.reshape(1, channels, 1, 1)
    if node.op_type == "Conv":
        weight = current(node, 1)
        put(node, 1, weight.astype(np.float64) / scale.reshape((channels,) + (1,) * (weight.ndim - 1)))
        if len(node.inputs) > 2 and node.inputs[2]:
            put(node, 2, current(node, 2).astype(np.float64).reshape(-1) / scale)
    elif node.op_type in ("Mul", "Add"):
        index = _constant_operand(graph, node, channels)
        constant = current(node, index).astype(np.float64)
        put(node, index, constant.reshape((1,) * (4 - constant.ndim) + constant.shape) / per_channel)
    elif node.op_type == "BatchNormalization":
        for index in (1, 2):
            put(node, index, np.broadcast_to(current(node, index).astype(np.float64).reshape(-1), (channels,)) / scale)
