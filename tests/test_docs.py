"""The generated tables in docs/ match the registries (regenerate: python -m devkit.docs)."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

from devkit.docs import GENERATORS, render_all

DOCS = Path(__file__).resolve().parents[1] / "docs"


@pytest.mark.parametrize("name", sorted(GENERATORS))
def test_generated_docs_are_up_to_date(name):
    text = (DOCS / name).read_text()
    if "known to onnx " in text and f"known to onnx {onnx.__version__} " not in text:
        pytest.skip(f"docs/{name} was generated with another onnx release than {onnx.__version__}")
    assert render_all()[name] == text, f"docs/{name} is stale: run python -m devkit.docs"
