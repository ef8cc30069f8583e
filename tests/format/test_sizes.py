"""The byte breakdown of an .eim file (``edgeinfer.format.sizes``) and ``edgeinfer inspect``'s
report of it, checked against an independent parse of the file's layout."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import edgeinfer as ei
from edgeinfer.errors import ModelFormatError
from edgeinfer.format.sizes import size_breakdown

HEADER_SIZE = 72  # as documented in edgeinfer/format/eim.py


@pytest.fixture
def mixed_path(tmp_path, rng, identity_graph) -> Path:
    arrays = {"w": rng.standard_normal((16, 16)).astype(np.float32), "q": np.arange(200, dtype=np.int8).reshape(20, 10),
              "scale": np.array(0.02, np.float32), "zp": np.zeros(10, np.int8), "zp2": np.zeros(10, np.int8),
              "names": np.array(["a", "bc"], dtype=object)}
    path = tmp_path / "mixed.eim"
    ei.Model(identity_graph(arrays)).save(path)
    return path


def test_the_parts_add_up_to_the_file(mixed_path, eim_file):
    parsed = eim_file.read(mixed_path)
    breakdown = size_breakdown(mixed_path)
    numeric = [t for t in parsed.document["tensors"] if "nbytes" in t]
    want_bytes: dict[str, int] = {}
    for entry in numeric:
        want_bytes[entry["dtype"]] = want_bytes.get(entry["dtype"], 0) + entry["nbytes"]
    assert breakdown.tensor_bytes == want_bytes
    assert breakdown.tensor_counts == {"float32": 2, "int8": 2, "str": 1}  # zp2 shares zp's bytes
    assert breakdown.references == 6
    assert breakdown.total == mixed_path.stat().st_size
    assert breakdown.header == HEADER_SIZE and breakdown.document == parsed.json_length
    assert breakdown.document_json == len(parsed.text)
    # per initializer: its tensor's stored bytes, a shared tensor counted at its first name only
    assert breakdown.initializer_bytes == {"w": 1024, "q": 200, "scale": 4, "zp": 10, "zp2": 0, "names": 0}
    assert sum(breakdown.initializer_bytes.values()) == breakdown.tensors
    assert breakdown.padding == parsed.data_offset - HEADER_SIZE - parsed.json_length + parsed.data_length \
        - sum(want_bytes.values())
    assert breakdown.tensors + breakdown.header + breakdown.document + breakdown.padding == breakdown.total
    assert breakdown.overhead == breakdown.total - breakdown.tensors


def test_version_1_file():
    path = Path(__file__).parent / "data" / "mixed_v1.eim"
    breakdown = size_breakdown(path)
    assert breakdown.version == (1, 0) and breakdown.document == breakdown.document_json
    assert breakdown.tensors + breakdown.header + breakdown.document + breakdown.padding == path.stat().st_size
    assert breakdown.padding >= 64 * 3  # every small tensor padded to 64 in version 1


def test_not_an_eim_file(tmp_path):
    path = tmp_path / "x.eim"
    path.write_bytes(b"not a model at all")
    with pytest.raises(ModelFormatError, match="not an .eim file"):
        size_breakdown(path)


def test_inspect_reports_the_breakdown(mixed_path):
    from click.testing import CliRunner

    from edgeinfer.cli import main

    result = CliRunner().invoke(main, ["inspect", str(mixed_path)])
    assert result.exit_code == 0, result.output
    breakdown = size_breakdown(mixed_path)
    for line in breakdown.lines():
        assert line in result.output
    assert f"{breakdown.total:,} bytes" in result.output and "padding" in result.output
