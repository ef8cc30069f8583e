"""A bounds-checked reader of TFLite flatbuffers, independent of TensorFlow.

The Python ``flatbuffers`` runtime has no verifier: a truncated or hostile file makes its
generated accessors raise ``IndexError``/``struct.error`` or read garbage. This module is the
verifier and accessor in one: every offset (table, vtable, vector, string, buffer) is checked
against the file before it is followed, so a bad file raises ``ModelFormatError`` saying which
field of which table is broken. ``flatbuffers.util`` supplies the identifier check; field slots
come from ``schema.py``.

``read_model(data)`` returns plain dataclasses (``ModelDef`` / ``SubGraphDef`` / ``TensorDef``
/ ``OperatorDef`` / ``SignatureDef``) in which every tensor, buffer, opcode and subgraph index
has been checked.
"""

from __future__ import annotations

import functools
import math
import struct
from dataclasses import dataclass, field

import flatbuffers.util
import numpy as np

from edgeinfer import limits
from edgeinfer.converters.tflite.sparsity import Sparsity, densify, read_sparsity
from edgeinfer.errors import ModelFormatError
from edgeinfer.format.tflite import schema
from edgeinfer.format.tflite.schema import Slot

# vtable slots of the SignatureDef tables (schema.fbs: Model.signature_defs is field 7,
# SignatureDef is {inputs, outputs, signature_key, deprecated_tag, subgraph_index}, TensorMap is
# {name, tensor_index}); kept here until ``schema.Slot`` lists them.
_MODEL_SIGNATURE_DEFS = 18
_SIGNATURE_INPUTS, _SIGNATURE_OUTPUTS, _SIGNATURE_KEY, _SIGNATURE_SUBGRAPH = 4, 6, 8, 12
_TENSOR_MAP_NAME, _TENSOR_MAP_INDEX = 4, 6

_SIZES = {"b": 1, "B": 1, "?": 1, "h": 2, "H": 2, "i": 4, "I": 4, "f": 4, "q": 8, "Q": 8, "d": 8}


class Buffer:
    """The whole file, with checked little-endian reads."""

    def __init__(self, data: bytes | bytearray | memoryview, where: str):
        self.data = memoryview(data).cast("B")
        self.size = len(self.data)
        self.where = where

    def fail(self, what: str) -> ModelFormatError:
        return ModelFormatError(f"{self.where}: corrupt TFLite flatbuffer: {what}")

    def check(self, pos: int, length: int, what: str) -> None:
        if pos < 0 or length < 0 or pos + length > self.size:
            raise self.fail(f"{what} at bytes [{pos}, {pos + length}) lies outside the "
                            f"{self.size}-byte file")

    def read(self, fmt: str, pos: int, what: str):
        self.check(pos, _SIZES[fmt], what)
        return struct.unpack_from("<" + fmt, self.data, pos)[0]

    def table_at(self, pos: int, what: str) -> Table:
        self.check(pos, 4, what)
        vtable = pos - self.read("i", pos, what)
        self.check(vtable, 4, f"vtable of {what}")
        vsize = self.read("H", vtable, f"vtable of {what}")
        inline = self.read("H", vtable + 2, f"vtable of {what}")
        if vsize < 4 or vsize % 2:
            raise self.fail(f"vtable of {what} has size {vsize} (expected an even size >= 4)")
        self.check(vtable, vsize, f"vtable of {what}")
        self.check(pos, inline, f"{what} (inline part)")
        return Table(self, pos, vtable, vsize, inline, what)


