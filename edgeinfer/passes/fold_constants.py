"""Constant folding, shape subgraphs included.

A node whose inputs are all constant computes the same tensor on every run, so it is
evaluated once, here, and its outputs become initializers. Evaluation uses the numpy
backend's kernels (a one-node graph compiled by the backend), never a second evaluator.

``Shape(x)`` (and ``Size(x)``) fold when the dims they read are static in ``x``'s inferred
type, and ``Gather(Shape(x), i)`` folds when the gathered dims are static even if others are
symbolic (``N``), so the ``Shape -> Gather -> Concat -> Reshape`` chains of exported
models collapse to a constant shape wherever the shape is in fact fixed.

Not folded: random ops (their results must differ per run), quantize/dequantize (the QDQ
pattern is what quantized backends fuse), a Cast that widens a float16/bfloat16 initializer
(fp16 weight storage: the file keeps the narrow weights, backends widen them once when they
compile), ops with subgraphs (except an ``If`` whose condition is known: it is replaced by the
branch it takes, as the TorchScript exporter's shape tests become once shapes are static),
nodes producing a graph
output (the interface stays computed), and results larger than ``MAX_FOLD_ELEMENTS``
(folding a ``ConstantOfShape`` of 100M elements would bloat the file, not speed anything).
"""

from __future__ import annotations

import numpy as np

from edgeinfer.errors import PassError
from edgeinfer.ir import Graph, Node, Value, dtypes
from edgeinfer.ir.infer import infer_types
from edgeinfer.passes.manager import PassResult, graph_pass
from edgeinfer.passes.rules import rebuild

MAX_FOLD_ELEMENTS = 1 << 20
NEVER_FOLD = frozenset({
    "RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial",
    "Bernoulli", "QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear",
})
# Ops whose output may be far larger than their inputs: folded only with a known output size.
GROWING = frozenset({"ConstantOfShape", "Expand", "Tile", "Range", "Pad", "Resize", "Upsample",
                     "OneHot", "EyeLike", "Col2Im"})


def _static_numel(value: Value) -> int | None:
    return int(np.prod(value.shape, dtype=np.int64)) if value.is_static else None


def _shape_fold(graph: Graph, node: Node, known: dict[str, np.ndarray]) -> np.ndarray | None:
    """The value of Shape/Size/Gather-of-Shape from static dims, without running anything."""
    if node.op_type in ("Shape", "Size") and node.inputs:
        shape = graph.values[node.inputs[0]].shape
        if shape is None:
            return None
        if node.op_type == "Size":
            return np.array(np.prod(shape), dtype=np.int64) if all(isinstance(d, int) for d in shape) else None
        rank = len(shape)
        start = int(node.attrs.get("start", 0))
        end = node.attrs.get("end")
        start = max(0, min(rank, start + rank if start < 0 else start))
        end = rank if end is None else int(end)
        end = max(0, min(rank, end + rank if end < 0 else end))
        dims = shape[start:end]
        return np.array(dims, dtype=np.int64) if all(isinstance(d, int) for d in dims) else None
    if node.op_type == "Gather" and len(node.inputs) == 2 and node.inputs[1] in known:
        source = graph.producer(node.inputs[0])
        if source is None or source.op_type != "Shape" or source.domain or int(node.attrs.get("axis", 0)) != 0:
            return None
        shape = graph.values[source.inputs[0]].shape
        if shape is None or source.attrs.get("start", 0) != 0 or source.attrs.get("end") is not None:
            return None
        indices = known[node.inputs[1]]
        if indices.dtype.kind not in "iu" or indices.size == 0:
            return None
        picked = [shape[int(i)] for i in indices.reshape(-1) if -len(shape) <= int(i) < len(shape)]
        if len(picked) != indices.size or not all(isinstance(d, int) for d in picked):
            return None
        return np.array(picked, dtype=np.int64).reshape(indices.shape)
    return None


def _is_weight_storage_cast(graph: Graph, node: Node) -> bool:
    if node.op_type != "Cast" or not node.inputs:
        return False
    source = graph.values[node.inputs[0]]
    return source.const is not None and source.dtype in ("float16", "bfloat16")


def _foldable(graph: Graph, node: Node, known: dict[str, np.ndarray]) -> bool:
    if node.domain or node.op_type in NEVER_FOLD or node.subgraphs() or _is_weight_storage_cast(graph, node):
        return False
    outputs = [graph.values[o] for o in node.outputs if o]
    if not outputs or any(o.name in graph.output_names for o in outputs):
        return False
    if not all(i in known for i in node.inputs if i):
        return False
    sizes = [_static_numel(o) for o in outputs]
    if any(s is not None and s > MAX_FOLD_ELEMENTS for s in sizes):
        return False
    return not (node.op_type in GROWING and any(s is None for s in sizes))


