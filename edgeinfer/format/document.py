"""Graph <-> JSON document: the structural half of an ``.eim`` file.

A graph becomes plain JSON (objects, arrays, strings, numbers, booleans). Values that JSON
cannot hold unambiguously are tagged objects, ``{"t": <tag>, ...}``:

===========  ==================================================  ==============================
tag          fields                                              Python value
===========  ==================================================  ==============================
``tensor``   ``ref``: index into the file's tensor table         ``np.ndarray``
``graph``    ``graph``: a nested graph document                  ``Graph`` (subgraph)
``float``    ``v``: ``"nan"``, ``"inf"`` or ``"-inf"``           non-finite ``float``
``bytes``    ``b64``: base64 text                                ``bytes``
``type``     ``dtype``: str or null, ``shape``: shape or null    ``TypeSpec``
``scalar``   ``dtype``: numeric dtype name, ``v``: its value     numpy scalar (``np.float32``)
===========  ==================================================  ==============================

Untagged: JSON ints are ``int``, JSON numbers with a fraction or exponent are ``float``,
``true``/``false`` are ``bool``, strings are ``str`` and arrays are tuples (so ``[]`` is the
empty tuple). Tensor data never lives here: the file's tensor table does (see ``eim.py``).

Reading is a strict, explicit schema check: every field present with the right type, no
unknown tag, every tensor reference resolvable, nesting bounded. Every problem raises
``ModelFormatError`` naming the file, the JSON path, what was expected and what was found.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from edgeinfer import limits
from edgeinfer.errors import ModelFormatError
from edgeinfer.ir import dtypes
from edgeinfer.ir.dtypes import TypeSpec
from edgeinfer.ir.graph import Graph, Node, Value

TAG = "t"
try:  # CPython's own SHA-256: no OpenSSL to load (``_hashlib``: 3.3 ms of a device's cold start)
    from _sha2 import sha256 as _builtin_sha256  # Python 3.12+
except ImportError:
    try:
        from _sha256 import sha256 as _builtin_sha256
    except ImportError:  # another Python implementation: hashlib's
        from hashlib import sha256 as _builtin_sha256
BUILTIN_SHA256_MAX = 512 << 10  # bytes hashed by the built-in SHA-256 (230 MB/s, the GIL held); OpenSSL's above


def sha256(data: bytes | memoryview = b"", size: int = 0) -> Any:
    """A SHA-256 object of ``data`` (``size``: the bytes ``update`` will add): CPython's built-in one for
    a device's small inputs (a compiled file's document and IR), OpenSSL's (``hashlib``) for more."""
    if len(data) + size <= BUILTIN_SHA256_MAX:
        return _builtin_sha256(data)
    import hashlib

    return hashlib.sha256(data)

MAX_NESTING = limits.MAX_DOCUMENT_NESTING  # subgraphs inside subgraphs and lists inside lists, together
MAX_DIM = 2**63 - 1  # a dim must fit ONNX's int64 dim_value
_NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}

_GRAPH_FIELDS = ("name", "opset", "metadata", "inputs", "outputs", "value_info", "initializers", "nodes")
_NODE_FIELDS = ("op_type", "domain", "name", "inputs", "outputs", "attrs")
_VALUE_FIELDS = ("name", "dtype", "shape")
_TAG_FIELDS = {
    "tensor": ("ref",),
    "graph": ("graph",),
    "float": ("v",),
    "bytes": ("b64",),
    "type": ("dtype", "shape"),
    "scalar": ("dtype", "v"),
}


# -- writing -------------------------------------------------------------------------------------
def _refuse(where: str, expected: str, value: Any) -> ModelFormatError:
    return ModelFormatError(f"cannot save {where}: expected {expected}, found {_describe(value)}")


