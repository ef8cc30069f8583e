"""INT8 on every CPU: does this onnxruntime saturate u8 x s8 products here, and the exact path.

onnxruntime's x86 kernels for uint8 activations times int8 weights on CPUs without VNNI
(AVX2, AVX-512 F/BW) multiply with ``vpmaddubsw``, which adds each pair of adjacent products
into int16 with saturation: ``255 * 127 + 255 * 127 = 64770`` is clamped to 32767, so the sum
is no longer the integer product of the operands (onnxruntime documents this; nothing in its
API says which kernel it picked). One MatMulInteger tells: ``[255] * 4`` by ``[127] * 4`` is
``129540`` exactly; a saturating build returns ``2 * 32767 = 65534``. ``saturates()`` runs that
probe once per process.

The exact path where it saturates, applied when the backend compiles (``exact_weights``):
int8 weights ``w`` with zero point ``z`` are the same numbers as uint8 weights ``w + 128``
with zero point ``z + 128`` (``w - z`` is unchanged), and onnxruntime's u8 x u8 kernels widen
both operands to int16 before multiplying, so they sum exactly. Rewritten: the weight (and
zero point) of QLinearConv, QLinearMatMul, MatMulInteger and ConvInteger, and of every
DequantizeLinear of a constant int8 tensor (the QDQ form, which onnxruntime fuses into those
ops), where the activations are uint8: int8 x int8 kernels widen both operands and are exact
(a second probe, ``saturates("int8")``, checks that). Weights that all lie within [-64, 64]
cannot saturate (``2 * 255 * 64 = 32640``) and stay int8: that is the fast path 7-bit weights
buy (``ei.quantize(..., reduce_range=True)``). The exact path costs speed: on this machine's
VNNI CPU the u8 x u8 kernels take 2.4-2.6x the native INT8 latency (same benchmark); on an
AVX2-only CPU, whose native kernels are slower, 1.3-1.45x was measured (issue 21).

onnxruntime's own session option ``session.x64quantprecision=1`` does the same rewrite, but
only at optimization level ``extended`` or ``all``. Measured (``benchmarks/bench_int8_exact_path.py``,
MobileNetV2 and ResNet-50 at 160x160, 2 threads, one run on a loaded machine): outputs equal
to the last bit, the option 1.08-1.15x slower than this rewrite; so the rewrite, which holds
at every level, is the one used.
"""

from __future__ import annotations

import platform
import threading
from collections.abc import Sequence

import numpy as np

from edgeinfer.ir import Graph, Node
from edgeinfer.ir.names import fresh_name

EXACT_PRODUCT = 4 * 255 * 127  # the probe's answer in exact integer arithmetic: 129540
# activations -> (activation value, weight value, the exact product of four of each)
PROBES = {"uint8": (255, 127, EXACT_PRODUCT), "int8": (-128, -128, 4 * 128 * 128)}
SEVEN_BIT_LIMIT = 64  # |w| <= 64: no pair of u8 x s8 products leaves int16
# op -> (weight input, weight zero point input)
WEIGHT_INPUTS = {
    "QLinearConv": (3, 5),
    "QLinearMatMul": (3, 5),
    "MatMulInteger": (1, 3),
    "ConvInteger": (1, 3),
    "DequantizeLinear": (0, 2),
}

# The integer paths, as ``integer_path()`` and the plan name them.
EXACT_NATIVE = "exact (VNNI)"
EXACT_NATIVE_OTHER = "exact"  # a non-x86 CPU, or int8 x int8 kernels: no pairs summed in int16
EXACT_REWRITE = "exact (u8 weights, zp+128)"
SATURATING = "saturating"
SEVEN_BIT = "exact (7-bit weights)"

_lock = threading.Lock()
_probed: dict[str, int] = {}


def probe_value(activations: str = "uint8") -> int:
    """MatMulInteger of four ``activations`` (uint8 255 or int8 -128) by four int8 weights
    (127, or -128) on this onnxruntime, here: ``PROBES[activations][2]`` (129540, 65536) where
    its kernel sums them exactly. Run once per process and kind."""
    with _lock:
        if activations not in _probed:
            _probed[activations] = _run_probe(activations)
        return _probed[activations]