def _evaluate(graph: Graph, node: Node, known: dict[str, np.ndarray]) -> list[np.ndarray]:
    from edgeinfer.backends.numpy import NumpyBackend

    inits = {i: known[i] for i in node.inputs if i}
    outputs = [graph.values[o].typed_like() for o in node.outputs if o]
    one = Graph([node], [], outputs, inits, opset=graph.opset, name=f"fold_{node.outputs[0]}")
    return list(NumpyBackend().compile(one).run({}).values())


def _as_declared(value: Value, array: np.ndarray, node: Node) -> np.ndarray:
    array = np.asarray(array)
    if value.dtype is not None and dtypes.is_tensor_type(value.dtype):
        want = dtypes.numpy_dtype(value.dtype)
        if array.dtype != want:
            if array.dtype.kind != np.dtype(want).kind:
                raise PassError(f"folding {node.label}: the kernel returned {array.dtype} for {value.name!r}, "
                                f"whose type is {value.dtype}")
            array = array.astype(want)
    return array


def _shapes_agree(graph: Graph, names: list[str], results: list) -> bool:
    """False where a static inferred shape disagrees with what the kernel computed: the
    inferred types around the node are then wrong (seen in exporter output with stale
    value_info), and the node is left to run rather than folded into an inconsistent graph."""
    for name, array in zip(names, results, strict=True):
        value = graph.values[name]
        if value.is_static and tuple(np.shape(array)) != tuple(value.shape):
            return False
    return True


@graph_pass("fold_constants", level=1)
def fold_constants(graph: Graph) -> PassResult:
    known = {name: array for name, array in graph.initializers.items() if name not in graph.input_names}
    kept: list[Node] = []
    fired: dict[str, int] = {}
    branch_infos: list[Value] = []
    for node in graph.nodes:
        taken = _taken_branch(node, known)
        if taken is not None:
            kept.extend(_inline_branch(node, taken, known, branch_infos))
            fired["If"] = fired.get("If", 0) + 1
            continue
        shape_value = _shape_fold(graph, node, known) if not node.domain else None
        if shape_value is not None and node.outputs[0] not in graph.output_names:
            known[node.outputs[0]] = shape_value
            fired["shape"] = fired.get("shape", 0) + 1
            continue
        if not _foldable(graph, node, known):
            kept.append(node)
            continue
        results = _evaluate(graph, node, known)
        names = [o for o in node.outputs if o]
        if (any(np.asarray(r).size > MAX_FOLD_ELEMENTS or np.asarray(r).dtype == object for r in results)
                or not _shapes_agree(graph, names, results)):
            kept.append(node)
            continue
        for name, array in zip(names, results, strict=True):
            known[name] = _as_declared(graph.values[name], array, node)
        fired[node.op_type] = fired.get(node.op_type, 0) + 1
    if not fired:
        return PassResult(graph, False)
    inits = {**graph.initializers, **{k: v for k, v in known.items() if k not in graph.initializers}}
    folded = rebuild(graph, kept, inits, graph.value_info() + branch_infos)
    if not all(v.is_static for v in folded.values.values() if v.const is None):
        infer_types(folded)  # dims that waited on a folded input (Pad's pads, a taken branch) resolve now
    return PassResult(folded, True, fired)


def _taken_branch(node: Node, known: dict[str, np.ndarray]) -> Graph | None:
    """The branch an ``If`` takes when its condition is a known constant, else None."""
    if node.op_type != "If" or node.domain or not node.inputs or node.inputs[0] not in known:
        return None
    condition = np.asarray(known[node.inputs[0]])
    if condition.size != 1:
        return None
    branch = node.attrs.get("then_branch" if bool(condition.reshape(-1)[0]) else "else_branch")
    return branch if isinstance(branch, Graph) and len(branch.outputs) == len(node.outputs) else None


def _inline_branch(node: Node, branch: Graph, known: dict[str, np.ndarray], infos: list[Value]) -> list[Node]:
    """The nodes of ``branch`` in place of the ``If``: names in a branch are unique in the
    model (ONNX forbids shadowing), so its nodes keep them; each If output becomes an
    Identity of the branch output (``remove_identity`` removes them later)."""
    known.update(branch.initializers)
    infos.extend(v for v in branch.value_info())
    infos.extend(v for v in branch.outputs if v.const is None and v.dtype is not None and v.producer is not None)
    nodes = list(branch.nodes)
    for inner, outer in zip(branch.output_names, node.outputs):
        if outer:
            nodes.append(Node("Identity", [inner], [outer], name=f"{node.name or outer}/inlined"))
    return nodes
