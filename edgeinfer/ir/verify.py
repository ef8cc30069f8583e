"""``Graph.verify()``: the IR's invariants, checked after every pass in debug mode and tests."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from edgeinfer.errors import ModelValidationError
from edgeinfer.ir import dtypes
from edgeinfer.ir.graph import Graph


def _fail(graph: Graph, what: str) -> None:
    raise ModelValidationError(f"graph {graph.name!r}: {what}")


def verify_graph(graph: Graph, outer_scope: set[str]) -> None:
    defined: set[str] = set(outer_scope)
    for value in graph.inputs:
        if value.name in defined and value.name not in outer_scope:
            _fail(graph, f"input {value.name!r} is declared twice")
        defined.add(value.name)
    for name, value in graph.values.items():
        if value.const is None:
            continue
        if name in graph.input_names:
            continue  # an input with a default value (ONNX IR < 4 style)
        defined.add(name)
        _check_const(graph, value)
    produced_by: dict[str, str] = {}
    for node in graph.nodes:
        for index, name in enumerate(node.inputs):
            if name and name not in defined:
                where = "later in the node order (not topologically sorted or a cycle)" \
                    if name in {o for n in graph.nodes for o in n.outputs} else "nowhere"
                _fail(graph, f"{node.label} input {index} {name!r}: expected a value defined "
                             f"before it, found it defined {where}")
        for sub in node.subgraphs():
            sub.verify(outer_scope=defined)
        for name in node.outputs:
            if not name:
                continue
            if name in defined:
                other = produced_by.get(name, "a graph input or initializer")
                _fail(graph, f"{node.label} output {name!r} is already produced by {other}: "
                             "expected every value to be produced exactly once")
            defined.add(name)
            produced_by[name] = node.label
    names = [n.name for n in graph.nodes if n.name]
    if len(names) != len(set(names)):
        dup = next(n for n in names if names.count(n) > 1)
        _fail(graph, f"node name {dup!r} is used more than once")
    _check_node_dtypes(graph)
    _check_quantization_scales(graph)
    for value in graph.outputs:
        if value.name not in defined:
            _fail(graph, f"output {value.name!r} is not produced by any node, input or initializer")
    for value in graph.values.values():
        if value.dtype is not None and value.dtype not in ("str",) and dtypes.is_tensor_type(value.dtype):
            try:
                dtypes.numpy_dtype(value.dtype)
            except Exception:
                _fail(graph, f"value {value.name!r} has unknown dtype {value.dtype!r}")
        if value.shape is not None:
            for dim in value.shape:
                if isinstance(dim, bool) or not (dim is None or isinstance(dim, str)
                                                 or (isinstance(dim, (int, np.integer)) and dim >= 0)):
                    _fail(graph, f"value {value.name!r} has invalid dim {dim!r} in shape {value.shape}")


# Ops whose inputs and output share one element type (ONNX type constraint "T" on all of them).
_SAME_DTYPE_OPS = frozenset({
    "Add", "Sub", "Mul", "Div", "Max", "Min", "Sum", "Mean", "Concat", "Relu", "Sigmoid",
    "Tanh", "Neg", "Abs", "Sqrt", "Exp", "Log", "Softmax", "LogSoftmax", "LeakyRelu", "Elu", "Erf",
    "MatMul", "Identity", "Transpose",
})


# op -> positions of its quantization scale inputs (ONNX default domain)
SCALE_INPUTS = {"QuantizeLinear": (1,), "DequantizeLinear": (1,), "QLinearConv": (1, 4, 6),
                "QLinearMatMul": (1, 4, 6)}


def _check_quantization_scales(graph: Graph) -> None:
    """A constant quantization scale must be finite, positive and normal: zero divides by zero
    (and a subnormal scale's reciprocal overflows), a negative one flips signs and NaN poisons
    every result, each engine differently. A subnormal scale that only multiplies constant
    integers (the DequantizeLinear of a stored weight or bias) is accepted, as onnxruntime
    runs it: onnxruntime's own quantize_static writes such bias scales (1.79e-39 on PP-OCR)."""
    for node in graph.nodes:
        if node.domain not in ("", "ai.onnx"):
            continue
        for index in SCALE_INPUTS.get(node.op_type, ()):
            if index >= len(node.inputs) or not node.inputs[index]:
                continue
            scale = graph.initializers.get(node.inputs[index])
            if scale is None or scale.dtype.kind != "f" or scale.size == 0:
                continue
            multiplies_constant = node.op_type == "DequantizeLinear" and node.inputs[0] in graph.initializers
            smallest = 0.0 if multiplies_constant else np.finfo(scale.dtype).tiny
            with np.errstate(invalid="ignore"):  # subnormal: 1 / scale overflows to inf
                bad = ~(np.isfinite(scale) & (scale > 0) & (scale >= smallest))
            if bad.any():
                value = float(np.asarray(scale).reshape(-1)[int(np.flatnonzero(bad.reshape(-1))[0])])
                _fail(graph, f"{node.label} scale {node.inputs[index]!r}: expected finite positive (normal) values, "
                             f"found {value!r}" + (f" ({int(bad.sum())} of {scale.size})" if scale.size > 1 else ""))


def _check_node_dtypes(graph: Graph) -> None:
    """Elementwise and shape-preserving ops: every known input/output dtype must agree."""
    for node in graph.nodes:
        if node.domain or node.op_type not in _SAME_DTYPE_OPS:
            continue
        seen = {}
        for name in [*node.inputs, *node.outputs]:
            value = graph.values.get(name) if name else None
            if value is not None and value.dtype is not None:
                seen.setdefault(value.dtype, name)
        if len(seen) > 1:
            found = ", ".join(f"{name}: {dtype}" for dtype, name in seen.items())
            _fail(graph, f"{node.label}: expected one element type for its inputs and outputs, found {found}")


def _check_const(graph: Graph, value) -> None:
    array = value.const
    if not isinstance(array, np.ndarray):
        _fail(graph, f"initializer {value.name!r}: expected a numpy array, found {type(array).__name__}")
    if value.dtype is not None and dtypes.name_of(array.dtype) != value.dtype:
        _fail(graph, f"initializer {value.name!r}: declared dtype {value.dtype}, data is "
                     f"{dtypes.name_of(array.dtype)}")
    if value.shape is not None and tuple(value.shape) != tuple(array.shape):
        _fail(graph, f"initializer {value.name!r}: declared shape {value.shape}, data has {array.shape}")


class NonFiniteWeightsWarning(UserWarning):
    """A model holds NaN weights, or infinite weights in an op that multiplies by them."""


# ops whose float constant inputs are weights: an infinity there cannot be meant (unlike an
# attention mask's -inf added to scores, or Clip's bounds)
WEIGHT_OPS = frozenset({"Conv", "ConvTranspose", "Gemm", "MatMul", "BatchNormalization", "InstanceNormalization",
                        "LayerNormalization", "GroupNormalization", "PRelu", "LSTM", "GRU", "RNN", "Einsum"})


_CHECK_CHUNK = 1 << 22  # elements tested at once: a big weight never gets a whole-size temporary


def _any_in_chunks(array: np.ndarray, test, advance: Callable[[int], None]) -> bool:
    flat = array.reshape(-1)
    with np.errstate(invalid="ignore"):
        for start in range(0, flat.size, _CHECK_CHUNK):
            chunk = flat[start:start + _CHECK_CHUNK]
            if test(chunk).any():
                advance(flat.nbytes - start * flat.itemsize)
                return True
            advance(chunk.nbytes)
    return False


def _not_finite(chunk: np.ndarray) -> np.ndarray:
    return ~np.isfinite(chunk)


def _checked(graph: Graph) -> list[tuple[str, np.ndarray]]:
    return [(name, array) for name, array in graph.initializers.items() if array.dtype.kind == "f" and array.size]


def checked_weight_bytes(graph: Graph) -> int:
    """The bytes ``nonfinite_weights`` reads (float initializers, subgraphs included)."""
    return (sum(array.nbytes for _, array in _checked(graph))
            + sum(checked_weight_bytes(sub) for node in graph.nodes for sub in node.subgraphs()))


def nonfinite_weights(graph: Graph, advance: Callable[[int], None] | None = None) -> list[str]:
    """Names of float initializers holding NaN, or +-inf when a weight op reads them, in
    ``graph`` and its subgraphs (``graph/sub/name``). Each weight is read once, in chunks;
    ``advance`` is told the bytes read as it goes."""
    advance = advance or (lambda nbytes: None)
    weight_inputs = {name for node in graph.nodes if node.op_type in WEIGHT_OPS for name in node.inputs}
    found = []
    for name, array in _checked(graph):
        if _any_in_chunks(array, _not_finite if name in weight_inputs else np.isnan, advance):
            found.append(name)
    for node in graph.nodes:
        for sub in node.subgraphs():
            found.extend(f"{node.name or node.op_type}/{name}" for name in nonfinite_weights(sub, advance))
    return found