class Table:
    """One flatbuffer table; every accessor checks the field against the table and the file."""

    __slots__ = ("buf", "pos", "vtable", "vsize", "inline", "what")

    def __init__(self, buf: Buffer, pos: int, vtable: int, vsize: int, inline: int, what: str):
        self.buf, self.pos, self.vtable, self.vsize, self.inline, self.what = buf, pos, vtable, vsize, inline, what

    def _field(self, slot: int, size: int, name: str) -> int:
        """Absolute position of a field, or 0 if absent."""
        if slot >= self.vsize:
            return 0
        rel = self.buf.read("H", self.vtable + slot, f"vtable of {self.what}")
        if rel == 0:
            return 0
        if rel + size > self.inline:
            raise self.buf.fail(f"field {name!r} of {self.what} at offset {rel} overruns the "
                                f"table's {self.inline} inline bytes")
        return self.pos + rel

    def scalar(self, slot: int, fmt: str, default=0, name: str = "?"):
        pos = self._field(slot, _SIZES[fmt], name)
        return default if pos == 0 else self.buf.read(fmt, pos, f"{self.what}.{name}")

    def _indirect(self, slot: int, name: str) -> int | None:
        pos = self._field(slot, 4, name)
        if pos == 0:
            return None
        return pos + self.buf.read("I", pos, f"{self.what}.{name}")

    def table(self, slot: int, name: str) -> Table | None:
        target = self._indirect(slot, name)
        return None if target is None else self.buf.table_at(target, f"{self.what}.{name}")

    def _vector(self, slot: int, elem_size: int, name: str) -> tuple[int, int] | None:
        start = self._indirect(slot, name)
        if start is None:
            return None
        what = f"{self.what}.{name}"
        length = self.buf.read("I", start, what)
        if length > limits.MAX_VECTOR_ELEMENTS:
            raise self.buf.fail(f"{what} claims {length} elements")
        self.buf.check(start + 4, length * elem_size, what)
        return start + 4, length

    def numbers(self, slot: int, dtype: str, name: str) -> np.ndarray | None:
        """A vector of scalars as a read-only numpy array (a view into the file)."""
        dt = np.dtype(dtype).newbyteorder("<")
        found = self._vector(slot, dt.itemsize, name)
        if found is None:
            return None
        start, length = found
        return np.frombuffer(self.buf.data, dtype=dt, count=length, offset=start)

    def raw_bytes(self, slot: int, name: str) -> memoryview | None:
        found = self._vector(slot, 1, name)
        return None if found is None else self.buf.data[found[0]:found[0] + found[1]]

    def tables(self, slot: int, name: str) -> list[Table]:
        found = self._vector(slot, 4, name)
        if found is None:
            return []
        start, length = found
        out = []
        for i in range(length):
            pos = start + 4 * i
            out.append(self.buf.table_at(pos + self.buf.read("I", pos, f"{self.what}.{name}[{i}]"),
                                         f"{self.what}.{name}[{i}]"))
        return out

    def string(self, slot: int, name: str) -> str | None:
        raw = self.raw_bytes(slot, name)
        if raw is None:
            return None
        return bytes(raw).decode("utf-8", errors="replace")


# -- the parsed model ---------------------------------------------------------------------------
@dataclass(frozen=True)
class QuantParams:
    scale: np.ndarray  # float32, one per channel (or one)
    zero_point: np.ndarray  # int64, same length as scale
    axis: int  # quantized_dimension; meaningful when there is more than one scale

    @property
    def per_channel(self) -> bool:
        return self.scale.size > 1


@dataclass
class TensorDef:
    index: int
    name: str
    type_code: int
    shape: tuple[int, ...]
    signature: tuple[int, ...] | None  # -1 marks a dynamic dim
    buffer: int
    quant: QuantParams | None
    is_variable: bool
    sparsity: Sparsity | None = None  # a sparse constant, densified by ModelDef.tensor_data

    @property
    def dtype(self) -> str | None:
        return schema.tensor_dtype(self.type_code)

    @property
    def type_name(self) -> str:
        return schema.tensor_type_name(self.type_code)