def _run_probe(activations: str) -> int:
    import onnxruntime
    from onnx import TensorProto, helper

    a_value, b_value, _ = PROBES[activations]
    a_type = TensorProto.UINT8 if activations == "uint8" else TensorProto.INT8
    node = helper.make_node("MatMulInteger", ["a", "b"], ["y"])
    graph = helper.make_graph([node], "int8_probe", [helper.make_tensor_value_info("a", a_type, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.INT32, [1, 1])],
                              [helper.make_tensor("b", TensorProto.INT8, [4, 1], [b_value] * 4)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 4
    session = onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    (result,) = session.run(None, {"a": np.full((1, 4), a_value, np.dtype(activations))})
    return int(result.reshape(-1)[0])


def saturates(activations: str = "uint8") -> bool:
    """Whether the installed onnxruntime's CPU kernels for ``activations`` (uint8 or int8) x
    int8 weights saturate on this CPU."""
    return probe_value(activations) != PROBES[activations][2]


def integer_path() -> str:
    """How the onnxruntime backend computes int8 x int8 products on this CPU:
    ``"exact (VNNI)"`` (x86 kernels that do not saturate), ``"exact"`` (other CPUs), or
    ``"exact (u8 weights, zp+128)"`` where the native kernels saturate and the backend
    rewrites int8 weights (``exact_weights``)."""
    if not saturates():
        return EXACT_NATIVE if platform.machine().lower() in ("x86_64", "amd64", "i686", "x86") else EXACT_NATIVE_OTHER
    return EXACT_REWRITE


def graph_integer_path(graph: Graph) -> str | None:
    """The integer path the onnxruntime backend takes for ``graph`` on this CPU (None when it
    has no int8 weight): ``integer_path()`` where the native kernels are exact; where they
    saturate, ``"exact (u8 weights, zp+128)"`` (rewritten), ``"exact (7-bit weights)"`` (every
    u8 x s8 weight fits in 7 bits), ``"exact"`` (int8 x int8 only, which does not saturate) or
    ``"saturating"`` (a weight that is not a constant, which cannot be rewritten)."""
    integer = int8_weight_nodes(graph)
    if not integer:
        return None
    if not saturates():
        return integer_path()
    narrow = [node for node in integer if not _saturable(node, graph)]  # int8 x int8 products
    if narrow and saturates("int8") and any(wide_weight(node, graph) for node in narrow):
        return SATURATING
    weights = [_weight(node, graph) for node in integer if _saturable(node, graph)]
    wide = [w for w in weights if w is None or _needs_rewrite(w)]
    if not weights:
        return EXACT_NATIVE_OTHER
    if not wide:
        return SEVEN_BIT
    if any(w is None for w in wide):
        return SATURATING
    return EXACT_REWRITE


def int8_weight_nodes(graph: Graph) -> list[Node]:
    """The integer products over int8 weights, and the DequantizeLinear of constant int8 weights."""
    return [node for node in graph.nodes if _int8_weight(node, graph)]


def wide_weight(node: Node, graph: Graph) -> bool:
    """Whether ``node``'s int8 weight could saturate u8 x s8 kernels: not a constant, or beyond 7 bits."""
    weight = _weight(node, graph)
    return weight is None or _needs_rewrite(weight)


def _int8_weight(node: Node, graph: Graph) -> bool:
    """An integer product (or the DequantizeLinear of a constant weight) over int8 weights."""
    if node.domain or node.op_type not in WEIGHT_INPUTS:
        return False
    w_index, _ = WEIGHT_INPUTS[node.op_type]
    if len(node.inputs) <= w_index:
        return False
    value = graph.values.get(node.inputs[w_index])
    if value is None or value.dtype != "int8":
        return False
    return node.op_type != "DequantizeLinear" or value.const is not None


def _saturable(node: Node, graph: Graph) -> bool:
    """Computed by u8 x s8 kernels: an integer op over uint8 activations (not int8 ones: x86
    int8 x int8 kernels widen both to int16, exact where ``saturates("int8")`` is False), or a
    constant int8 weight in QDQ form, which onnxruntime fuses with uint8 activations (it turns
    int8 QDQ activations into uint8 first, measured)."""
    if not _int8_weight(node, graph):
        return False
    if node.op_type == "DequantizeLinear":
        return True
    activation = graph.values.get(node.inputs[0])
    return activation is None or activation.dtype != "int8"


def _weight(node: Node, graph: Graph) -> np.ndarray | None:
    return graph.values[node.inputs[WEIGHT_INPUTS[node.op_type][0]]].const


def _needs_rewrite(weight: np.ndarray) -> bool:
    return bool(weight.size) and int(np.abs(weight.astype(np.int16)).max()) > SEVEN_BIT_LIMIT


def exact_weights(graph: Graph, *, int8_activations: bool = False) -> tuple[Graph, list[str]]:
    """``graph`` with every constant int8 weight that could saturate rewritten as uint8
    ``w + 128`` with zero point ``z + 128`` (the same products), and the labels of the nodes
    rewritten. Weights within [-64, 64] and non-constant ones are left as they are; so are those
    of products over int8 activations unless ``int8_activations`` (OpenVINO, whose CPU plugin
    takes uint8 weights with int8 activations; onnxruntime has no such QLinearConv)."""
    taken = set(graph.values) | {n.name for n in graph.nodes if n.name}
    initializers = graph.initializers
    converted: dict[tuple[str, str], tuple[str, str]] = {}  # (weight, zero point) -> new names
    nodes: list[Node] = []
    rewritten: list[str] = []
    for node in graph.nodes:
        chosen = _int8_weight(node, graph) if int8_activations else _saturable(node, graph)
        weight = _weight(node, graph) if chosen else None
        if weight is None or not _needs_rewrite(weight):
            nodes.append(node)
            continue
        w_index, zp_index = WEIGHT_INPUTS[node.op_type]
        zero_name = node.inputs[zp_index] if len(node.inputs) > zp_index else ""
        zero = _zero_point(graph, zero_name, _scale_shape(node, graph, w_index))
        if zero is None:  # a zero point computed at run time: cannot be moved here
            nodes.append(node)
            continue
        key = (node.inputs[w_index], zero_name)
        if key not in converted:
            new_weight = fresh_name(f"{key[0]}_u8", taken)
            new_zero = fresh_name(f"{key[1] or key[0]}_zero_point_u8", taken)
            initializers[new_weight] = to_uint8(weight)
            initializers[new_zero] = to_uint8(zero)
            taken.update((new_weight, new_zero))
            converted[key] = (new_weight, new_zero)
        inputs = _padded(node.inputs, zp_index + 1)
        inputs[w_index], inputs[zp_index] = converted[key]
        nodes.append(node.with_(inputs=tuple(inputs)))
        rewritten.append(node.label)
    if not rewritten:
        return graph, []
    used = {name for node in nodes for name in node.inputs if name} | set(graph.output_names)
    kept = {name: array for name, array in initializers.items() if name in used}
    return graph.replace(nodes, initializers=kept), rewritten


def to_uint8(values: np.ndarray) -> np.ndarray:
    """int8 ``values`` + 128 as uint8: the same differences, on the unsigned grid."""
    return (np.asarray(values, np.int8).astype(np.int16) + 128).astype(np.uint8)


def _scale_shape(node: Node, graph: Graph, w_index: int) -> tuple[int, ...]:
    """The shape of the weight's scale (the input after the weight, where the op has one): an
    omitted zero point becomes zeros of that shape (per-axis scales take per-axis zero points)."""
    if node.op_type not in ("DequantizeLinear", "QLinearConv", "QLinearMatMul") or len(node.inputs) <= w_index + 1:
        return ()
    value = graph.values.get(node.inputs[w_index + 1])
    return () if value is None or value.const is None else tuple(value.const.shape)


def _zero_point(graph: Graph, name: str, shape: tuple[int, ...] = ()) -> np.ndarray | None:
    """The int8 zero point ``name`` (an omitted one is 0, of ``shape``), or None where it is not a constant."""
    if not name:
        return np.zeros(shape, np.int8)
    value = graph.values.get(name)
    if value is None or value.const is None or value.const.dtype != np.int8:
        return None
    return value.const


def _padded(inputs: Sequence[str], length: int) -> list[str]:
    return list(inputs) + [""] * (length - len(inputs))
