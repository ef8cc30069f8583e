"""A compiled ``.eim`` read for its plan (``format.lean``): the section is bound to the IR by the
SHA-256 of the IR's stored bytes (version 3.4, ``ir_sha256``) rather than by encoding the parsed
document again; a byte of the stored IR changed is a stale section; a 3.3 file (no ``ir_sha256``)
and a document stored otherwise are still checked by ``digest``; loading for the plan imports
neither the writer's half of the format nor a memory map."""

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
from edgeinfer.format import compiled as compiled_module
from edgeinfer.format.lean import read_compiled
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
    assert (parsed.major, parsed.minor) == (3, 4) and parsed.document["compiled"]["ir_sha256"]

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