@dataclass
class OperatorDef:
    index: int
    opcode: str
    version: int
    custom_code: str | None
    inputs: tuple[int, ...]  # -1 marks an omitted optional input
    outputs: tuple[int, ...]
    options_type: int
    options_table: Table | None
    intermediates: tuple[int, ...] = ()
    custom_options: bytes | None = None  # a custom op's own option bytes

    @property
    def label(self) -> str:
        name = self.custom_code if self.opcode == "CUSTOM" and self.custom_code else self.opcode
        return f"operator #{self.index} ({name})"


@dataclass
class SubGraphDef:
    index: int
    name: str
    tensors: list[TensorDef]
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    operators: list[OperatorDef]

    @functools.cached_property
    def producers(self) -> dict[int, OperatorDef]:
        """Tensor index -> the first operator that writes it."""
        found: dict[int, OperatorDef] = {}
        for op in self.operators:
            for index in op.outputs:
                if index >= 0:
                    found.setdefault(index, op)
        return found


@dataclass(frozen=True)
class SignatureDef:
    """A named entry point: its input and output names, each mapped to a tensor of ``subgraph``
    (TensorFlow's converter writes one, ``serving_default``, keyed by the source's signature)."""

    key: str
    subgraph: int
    inputs: dict[str, int]  # name -> tensor index
    outputs: dict[str, int]


@dataclass
class ModelDef:
    version: int
    description: str
    subgraphs: list[SubGraphDef]
    buffers: list[memoryview | None]  # None: no data (an activation or an empty buffer)
    where: str
    signatures: list[SignatureDef] = field(default_factory=list)

    def tensor_data(self, tensor: TensorDef, subgraph: SubGraphDef) -> np.ndarray | None:
        """The constant contents of ``tensor`` (a read-only view), or None for an activation."""
        raw = self.buffers[tensor.buffer]
        empty = raw is None or len(raw) == 0
        if empty and not self.is_empty_constant(tensor, subgraph):
            return None
        where = f"{self.where}: subgraph {subgraph.index} tensor #{tensor.index} {tensor.name!r}"
        dtype = tensor.dtype
        if dtype is None:
            raise ModelFormatError(f"{where}: constant of type {tensor.type_name} cannot be imported")
        if empty:
            return np.zeros(tensor.shape, dtype)
        dt = np.dtype(dtype).newbyteorder("<")
        if tensor.sparsity is not None:
            if len(raw) % dt.itemsize:
                raise ModelFormatError(f"{where}: sparse buffer {tensor.buffer} holds {len(raw)} bytes, not a "
                                       f"whole number of {tensor.type_name} values")
            values = np.frombuffer(raw, dtype=dt).astype(dtype, copy=False)
            return densify(values, tensor.shape, tensor.sparsity, where)
        count = math.prod(tensor.shape)
        if len(raw) != count * dt.itemsize:
            raise ModelFormatError(f"{where}: buffer {tensor.buffer} holds {len(raw)} bytes, expected "
                                   f"{count * dt.itemsize} for shape {list(tensor.shape)} of {tensor.type_name}")
        return np.frombuffer(raw, dtype=dt, count=count).reshape(tensor.shape).astype(dtype, copy=False)

    def is_empty_constant(self, tensor: TensorDef, subgraph: SubGraphDef) -> bool:
        """Whether ``tensor`` is a constant holding no values: a buffer of its own (not the
        sentinel buffer 0, which marks an activation) that is empty, a static shape with a
        zero-sized dim, and nothing else defines it (no operator writes it, it is no subgraph
        input or variable). onnx-tf writes the int32 [0] shape of a RESHAPE to a scalar so;
        LiteRT allocates such a tensor without data, which needs none."""
        raw = self.buffers[tensor.buffer]
        dynamic = tensor.signature is not None and -1 in tensor.signature
        return (tensor.buffer != 0 and (raw is None or len(raw) == 0) and math.prod(tensor.shape) == 0
                and not dynamic and not tensor.is_variable and tensor.index not in subgraph.inputs
                and tensor.index not in subgraph.producers)


