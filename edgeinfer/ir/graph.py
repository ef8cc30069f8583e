"""The intermediate representation: ``Graph``, ``Node`` and ``Value``.

Op semantics are those of the ONNX operator specification (default domain ``""``) plus the
``edgeinfer`` domain for fused and quantized ops. A graph is immutable in spirit: passes build
new nodes and new graphs (``Graph.replace``) rather than poking old ones, and every structural
index (producer, uses) is derived from the node list, never stored twice by hand.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

import numpy as np

from edgeinfer.errors import ModelValidationError
from edgeinfer.ir import dtypes

Dim = int | str | None
Shape = tuple[Dim, ...] | None

ONNX_DOMAIN = ""
EDGEINFER_DOMAIN = "edgeinfer"


def normalize_domain(domain: str | None) -> str:
    return "" if domain in (None, "", "ai.onnx") else domain


class Value:
    """A named tensor (or sequence/optional) flowing between nodes.

    ``dtype`` is a dtype name (see ``edgeinfer.ir.dtypes``), ``shape`` a tuple of ints and
    symbol strings (``"N"``) or None for an unknown dim, or None for an unknown rank.
    ``const`` holds the data of an initializer. ``producer`` and ``uses`` are filled in by the
    owning graph.
    """

    __slots__ = ("name", "dtype", "shape", "const", "producer", "uses")

    def __init__(self, name: str, dtype: str | None = None, shape: Shape = None,
                 const: np.ndarray | None = None):
        self.name = name
        if const is not None:
            dtype = dtypes.name_of(const.dtype) if dtype is None else dtype
            shape = tuple(const.shape) if shape is None else shape
        self.dtype = dtype
        self.shape = None if shape is None else tuple(shape)
        self.const = const
        self.producer: Node | None = None
        self.uses: list[tuple[Node, int]] = []

    @property
    def rank(self) -> int | None:
        return None if self.shape is None else len(self.shape)

    @property
    def is_static(self) -> bool:
        return self.shape is not None and all(isinstance(d, int) for d in self.shape)

    def typed_like(self, name: str | None = None) -> Value:
        """A fresh, unlinked Value with this one's name (or ``name``), dtype and shape."""
        return Value(name or self.name, self.dtype, self.shape)

    def type_str(self) -> str:
        if self.shape is None:
            return f"{self.dtype or '?'}[?]"
        dims = ",".join("?" if d is None else str(d) for d in self.shape)
        return f"{self.dtype or '?'}[{dims}]"

    def __repr__(self) -> str:
        return f"Value({self.name!r}, {self.type_str()}{', const' if self.const is not None else ''})"


class Node:
    """One op application. ``inputs``/``outputs`` are value names; ``""`` marks an omitted
    optional input or output. ``attrs`` is a read-only mapping of python values (int, float,
    str, tuples, numpy arrays for tensors, ``Graph`` for subgraphs)."""

    __slots__ = ("op_type", "domain", "inputs", "outputs", "attrs", "name")

    def __init__(self, op_type: str, inputs: Sequence[str], outputs: Sequence[str],
                 attrs: Mapping[str, Any] | None = None, *, domain: str = "", name: str = ""):
        self.op_type = op_type
        self.domain = normalize_domain(domain)
        self.inputs = tuple(inputs)
        self.outputs = tuple(outputs)
        self.attrs = MappingProxyType(dict(attrs or {}))
        self.name = name

    @property
    def label(self) -> str:
        """How errors name this node: its name if it has one, else its first output."""
        op = f"{self.domain}::{self.op_type}" if self.domain else self.op_type
        who = self.name or (self.outputs[0] if self.outputs else "?")
        return f"node {who!r} ({op})"

    def with_(self, **changes: Any) -> Node:
        """A copy of this node with some fields replaced."""
        fields = {"op_type": self.op_type, "inputs": self.inputs, "outputs": self.outputs,
                  "attrs": self.attrs, "domain": self.domain, "name": self.name}
        fields.update(changes)
        return Node(fields.pop("op_type"), fields.pop("inputs"), fields.pop("outputs"),
                    fields.pop("attrs"), **fields)

    def subgraphs(self) -> list[Graph]:
        found: list[Graph] = []
        for value in self.attrs.values():
            if isinstance(value, Graph):
                found.append(value)
            elif isinstance(value, tuple) and value and isinstance(value[0], Graph):
                found.extend(value)
        return found

    def __repr__(self) -> str:
        return f"Node({self.op_type!r}, {list(self.inputs)} -> {list(self.outputs)})"


