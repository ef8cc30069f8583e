"""IR graph -> TFLite flatbuffer, without TensorFlow.

Each IR node goes through an export rule of ``RULES`` (keyed by ``(domain, op_type, since)``,
registered with ``@export_rule`` in ``ops/``); a node without a rule, or one whose rule
refuses its attributes, raises ``UnsupportedOpError`` naming the node. ``edgeinfer``-domain
ops without a rule of their own are lowered to standard ops first (``lower_graph``).

Layout. TFLite's convolutions, pooling and resize read NHWC; the IR follows ONNX (NCHW). The
exporter does not rewrite the graph into NHWC; it keeps, for every IR value, the TFLite
tensors that hold it in some axis order: ``reps[value][perm] = tensor`` where the tensor is
``numpy.transpose(value, perm)``. A conv asks for its input in NHWC order and writes its
output in NHWC order; element-wise ops, concatenation, padding and reductions work in
whatever order their inputs already have (axes are mapped through the permutation); an IR
``Transpose`` emits nothing, it only relabels its input's tensors. A ``TRANSPOSE`` operator
is written only where a consumer needs an order that no tensor has yet (a ``Reshape`` of an
NHWC activation, a graph output), so a chain of convolutions runs in NHWC end to end and a
graph imported from TFLite (NHWC with transposes around each conv) exports with none.

Quantization. A quantized IR is QDQ: ``DequantizeLinear`` makes a float *view* of an int8
value, a float op computes, ``QuantizeLinear`` stores its result as int8. A float op whose
float inputs are all such views and whose output is read only by ``QuantizeLinear`` (one
set of parameters) is written as TFLite's integer op: int8 tensors carrying scale and zero
point (per channel for weights), int32 bias on ``input_scale * weight_scale``. A view read
by a float op becomes a ``DEQUANTIZE``, a ``QuantizeLinear`` of a float tensor a
``QUANTIZE``. uint8 values become int8 with the zero point moved by -128 (the same real
numbers), since TFLite's int8 kernels take int8 weights with int8 activations only.
``edgeinfer::TFLite*`` integer ops (from the TFLite importer) map back to their builtins.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from edgeinfer.errors import EdgeInferError, UnsupportedOpError
from edgeinfer.format.tflite import schema
from edgeinfer.format.tflite.writer import Quantization
from edgeinfer.ir import Graph, Node, dtypes
from edgeinfer.registry import OpRegistry

if TYPE_CHECKING:
    from edgeinfer.format.tflite.context import OpContext

NCHW_TO_NHWC = (0, 2, 3, 1)
INT8_MODES = ("none", "any", "same", "fixed")
# Constants folded, Gelu and fused activations recognised, before export.
CANONICAL_PASSES = ("fold_constants", "fuse_gelu", "fuse_bias_activation")
QUANTIZE_OPS = ("QuantizeLinear", "DequantizeLinear")
RELABELLING_OPS = ("Transpose", "Identity", "Dropout")  # the exporter writes no operator for these
FOLDED_OPS = ("Constant",)  # folded into constants before export
WIDE_FLOATS = ("float64", "float16")  # activations of these dtypes: no TFLite kernel but CAST takes them
WIDE_FLOAT_OPS = ("Cast",)
# Integer dtypes (of int32/int64) the kernels of these ops take, where they do not take both.
INTEGER_KERNEL_DTYPES = {"Relu": (), "PRelu": (), "Abs": ("int32",), "Sign": ("int32",), "Pow": ("int32",),
                         "Div": ("int32",)}
RAW_SMALL_INTS = ("int8", "uint8", "int16")
DATA_MOVEMENT_OPS = ("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Concat", "Slice", "Gather", "Split",
                     "Transpose", "Identity", "Dropout", "Shape", "Tile", "Expand")


@dataclass(frozen=True)
class ExportRule:
    fn: Callable[[OpContext], None]
    check: Callable[[Node, Graph], str | None] | None
    int8: str  # how the op runs on int8 tensors: none | any (own output params) | same (as input 0) | fixed
    int8_inputs: tuple[int, ...] | None  # inputs that must be int8 views for the integer op (None: all float)
    int8_weights: tuple[int, ...]  # inputs that, when constant, must be symmetric (zero point 0)
    fixed: tuple[float, int] | None  # output (scale, zero point) for int8 == "fixed"
    int8_when: Callable[[Node, Graph], bool] | None  # attributes under which the integer op applies


RULES: OpRegistry[ExportRule] = OpRegistry("TFLite export rule")


def export_rule(op_type: str | tuple[str, ...], *, domain: str = "", since: int = 1,
                check: Callable[[Node, Graph], str | None] | None = None, int8: str = "none",
                int8_inputs: tuple[int, ...] | None = None, int8_weights: tuple[int, ...] = (),
                fixed: tuple[float, int] | None = None, int8_when: Callable[[Node, Graph], bool] | None = None):
    """Register ``fn(ctx)`` as the exporter of IR op(s) ``op_type``. ``check(node, graph)``
    returns why a node cannot be exported (None: it can); it must be cheap (the tflite
    backend's ``supports`` calls it for every node)."""
    if int8 not in INT8_MODES:
        raise ValueError(f"int8 mode {int8!r}: expected one of {INT8_MODES}")

    def register(fn: Callable[[OpContext], None]):
        for name in (op_type,) if isinstance(op_type, str) else op_type:
            RULES.register(name, ExportRule(fn, check, int8, int8_inputs, int8_weights, fixed,
                                                      int8_when), domain=domain, since=since)
        return fn

    return register


def find_rule(node: Node, graph: Graph) -> ExportRule | None:
    _load_rules()
    return RULES.lookup(node.op_type, domain=node.domain, version=graph.opset.get(node.domain, 1))


def node_support(node: Node, graph: Graph) -> str | None:
    """None if the exporter can write ``node``, else the reason it cannot (cheap)."""
    if node.domain == "" and node.op_type in FOLDED_OPS:
        if any(name in graph.output_names for name in node.outputs):
            return "a constant graph output: TFLite computes every output with an operator"
        return None
    refused = _unknown_rank(node, graph) or _tensor_types(node, graph) or _wide_float(node, graph) \
        or _integer_kernel(node, graph)
    if refused is not None:
        return refused
    if node.domain == "" and node.op_type in RELABELLING_OPS:
        if node.op_type == "Dropout" and len(node.outputs) > 1 and node.outputs[1]:
            return "Dropout's mask output has no TFLite tensor to relabel"
        return None
    if node.domain == "" and node.op_type in QUANTIZE_OPS:
        return _check_quantize(node, graph)
    entry = find_rule(node, graph)
    if entry is None:
        from edgeinfer.ir.lowering import find_lowering

        if node.domain and find_lowering(node, graph) is not None:
            return None  # lowered to standard ops first; those are checked when exporting
        op = f"{node.domain}::{node.op_type}" if node.domain else node.op_type
        return f"op {op} has no TFLite export rule"
    for name in node.outputs:
        value = graph.values.get(name)
        if name and value is not None and value.dtype is not None and value.dtype not in _TFLITE_DTYPES:
            return f"output {name!r} has dtype {value.dtype}, which TFLite tensors cannot hold"
    return entry.check(node, graph) if entry.check is not None else None


def _tensor_types(node: Node, graph: Graph) -> str | None:
    """A value of a dtype no TFLite tensor holds (bfloat16, int2, int4, float8...)."""
    for name in (*node.inputs, *node.outputs):
        value = graph.values.get(name) if name else None
        if value is not None and value.dtype is not None and value.dtype not in schema.TENSOR_TYPE_CODES \
                and dtypes.is_tensor_type(value.dtype):
            return f"value {name!r} has dtype {value.dtype}, which TFLite tensors cannot hold"
    return None


def _unknown_rank(node: Node, graph: Graph) -> str | None:
    """A computed value of unknown rank: every TFLite tensor has one (the exporter refuses it)."""
    for name in list(node.inputs) + list(node.outputs):
        value = graph.values.get(name) if name else None
        if value is not None and value.const is None and value.shape is None:
            return f"value {name!r} has no known shape (TFLite needs every rank)"
    return None


def _wide_float(node: Node, graph: Graph) -> str | None:
    """Why a node computing on float64 or float16 tensors cannot run (None: it does not). The
    writer can hold them, but TFLite's kernels take float32 activations ("Only float32, uint8,
    int8 and int16 are supported", at invoke); constants are narrowed to float32 (float16
    weights go through DEQUANTIZE), and CAST converts from and to both."""
    if node.domain == "" and node.op_type in WIDE_FLOAT_OPS:
        return None
    for name in list(node.inputs) + list(node.outputs):
        value = graph.values.get(name) if name else None
        if value is not None and value.const is None and value.dtype in WIDE_FLOATS:
            return (f"value {name!r} is {value.dtype}; TFLite kernels compute on float32 "
                    f"(only {', '.join(WIDE_FLOAT_OPS)} take {value.dtype})")
    return None


def _integer_kernel(node: Node, graph: Graph) -> str | None:
    """Why a node's integer tensors have no TFLite kernel (None: they have one). Measured on
    LiteRT 2.3: RELU and PRELU take no int32/int64, ABS, SIGN, POW and DIV no int64 (each fails
    at prepare or invoke); an int8/uint8/int16 tensor without quantization parameters (no
    QuantizeLinear writes it, no DequantizeLinear reads it) in an arithmetic kernel can abort
    the process (ADD), so only data movement takes such raw small integers."""
    if node.domain != "" or node.op_type in QUANTIZE_OPS + WIDE_FLOAT_OPS:
        return None
    allowed = INTEGER_KERNEL_DTYPES.get(node.op_type)
    for name in list(node.inputs) + list(node.outputs):
        value = graph.values.get(name) if name else None
        if value is None or value.const is not None:
            continue
        if allowed is not None and value.dtype in ("int32", "int64") and value.dtype not in allowed:
            return f"value {name!r} is {value.dtype}; TFLite's {node.op_type} kernel takes no {value.dtype}"
        if (value.dtype in RAW_SMALL_INTS and node.op_type not in DATA_MOVEMENT_OPS
                and not _quantized(name, graph)):
            return (f"value {name!r} is {value.dtype} without quantization parameters; TFLite's arithmetic "
                    f"kernels take {value.dtype} only quantized (a QuantizeLinear/DequantizeLinear pair)")
    return None


def _quantized(name: str, graph: Graph) -> bool:
    producer = graph.producer(name)
    if producer is not None and producer.domain == "" and producer.op_type == "QuantizeLinear":
        return True
    return any(c.domain == "" and c.op_type == "DequantizeLinear" for c in graph.consumers(name))


def _check_quantize(node: Node, graph: Graph) -> str | None:
    for name in node.inputs[1:3]:
        if name and (graph.values.get(name) is None or graph.values[name].const is None):
            return "the scale and zero point must be constants"
    raw = graph.values.get(node.inputs[0] if node.op_type == "DequantizeLinear" else node.outputs[0])
    if raw is not None and raw.dtype not in (None, "int8", "uint8", "int32"):
        return f"{raw.dtype} quantization has no TFLite form (int8, uint8 and int32 bias have)"
    scale = graph.values.get(node.inputs[1]) if len(node.inputs) > 1 else None
    at_edge = raw is not None and (raw.name in graph.input_names or raw.name in graph.output_names)
    if at_edge and raw.dtype == "uint8" and scale is not None and scale.const is not None and scale.const.size > 1:
        return f"uint8 graph edge {raw.name!r} is quantized per channel; TFLite requantizes uint8 <-> int8 per tensor only"
    return None


_TFLITE_DTYPES = ("float32", "float16", "int32", "uint8", "int64", "bool", "int16", "int8", "float64")
_LOADED = False


def _load_rules() -> None:
    global _LOADED
    if not _LOADED:
        from edgeinfer.format.tflite import ops  # noqa: F401  (registers the rules)

        _LOADED = True


# -- permutations -----------------------------------------------------------------------------------
def identity(rank: int) -> tuple[int, ...]:
    return tuple(range(rank))


def inverse(perm: Sequence[int]) -> tuple[int, ...]:
    out = [0] * len(perm)
    for index, axis in enumerate(perm):
        out[axis] = index
    return tuple(out)


def relative(have: Sequence[int], want: Sequence[int]) -> tuple[int, ...]:
    """The TRANSPOSE perm that turns a tensor held in order ``have`` into order ``want``."""
    position = inverse(have)
    return tuple(position[axis] for axis in want)


def compose_transpose(perm: Sequence[int], node_perm: Sequence[int]) -> tuple[int, ...]:
    """If tensor ``T = transpose(x, perm)`` and ``y = transpose(x, node_perm)``, then
    ``T = transpose(y, result)``."""
    back = inverse(node_perm)
    return tuple(back[axis] for axis in perm)


# IR fused activation (edgeinfer.ir.lowering.ACTIVATIONS) -> TFLite fused_activation_function
# code (schema.ACTIVATIONS) where TFLite can fuse it.
FUSABLE_CLIPS = {(0.0, 6.0): 3, (-1.0, 1.0): 2, (0.0, float("inf")): 1}


def fused_code(activation: str, params: Sequence[float], *, int8: bool = False) -> int | None:
    """TFLite's fused activation code for an IR activation, or None if it has none."""
    if activation == "":
        return 0
    if activation == "Relu":
        return 1
    if activation == "Clip":
        return FUSABLE_CLIPS.get(tuple(float(p) for p in params))
    return None  # TANH as a fused activation is refused by FULLY_CONNECTED and ignored by some kernels


def node_fused_code(node: Node, *, int8: bool = False) -> int | None:
    return fused_code(str(node.attrs.get("activation", "")), tuple(node.attrs.get("activation_params", ())),
                      int8=int8)


@dataclass
class QuantInfo:
    """Quantization of a raw integer IR value, as TFLite will hold it (int8)."""

    scale: np.ndarray  # float32, 1-D
    zero_point: np.ndarray  # int64, 1-D, already moved to int8 for uint8 values
    axis: int | None  # IR axis for per-channel params
    shift: int  # added to raw values to reach int8 (-128 for uint8, else 0)

    @property
    def per_tensor(self) -> bool:
        return self.scale.size == 1

    def tflite(self, perm: Sequence[int] | None = None) -> Quantization:
        axis = 0 if self.axis is None else self.axis
        if perm is not None and self.scale.size > 1:
            axis = list(perm).index(axis)
        return Quantization(self.scale, self.zero_point, axis if self.scale.size > 1 else 0)

    def same(self, other: QuantInfo) -> bool:
        return np.array_equal(self.scale, other.scale) and np.array_equal(self.zero_point, other.zero_point)


def quant_info(scale: np.ndarray, zero_point: np.ndarray | None, dtype: str, axis: int | None) -> QuantInfo:
    shift = -128 if dtype == "uint8" else 0
    scale = np.asarray(scale, np.float32).reshape(-1)
    zero = np.zeros(scale.size, np.int64) if zero_point is None else np.asarray(zero_point, np.int64).reshape(-1)
    if zero.size == 1 and scale.size > 1:
        zero = np.repeat(zero, scale.size)
    return QuantInfo(scale, zero + shift, axis if scale.size > 1 else None, shift)


class ExportError(UnsupportedOpError):
    """Raised by a rule for what it cannot express; the exporter adds the node's label."""


def export_graph(graph: Graph, *, description: str = "edgeinfer") -> bytes:
    """The TFLite flatbuffer (bytes) of ``graph`` (see the module docstring)."""
    from edgeinfer.format.tflite.exporter import Exporter

    return Exporter(prepare(graph)).run(description)


def prepare(graph: Graph) -> Graph:
    """``graph`` typed, constants folded, Gelu and fused activations recognised (``CANONICAL_PASSES``) and
    ``edgeinfer``-domain ops without an export rule lowered to standard ops."""
    from edgeinfer.ir.infer import infer_types
    from edgeinfer.ir.lowering import lower_graph
    from edgeinfer.passes import load_all, run_pass

    _load_rules()
    load_all()
    graph = infer_types(graph.sorted())
    for name in CANONICAL_PASSES:
        graph = run_pass(name, graph, level=2).graph
    keep = {key for key in RULES.keys() if key[0]}
    if any(node.domain and (node.domain, node.op_type) not in keep for node in graph.nodes):
        from edgeinfer.ir.lowering import LOWERINGS

        registry: OpRegistry = OpRegistry("lowering for TFLite export")
        for domain, op_type in LOWERINGS.keys():
            if domain and (domain, op_type) not in keep:
                registry.register(op_type, LOWERINGS.lookup(op_type, domain=domain), domain=domain)
        graph = infer_types(lower_graph(graph, domains=(), registry=registry))
    return graph


def label_error(node: Node, exc: EdgeInferError) -> UnsupportedOpError:
    return UnsupportedOpError(f"TFLite export: {node.label}: {exc}")


__all__ = ["RULES", "ExportRule", "export_rule", "export_graph", "find_rule", "node_support", "prepare"]