def read_model(data: bytes | bytearray | memoryview, where: str = "<tflite>") -> ModelDef:
    """Parse and verify a TFLite flatbuffer (see the module docstring)."""
    buf = Buffer(data, where)
    if buf.size < 8:
        raise buf.fail(f"expected at least 8 bytes, found {buf.size}")
    if flatbuffers.util.GetBufferIdentifier(bytes(buf.data[:8]), 0) != schema.FILE_IDENTIFIER:
        raise ModelFormatError(f"{where}: expected a TFLite flatbuffer (identifier 'TFL3' at byte 4), "
                               f"found {bytes(buf.data[4:8])!r}")
    root = buf.table_at(buf.read("I", 0, "root offset"), "Model")
    version = root.scalar(Slot.MODEL_VERSION, "I", 0, "version")
    if version != schema.SCHEMA_VERSION:
        raise ModelFormatError(f"{where}: expected TFLite schema version {schema.SCHEMA_VERSION}, found {version}")
    buffers = [_read_buffer(t, buf, i) for i, t in enumerate(root.tables(Slot.MODEL_BUFFERS, "buffers"))]
    opcodes = [_read_opcode(t, buf) for t in root.tables(Slot.MODEL_OPERATOR_CODES, "operator_codes")]
    subgraph_tables = root.tables(Slot.MODEL_SUBGRAPHS, "subgraphs")
    if not subgraph_tables:
        raise buf.fail("the model has no subgraphs")
    subgraphs = [_read_subgraph(i, t, buf, opcodes, len(buffers)) for i, t in enumerate(subgraph_tables)]
    description = root.string(Slot.MODEL_DESCRIPTION, "description") or ""
    signatures = [_read_signature(t, buf, subgraphs)
                  for t in root.tables(_MODEL_SIGNATURE_DEFS, "signature_defs")]
    return ModelDef(version, description, subgraphs, buffers, where, signatures)


def _read_signature(table: Table, buf: Buffer, subgraphs: list[SubGraphDef]) -> SignatureDef:
    key = table.string(_SIGNATURE_KEY, "signature_key") or ""
    index = table.scalar(_SIGNATURE_SUBGRAPH, "I", 0, "subgraph_index")
    if index >= len(subgraphs):
        raise buf.fail(f"signature {key!r} refers to subgraph {index}, but the model has {len(subgraphs)}")
    n = len(subgraphs[index].tensors)

    def tensor_map(slot: int, name: str) -> dict[str, int]:
        found = {}
        for i, entry in enumerate(table.tables(slot, name)):
            tensor = entry.scalar(_TENSOR_MAP_INDEX, "I", 0, "tensor_index")
            if tensor >= n:
                raise buf.fail(f"signature {key!r} {name}[{i}] refers to tensor {tensor}, but subgraph "
                               f"{index} has {n} tensors")
            found[entry.string(_TENSOR_MAP_NAME, "name") or f"{name}_{i}"] = tensor
        return found

    return SignatureDef(key, index, tensor_map(_SIGNATURE_INPUTS, "inputs"),
                        tensor_map(_SIGNATURE_OUTPUTS, "outputs"))


def _read_buffer(table: Table, buf: Buffer, index: int) -> memoryview | None:
    data = table.raw_bytes(Slot.BUFFER_DATA, "data")
    offset = table.scalar(Slot.BUFFER_OFFSET, "Q", 0, "offset")
    size = table.scalar(Slot.BUFFER_SIZE, "Q", 0, "size")
    if offset > 1:  # stored after the flatbuffer (files over 2 GB); offset is from the file start
        if data is not None and len(data):
            raise buf.fail(f"buffer {index} has both inline data and an external offset")
        buf.check(offset, size, f"buffer {index} (external data)")
        return buf.data[offset:offset + size]
    return data