class Graph:
    """A dataflow graph: inputs, outputs, nodes in topological order, initializers.

    ``values`` maps every name to its ``Value``; ``value_info`` passed to the constructor
    supplies types for intermediate values. ``opset`` maps domain -> version.
    """

    def __init__(self, nodes: Iterable[Node], inputs: Sequence[Value], outputs: Sequence[Value],
                 initializers: Mapping[str, np.ndarray] | None = None, *,
                 value_info: Iterable[Value] = (), opset: Mapping[str, int] | None = None,
                 name: str = "main", metadata: Mapping[str, str] | None = None):
        self.name = name
        self.nodes: list[Node] = list(nodes)
        self.opset: dict[str, int] = {normalize_domain(k): int(v) for k, v in (opset or {}).items()}
        self.metadata: dict[str, str] = dict(metadata or {})
        self.values: dict[str, Value] = {}
        for value in inputs:
            self.values[value.name] = Value(value.name, value.dtype, value.shape)
        for vname, array in (initializers or {}).items():
            old = self.values.get(vname)
            self.values[vname] = Value(vname, old.dtype if old else None,
                                       old.shape if old else None, const=np.asarray(array))
        self.inputs: list[Value] = [self.values[v.name] for v in inputs]
        for info in value_info:
            if info.name not in self.values:
                self.values[info.name] = Value(info.name, info.dtype, info.shape)
        for node in self.nodes:
            for out in node.outputs:
                if out and out not in self.values:
                    self.values[out] = Value(out)
        for value in outputs:
            known = self.values.get(value.name)
            if known is None:
                self.values[value.name] = Value(value.name, value.dtype, value.shape)
            elif known.dtype is None and known.const is None:
                known.dtype, known.shape = value.dtype, value.shape
        self.outputs: list[Value] = [self.values[v.name] for v in outputs]
        self._link()

    # -- structure ------------------------------------------------------------------------
    def _link(self) -> None:
        for value in self.values.values():
            value.producer, value.uses = None, []
        for node in self.nodes:
            for index, name in enumerate(node.inputs):
                if name:
                    value = self.values.get(name)
                    if value is None:  # an outer-scope name (subgraphs) or a dangling input
                        value = self.values[name] = Value(name)
                    value.uses.append((node, index))
            for name in node.outputs:
                if name:
                    self.values[name].producer = node

    @property
    def initializers(self) -> dict[str, np.ndarray]:
        return {n: v.const for n, v in self.values.items() if v.const is not None}

    @property
    def input_names(self) -> list[str]:
        return [v.name for v in self.inputs]

    @property
    def output_names(self) -> list[str]:
        return [v.name for v in self.outputs]

    def value_info(self) -> list[Value]:
        """Typed intermediate values (neither graph inputs, outputs nor initializers)."""
        boundary = set(self.input_names) | set(self.output_names)
        return [v for v in self.values.values()
                if v.name not in boundary and v.const is None and v.dtype is not None]

    def producer(self, name: str) -> Node | None:
        value = self.values.get(name)
        return None if value is None else value.producer

    def consumers(self, name: str) -> list[Node]:
        value = self.values.get(name)
        return [] if value is None else [node for node, _ in value.uses]

    def outer_names(self) -> set[str]:
        """Names a (sub)graph reads without defining: its outer-scope references."""
        defined = set(self.input_names) | {n for n, v in self.values.items() if v.const is not None}
        used: set[str] = set()
        for node in self.nodes:
            used.update(i for i in node.inputs if i)
            for sub in node.subgraphs():
                used |= sub.outer_names()
            defined.update(o for o in node.outputs if o)
        used.update(self.output_names)
        return used - defined

    def replace(self, nodes: Iterable[Node] | None = None, *, inputs: Sequence[Value] | None = None,
                outputs: Sequence[Value] | None = None,
                initializers: Mapping[str, np.ndarray] | None = None,
                keep_types: bool = True) -> Graph:
        """A new graph with some parts replaced; types of surviving values are kept."""
        new_nodes = list(self.nodes if nodes is None else nodes)
        new_inits = self.initializers if initializers is None else initializers
        infos = [v for v in self.value_info()] if keep_types else []
        return Graph(new_nodes, list(self.inputs if inputs is None else inputs),
                     list(self.outputs if outputs is None else outputs), new_inits,
                     value_info=infos, opset=self.opset, name=self.name, metadata=self.metadata)

    def copy(self) -> Graph:
        return self.replace()

    # -- order and checks -------------------------------------------------------------------
    def topological_order(self) -> list[Node]:
        """Nodes ordered so each comes after the producers of its inputs (stable: keeps the
        current order where it is already valid). Raises ``ModelValidationError`` on a cycle."""
        order, pending = stable_topological_order([_node_reads(n) for n in self.nodes],
                                                  [n.outputs for n in self.nodes])
        if len(order) != len(self.nodes):
            stuck = [self.nodes[i] for i, count in enumerate(pending) if count > 0]
            raise ModelValidationError(
                f"graph {self.name!r} has a cycle: expected an acyclic graph, found "
                f"{len(stuck)} nodes on or behind a cycle, first {stuck[0].label}")
        return [self.nodes[i] for i in order]

    def sorted(self) -> Graph:
        """This graph with its nodes in topological order."""
        order = self.topological_order()
        if all(a is b for a, b in zip(order, self.nodes)):
            return self
        return self.replace(order)

    def verify(self, outer_scope: Iterable[str] = ()) -> None:
        """Check the IR invariants; raise ``ModelValidationError`` naming the offender.

        Invariants: unique value names, every value produced exactly once (by a node, as an
        input or as an initializer), nodes in topological order (hence acyclic), every input
        defined, graph outputs produced, constant data matching its declared type.
        """
        from edgeinfer.ir.verify import verify_graph

        verify_graph(self, set(outer_scope))

    # -- identity ---------------------------------------------------------------------------
    def content_hash(self) -> str:
        """A stable sha256 of structure, types and constant data (for plan caches)."""
        import hashlib  # not imported by a compiled file's load

        digest = hashlib.sha256()
        _hash_graph(self, digest)
        return digest.hexdigest()

    # -- reporting ----------------------------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        from edgeinfer.ir.cost import graph_summary

        return graph_summary(self)

    def __str__(self) -> str:
        from edgeinfer.ir.text import format_graph

        return format_graph(self)

    def __repr__(self) -> str:
        return (f"Graph({self.name!r}, {len(self.nodes)} nodes, inputs={self.input_names}, "
                f"outputs={self.output_names})")

    def op_histogram(self) -> Counter:
        return Counter((f"{n.domain}::{n.op_type}" if n.domain else n.op_type) for n in self.nodes)

    # -- partitions ---------------------------------------------------------------------------
    def computed_from_constants(self) -> dict[str, Node]:
        """Value name -> the node computing it from constants alone, directly or through other
        such nodes (a weight's DequantizeLinear, a Cast or Transpose of a constant)."""
        found: dict[str, Node] = {}
        for node in self.nodes:
            reads = [name_ for name_ in node.inputs if name_]
            if reads and not node.subgraphs() and all(
                    name_ in found or self.values[name_].const is not None for name_ in reads):
                found.update({name_: node for name_ in node.outputs if name_})
        return found

    def body_readers(self) -> dict[str, list[Node]]:
        """Value name -> the nodes whose bodies (subgraphs) read it from this scope."""
        readers: dict[str, list[Node]] = {}
        for node in self.nodes:
            for name_ in set().union(*(sub.outer_names() for sub in node.subgraphs())):
                readers.setdefault(name_, []).append(node)
        return readers

    def subgraph(self, nodes: Iterable[Node], name: str | None = None, *, in_order: bool = False,
                 body_readers: Mapping[str, list[Node]] | None = None) -> Graph:
        """A self-contained graph of ``nodes`` (kept in this graph's order). Its inputs are
        the non-constant values read from outside, its outputs the values used outside it
        (or graph outputs), a node's body (If, Loop) reading it counting as a use; initializers
        it reads are copied in (by reference). ``in_order=True``: the caller gives nodes of this
        graph already in its order, and ``body_readers`` (``body_readers()``, computed once) the
        nodes whose bodies read each value: the partitioner does, which spares two scans of the
        whole graph per subgraph."""
        if in_order:
            members = list(nodes)
            chosen = {id(n) for n in members}
        else:
            chosen = {id(n) for n in nodes}
            members = [n for n in self.nodes if id(n) in chosen]
        if len(members) != len(chosen):
            raise ModelValidationError("subgraph(): every node must belong to this graph")
        produced = {o for n in members for o in n.outputs if o}
        if body_readers is None:
            body_readers = self.body_readers()
        inputs: list[Value] = []
        inits: dict[str, np.ndarray] = {}
        seen: set[str] = set()
        for node in members:
            reads = list(node.inputs) + sorted(set().union(*(s.outer_names() for s in node.subgraphs())))
            for name_ in reads:
                if not name_ or name_ in produced or name_ in seen:
                    continue
                seen.add(name_)
                value = self.values[name_]
                if value.const is not None:
                    inits[name_] = value.const
                else:
                    inputs.append(value.typed_like())
        graph_outputs = set(self.output_names)
        outputs = []
        for node in members:
            for out in node.outputs:
                if not out:
                    continue
                used_outside = any(id(c) not in chosen for c, _ in self.values[out].uses) or any(
                    id(c) not in chosen for c in body_readers.get(out, ()))
                if used_outside or out in graph_outputs:
                    outputs.append(self.values[out].typed_like())
        infos = [self.values[o].typed_like() for o in produced if self.values[o].dtype is not None]
        return Graph(members, inputs, outputs, inits, value_info=infos, opset=self.opset,
                     name=name or f"{self.name}_part", metadata=_storage_of(self.metadata, inits))


