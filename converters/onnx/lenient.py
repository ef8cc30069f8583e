"""What real ONNX files get wrong that onnxruntime runs anyway, repaired on import.

Exporters in the wild write files that ``onnx.checker`` rejects or that break the IR's
invariants, although onnxruntime loads and runs them. Following onnxruntime's leniency, the
importer repairs these classes on a copy of the model and says so in one
``OnnxLeniencyWarning``; anything else the checker rejects is refused as before.

Always repaired (silently where onnxruntime reads the file the same way):
- a dim declared as ``dim_value: -1`` (paddle2onnx) or ``0``, or named ``?``, is dynamic:
  onnxruntime treats a negative dim as unknown and never ties two ``?`` dims together; a 0
  on a graph input (which onnxruntime would only accept for an empty tensor) is taken as
  dynamic too, with a warning; in value_info and graph outputs such dims become unknown
  (shape inference recomputes them);
- several nodes sharing one name (spox writes ``F0::anon`` more than once): later ones get a
  fresh name; names are labels, never semantics.

Repaired when the checker names them:
- nodes out of topological order (onnxruntime sorts them; so does the IR);
- a graph with an empty name; no ``ir_version``; initializers sharing a name (onnxruntime
  uses the first one, whatever its warning says);
- graph outputs without a type or shape: filled from ONNX shape inference where it can, else
  left unknown to the IR (the check runs without them).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator

import onnx

from edgeinfer.errors import ModelFormatError, ModelValidationError
from edgeinfer.ir.graph import stable_topological_order


class OnnxLeniencyWarning(UserWarning):
    """An ONNX file breaks a rule that onnxruntime does not enforce; edgeinfer repaired it."""


def all_graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            for sub in [attr.g] if attr.HasField("g") else list(attr.graphs):
                yield from all_graphs(sub)


# -- repairs applied to every model ----------------------------------------------------------
def normalize_dims(model: onnx.ModelProto) -> list[str]:
    """Dims of ``dim_value`` <= 0 become unknown; returns notes for graph inputs declared 0."""
    notes = []
    for graph in all_graphs(model.graph):
        for kind, infos in (("input", graph.input), ("output", graph.output), ("value_info", graph.value_info)):
            for info in infos:
                if not info.type.HasField("tensor_type") or not info.type.tensor_type.HasField("shape"):
                    continue
                for index, dim in enumerate(info.type.tensor_type.shape.dim):
                    if _unknown_dim(dim):
                        if dim.WhichOneof("value") == "dim_value" and dim.dim_value == 0 and kind == "input":
                            notes.append(f"input {info.name!r} dim {index} declared 0 is taken as dynamic")
                        dim.Clear()
    return notes


def _unknown_dim(dim: onnx.TensorShapeProto.Dimension) -> bool:
    """A dim declared -1 or 0, or named ``?`` (paddle2onnx's "unknown", which would otherwise
    tie every such dim of a model to one size)."""
    kind = dim.WhichOneof("value")
    return (kind == "dim_value" and dim.dim_value <= 0) or (kind == "dim_param" and dim.dim_param.strip() in ("?", ""))


def unique_node_names(model: onnx.ModelProto) -> list[str]:
    """Rename the second and later nodes of a name used more than once (in any graph)."""
    seen: set[str] = set()
    nodes = [node for graph in all_graphs(model.graph) for node in graph.node]
    taken = {node.name for node in nodes}
    renamed = 0
    for node in nodes:
        if not node.name:
            continue
        if node.name in seen:
            index, candidate = 1, f"{node.name}_{1}"
            while candidate in taken:
                index += 1
                candidate = f"{node.name}_{index}"
            node.name = candidate
            taken.add(candidate)
            renamed += 1
        seen.add(node.name)
    return [f"{renamed} node(s) renamed that shared a name"] if renamed else []


# -- repairs for what the checker names --------------------------------------------------------
def _free_names(graph: onnx.GraphProto) -> set[str]:
    """Names a (sub)graph reads from its enclosing scopes."""
    defined = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    defined |= {s.values.name for s in graph.sparse_initializer}
    used: set[str] = set()
    for node in graph.node:
        used.update(node.input)
        for attr in node.attribute:
            for sub in [attr.g] if attr.HasField("g") else list(attr.graphs):
                used |= _free_names(sub)
        defined.update(node.output)
    return {name for name in used if name and name not in defined}


def _node_reads(node: onnx.NodeProto) -> set[str]:
    reads = {name for name in node.input if name}
    for attr in node.attribute:
        for sub in [attr.g] if attr.HasField("g") else list(attr.graphs):
            reads |= _free_names(sub)
    return reads


def _sort_graph(graph: onnx.GraphProto) -> bool:
    """Sort one graph's nodes, keeping the file's order among ready nodes; False on a cycle
    (left as it is: the IR's sort names a node on it)."""
    order, _ = stable_topological_order([_node_reads(n) for n in graph.node], [n.output for n in graph.node])
    if len(order) != len(graph.node):
        return False
    _replace(graph.node, [graph.node[index] for index in order])
    return True


def _replace(field, items) -> None:
    """Set a repeated message field to ``items`` (copied first: they may be its own elements)."""
    copies = []
    for item in items:
        copy = type(item)()
        copy.CopyFrom(item)
        copies.append(copy)
    del field[:]
    field.extend(copies)


def sort_nodes(model: onnx.ModelProto) -> str | None:
    graphs = list(all_graphs(model.graph))
    return "nodes sorted topologically" if all([_sort_graph(g) for g in graphs]) else None


def name_graphs(model: onnx.ModelProto) -> str | None:
    unnamed = [g for g in all_graphs(model.graph) if not g.name]
    for index, graph in enumerate(unnamed):
        graph.name = "main" if graph is model.graph else f"subgraph_{index}"
    return f"{len(unnamed)} unnamed graph(s) named" if unnamed else None


def set_ir_version(model: onnx.ModelProto) -> str | None:
    if model.ir_version > 0:
        return None
    standard = [o for o in model.opset_import if o.domain in ("", "ai.onnx", "ai.onnx.ml")]
    model.ir_version = max(onnx.helper.find_min_ir_version_for(standard, ignore_unknown=True), 3)
    return f"ir_version set to {model.ir_version}"


def dedupe_initializers(model: onnx.ModelProto) -> str | None:
    dropped = 0
    for graph in all_graphs(model.graph):
        first: dict[str, int] = {}
        for index, tensor in enumerate(graph.initializer):
            first.setdefault(tensor.name, index)
        keep = [tensor for index, tensor in enumerate(graph.initializer) if first[tensor.name] == index]
        if len(keep) < len(graph.initializer):
            dropped += len(graph.initializer) - len(keep)
            _replace(graph.initializer, keep)
    return f"{dropped} duplicate initializer(s) dropped (the first one is kept, as onnxruntime does)" if dropped else None


def _typed(info: onnx.ValueInfoProto) -> bool:
    kind = info.type.WhichOneof("value")
    if kind != "tensor_type":
        return kind is not None  # a sequence, map or optional output carries its own type
    return info.type.tensor_type.elem_type != 0 and info.type.tensor_type.HasField("shape")


def type_outputs(model: onnx.ModelProto) -> str | None:
    """Outputs of the main graph without a complete type get one from ONNX shape inference."""
    missing = [info for info in model.graph.output if not _typed(info)]
    if not missing:
        return None
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError, RuntimeError):
        return None
    found = {info.name: info for info in [*inferred.graph.value_info, *inferred.graph.output] if _typed(info)}
    typed = [info.name for info in missing if info.name in found]
    for info in missing:
        if info.name in found:
            info.type.CopyFrom(found[info.name].type)
    return f"output(s) {typed} typed by shape inference" if typed else None