def _read_opcode(table: Table, buf: Buffer) -> tuple[str, int, str | None]:
    deprecated = table.scalar(Slot.OPCODE_DEPRECATED_BUILTIN, "b", 0, "deprecated_builtin_code")
    code = table.scalar(Slot.OPCODE_BUILTIN, "i", 0, "builtin_code")
    # Files before schema 3a only set the deprecated int8 field; newer ones set both.
    code = max(code, deprecated)
    if code < 0:
        raise buf.fail(f"operator code {code} is negative")
    version = table.scalar(Slot.OPCODE_VERSION, "i", 1, "version")
    custom = table.string(Slot.OPCODE_CUSTOM, "custom_code")
    return schema.opcode_name(code), version, custom


def _index_list(array: np.ndarray | None, limit: int, what: str, buf: Buffer, optional: bool) -> tuple[int, ...]:
    if array is None:
        return ()
    values = tuple(int(v) for v in array)
    for v in values:
        if not (0 <= v < limit or (optional and v == -1)):
            raise buf.fail(f"{what} refers to tensor {v}, but the subgraph has {limit} tensors")
    return values


def _read_subgraph(index: int, table: Table, buf: Buffer, opcodes: list, n_buffers: int) -> SubGraphDef:
    name = table.string(Slot.SUBGRAPH_NAME, "name") or f"subgraph{index}"
    tensors = [_read_tensor(i, t, buf, n_buffers, index)
               for i, t in enumerate(table.tables(Slot.SUBGRAPH_TENSORS, "tensors"))]
    n = len(tensors)
    where = f"subgraph {index}"
    inputs = _index_list(table.numbers(Slot.SUBGRAPH_INPUTS, "i4", "inputs"), n, f"{where} inputs", buf, False)
    outputs = _index_list(table.numbers(Slot.SUBGRAPH_OUTPUTS, "i4", "outputs"), n, f"{where} outputs", buf, False)
    operators = []
    for i, op_table in enumerate(table.tables(Slot.SUBGRAPH_OPERATORS, "operators")):
        opcode_index = op_table.scalar(Slot.OPERATOR_OPCODE_INDEX, "I", 0, "opcode_index")
        if opcode_index >= len(opcodes):
            raise buf.fail(f"{where} operator #{i} uses opcode index {opcode_index}, but the model "
                           f"has {len(opcodes)} operator codes")
        opname, version, custom = opcodes[opcode_index]
        what = f"{where} operator #{i} ({opname})"
        op_inputs = _index_list(op_table.numbers(Slot.OPERATOR_INPUTS, "i4", "inputs"), n, f"{what} inputs", buf, True)
        op_outputs = _index_list(op_table.numbers(Slot.OPERATOR_OUTPUTS, "i4", "outputs"), n,
                                 f"{what} outputs", buf, True)
        intermediates = _index_list(op_table.numbers(Slot.OPERATOR_INTERMEDIATES, "i4", "intermediates"), n,
                                    f"{what} intermediates", buf, False)
        options_type = op_table.scalar(Slot.OPERATOR_OPTIONS_TYPE, "B", 0, "builtin_options_type")
        options = op_table.table(Slot.OPERATOR_OPTIONS, "builtin_options") if options_type else None
        custom_options = op_table.raw_bytes(Slot.OPERATOR_CUSTOM_OPTIONS, "custom_options")
        operators.append(OperatorDef(i, opname, version, custom, op_inputs, op_outputs, options_type,
                                     options, intermediates,
                                     None if custom_options is None else bytes(custom_options)))
    return SubGraphDef(index, name, tensors, inputs, outputs, operators)


