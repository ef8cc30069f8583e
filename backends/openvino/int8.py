"""Does OpenVINO's CPU plugin saturate uint8 x int8 products on this CPU?

Like onnxruntime's (``edgeinfer.backends.onnxruntime.int8``), OpenVINO's CPU integer kernels
(oneDNN) add pairs of u8 x s8 products in int16 on x86 CPUs without VNNI and saturate there:
measured under ``qemu-x86_64-static -cpu Haswell``, a QDQ MatMul and QLinearMatMul are off by
up to 5 steps, a per-channel QDQ Conv by up to 74 (MatMulInteger is exact: OpenVINO does not
run it in those kernels). The probe is the QDQ form OpenVINO fuses into them: uint8 ``[255] * 4``
by int8 ``[127] * 4``, requantized so that the exact sum 129540 is 127; a saturating CPU gives 64
(``65534 / 1020``). This backend has no exact path yet: where it saturates, ``integer_path()``
says so, and the plan names it for each OpenVINO part that has int8 weights.
"""

from __future__ import annotations

import threading

import numpy as np

from edgeinfer.ir import Graph

EXACT_OUTPUT = 127  # round(4 * 255 * 127 / 1020)
EXACT = "exact"
SATURATING = "saturating"

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

    from edgeinfer.backends.openvino.backend import OpenVinoBackend
    from edgeinfer.ir.onnx_io import graph_from_model

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
    executable = OpenVinoBackend(device="cpu").compile(graph_from_model(model))
    (result,) = executable.run({"x": np.full((1, 4), 255, np.uint8)}).values()
    return int(np.asarray(result).reshape(-1)[0])


def saturates() -> bool:
    """Whether OpenVINO's CPU u8 x s8 kernels saturate on this CPU."""
    return probe_value() != EXACT_OUTPUT


def integer_path() -> str:
    """``"exact"``, or ``"saturating"`` where OpenVINO's CPU kernels saturate here."""
    return SATURATING if saturates() else EXACT


def graph_integer_path(graph: Graph) -> str | None:
    """``integer_path()`` for a graph with int8 weights on the CPU, None for one without."""
    has_int8 = any(v.const is not None and v.dtype == "int8" and v.const.size > 1 for v in graph.values.values())
    return integer_path() if has_int8 else None
