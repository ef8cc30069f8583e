"""The limits table: one module, used by the loaders, documented in docs/limits.md."""

from __future__ import annotations

from pathlib import Path

from edgeinfer import limits

DOCS = Path(__file__).resolve().parents[2] / "docs" / "limits.md"


def test_docs_are_generated_from_the_table():
    assert DOCS.read_text() == limits.limits_markdown(), "docs/limits.md is stale: run python -m edgeinfer.limits"


def test_every_row_is_a_constant_of_the_module():
    names = [limit.name for limit in limits.LIMITS]
    assert len(names) == len(set(names))
    for limit in limits.LIMITS:
        assert getattr(limits, limit.name) == limit.value
        assert limit.value > 0 and limit.formats and limit.error.endswith("Error")
    constants = {name for name in vars(limits) if name.startswith("MAX_")}
    assert constants == set(names), "a MAX_ constant without a row in LIMITS (or the reverse)"


def test_loaders_use_the_table():
    from edgeinfer.converters import tflite
    from edgeinfer.format import document, eim

    assert eim.MAX_JSON_BYTES == limits.MAX_DOCUMENT_BYTES
    assert eim.MAX_RANK == limits.MAX_RANK
    assert document.MAX_NESTING == limits.MAX_DOCUMENT_NESTING
    assert tflite.MAX_FILE_BYTES == limits.MAX_FILE_BYTES