def _read_tensor(index: int, table: Table, buf: Buffer, n_buffers: int, subgraph: int) -> TensorDef:
    what = f"subgraph {subgraph} tensor #{index}"
    shape_array = table.numbers(Slot.TENSOR_SHAPE, "i4", "shape")
    if shape_array is not None and shape_array.size > limits.MAX_RANK:
        raise buf.fail(f"{what} has {shape_array.size} dims, expected at most {limits.MAX_RANK}")
    shape = () if shape_array is None else tuple(int(d) for d in shape_array)
    if any(d < 0 for d in shape):
        raise buf.fail(f"{what} has a negative dim in shape {list(shape)}")
    signature_array = table.numbers(Slot.TENSOR_SHAPE_SIGNATURE, "i4", "shape_signature")
    signature = None if signature_array is None else tuple(int(d) for d in signature_array)
    if signature is not None and (len(signature) != len(shape) or any(d < -1 for d in signature)):
        raise buf.fail(f"{what} has shape_signature {list(signature)} inconsistent with shape {list(shape)}")
    buffer = table.scalar(Slot.TENSOR_BUFFER, "I", 0, "buffer")
    if buffer >= n_buffers:
        raise buf.fail(f"{what} uses buffer {buffer}, but the model has {n_buffers} buffers")
    name = table.string(Slot.TENSOR_NAME, "name") or f"tensor{index}"
    if len(name) > limits.MAX_NAME_CHARS:
        raise buf.fail(f"{what} has a name of {len(name)} characters, expected at most {limits.MAX_NAME_CHARS}")
    type_code = table.scalar(Slot.TENSOR_TYPE, "b", 0, "type")
    quant = _read_quant(table.table(Slot.TENSOR_QUANTIZATION, "quantization"), shape, what, buf)
    is_variable = bool(table.scalar(Slot.TENSOR_IS_VARIABLE, "?", False, "is_variable"))
    sparse_table = table.table(Slot.TENSOR_SPARSITY, "sparsity")
    sparsity = None if sparse_table is None else read_sparsity(sparse_table, f"{what} {name!r}", buf.fail)
    return TensorDef(index, name, type_code, shape, signature, buffer, quant, is_variable, sparsity)


def _read_quant(table: Table | None, shape: tuple[int, ...], what: str, buf: Buffer) -> QuantParams | None:
    if table is None:
        return None
    scale = table.numbers(Slot.QUANT_SCALE, "f4", "scale")
    if scale is None or scale.size == 0:
        return None  # min/max only (a float tensor's recorded range), nothing to import
    zero = table.numbers(Slot.QUANT_ZERO_POINT, "i8", "zero_point")
    zero = np.zeros(scale.size, np.int64) if zero is None or zero.size == 0 else zero.astype(np.int64)
    if zero.size != scale.size:
        raise buf.fail(f"{what} has {scale.size} quantization scales but {zero.size} zero points")
    if not np.all(np.isfinite(scale)) or np.any(scale <= 0):
        raise buf.fail(f"{what} has a non-positive or non-finite quantization scale")
    axis = table.scalar(Slot.QUANT_QUANTIZED_DIMENSION, "i", 0, "quantized_dimension")
    if scale.size > 1 and not (0 <= axis < len(shape) and shape[axis] == scale.size):
        raise buf.fail(f"{what} has {scale.size} per-channel scales on dimension {axis}, which does not "
                       f"match shape {list(shape)}")
    return QuantParams(scale.astype(np.float32), zero, axis)


def read_options(op: OperatorDef, expected: str, buf_where: str) -> dict[str, object]:
    """The builtin options of ``op`` as a dict, with schema defaults for absent fields."""
    spec = schema.OPTIONS_TABLES[expected]
    if op.options_table is None:
        table = None
    elif op.options_type != spec.union_type:
        raise ModelFormatError(f"{buf_where}: {op.label} carries builtin options of union type "
                               f"{op.options_type}, expected {spec.union_type} ({expected})")
    else:
        table = op.options_table
    out: dict[str, object] = {}
    for name, fld in spec.fields.items():
        if table is None:
            out[name] = fld.default
        elif fld.kind == "int_vector":
            arr = table.numbers(fld.slot, "i4", name)
            out[name] = fld.default if arr is None else tuple(int(v) for v in arr)
        else:
            out[name] = table.scalar(fld.slot, fld.kind, fld.default, name)
    return out