class TensorTable:
    """The tensors a document refers to, one entry per distinct content.

    An array used in several places (tied weights, a constant shared by two subgraphs) is
    stored once and comes back from the file as one shared array; so are distinct arrays of
    the same dtype, shape and bytes (the zero points of several quantized layers, repeated
    shape constants). Loaded arrays are read-only, so sharing them changes nothing a graph
    can observe. Arrays are grouped by dtype, shape and their first and last bytes; only one
    that joins a non-empty group is hashed whole, so distinct weights cost no hashing.
    """

    def __init__(self) -> None:
        self.arrays: list[np.ndarray] = []
        self._index: dict[int, int] = {}
        self._groups: dict[tuple[str, tuple[int, ...], bytes], list[int]] = {}
        self._digests: dict[int, bytes] = {}
        self._alive: list[np.ndarray] = []  # every array seen, so that no id is reused while the table lives
        self.int8_products: dict[int, tuple[int, int]] = {}  # index -> (int8 values, scale): stored as q * scale

    def int8_ref(self, array: np.ndarray, axis: int, where: str) -> int:
        """``ref`` of a weight declared int8-stored; when it is exactly ``q * scale``
        (``int8_factors``), ``q`` and ``scale`` are stored and the weight becomes their product."""
        # the writer's: a device's load imports no weights module
        from edgeinfer.ir.weights import int8_factors

        index = self.ref(array, where)
        factors = int8_factors(array, axis) if index not in self.int8_products else None
        if factors is not None:
            q, scale = (self.ref(f, f"{where} int8 storage") for f in factors)
            if index not in (q, scale):
                self.int8_products[index] = (q, scale)
        return index

    def ref(self, array: np.ndarray, where: str) -> int:
        index = self._index.get(id(array))
        if index is None:
            _check_savable(array, where)
            index = self._index[id(array)] = self._same_content(array)
            if index == len(self.arrays):
                self.arrays.append(array)
            self._alive.append(array)
        return index

    def _same_content(self, array: np.ndarray) -> int:
        """The index of a stored array with the same dtype, shape and bytes, or the next index."""
        if array.dtype == object or array.dtype.kind in "US":
            return len(self.arrays)
        raw = _raw_bytes(array)
        group = self._groups.setdefault((array.dtype.str, array.shape, bytes(raw[:256]) + bytes(raw[-256:])), [])
        if group:
            digest = _digest(raw)
            for index in group:
                if index not in self._digests:
                    self._digests[index] = _digest(_raw_bytes(self.arrays[index]))
                if self._digests[index] == digest:
                    return index
            self._digests[len(self.arrays)] = digest
        group.append(len(self.arrays))
        return len(self.arrays)


def _raw_bytes(array: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8)


def _digest(raw: np.ndarray) -> bytes:
    import hashlib  # the writer's: a device's load imports OpenSSL's SHA-256 alone (``sha256``)

    return hashlib.blake2b(raw, digest_size=32).digest()


def _check_savable(array: np.ndarray, where: str) -> None:
    if array.dtype == object or array.dtype.kind in "US":
        return  # string tensor; its elements are checked when the table is written
    try:
        name = dtypes.name_of(array.dtype)
    except ModelFormatError:
        name = str(array.dtype)
    if name not in dtypes.NUMERIC_DTYPES:
        raise _refuse(where, f"a tensor of one of {', '.join(dtypes.NUMERIC_DTYPES)} or str",
                      Finding(f"dtype {name}"))


def graph_to_document(graph: Graph, table: TensorTable, depth: int = 0) -> dict[str, Any]:
    """The JSON document of ``graph``; its tensors are added to ``table``."""
    where = f"graph {graph.name!r}"
    if depth > MAX_NESTING:
        raise _refuse(where, f"subgraphs nested at most {MAX_NESTING} deep", Finding(f"depth {depth}"))
    boundary = set(graph.input_names) | set(graph.output_names)
    # Every typed value that is not a boundary or constant; unlike Graph.value_info() this also
    # keeps values known only by shape, so the loaded graph is the same graph.
    typed = [v for v in graph.values.values() if v.name not in boundary and v.const is None
             and (v.dtype is not None or v.shape is not None)]
    from edgeinfer.ir.weights import int8_stored_weights, storage_array, stored_weights

    narrow = stored_weights(graph.metadata)  # float16-stored weights keep their narrow bytes
    int8 = int8_stored_weights(graph.metadata) if depth == 0 else {}  # and int8-stored ones int8 and a scale

    def initializer_ref(name: str, array: np.ndarray) -> int:
        where_init = f"{where} initializer {name!r}"
        if name in int8:
            return table.int8_ref(array, int8[name], where_init)
        return table.ref(storage_array(array, narrow.get(name)), where_init)
    return {
        "name": _text(graph.name, f"{where} name"),
        "opset": {_text(domain, f"{where} opset domain"): _int(version, f"{where} opset {domain!r}")
                  for domain, version in graph.opset.items()},
        "metadata": metadata_to_document(graph.metadata, f"{where} metadata"),
        "inputs": [_value_doc(v, where) for v in graph.inputs],
        "outputs": [_value_doc(v, where) for v in graph.outputs],
        "value_info": [_value_doc(v, where) for v in typed],
        "initializers": [{"name": _text(name, f"{where} initializer name"),
                          "tensor": initializer_ref(name, array)}
                         for name, array in graph.initializers.items()],
        "nodes": [_node_doc(node, graph, table, depth) for node in graph.nodes],
    }


