"""Fixtures for the .eim tests: small models, and an independent reader/writer of the byte
layout so tests can tamper with a file and re-seal its checksum."""

from __future__ import annotations

import hashlib
import json
import lzma
import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import edgeinfer as ei
from devkit.testing import parse_model
from edgeinfer.ir import Graph, Node, Value, dtypes

# The layout as documented in edgeinfer/format/eim.py, restated here on purpose: the tests
# check the file against the documentation, not against the writer's own constants.
HEADER = struct.Struct("<4sHHIIQQQ32s")
COMPRESSED = 1  # header flag bit 0: the document is stored zlib-compressed
XZ = 2  # header flag bit 1 (version 3): the document is stored xz-compressed


def _inflate(stored: bytes, flags: int) -> bytes:
    if flags & XZ:
        return lzma.decompress(stored, lzma.FORMAT_XZ)
    return zlib.decompress(stored) if flags & COMPRESSED else stored


@dataclass
class EimFile:
    """A parsed .eim file whose parts can be changed and packed again with a valid checksum."""

    magic: bytes
    major: int
    minor: int
    flags: int
    reserved: int
    json_length: int
    data_offset: int
    data_length: int
    digest: bytes
    json_bytes: bytes  # the document as stored (compressed when flags has COMPRESSED)
    data: bytes
    document: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def parse(cls, raw: bytes) -> EimFile:
        fields = HEADER.unpack_from(raw, 0)
        json_length, data_offset, data_length = fields[5], fields[6], fields[7]
        json_bytes = raw[HEADER.size:HEADER.size + json_length]
        data = raw[data_offset:data_offset + data_length]
        return cls(*fields, json_bytes, data, json.loads(_inflate(json_bytes, fields[3])))

    @property
    def text(self) -> bytes:
        """The document's JSON text (decompressed)."""
        return _inflate(self.json_bytes, self.flags)

    @classmethod
    def read(cls, path: Path) -> EimFile:
        return cls.parse(path.read_bytes())

    def pack(self, *, json_bytes: bytes | None = None, reseal: bool = True, **header: Any) -> bytes:
        """The file bytes; the stored document is ``json_bytes`` as given, or the (possibly edited)
        document, compressed when the (possibly overridden) flags say so."""
        text = json_bytes
        if text is None:
            text = json.dumps(self.document).encode()
            flags = header.get("flags", self.flags)
            if flags & XZ:
                text = lzma.compress(text, lzma.FORMAT_XZ)
            elif flags & COMPRESSED:
                text = zlib.compress(text)
        data_offset = -(-(HEADER.size + len(text)) // 64) * 64
        values = {"magic": self.magic, "major": self.major, "minor": self.minor, "flags": self.flags,
                  "reserved": self.reserved, "json_length": len(text), "data_offset": data_offset,
                  "data_length": len(self.data),
                  "digest": hashlib.sha256(text).digest() if reseal else self.digest}
        values.update(header)
        head = HEADER.pack(*values.values())
        return head + text + bytes(data_offset - HEADER.size - len(text)) + self.data


def _identity_graph(arrays: dict[str, np.ndarray], name: str = "consts") -> Graph:
    """A graph whose outputs are Identity copies of ``arrays`` (initializers)."""
    nodes = [Node("Identity", [key], [f"{key}_out"], name=f"id_{key}") for key in arrays]
    outputs = [Value(f"{key}_out", dtypes.name_of(a.dtype), a.shape) for key, a in arrays.items()]
    return Graph(nodes, [], outputs, arrays, opset={"": 17}, name=name)


@pytest.fixture
def eim_file() -> type[EimFile]:
    """The independent layout parser/packer (``EimFile.read(path)``, ``.pack()``)."""
    return EimFile


@pytest.fixture
def identity_graph():
    """``identity_graph(arrays, name=...)``: a graph that outputs copies of its initializers."""
    return _identity_graph


@pytest.fixture
def small_model() -> ei.Model:
    """Two float tensors and a bool tensor feeding Add/Where: small enough to truncate at every byte."""
    model = ei.convert(parse_model("""
        <ir_version: 8, opset_import: ["" : 17]>
        small (float[N, 3] x) => (float[N, 3] y)
        <float[3] b = {1.0, 2.0, 3.0}, float[3] s = {0.5, 0.25, 2.0}, bool[3] keep = {1, 0, 1}>
        {
            t = Add(x, b)
            u = Mul(t, s)
            y = Where(keep, u, x)
        }"""), optimize=0)  # the format, not the passes, is under test
    model.metadata.update({"author": "tests", "note": "small"})
    return model


@pytest.fixture
def if_model() -> ei.Model:
    """An If with then/else subgraphs; the then branch has its own initializer and reads outer names."""
    return ei.convert(parse_model("""
        <ir_version: 8, opset_import: ["" : 17]>
        branchy (float[N] x, bool c) => (float[N] y) <float[1] two = {2.0}>
        {
            y = If(c) <
                then_branch = then_g () => (float[N] t) <float[1] k = {3.0}> { t1 = Mul(x, two)
                                                                               t = Add(t1, k) },
                else_branch = else_g () => (float[N] e) { e = Neg(x) }
            >
        }"""), optimize=0)  # the format, not the passes, is under test


@pytest.fixture
def saved(tmp_path, small_model) -> Path:
    path = tmp_path / "small.eim"
    small_model.save(path)
    return path
