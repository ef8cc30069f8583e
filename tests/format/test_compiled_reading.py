"""A compiled ``.eim`` read for its plan (``format.lean``): the section is bound to the IR by the
SHA-256 of the IR's stored bytes (version 3.4, ``ir_sha256``) rather than by encoding the parsed
document again; a byte of the stored IR changed is a stale section; a 3.3 file (no ``ir_sha256``)
and a document stored otherwise are still checked by ``digest``; a 3.5 file is read without parsing
its IR (the section's ``io`` copy, checked against the parts here and against the graph by a full
load); loading for the plan imports neither the writer's half of the format nor a memory map."""

from __future__ import annotations

import json
import logging
import lzma
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import edgeinfer as ei
from devkit import zoo
from edgeinfer.errors import ModelFormatError
from edgeinfer.format import compiled as compiled_module
from edgeinfer.format import lean as lean_module
from edgeinfer.format.lean import read_compiled
from edgeinfer.format.reading import parse_document as compiled_module_parse
from tests.format.conftest import XZ, EimFile

pytest.importorskip("ai_edge_litert")


@pytest.fixture(scope="module")
def compiled_file(tmp_path_factory) -> Path:
    model = ei.convert(zoo.cnn_residual_depthwise(size=16, channels=8))
    path = tmp_path_factory.mktemp("lean") / "model.eim"
    ei.compile(model, path, backend="tflite", threads=1)
    return path


def test_a_compiled_file_is_bound_by_its_stored_bytes_not_encoded_again(compiled_file, monkeypatch):
    parsed = EimFile.read(compiled_file)
    assert (parsed.major, parsed.minor) == (3, 6) and parsed.document["compiled"]["ir_sha256"]

    def encoded_again(document):
        raise AssertionError("the document was encoded again")

    monkeypatch.setattr(compiled_module, "ir_digest", encoded_again)
    assert read_compiled(compiled_file) is not None
    assert ei.load(compiled_file).compiled is not None


def test_a_changed_byte_of_the_stored_ir_makes_the_section_stale(compiled_file, tmp_path, caplog):
    parsed = EimFile.read(compiled_file)
    text = parsed.text
    name = json.dumps(parsed.document["graph"]["name"]).encode()
    assert name in text and len(name) > 2
    edited = text.replace(name, name[:-2] + (b"x" if name[-2:-1] != b"x" else b"y") + b'"', 1)
    path = tmp_path / "edited.eim"
    path.write_bytes(parsed.pack(json_bytes=lzma.compress(edited, lzma.FORMAT_XZ), flags=XZ))
    with caplog.at_level(logging.WARNING):
        assert read_compiled(path) is None
        assert ei.load(path).compiled is None
    assert any("made from another IR" in r.getMessage() for r in caplog.records)


def test_a_version_3_3_file_and_a_document_stored_otherwise_are_checked_by_digest(compiled_file, tmp_path):
    parsed = EimFile.read(compiled_file)
    feeds = zoo.example_inputs(zoo.cnn_residual_depthwise(size=16, channels=8), seed=0)
    expected = ei.Session(compiled_file).run(feeds)
    spaced = tmp_path / "spaced.eim"
    spaced.write_bytes(parsed.pack())  # encoded again with spaces: no stored bytes of the IR to hash
    del parsed.document["compiled"]["ir_sha256"]
    parsed.document["version"] = [3, 3]
    old = tmp_path / "v33.eim"
    old.write_bytes(parsed.pack(minor=3))
    for path in (spaced, old):
        file = read_compiled(path)
        assert file is not None and file.section.digest == parsed.document["compiled"]["digest"]
        with ei.Session(path) as session:
            got = session.run(feeds)
        for key, value in expected.items():
            np.testing.assert_array_equal(got[key], value)