REPAIRS: list[tuple[str, Callable[[onnx.ModelProto], str | None]]] = [
    ("must be topologically sorted", sort_nodes),
    ("Field 'name' of 'graph' is required to be non-empty", name_graphs),
    ("does not have an ir_version set", set_ir_version),
    ("initializer name is not unique", dedupe_initializers),
    ("of 'value_info' is required but missing", type_outputs),
    ("of 'type' is required but missing", type_outputs),
]


def _without_untyped_outputs(model: onnx.ModelProto) -> onnx.ModelProto | None:
    """A copy for the checker without the main graph's outputs that no inference could type
    (the IR takes them with unknown types); None if every output is typed."""
    untyped = [info for info in model.graph.output if not _typed(info)]
    if not untyped:
        return None
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    _replace(copy.graph.output, [info for info in copy.graph.output if _typed(info)])
    return copy


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else "invalid model"


def check_leniently(model: onnx.ModelProto, where: str) -> onnx.ModelProto:
    """The model the importer goes on with: ``model`` itself when it passes the checker, else a
    repaired copy (with an ``OnnxLeniencyWarning`` naming the repairs); a model the checker
    still rejects after every applicable repair raises ``ModelValidationError``."""
    notes: list[str] = []
    working = model
    if any(_unknown_dim(dim)
           for graph in all_graphs(model.graph)
           for info in (*graph.input, *graph.output, *graph.value_info)
           for dim in info.type.tensor_type.shape.dim) or _has_duplicate_names(model):
        working = onnx.ModelProto()
        working.CopyFrom(model)
        notes += normalize_dims(working) + unique_node_names(working)
    applied: set[str] = set()
    while True:
        checked = _without_untyped_outputs(working) if "typed" in applied else None
        try:
            onnx.checker.check_model(checked or working)
            break
        except ValueError as exc:  # the checker's own parser refuses the model (too deep, too large)
            raise ModelFormatError(f"{where}: the ONNX checker cannot parse the model: "
                                   f"{str(exc).strip()[:200]}") from exc
        except onnx.checker.ValidationError as exc:
            message = _first_line(exc)
            repair = next((fn for pattern, fn in REPAIRS if pattern in message), None)
            key = "typed" if repair is type_outputs else message
            if repair is None or key in applied:
                raise ModelValidationError(f"{where}: the ONNX checker rejects the model: {message}") from exc
            applied.add(key)
            if working is model:
                working = onnx.ModelProto()
                working.CopyFrom(model)
            note = repair(working)
            if note is None and repair is not type_outputs:
                raise ModelValidationError(f"{where}: the ONNX checker rejects the model: {message}") from exc
            notes.append(note or f"output(s) left untyped for the IR to infer ({message})")
    if notes:
        warnings.warn(f"{where}: repaired as onnxruntime would run it: {'; '.join(notes)}",
                      OnnxLeniencyWarning, stacklevel=5)
    return working


def _has_duplicate_names(model: onnx.ModelProto) -> bool:
    names = [node.name for graph in all_graphs(model.graph) for node in graph.node if node.name]
    return len(names) != len(set(names))
