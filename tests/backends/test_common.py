"""The backends' shared helpers: one refusal message, one missing-device rule, one option merge."""

from __future__ import annotations

import logging

import pytest

from edgeinfer.backends.common import first_line, merged_options, missing_device, refuse_unsupported
from edgeinfer.errors import BackendError


def test_refusal_names_the_count_the_graph_and_the_first_five_nodes():
    refused = {f"Op_{i} (n{i})": f"reason {i}" for i in range(7)}
    with pytest.raises(BackendError) as caught:
        refuse_unsupported("someengine", "g", refused)
    message = str(caught.value)
    assert message.startswith("someengine cannot run 7 node(s) of graph 'g': Op_0 (n0): reason 0; ")
    assert "Op_4 (n4): reason 4" in message and "Op_5" not in message
    refuse_unsupported("someengine", "g", {})  # nothing refused: no error
    refuse_unsupported("someengine", "g", [])


def test_missing_device_is_an_error_that_says_how_to_run_anyway_or_a_warning_with_fallback(caplog):
    with pytest.raises(BackendError, match=r"^no GPU here \(fallback=True runs on the CPU instead\)$"):
        missing_device("no GPU here", False, logging.getLogger("t"), "running on the CPU")
    with caplog.at_level(logging.WARNING, logger="t"):
        missing_device("no GPU here", True, logging.getLogger("t"), "running on the CPU")
    assert caplog.messages == ["no GPU here; running on the CPU"]


def test_merged_options_put_the_checked_compile_options_on_top():
    def check(options):
        if "bad" in options:
            raise BackendError("bad option")
        return dict(options)

    assert merged_options({"a": 1, "b": 2}, {"b": 3}, check) == {"a": 1, "b": 3}
    with pytest.raises(BackendError, match="bad option"):
        merged_options({"a": 1}, {"bad": 1}, check)


def test_first_line_keeps_one_line_of_an_engine_error():
    assert first_line(RuntimeError("  first\nsecond\n")) == "first"
    assert first_line(ValueError("")) == "ValueError"
    assert first_line(RuntimeError("x" * 1000), 300) == "x" * 300