def metadata_to_document(metadata: Mapping[str, str], where: str) -> dict[str, str]:
    return {_text(key, f"{where} key"): _text(value, f"{where} {key!r}") for key, value in metadata.items()}


def _text(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise _refuse(where, "a str", value)
    return value


def _int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise _refuse(where, "an int", value)
    return int(value)


def _value_doc(value: Value, where: str) -> dict[str, Any]:
    where = f"{where} value {value.name!r}"
    return {"name": _text(value.name, where),
            "dtype": None if value.dtype is None else _text(value.dtype, where),
            "shape": _shape_doc(value.shape, where)}


def _shape_doc(shape: Sequence[Any] | None, where: str) -> list[Any] | None:
    if shape is None:
        return None
    dims = []
    for dim in shape:
        if dim is None or isinstance(dim, str):
            dims.append(dim)
        else:
            dims.append(_int(dim, f"{where} shape {tuple(shape)}"))
    return dims


def _node_doc(node: Node, graph: Graph, table: TensorTable, depth: int) -> dict[str, Any]:
    where = f"{node.label} in graph {graph.name!r}"
    for key, value in node.attrs.items():
        problem = attr_shape_problem(value)
        if problem is not None:
            raise ModelFormatError(f"cannot save {where} attribute {key!r}: expected {problem}")
    return {
        "op_type": _text(node.op_type, f"{where} op_type"),
        "domain": _text(node.domain, f"{where} domain"),
        "name": _text(node.name, f"{where} name"),
        "inputs": [_text(name, f"{where} input") for name in node.inputs],
        "outputs": [_text(name, f"{where} output") for name in node.outputs],
        "attrs": {_text(key, f"{where} attribute name"):
                  encode_attr(value, table, f"{where} attribute {key!r}", depth)
                  for key, value in node.attrs.items()},
    }


def attr_shape_problem(value: Any) -> str | None:
    """Why an attribute value cannot be a node attribute, or None.

    Graphs and tensors are an attribute's whole value or fill a whole flat tuple (ONNX's GRAPH,
    GRAPHS, TENSOR, TENSORS): ``Node.subgraphs()`` and the ONNX export look at a tuple's first
    element to tell its kind, so a mixed tuple or a graph in a nested list would be missed.
    """
    if not isinstance(value, (tuple, list)):
        return None
    for kind, name in ((Graph, "graph"), (np.ndarray, "tensor")):
        flags = [isinstance(item, kind) for item in value]
        if any(flags) and not all(flags):
            return f"a tuple of only {name}s or of no {name}s, found one mixing {name}s with other values"
        if not any(flags) and any(_holds(item, kind) for item in value):
            return f"{name}s only directly in an attribute's tuple, found one in a nested list"
    return None


def _holds(value: Any, kind: type) -> bool:
    if isinstance(value, kind):
        return True
    return isinstance(value, (tuple, list)) and any(_holds(item, kind) for item in value)


def encode_attr(value: Any, table: TensorTable, where: str, depth: int = 0) -> Any:
    """An attribute value as JSON (see the module docstring for the tags)."""
    if depth > MAX_NESTING:
        raise _refuse(where, f"attribute values nested at most {MAX_NESTING} deep", Finding(f"depth {depth}"))
    if isinstance(value, (bool, str)):  # before int: bool is an int; also numpy's str_
        return str(value) if isinstance(value, str) else value
    if isinstance(value, bytes):
        import base64

        return {TAG: "bytes", "b64": base64.b64encode(value).decode("ascii")}
    if isinstance(value, np.ndarray):
        return {TAG: "tensor", "ref": table.ref(value, where)}
    if isinstance(value, np.generic):  # before float: np.float64 is a float
        try:
            name = dtypes.name_of(value.dtype)
        except ModelFormatError:
            name = str(value.dtype)
        if name not in dtypes.NUMERIC_DTYPES:
            raise _refuse(where, "a numeric numpy scalar", value)
        return {TAG: "scalar", "dtype": name, "v": encode_attr(value.item(), table, where, depth + 1)}
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        if math.isfinite(value):
            return float(value)
        return {TAG: "float", "v": "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")}
    if isinstance(value, Graph):
        return {TAG: "graph", "graph": graph_to_document(value, table, depth + 1)}
    if isinstance(value, TypeSpec):
        return {TAG: "type", "dtype": None if value.dtype is None else _text(value.dtype, where),
                "shape": _shape_doc(value.shape, where)}
    if isinstance(value, (tuple, list)):
        return [encode_attr(item, table, where, depth + 1) for item in value]
    raise _refuse(where, "an int, float, str, bytes, tensor, graph, TypeSpec or a tuple of those", value)


