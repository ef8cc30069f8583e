"""INT8 on every CPU for OpenVINO: does its CPU plugin saturate u8 x s8 products here, and the exact path.

Like onnxruntime's (``edgeinfer.backends.onnxruntime.int8``), OpenVINO's CPU integer kernels
(oneDNN) add pairs of u8 x s8 products in int16 on x86 CPUs without VNNI and saturate there:
measured under ``qemu-x86_64-static -cpu Haswell``, a QDQ MatMul and QLinearMatMul are off by
up to 5 steps, a per-channel QDQ Conv by up to 74 (MatMulInteger and ConvInteger are exact:
OpenVINO does not run them in those kernels). The probe is the QDQ form OpenVINO fuses into
them: uint8 ``[255] * 4`` by int8 ``[127] * 4``, requantized so that the exact sum 129540 is 127;
a saturating CPU gives 64 (``65534 / 1020``). ``saturates()`` runs it once per process.

The exact path where it saturates (``exact_graph``, applied by ``compile`` for the CPU): the
onnxruntime backend's rewrite (``exact_weights``), int8 weights ``w`` with zero point ``z`` as
uint8 ``w + 128`` with zero point ``z + 128`` (the same numbers), here also under int8
activations. OpenVINO's low-precision transformations take only int8 weights, so the rewritten
nodes run in its float32 kernels on the dequantized values: measured under ``-cpu Haswell``,
QDQ Conv, QDQ MatMul and QLinearMatMul then match int64 math exactly (``max 0`` steps; a float
requantization may in principle round a tie one step apart), as turning the transformations off
(the internal ``LP_TRANSFORMS_MODE`` property) does for the whole model. Weights within [-64, 64]
cannot saturate (``2 * 255 * 64 = 32640``) and keep the integer kernels (``reduce_range=True``).
What the exact path costs (``python benchmarks/bench_int8_exact_path.py --engine openvino``,
MobileNetV2 and ResNet-50 at 160x160, 2 threads, one run on this machine's loaded VNNI CPU):
float32 speed, 0.94-1.07x fp32 latency, 2.1-3.2x that of the native INT8 kernels; turning the
transformations off instead measured 0.91-1.18x fp32 in the same run (no consistent winner), and
is an internal property for the whole model, so the per-node rewrite is the one used. 7-bit
weights keep the integer kernels' speed (2.0-4.3x fp32) for 0.7-2.8 dB of output SQNR.
"""

from __future__ import annotations

import threading

import numpy as np

from edgeinfer.backends.onnxruntime.int8 import (
    SATURATING,
    SEVEN_BIT,
    exact_weights,
    int8_weight_nodes,
    wide_weight,
)
from edgeinfer.ir import Graph
from edgeinfer.ir.names import fresh_name

EXACT_OUTPUT = 127  # round(4 * 255 * 127 / 1020)
EXACT = "exact"
EXACT_REWRITE = "exact (u8 weights, zp+128: float kernels)"
WIDENED = ("MatMulInteger", "ConvInteger")  # OpenVINO computes these exactly on every CPU (measured)

QDQ_OPS = ("QuantizeLinear", "DequantizeLinear")
_lock = threading.Lock()
_probed: list[int] = []


def probe_value() -> int:
    """The probe's uint8 output on OpenVINO's CPU plugin here (``EXACT_OUTPUT`` where exact);
    run once per process."""
    with _lock:
        if not _probed:
            _probed.append(_run_probe())
        return _probed[0]