def _storage_of(metadata: Mapping[str, str], initializers: Mapping[str, Any]) -> dict[str, str]:
    """The weight-storage declaration of ``metadata`` for ``initializers`` alone (a part keeps its
    float16-stored weights float16 where an exporter asks: the TFLite artifact's ``DEQUANTIZE``
    of a float16 buffer, as the source file had it, at half the bytes)."""
    from edgeinfer.ir.weights import STORAGE_KEY, with_live_stored_weights

    if STORAGE_KEY not in metadata:
        return {}
    return with_live_stored_weights({STORAGE_KEY: metadata[STORAGE_KEY]}, initializers)


def stable_topological_order(reads: Sequence[Iterable[str]],
                             writes: Sequence[Iterable[str]]) -> tuple[list[int], list[int]]:
    """Kahn's sort of items (nodes) that read and write names, keeping the given order among
    ready items: (the order, shorter than the items on a cycle; each item's count of
    producers it still waits for, above zero for those on or behind a cycle)."""
    producer_of = {name: index for index, names in enumerate(writes) for name in names if name}
    pending = []
    consumers: list[list[int]] = [[] for _ in writes]
    for index, names in enumerate(reads):
        deps = {producer_of[name] for name in names if name in producer_of}
        pending.append(len(deps))
        for dep in deps:
            consumers[dep].append(index)
    import heapq  # not imported by a compiled file's load

    ready = [i for i, count in enumerate(pending) if count == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        index = heapq.heappop(ready)
        order.append(index)
        for consumer in consumers[index]:
            pending[consumer] -= 1
            if pending[consumer] == 0:
                heapq.heappush(ready, consumer)
    return order, pending


def _node_reads(node: Node) -> list[str]:
    reads = [i for i in node.inputs if i]
    for sub in node.subgraphs():
        reads.extend(sub.outer_names())
    return reads


def _hash_graph(graph: Graph, digest: Any) -> None:
    def attr_token(value: Any) -> Any:
        if isinstance(value, Graph):
            import hashlib

            sub = hashlib.sha256()
            _hash_graph(value, sub)
            return {"graph": sub.hexdigest()}
        if isinstance(value, np.ndarray):
            return {"tensor": str(value.dtype), "shape": list(value.shape),
                    "sha": _array_digest(value) if value.dtype != object else repr(value.tolist())}
        if isinstance(value, tuple):
            return [attr_token(v) for v in value]
        if isinstance(value, bytes):
            return value.hex()
        return value

    doc = {
        "inputs": [[v.name, v.dtype, list(v.shape) if v.shape is not None else None] for v in graph.inputs],
        "outputs": graph.output_names,
        "opset": sorted(graph.opset.items()),
        "nodes": [[n.domain, n.op_type, list(n.inputs), list(n.outputs),
                   sorted((k, attr_token(v)) for k, v in n.attrs.items())] for n in graph.nodes],
    }
    digest.update(json.dumps(doc, sort_keys=True, default=str).encode())
    for name in sorted(graph.initializers):
        array = graph.values[name].const
        digest.update(f"{name}:{array.dtype}:{array.shape}".encode())
        if array.dtype == object:
            digest.update(repr(array.tolist()).encode())
        else:
            hash_array_bytes(array, digest)


HASH_CHUNK_BYTES = 16 << 20


def hash_array_bytes(array: np.ndarray, digest: Any, chunk: int = HASH_CHUNK_BYTES) -> None:
    """``digest.update`` with ``array``'s bytes in C order (those of ``tobytes()``) without a
    whole copy: a contiguous array is read in place ``chunk`` bytes at a time, a strided one
    copied ``chunk`` bytes at a time; the pages of a mapped weight are released as they are
    hashed (``edgeinfer.ir.mapped.release_pages``), so the hash of a big model holds none."""
    from edgeinfer.ir.mapped import release_pages

    if array.flags.c_contiguous:
        flat = array.reshape(-1).view(np.uint8)
        for start in range(0, flat.size, chunk):
            part = flat[start:start + chunk]
            digest.update(part)
            release_pages(part)
        return
    row = array[0].nbytes  # strided, hence not empty and at least 1-D
    if array.ndim > 1 and row > chunk:  # one slice of the first axis is itself big: by slices
        for index in range(array.shape[0]):
            hash_array_bytes(array[index], digest, chunk)
        return
    step = max(1, chunk // row)
    for start in range(0, array.shape[0], step):
        digest.update(np.ascontiguousarray(array[start:start + step]).reshape(-1).view(np.uint8))


def _array_digest(array: np.ndarray) -> str:
    import hashlib

    digest = hashlib.sha256()
    hash_array_bytes(array, digest)
    return digest.hexdigest()
