"""Serialize a TFLite model (schema version 3) with the ``flatbuffers`` package's ``Builder``.

``ModelWriter`` collects buffers, tensors, operator codes and operators of one subgraph and
writes the flatbuffer in one go (``to_bytes``). Field numbers come from ``schema.Slot`` and
``schema.OPTIONS_TABLES`` (slot = 4 + 2 * field id), the same facts the bounds-checked reader
in ``converters/tflite`` reads with, so what one writes the other reads. Constant buffers are
16-byte aligned, as TFLite's own converter writes them (XNNPACK reads weights in place).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import flatbuffers
import numpy as np

from edgeinfer.errors import UnsupportedOpError
from edgeinfer.format.tflite import schema
from edgeinfer.format.tflite.schema import Slot

BUFFER_ALIGNMENT = 16
MAX_FLATBUFFER_BYTES = (1 << 31) - 1  # flatbuffers' 32-bit offsets


def _field(slot: int) -> int:
    return (slot - 4) // 2


@dataclass(frozen=True)
class Quantization:
    """Per-tensor (one scale) or per-channel (``axis``) affine quantization."""

    scale: np.ndarray  # float32, 1-D
    zero_point: np.ndarray  # int64, 1-D, same length
    axis: int = 0

    def same_as(self, other: Quantization | None) -> bool:
        return (other is not None and self.axis == other.axis and np.array_equal(self.scale, other.scale)
                and np.array_equal(self.zero_point, other.zero_point))


@dataclass
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    signature: tuple[int, ...] | None  # -1 marks a dynamic dim; None when all dims are static
    type_code: int
    buffer: int
    quant: Quantization | None = None


@dataclass
class OperatorSpec:
    opcode: int  # index into the model's operator codes
    inputs: tuple[int, ...]  # -1: an omitted optional input
    outputs: tuple[int, ...]
    options: str | None = None  # name of a table in schema.OPTIONS_TABLES
    values: dict[str, Any] = field(default_factory=dict)


class ModelWriter:
    """One subgraph's tensors and operators; ``to_bytes`` writes the model."""

    def __init__(self) -> None:
        self.buffers: list[bytes | None] = [None]  # buffer 0: the empty sentinel TFLite requires
        self.tensors: list[TensorSpec] = []
        self.operators: list[OperatorSpec] = []
        self.opcodes: dict[tuple[str, int], int] = {}
        self.inputs: list[int] = []
        self.outputs: list[int] = []

    def add_tensor(self, name: str, shape, dtype: str, data: np.ndarray | None = None,
                   quant: Quantization | None = None) -> int:
        """A tensor of IR dtype ``dtype``; ``shape`` may hold symbols or None (dynamic dims)."""
        code = schema.TENSOR_TYPE_CODES.get(dtype)
        if code is None:
            raise UnsupportedOpError(f"tensor {name!r}: dtype {dtype} has no TFLite tensor type; expected one of "
                                     f"{sorted(schema.TENSOR_TYPE_CODES)}")
        dims = tuple(d if isinstance(d, int) else 1 for d in shape)
        dynamic = any(not isinstance(d, int) for d in shape)
        signature = tuple(d if isinstance(d, int) else -1 for d in shape) if dynamic else None
        buffer = 0
        if data is not None:
            self.buffers.append(np.ascontiguousarray(data).astype(data.dtype.newbyteorder("<"), copy=False)
                                .tobytes())
            buffer = len(self.buffers) - 1
        self.tensors.append(TensorSpec(name, dims, signature, code, buffer, quant))
        return len(self.tensors) - 1

    def add_operator(self, opcode: str, inputs, outputs, *, version: int = 1, options: str | None = None,
                     **values: Any) -> None:
        key = (opcode, version)
        if key not in self.opcodes:
            self.opcodes[key] = len(self.opcodes)
        if options is not None and options not in schema.OPTIONS_TABLES:
            raise KeyError(f"unknown TFLite options table {options!r}")
        self.operators.append(OperatorSpec(self.opcodes[key], tuple(inputs), tuple(outputs), options, values))

    # -- serialization --------------------------------------------------------------------------
    def to_bytes(self, *, description: str = "edgeinfer", subgraph_name: str = "main") -> bytes:
        data_bytes = sum(len(b) for b in self.buffers if b)
        builder = flatbuffers.Builder(data_bytes + 64 * len(self.tensors) + 4096)
        buffers = [self._buffer(builder, data) for data in self.buffers]
        tensors = [self._tensor(builder, spec) for spec in self.tensors]
        operators = [self._operator(builder, spec) for spec in self.operators]
        codes = [self._opcode(builder, name, version) for (name, version) in self.opcodes]
        subgraph = self._subgraph(builder, tensors, operators, subgraph_name)
        code_vector, subgraph_vector = _offsets(builder, codes), _offsets(builder, [subgraph])
        buffer_vector = _offsets(builder, buffers)
        text = builder.CreateString(description)
        builder.StartObject(_field(Slot.MODEL_BUFFERS) + 1)
        builder.PrependUint32Slot(_field(Slot.MODEL_VERSION), schema.SCHEMA_VERSION, 0)
        builder.PrependUOffsetTRelativeSlot(_field(Slot.MODEL_OPERATOR_CODES), code_vector, 0)
        builder.PrependUOffsetTRelativeSlot(_field(Slot.MODEL_SUBGRAPHS), subgraph_vector, 0)
        builder.PrependUOffsetTRelativeSlot(_field(Slot.MODEL_DESCRIPTION), text, 0)
        builder.PrependUOffsetTRelativeSlot(_field(Slot.MODEL_BUFFERS), buffer_vector, 0)
        builder.Finish(builder.EndObject(), file_identifier=schema.FILE_IDENTIFIER)
        output = bytes(builder.Output())
        if len(output) > MAX_FLATBUFFER_BYTES:
            raise UnsupportedOpError(f"the TFLite flatbuffer would be {len(output)} bytes; expected at most "
                                     f"{MAX_FLATBUFFER_BYTES} (weights beyond 2 GiB are not supported)")
        return output

    @staticmethod
    def _buffer(builder: flatbuffers.Builder, data: bytes | None) -> int:
        vector = None
        if data:
            builder.StartVector(1, len(data), BUFFER_ALIGNMENT)
            builder.head -= len(data)
            builder.Bytes[builder.head:builder.head + len(data)] = data
            vector = builder.EndVector()
        builder.StartObject(_field(Slot.BUFFER_SIZE) + 1)
        if vector is not None:
            builder.PrependUOffsetTRelativeSlot(_field(Slot.BUFFER_DATA), vector, 0)
        return builder.EndObject()

    @staticmethod
    def _quantization(builder: flatbuffers.Builder, quant: Quantization) -> int:
        scale = builder.CreateNumpyVector(np.asarray(quant.scale, "<f4").reshape(-1))
        zero = builder.CreateNumpyVector(np.asarray(quant.zero_point, "<i8").reshape(-1))
        builder.StartObject(_field(Slot.QUANT_QUANTIZED_DIMENSION) + 1)
        builder.PrependUOffsetTRelativeSlot(_field(Slot.QUANT_SCALE), scale, 0)
        builder.PrependUOffsetTRelativeSlot(_field(Slot.QUANT_ZERO_POINT), zero, 0)
        builder.PrependInt32Slot(_field(Slot.QUANT_QUANTIZED_DIMENSION), int(quant.axis), 0)
        return builder.EndObject()

    def _tensor(self, builder: flatbuffers.Builder, spec: TensorSpec) -> int:
        shape = builder.CreateNumpyVector(np.asarray(spec.shape, "<i4"))
        signature = builder.CreateNumpyVector(np.asarray(spec.signature, "<i4")) if spec.signature else None
        name = builder.CreateString(spec.name)
        quant = self._quantization(builder, spec.quant) if spec.quant is not None else None
        builder.StartObject(_field(Slot.TENSOR_SHAPE_SIGNATURE) + 1)
        builder.PrependUOffsetTRelativeSlot(_field(Slot.TENSOR_SHAPE), shape, 0)
        builder.PrependInt8Slot(_field(Slot.TENSOR_TYPE), spec.type_code, -1)  # always written
        builder.PrependUint32Slot(_field(Slot.TENSOR_BUFFER), spec.buffer, 0)
        builder.PrependUOffsetTRelativeSlot(_field(Slot.TENSOR_NAME), name, 0)
        if quant is not None:
            builder.PrependUOffsetTRelativeSlot(_field(Slot.TENSOR_QUANTIZATION), quant, 0)
        if signature is not None:
            builder.PrependUOffsetTRelativeSlot(_field(Slot.TENSOR_SHAPE_SIGNATURE), signature, 0)
        return builder.EndObject()

    @staticmethod
    def _options(builder: flatbuffers.Builder, table: schema.OptionsTable, values: dict[str, Any]) -> int:
        unknown = set(values) - set(table.fields)
        if unknown:
            raise KeyError(f"{table.name} has no field(s) {sorted(unknown)}")
        vectors = {name: builder.CreateNumpyVector(np.asarray(values[name], "<i4"))
                   for name, fld in table.fields.items() if fld.kind == "int_vector" and name in values}
        builder.StartObject(max(_field(f.slot) for f in table.fields.values()) + 1)
        for name, fld in table.fields.items():
            if name not in values:
                continue
            slot = _field(fld.slot)
            if fld.kind == "int_vector":
                builder.PrependUOffsetTRelativeSlot(slot, vectors[name], 0)
            elif fld.kind == "b":
                builder.PrependInt8Slot(slot, int(values[name]), -1)
            elif fld.kind == "i":
                builder.PrependInt32Slot(slot, int(values[name]), -(1 << 31))
            elif fld.kind == "?":
                builder.PrependBoolSlot(slot, bool(values[name]), not bool(values[name]))
            elif fld.kind == "f":
                builder.PrependFloat32Slot(slot, float(values[name]), float("nan"))
            else:
                raise KeyError(f"{table.name}.{name}: field kind {fld.kind!r} cannot be written")
        return builder.EndObject()

    def _operator(self, builder: flatbuffers.Builder, spec: OperatorSpec) -> int:
        inputs = builder.CreateNumpyVector(np.asarray(spec.inputs, "<i4"))
        outputs = builder.CreateNumpyVector(np.asarray(spec.outputs, "<i4"))
        table = schema.OPTIONS_TABLES[spec.options] if spec.options else None
        options = self._options(builder, table, spec.values) if table is not None else None
        builder.StartObject(_field(Slot.OPERATOR_INTERMEDIATES) + 1)
        builder.PrependUint32Slot(_field(Slot.OPERATOR_OPCODE_INDEX), spec.opcode, 0)
        builder.PrependUOffsetTRelativeSlot(_field(Slot.OPERATOR_INPUTS), inputs, 0)
        builder.PrependUOffsetTRelativeSlot(_field(Slot.OPERATOR_OUTPUTS), outputs, 0)
        if table is not None:
            builder.PrependUint8Slot(_field(Slot.OPERATOR_OPTIONS_TYPE), table.union_type, 0)
            builder.PrependUOffsetTRelativeSlot(_field(Slot.OPERATOR_OPTIONS), options, 0)
        return builder.EndObject()

    @staticmethod
    def _opcode(builder: flatbuffers.Builder, name: str, version: int) -> int:
        code = schema.BUILTIN_OPERATORS.index(name)
        builder.StartObject(_field(Slot.OPCODE_BUILTIN) + 1)
        # Readers before schema 3a look only at the int8 field; newer ones take the larger.
        builder.PrependInt8Slot(_field(Slot.OPCODE_DEPRECATED_BUILTIN),
                                min(code, schema.PLACEHOLDER_FOR_GREATER_OP_CODES), 0)
        builder.PrependInt32Slot(_field(Slot.OPCODE_VERSION), version, 1)
        builder.PrependInt32Slot(_field(Slot.OPCODE_BUILTIN), code, 0)
        return builder.EndObject()

    def _subgraph(self, builder: flatbuffers.Builder, tensors: list[int], operators: list[int], name: str) -> int:
        tensor_vector, operator_vector = _offsets(builder, tensors), _offsets(builder, operators)
        inputs = builder.CreateNumpyVector(np.asarray(self.inputs, "<i4"))
        outputs = builder.CreateNumpyVector(np.asarray(self.outputs, "<i4"))
        text = builder.CreateString(name)
        builder.StartObject(_field(Slot.SUBGRAPH_NAME) + 1)
        builder.PrependUOffsetTRelativeSlot(_field(Slot.SUBGRAPH_TENSORS), tensor_vector, 0)
        builder.PrependUOffsetTRelativeSlot(_field(Slot.SUBGRAPH_INPUTS), inputs, 0)
        builder.PrependUOffsetTRelativeSlot(_field(Slot.SUBGRAPH_OUTPUTS), outputs, 0)
        builder.PrependUOffsetTRelativeSlot(_field(Slot.SUBGRAPH_OPERATORS), operator_vector, 0)
        builder.PrependUOffsetTRelativeSlot(_field(Slot.SUBGRAPH_NAME), text, 0)
        return builder.EndObject()


def _offsets(builder: flatbuffers.Builder, offsets: list[int]) -> int:
    builder.StartVector(4, len(offsets), 4)
    for offset in reversed(offsets):
        builder.PrependUOffsetTRelative(offset)
    return builder.EndVector()
