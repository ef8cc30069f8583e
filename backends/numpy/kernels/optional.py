"""Optional ops: an optional value is its element (an array or a list) or None when empty."""

from __future__ import annotations

import numpy as np

from edgeinfer.backends.numpy.registry import kernel


@kernel("Optional", since=15)
def optional(value=None, *, type=None):  # noqa: A002  (the spec's attribute name)
    return value


@kernel("OptionalHasElement", since=15)
def optional_has_element(value=None):
    """Opset 18 also takes a plain tensor or sequence (always present) or no input (empty)."""
    return np.array(value is not None)


@kernel("OptionalGetElement", since=15)
def optional_get_element(value):
    if value is None:
        raise ValueError("expected an optional holding a value, found an empty optional")
    return value