def test_loading_for_the_plan_reads_the_file_without_the_writer_or_a_map(compiled_file):
    script = (f"import json, sys, edgeinfer as ei\n"
              f"s = ei.Session({str(compiled_file)!r})\n"
              f"print(json.dumps(sorted(sys.modules)))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    modules = set(json.loads(done.stdout.splitlines()[-1]))
    assert "edgeinfer.format.reading" in modules
    assert not {"edgeinfer.format.eim", "edgeinfer.format.atomic", "edgeinfer.ir.mapped", "mmap",
                "edgeinfer.api"} & modules
    # version 3.6: the artifacts' CRC-32 (zlib's) and the small SHA-256s (CPython's own): no OpenSSL
    # loaded; the document is zlib's
    assert not {"hashlib", "_hashlib", "lzma", "edgeinfer.ir.weights"} & modules


def _compact(parsed: EimFile, document: dict) -> bytes:
    """The file with ``document`` stored as ``save_model`` writes it (compact JSON, xz)."""
    text = json.dumps(document, separators=(",", ":")).encode()
    return parsed.pack(json_bytes=lzma.compress(text, lzma.FORMAT_XZ), flags=XZ)


def test_a_version_3_5_file_runs_without_its_ir_parsed(compiled_file, monkeypatch):
    feeds = zoo.example_inputs(zoo.cnn_residual_depthwise(size=16, channels=8), seed=0)
    expected = ei.load(compiled_file)
    reference = ei.Session(expected, backend="numpy").run(feeds)

    def parsed(*args, **kwargs):
        raise AssertionError("the IR was parsed")

    monkeypatch.setattr(lean_module, "parse_document", parsed)
    monkeypatch.setattr(lean_module, "read_tensors", parsed)
    file = read_compiled(compiled_file)
    assert file is not None and file._table is None
    assert (file.name, [v.name for v in file.inputs], [v.name for v in file.outputs]) == (
        expected.graph.name, expected.graph.input_names, expected.graph.output_names)
    assert [(v.dtype, v.shape) for v in file.inputs] == [(v.dtype, v.shape) for v in expected.graph.inputs]
    with ei.Session(compiled_file) as session:
        got = session.run(feeds)
    for key, value in reference.items():
        np.testing.assert_allclose(got[key], value, rtol=1e-4, atol=1e-5)


def test_a_copy_of_the_inputs_that_is_not_the_graphs_is_refused(compiled_file, tmp_path):
    parsed = EimFile.read(compiled_file)
    io = parsed.document["compiled"]["io"]
    io["inputs"][0]["name"] = io["inputs"][0]["name"] + "_other"
    path = tmp_path / "io.eim"
    path.write_bytes(_compact(parsed, parsed.document))
    with pytest.raises(ModelFormatError, match="compiled.parts.0..inputs"):
        read_compiled(path)  # the lean read: the parts read no such input
    with pytest.raises(ModelFormatError, match="compiled.io"):
        ei.load(path)  # the full read: the graph's own inputs


def test_a_copy_whose_node_count_is_not_the_graphs_is_refused(compiled_file, tmp_path):
    parsed = EimFile.read(compiled_file)
    parsed.document["compiled"]["io"]["nodes"] += 1
    path = tmp_path / "nodes.eim"
    path.write_bytes(_compact(parsed, parsed.document))
    with pytest.raises(ModelFormatError, match="assignment"):
        read_compiled(path)  # the lean read: one backend per node it says the graph has
    with pytest.raises(ModelFormatError, match="io.nodes: expected the graph's node count"):
        ei.load(path)


def test_a_version_3_4_file_is_still_read_by_parsing_its_ir(compiled_file, tmp_path, monkeypatch):
    parsed = EimFile.read(compiled_file)
    feeds = zoo.example_inputs(zoo.cnn_residual_depthwise(size=16, channels=8), seed=0)
    expected = ei.Session(compiled_file).run(feeds)
    document = parsed.document
    del document["compiled"]["io"]
    document["version"] = [3, 4]
    path = tmp_path / "v34.eim"
    path.write_bytes(parsed.pack(json_bytes=lzma.compress(json.dumps(document, separators=(",", ":")).encode(),
                                                         lzma.FORMAT_XZ), flags=XZ, minor=4))
    calls = []
    monkeypatch.setattr(lean_module, "parse_document",
                        lambda *a: calls.append(1) or compiled_module_parse(*a))
    file = read_compiled(path)
    assert file is not None and file._table is not None and calls
    with ei.Session(path) as session:
        got = session.run(feeds)
    for key, value in expected.items():
        np.testing.assert_array_equal(got[key], value)


def test_a_document_that_ends_in_a_nested_compiled_key_is_located_by_its_end(compiled_file, tmp_path):
    parsed = EimFile.read(compiled_file)
    document = parsed.document
    document["compiled"]["auto"] = {"reason": "x", "compiled": {"version": 1}}  # the last "compiled" key is nested
    path = tmp_path / "nested.eim"
    path.write_bytes(_compact(parsed, document))
    file = read_compiled(path)
    assert file is not None and file._table is None and file.section.auto["compiled"] == {"version": 1}


def test_a_version_3_5_file_records_its_artifacts_by_sha256_and_is_still_checked(compiled_file, tmp_path, caplog):
    import hashlib

    parsed = EimFile.read(compiled_file)
    feeds = zoo.example_inputs(zoo.cnn_residual_depthwise(size=16, channels=8), seed=0)
    expected = ei.Session(compiled_file).run(feeds)
    document = parsed.document
    for entry in document["compiled"]["artifacts"]:
        start = entry["offset"]
        del entry["crc32"]
        entry["sha256"] = hashlib.sha256(parsed.data[start:start + entry["nbytes"]]).hexdigest()
    document["version"] = [3, 5]
    text = json.dumps(document, separators=(",", ":")).encode()
    path = tmp_path / "v35.eim"
    path.write_bytes(parsed.pack(json_bytes=lzma.compress(text, lzma.FORMAT_XZ), flags=XZ, minor=5))
    file = read_compiled(path)
    assert file is not None and file.section.artifacts[0].algorithm == "sha256"
    with ei.Session(path) as session:
        got = session.run(feeds)
    for key, value in expected.items():
        np.testing.assert_array_equal(got[key], value)
    entry = document["compiled"]["artifacts"][0]
    data = bytearray(parsed.data)
    data[entry["offset"] + entry["nbytes"] // 2] ^= 0xFF  # one byte of the artifact changed
    parsed.data = bytes(data)
    damaged = tmp_path / "v35-damaged.eim"
    damaged.write_bytes(parsed.pack(json_bytes=lzma.compress(text, lzma.FORMAT_XZ), flags=XZ, minor=5))
    with pytest.raises(ModelFormatError, match="expected bytes of SHA-256"):
        read_compiled(damaged).section.artifact(0)


def test_a_version_3_6_artifact_changed_by_one_byte_is_refused_by_its_crc32(compiled_file, tmp_path):
    parsed = EimFile.read(compiled_file)
    entry = parsed.document["compiled"]["artifacts"][0]
    assert isinstance(entry["crc32"], int) and "sha256" not in entry
    data = bytearray(parsed.data)
    data[entry["offset"] + entry["nbytes"] // 3] ^= 0x01  # one bit
    parsed.data = bytes(data)
    path = tmp_path / "damaged.eim"
    path.write_bytes(parsed.pack(json_bytes=parsed.json_bytes))
    file = read_compiled(path)
    with pytest.raises(ModelFormatError, match=f"expected bytes of CRC-32 {entry['crc32']:08x}, found"):
        file.section.artifact(0)