# -- reading -------------------------------------------------------------------------------------
class Finding(str):
    """What was found, already worded for a message (rather than a value to describe)."""


def _describe(value: Any) -> str:
    if isinstance(value, Finding):
        return str(value)
    if isinstance(value, np.generic):
        return f"{value.dtype} {value!r}"
    kind = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null",
            int: "integer", float: "number"}.get(type(value), type(value).__name__)
    text = repr(value)
    return f"{kind} {text if len(text) <= 60 else text[:57] + '...'}"


class DocumentReader:
    """Validates a parsed document and builds the graph it describes.

    ``tensors`` is the file's tensor table (already validated against the data section);
    ``source`` names the file in messages. With ``strict`` (the file's minor version is not
    newer than this reader's) unknown fields are errors; otherwise they are ignored, so a
    newer minor version that only adds fields stays readable.
    """

    def __init__(self, tensors: Sequence[np.ndarray], source: str, *, strict: bool = True):
        self.tensors = tensors
        self.source = source
        self.strict = strict

    def fail(self, where: str, expected: str, found: Any) -> ModelFormatError:
        return ModelFormatError(f"{self.source}: {where}: expected {expected}, found {_describe(found)}")

    # -- primitives ---------------------------------------------------------------------------
    def fields(self, obj: Any, where: str, names: Sequence[str]) -> dict[str, Any]:
        if not isinstance(obj, dict):
            raise self.fail(where, f"an object with fields {', '.join(names)}", obj)
        missing = [n for n in names if n not in obj]
        if missing:
            raise ModelFormatError(f"{self.source}: {where}: expected fields {', '.join(names)}, "
                                   f"missing {', '.join(missing)}")
        if self.strict:
            unknown = [k for k in obj if k not in names]
            if unknown:
                raise ModelFormatError(f"{self.source}: {where}: expected only fields {', '.join(names)}, "
                                       f"found unknown {', '.join(map(repr, unknown))}")
        return obj

    def string(self, obj: Any, where: str, *, non_empty: bool = False) -> str:
        if not isinstance(obj, str) or (non_empty and not obj):
            raise self.fail(where, "a non-empty string" if non_empty else "a string", obj)
        return obj

    def name(self, obj: Any, where: str, *, non_empty: bool = False) -> str:
        """A graph, node, value, op type or domain name: a string of at most ``MAX_NAME_CHARS``."""
        text = self.string(obj, where, non_empty=non_empty)
        if len(text) > limits.MAX_NAME_CHARS:
            raise self.fail(where, f"a name of at most {limits.MAX_NAME_CHARS} characters",
                            Finding(f"one of {len(text)}"))
        return text

    def names(self, obj: Any, where: str) -> tuple[str, ...]:
        return tuple(self.name(item, f"{where}[{i}]") for i, item in enumerate(self.array(obj, where)))

    def optional_string(self, obj: Any, where: str) -> str | None:
        if obj is not None and not isinstance(obj, str):
            raise self.fail(where, "a string or null", obj)
        return obj

    def integer(self, obj: Any, where: str, *, minimum: int = 0, maximum: int = MAX_DIM) -> int:
        if isinstance(obj, bool) or not isinstance(obj, int) or not minimum <= obj <= maximum:
            bounds = f">= {minimum}" if maximum == MAX_DIM else f"in [{minimum}, {maximum}]"
            raise self.fail(where, f"an integer {bounds}", obj)
        return obj

    def array(self, obj: Any, where: str) -> list[Any]:
        if not isinstance(obj, list):
            raise self.fail(where, "an array", obj)
        return obj

    def strings(self, obj: Any, where: str) -> tuple[str, ...]:
        return tuple(self.string(item, f"{where}[{i}]") for i, item in enumerate(self.array(obj, where)))

    def str_map(self, obj: Any, where: str) -> dict[str, str]:
        if not isinstance(obj, dict):
            raise self.fail(where, "an object of string -> string", obj)
        return {key: self.string(value, f"{where}[{key!r}]") for key, value in obj.items()}

    def shape(self, obj: Any, where: str) -> tuple[int | str | None, ...] | None:
        """A value shape: null (unknown rank) or dims that are ints >= 0, symbols or null."""
        if obj is None:
            return None
        dims = []
        for axis, dim in enumerate(self.array(obj, where)):
            if dim is None or isinstance(dim, str):
                dims.append(dim)
            else:
                dims.append(self.integer(dim, f"{where}[{axis}]"))
        return tuple(dims)

    def tensor(self, ref: Any, where: str) -> np.ndarray:
        if not self.tensors:
            raise self.fail(where, "no tensor reference (the tensor table is empty)", ref)
        return self.tensors[self.integer(ref, where, maximum=len(self.tensors) - 1)]

    # -- structure ----------------------------------------------------------------------------
    def value(self, obj: Any, where: str) -> Value:
        obj = self.fields(obj, where, _VALUE_FIELDS)
        return Value(self.name(obj["name"], f"{where}.name", non_empty=True),
                     self.optional_string(obj["dtype"], f"{where}.dtype"),
                     self.shape(obj["shape"], f"{where}.shape"))

    def values(self, obj: Any, where: str) -> list[Value]:
        return [self.value(item, f"{where}[{i}]") for i, item in enumerate(self.array(obj, where))]

    def graph(self, obj: Any, where: str = "graph", depth: int = 0) -> Graph:
        if depth > MAX_NESTING:
            raise self.fail(where, f"subgraphs nested at most {MAX_NESTING} deep", Finding(f"depth {depth}"))
        obj = self.fields(obj, where, _GRAPH_FIELDS)
        opset_obj = obj["opset"]
        if not isinstance(opset_obj, dict):
            raise self.fail(f"{where}.opset", "an object of domain -> version", opset_obj)
        opset = {domain: self.integer(version, f"{where}.opset[{domain!r}]")
                 for domain, version in opset_obj.items()}
        initializers: dict[str, np.ndarray] = {}
        for i, item in enumerate(self.array(obj["initializers"], f"{where}.initializers")):
            at = f"{where}.initializers[{i}]"
            item = self.fields(item, at, ("name", "tensor"))
            name = self.name(item["name"], f"{at}.name", non_empty=True)
            if name in initializers:
                raise self.fail(f"{at}.name", "initializer names to be unique", name)
            initializers[name] = self.tensor(item["tensor"], f"{at}.tensor")
        nodes = [self.node(item, f"{where}.nodes[{i}]", depth)
                 for i, item in enumerate(self.array(obj["nodes"], f"{where}.nodes"))]
        metadata = self.str_map(obj["metadata"], f"{where}.metadata")
        from edgeinfer.ir.weights import widen_stored

        return Graph(nodes, self.values(obj["inputs"], f"{where}.inputs"),
                     self.values(obj["outputs"], f"{where}.outputs"), widen_stored(initializers, metadata),
                     value_info=self.values(obj["value_info"], f"{where}.value_info"), opset=opset,
                     name=self.name(obj["name"], f"{where}.name"), metadata=metadata)

    def node(self, obj: Any, where: str, depth: int) -> Node:
        obj = self.fields(obj, where, _NODE_FIELDS)
        attrs_obj = obj["attrs"]
        if not isinstance(attrs_obj, dict):
            raise self.fail(f"{where}.attrs", "an object of attribute name -> value", attrs_obj)
        attrs = {key: self.attr(value, f"{where}.attrs[{key!r}]", depth) for key, value in attrs_obj.items()}
        for key, value in attrs.items():
            problem = attr_shape_problem(value)
            if problem is not None:
                raise ModelFormatError(f"{self.source}: {where}.attrs[{key!r}]: expected {problem}")
        return Node(self.name(obj["op_type"], f"{where}.op_type", non_empty=True),
                    self.names(obj["inputs"], f"{where}.inputs"),
                    self.names(obj["outputs"], f"{where}.outputs"), attrs,
                    domain=self.name(obj["domain"], f"{where}.domain"),
                    name=self.name(obj["name"], f"{where}.name"))

    def attr(self, obj: Any, where: str, depth: int = 0) -> Any:
        """One attribute value (see the module docstring for the encoding)."""
        if depth > MAX_NESTING:
            raise self.fail(where, f"attribute values nested at most {MAX_NESTING} deep", Finding(f"depth {depth}"))
        if isinstance(obj, (bool, int, str)):
            return obj
        if isinstance(obj, float):
            return obj  # the JSON parser refuses NaN and Infinity literals, so this is finite
        if isinstance(obj, list):
            return tuple(self.attr(item, f"{where}[{i}]", depth + 1) for i, item in enumerate(obj))
        if not isinstance(obj, dict):
            raise self.fail(where, "an attribute value (number, string, boolean, array or tagged object)",
                            obj)
        tag = obj.get(TAG)
        decode = self._TAGGED.get(tag) if isinstance(tag, str) else None
        if decode is None:
            raise self.fail(f"{where}.{TAG}", f"a tag, one of {', '.join(_TAG_FIELDS)}", tag)
        obj = self.fields(obj, where, (TAG, *_TAG_FIELDS[tag]))
        return decode(self, obj, where, depth)

    def _tensor_attr(self, obj: dict, where: str, depth: int) -> np.ndarray:
        return self.tensor(obj["ref"], f"{where}.ref")

    def _graph_attr(self, obj: dict, where: str, depth: int) -> Graph:
        return self.graph(obj["graph"], f"{where}.graph", depth + 1)

    def _float_attr(self, obj: dict, where: str, depth: int) -> float:
        text = obj["v"]
        if not isinstance(text, str) or text not in _NON_FINITE:
            raise self.fail(f"{where}.v", "one of 'nan', 'inf', '-inf'", text)
        return _NON_FINITE[text]

    def _bytes_attr(self, obj: dict, where: str, depth: int) -> bytes:
        return self.base64_bytes(obj["b64"], f"{where}.b64")

    def base64_bytes(self, text: Any, where: str) -> bytes:
        if not isinstance(text, str):
            raise self.fail(where, "base64 text", text)
        try:
            import base64  # not imported by a load whose document holds no bytes

            return base64.b64decode(text.encode("ascii"), validate=True)
        except (UnicodeEncodeError, ValueError):  # binascii.Error is a ValueError
            raise self.fail(where, "base64 text", text) from None

    def _type_attr(self, obj: dict, where: str, depth: int) -> TypeSpec:
        return TypeSpec(self.optional_string(obj["dtype"], f"{where}.dtype"),
                        self.shape(obj["shape"], f"{where}.shape"))

    def _scalar_attr(self, obj: dict, where: str, depth: int) -> np.generic:
        name = obj["dtype"]
        if name not in dtypes.NUMERIC_DTYPES:
            raise self.fail(f"{where}.dtype", f"one of {', '.join(dtypes.NUMERIC_DTYPES)}", name)
        dtype = dtypes.numpy_dtype(name)
        raw = self.attr(obj["v"], f"{where}.v", depth + 1)
        if dtype.kind == "b":
            ok = isinstance(raw, bool)
        elif dtype.kind in "iu":
            info = np.iinfo(dtype)
            ok = isinstance(raw, int) and not isinstance(raw, bool) and info.min <= raw <= info.max
        else:
            ok = isinstance(raw, (int, float)) and not isinstance(raw, bool)
        if not ok:
            raise self.fail(f"{where}.v", f"a value representable as {name}", raw)
        try:
            with np.errstate(over="ignore"):
                return dtype.type(float(raw) if dtype.kind not in "biu" else raw)
        except (OverflowError, TypeError, ValueError):
            raise self.fail(f"{where}.v", f"a value representable as {name}", raw) from None

    _TAGGED: dict[str, Callable[[DocumentReader, dict, str, int], Any]] = {
        "tensor": _tensor_attr,
        "graph": _graph_attr,
        "float": _float_attr,
        "bytes": _bytes_attr,
        "type": _type_attr,
        "scalar": _scalar_attr,
    }
