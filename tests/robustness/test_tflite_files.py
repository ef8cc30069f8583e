"""Hostile and broken TFLite flatbuffers: every index, offset and size is checked before it is
followed, and every limit of ``edgeinfer.limits`` holds; a typed error names the field."""

from __future__ import annotations

import importlib.util
import struct
from pathlib import Path

import numpy as np
import pytest

import edgeinfer as ei
from edgeinfer import limits
from edgeinfer.converters import tflite
from edgeinfer.errors import ModelFormatError, UnsupportedOpError

_BUILDER = Path(__file__).resolve().parents[1] / "converters" / "tflite" / "conftest.py"


@pytest.fixture(scope="module")
def build():
    """``build_model`` of the TFLite tests' hand-written flatbuffer writer (one ADD of x and a constant)."""
    pytest.importorskip("flatbuffers")
    spec = importlib.util.spec_from_file_location("tflite_test_builder", _BUILDER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.build_model


def convert(data: bytes):
    return tflite.convert(data)


def test_the_hand_built_model_converts(build):
    assert convert(build()).nodes


@pytest.mark.parametrize("field, value, message", [
    ("tensor_index", 99, "refers to tensor 99, but the subgraph has 3 tensors"),
    ("tensor_index", -7, "refers to tensor -7"),
    ("buffer_index", 99, "uses buffer 99, but the model has 4 buffers"),
    ("opcode_index", 5, "uses opcode index 5, but the model has 1 operator codes"),
])
def test_out_of_range_indices(build, field, value, message):
    with pytest.raises(ModelFormatError, match=message):
        convert(build(**{field: value}))


def test_unknown_opcode(build):
    with pytest.raises((UnsupportedOpError, ModelFormatError), match="250|unknown|not supported"):
        convert(build(opcode=250))


@pytest.mark.parametrize("root", [2**32 - 1, 2**31, 10_000])
def test_root_offset_past_the_end(build, root):
    data = struct.pack("<I", root) + build()[4:]
    with pytest.raises(ModelFormatError, match="outside the"):
        convert(data)


def test_vtable_offset_past_the_start(build):
    data = bytearray(build())
    root = struct.unpack_from("<I", data, 0)[0]
    struct.pack_into("<i", data, root, 2**30)  # the root table's vtable lies before byte 0
    with pytest.raises(ModelFormatError, match="vtable"):
        convert(bytes(data))


def test_constant_size_does_not_match_its_shape(build):
    with pytest.raises(ModelFormatError, match="holds 12 bytes, expected 16"):
        convert(build(np.zeros(3, np.float32)))


def test_external_buffer_past_the_end(build):
    data = build(external=True)
    with pytest.raises(ModelFormatError, match="outside"):
        convert(data[:-8])


@pytest.mark.parametrize("limit, value, message", [
    ("MAX_RANK", 1, "has 2 dims, expected at most 1"),
    ("MAX_NAME_CHARS", 0, "name of 1 characters, expected at most 0"),
    ("MAX_VECTOR_ELEMENTS", 2, "claims"),
])
def test_limits(build, monkeypatch, limit, value, message):
    monkeypatch.setattr(limits, limit, value)
    with pytest.raises(ModelFormatError, match=message):
        convert(build())


def test_file_larger_than_the_limit(build, tmp_path, monkeypatch):
    path = tmp_path / "model.tflite"
    path.write_bytes(build())
    monkeypatch.setattr(tflite, "MAX_FILE_BYTES", 100)
    with pytest.raises(ModelFormatError, match="100-byte limit"):
        ei.convert(path)


@pytest.mark.parametrize("size", [0, 4, 7, 8, 12])
def test_tiny_files(build, tmp_path, size):
    path = tmp_path / "model.tflite"
    path.write_bytes(build()[:size])
    with pytest.raises(ModelFormatError, match="model.tflite"):
        ei.convert(path)
