"""A minimal TFLite flatbuffer writer for tests (with ``flatbuffers.Builder``), so that the
importer's handling of hand-made, broken and unusual files is tested without TensorFlow.

``build_model`` writes: input ``x`` [1, 4] float32, a constant ``c`` [4] float32, one
operator (``ADD`` with a fused RELU by default) producing ``y``. Keyword arguments corrupt
or vary single facts (an index, the opcode, where the constant's bytes live).
"""

from __future__ import annotations

import flatbuffers
import numpy as np
import pytest

from edgeinfer.format.tflite import schema

ADD_OPTIONS = schema.OPTIONS_TABLES["AddOptions"].union_type


def _vector(builder: flatbuffers.Builder, offsets: list[int]) -> int:
    builder.StartVector(4, len(offsets), 4)
    for offset in reversed(offsets):
        builder.PrependUOffsetTRelative(offset)
    return builder.EndVector()


def _ints(builder: flatbuffers.Builder, values) -> int:
    return builder.CreateNumpyVector(np.asarray(values, np.int32))


def _write(constant: np.ndarray, *, opcode: int, opcode_index: int, tensor_index: int, buffer_index: int,
           external_offset: int | None, fused_activation: int) -> bytes:
    builder = flatbuffers.Builder(1024)
    # buffers: 0 = the empty sentinel, 1 = x (none), 2 = constant, 3 = y (none)
    buffers = []
    for index in range(4):
        data = builder.CreateNumpyVector(constant.view(np.uint8).reshape(-1)) \
            if index == 2 and external_offset is None else None
        builder.StartObject(3)
        if data is not None:
            builder.PrependUOffsetTRelativeSlot(0, data, 0)
        if index == 2 and external_offset is not None:
            builder.PrependUint64Slot(1, external_offset, 0)
            builder.PrependUint64Slot(2, constant.nbytes, 0)
        buffers.append(builder.EndObject())
    tensors = []
    for name, shape, buffer in (("x", [1, 4], 1), ("c", [4], buffer_index), ("y", [1, 4], 3)):
        name_offset, shape_offset = builder.CreateString(name), _ints(builder, shape)
        builder.StartObject(8)
        builder.PrependUOffsetTRelativeSlot(0, shape_offset, 0)
        builder.PrependInt8Slot(1, 0, -1)  # FLOAT32 (written explicitly)
        builder.PrependUint32Slot(2, buffer, 0)
        builder.PrependUOffsetTRelativeSlot(3, name_offset, 0)
        tensors.append(builder.EndObject())
    builder.StartObject(2)
    builder.PrependInt8Slot(0, fused_activation, 0)
    options = builder.EndObject()
    op_inputs, op_outputs = _ints(builder, [0, tensor_index]), _ints(builder, [2])
    builder.StartObject(6)
    builder.PrependUint32Slot(0, opcode_index, 0)
    builder.PrependUOffsetTRelativeSlot(1, op_inputs, 0)
    builder.PrependUOffsetTRelativeSlot(2, op_outputs, 0)
    builder.PrependUint8Slot(3, ADD_OPTIONS if opcode == 0 else 0, 0)
    if opcode == 0:
        builder.PrependUOffsetTRelativeSlot(4, options, 0)
    operator = builder.EndObject()
    tensor_vector, op_vector = _vector(builder, tensors), _vector(builder, [operator])
    sub_inputs, sub_outputs, sub_name = _ints(builder, [0]), _ints(builder, [2]), builder.CreateString("main")
    builder.StartObject(5)
    builder.PrependUOffsetTRelativeSlot(0, tensor_vector, 0)
    builder.PrependUOffsetTRelativeSlot(1, sub_inputs, 0)
    builder.PrependUOffsetTRelativeSlot(2, sub_outputs, 0)
    builder.PrependUOffsetTRelativeSlot(3, op_vector, 0)
    builder.PrependUOffsetTRelativeSlot(4, sub_name, 0)
    subgraph = builder.EndObject()
    builder.StartObject(4)
    builder.PrependInt8Slot(0, min(opcode, 127), 0)
    builder.PrependInt32Slot(2, 1, 1)
    builder.PrependInt32Slot(3, opcode, 0)
    operator_code = builder.EndObject()
    codes, subgraphs, buffer_vector = _vector(builder, [operator_code]), _vector(builder, [subgraph]), \
        _vector(builder, buffers)
    description = builder.CreateString("edgeinfer test model")
    builder.StartObject(5)
    builder.PrependUint32Slot(0, schema.SCHEMA_VERSION, 0)
    builder.PrependUOffsetTRelativeSlot(1, codes, 0)
    builder.PrependUOffsetTRelativeSlot(2, subgraphs, 0)
    builder.PrependUOffsetTRelativeSlot(3, description, 0)
    builder.PrependUOffsetTRelativeSlot(4, buffer_vector, 0)
    builder.Finish(builder.EndObject(), file_identifier=schema.FILE_IDENTIFIER)
    return bytes(builder.Output())


def build_model(constant: np.ndarray | None = None, *, opcode: int = 0, opcode_index: int = 0,
                tensor_index: int = 1, buffer_index: int = 2, external: bool = False,
                fused_activation: int = 1) -> bytes:
    """The test model as flatbuffer bytes (see the module docstring)."""
    constant = np.asarray([0.5, -1.0, 2.0, -3.0], np.float32) if constant is None else constant
    kwargs = dict(opcode=opcode, opcode_index=opcode_index, tensor_index=tensor_index,
                  buffer_index=buffer_index, fused_activation=fused_activation)
    if not external:
        return _write(constant, external_offset=None, **kwargs)
    # The offset field has a fixed width, so a first pass with a placeholder gives the size.
    size = len(_write(constant, external_offset=1 << 40, **kwargs))
    offset = -(-size // 16) * 16
    head = _write(constant, external_offset=offset, **kwargs)
    assert len(head) == size
    return head + b"\x00" * (offset - size) + constant.tobytes()


@pytest.fixture(scope="session")
def tflite_builder():
    """``tflite_builder(**kwargs) -> bytes``: see ``build_model``."""
    return build_model
