"""Hostile .eim documents (re-sealed with a valid checksum, so only the content is wrong):
typed errors naming the file and the JSON path. tests/format/test_corrupt.py covers the
header, checksum and tensor table byte by byte; these are the graph-level attacks."""

from __future__ import annotations

import hashlib
import json
import lzma
import zlib

import pytest

import edgeinfer as ei
from edgeinfer import limits
from edgeinfer.errors import EdgeInferError, ModelFormatError, ModelValidationError
from edgeinfer.format.eim import HEADER, HEADER_SIZE, align


def repack(raw: bytes, edit) -> bytes:
    """The file with ``edit(document)`` applied, the header and checksum made consistent."""
    magic, major, minor, flags, reserved, json_length, data_offset, data_length, _ = HEADER.unpack_from(raw, 0)
    stored = raw[HEADER_SIZE:HEADER_SIZE + json_length]
    document = json.loads(lzma.decompress(stored) if flags & 2 else zlib.decompress(stored))
    flags = 1  # written back zlib-compressed (version 3 reads either)
    edit(document)
    text = json.dumps(document)
    for placeholder, deep in DEEP.items():  # too deep for json.dumps: spliced in as text
        text = text.replace(json.dumps(placeholder), deep)
    stored = zlib.compress(text.encode())
    new_offset = align(HEADER_SIZE + len(stored))
    header = HEADER.pack(magic, major, minor, flags, reserved, len(stored), new_offset, data_length,
                         hashlib.sha256(stored).digest())
    return header + stored + bytes(new_offset - HEADER_SIZE - len(stored)) + raw[data_offset:]


def nodes(document):
    return document["graph"]["nodes"]


def _deep_graph_text(depth: int) -> str:
    empty = '"name": "g", "opset": {}, "metadata": {}, "inputs": [], "outputs": [], "value_info": [], "initializers": []'
    head = ('{' + empty + ', "nodes": [{"op_type": "If", "domain": "", "name": "", "inputs": [], "outputs": [], '
            '"attrs": {"then_branch": {"t": "graph", "graph": ')
    return head * depth + '{' + empty + ', "nodes": []}' + "}}}]}" * depth


DEEP = {"@deep lists@": "[" * 1000 + "1" + "]" * 1000,
        "@deep graphs@": '{"t": "graph", "graph": ' + _deep_graph_text(1000) + "}"}


def splice(placeholder: str):
    def edit(document):
        nodes(document)[0]["attrs"]["deep"] = placeholder
    return edit


EDITS = {
    "tensor reference out of range": (
        lambda d: d["graph"]["initializers"][0].__setitem__("tensor", 999), ModelFormatError, "tensor"),
    "negative tensor reference": (
        lambda d: d["graph"]["initializers"][0].__setitem__("tensor", -1), ModelFormatError, "tensor"),
    "rank 65": (lambda d: d["tensors"][0].__setitem__("shape", [1] * 65), ModelFormatError, "at most 64 dims"),
    "declared size differs from the dims": (
        lambda d: d["tensors"][0].__setitem__("shape", [2**40, 2**40]), ModelFormatError, "nbytes"),
    "huge negative dim": (lambda d: d["tensors"][0].__setitem__("shape", [-4, 5]), ModelFormatError, "shape"),
    "lists nested 1000 deep": (splice("@deep lists@"), ModelFormatError, "nested at most|too deeply"),
    "subgraphs nested 1000 deep": (splice("@deep graphs@"), ModelFormatError, "nested at most|too deeply"),
    "duplicate node output": (lambda d: nodes(d)[1].__setitem__("outputs", nodes(d)[0]["outputs"]),
                              ModelValidationError, "produced"),
    "cycle": (lambda d: nodes(d)[0].__setitem__("inputs", nodes(d)[-1]["outputs"]), ModelValidationError,
              "before it|cycle"),
    "huge name": (lambda d: nodes(d)[0].__setitem__("name", "n" * (limits.MAX_NAME_CHARS + 1)), ModelFormatError,
                  "a name of at most"),
    "unknown tag": (lambda d: nodes(d)[0]["attrs"].__setitem__("x", {"t": "pickle", "v": "..."}),
                    ModelFormatError, "a tag"),
    "non-string op": (lambda d: nodes(d)[0].__setitem__("op_type", 7), ModelFormatError, "op_type"),
}


@pytest.mark.parametrize("case", sorted(EDITS))
def test_hostile_document(seeds, tmp_path, case):
    edit, error, message = EDITS[case]
    path = tmp_path / "model.eim"
    path.write_bytes(repack(seeds.data("eim"), edit))
    with pytest.raises(error, match=message) as info:
        ei.load(path)
    assert str(path) in str(info.value) or error is ModelValidationError


def test_repack_keeps_a_valid_file_valid(seeds, tmp_path):
    path = tmp_path / "model.eim"
    path.write_bytes(repack(seeds.data("eim"), lambda document: None))
    assert ei.load(path).summary()["nodes"] > 0


def test_unknown_op_loads_but_cannot_run(seeds, tmp_path):
    path = tmp_path / "model.eim"
    path.write_bytes(repack(seeds.data("eim"), lambda d: nodes(d)[-1].__setitem__("op_type", "Frobnicate")))
    model = ei.load(path)
    with pytest.raises(EdgeInferError, match="Frobnicate"):
        ei.Session(model, backend="numpy")