def _run_probe() -> int:
    from onnx import TensorProto, helper, numpy_helper

    from edgeinfer.backends.openvino.backend import compile_config, core
    from edgeinfer.backends.openvino.convert import read_onnx

    consts = {"xs": np.float32(1), "xz": np.uint8(0), "w": np.full((4, 1), 127, np.int8), "ws": np.float32(1),
              "wz": np.int8(0), "ys": np.float32(1020), "yz": np.uint8(0)}
    nodes = [helper.make_node("DequantizeLinear", ["x", "xs", "xz"], ["xd"]),
             helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"]),
             helper.make_node("MatMul", ["xd", "wd"], ["m"]),
             helper.make_node("QuantizeLinear", ["m", "ys", "yz"], ["y"])]
    graph = helper.make_graph(nodes, "u8s8_probe", [helper.make_tensor_value_info("x", TensorProto.UINT8, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.UINT8, [1, 1])],
                              [numpy_helper.from_array(np.asarray(v), n) for n, v in consts.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    model.ir_version = 9
    # compiled directly (not by the backend, whose compile applies the exact path this decides)
    compiled = core().compile_model(read_onnx(model.SerializeToString()), "CPU", compile_config("CPU", {}, None, False))
    result = compiled.create_infer_request().infer({"x": np.full((1, 4), 255, np.uint8)})
    return int(np.asarray(next(iter(result.values()))).reshape(-1)[0])


def saturates() -> bool:
    """Whether OpenVINO's CPU u8 x s8 kernels saturate on this CPU."""
    return probe_value() != EXACT_OUTPUT


def integer_path() -> str:
    """``"exact"``, or where OpenVINO's CPU kernels saturate here, the exact path's name
    (``"exact (u8 weights, zp+128: float kernels)"``)."""
    return EXACT_REWRITE if saturates() else EXACT


def exact_graph(graph: Graph) -> tuple[Graph, str | None]:
    """``graph`` as OpenVINO's CPU plugin computes it exactly here, and its integer path (None
    for a graph without int8 weights): unchanged and ``"exact"`` where the kernels do not
    saturate; where they do, int8 weights rewritten (``exact_weights``) and
    ``"exact (u8 weights, zp+128: float kernels)"``, ``"exact (7-bit weights)"`` (no weight
    needs it) or ``"saturating"`` (a weight that is not a constant, which cannot be rewritten)."""
    nodes = int8_weight_nodes(graph)
    if not nodes:
        return graph, None
    if not saturates():
        return graph, EXACT
    rewritten, labels = exact_weights(graph, int8_activations=True)
    if any(n.op_type not in WIDENED and wide_weight(n, rewritten) for n in int8_weight_nodes(rewritten)):
        return rewritten, SATURATING
    if labels:
        return rewritten, EXACT_REWRITE
    return graph, EXACT if any(wide_weight(n, graph) for n in nodes) else SEVEN_BIT


def graph_integer_path(graph: Graph) -> str | None:
    """The integer path OpenVINO's CPU plugin takes for ``graph`` here (see ``exact_graph``)."""
    return exact_graph(graph)[1]


def own_quantization_parameters(graph: Graph) -> Graph:
    """``graph`` with a copy of each constant scale and zero point for every QuantizeLinear and
    DequantizeLinear that shares it with another (the first keeps the original).

    OpenVINO's ONNX frontend makes one Constant per initializer, shared by every node reading
    it, and its low-precision transformations change such a constant in place: moving the
    dequantization through a Pad along channels (MediaPipe's residual branch pads 16 -> 32
    channels) widens the zero point to the padded shape, ``[1, 32, 1, 1]``, and the
    dequantization in front of a Conv reading the same constant then fails to compile
    ("Argument shapes are inconsistent", the INT8 face landmark model). Scales and zero points
    are scalars or one value per channel: the copies cost a few bytes."""
    initializers = graph.initializers
    taken = set(graph.values) | {n.name for n in graph.nodes if n.name}
    seen: set[str] = set()
    nodes = []
    for node in graph.nodes:
        if node.op_type not in QDQ_OPS or node.domain:
            nodes.append(node)
            continue
        inputs = list(node.inputs)
        for index in (1, 2):
            name = inputs[index] if index < len(inputs) else ""
            if name not in initializers:
                continue
            if name in seen:
                copy = fresh_name(f"{name}_{node.name or node.outputs[0]}", taken)
                taken.add(copy)
                initializers[copy] = initializers[name]
                inputs[index] = copy
            seen.add(name)
        nodes.append(node.with_(inputs=tuple(inputs)) if inputs != list(node.inputs) else node)
    if len(initializers) == len(graph.initializers):
        return graph
    return graph.replace(nodes, initializers=initializers)


def float_transposed_conv_weights(graph: Graph) -> Graph:
    """``graph`` with the int8 weight of every ConvTranspose (a DequantizeLinear of constants)
    replaced by its float32 values: the layer then runs in OpenVINO's float kernel.

    OpenVINO's low-precision transformations get a quantized ConvTranspose wrong: PP-OCRv4's
    text detector, INT8 with its two ConvTranspose layers quantized, gave -10.0 dB output SQNR
    on OpenVINO (onnxruntime: 4.2 dB, the same as plain INT8 elsewhere); with those two float,
    4.2 dB on both (measured on two held-out pages). The weight's bytes in the file stay int8."""
    from edgeinfer.backends.numpy.kernels.quantize import dequantize_linear  # the reference's kernel

    initializers = graph.initializers
    replaced: dict[tuple[int, int], str] = {}
    taken = set(graph.values) | {n.name for n in graph.nodes if n.name}
    for node in graph.nodes:
        if node.op_type != "ConvTranspose" or node.domain or len(node.inputs) < 2:
            continue
        dequantize = graph.producer(node.inputs[1])
        if dequantize is None or dequantize.op_type != "DequantizeLinear" or dequantize.domain:
            continue
        if not all(name in initializers for name in dequantize.inputs if name):
            continue  # a weight computed at run time
        values = dequantize_linear(*(initializers[name] if name else None for name in dequantize.inputs),
                                   **{k: int(v) for k, v in dequantize.attrs.items()})
        name = fresh_name(f"{node.inputs[1]}_float", taken)
        taken.add(name)
        initializers[name] = np.asarray(values, np.float32)
        replaced[(id(node), 1)] = name
    if not replaced:
        return graph
    nodes = [n.with_(inputs=tuple(replaced.get((id(n), i), x) for i, x in enumerate(n.inputs)))
             if (id(n), 1) in replaced else n for n in graph.nodes]
    used = {x for n in nodes for x in n.inputs if x} | set(graph.output_names)
    nodes = [n for n in nodes if n.op_type != "DequantizeLinear" or n.domain or any(o in used for o in n.outputs)]
    used = {x for n in nodes for x in n.inputs if x} | set(graph.output_names)  # without the dropped nodes' reads
    return graph.replace(nodes, initializers={k: v for k, v in initializers.items() if k in used})
