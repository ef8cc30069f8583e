"""What every backend does the same way, written once.

- ``first_line``: the first line of an engine's error (re-exported from ``edgeinfer.errors``);
- ``refuse_unsupported``: ``compile`` of a graph holding nodes the engine cannot run is a
  ``BackendError`` that names the count, the graph and the first few nodes with their reasons;
- ``missing_device``: a device this machine lacks is a ``BackendError`` that says how to run
  anyway, or with ``fallback=True`` a warning that says where it runs instead;
- ``merged_options``: the backend's engine options with one compile's options on top, the
  latter checked by the backend's own checker.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from edgeinfer.errors import BackendError, first_line
from edgeinfer.log import Logger

__all__ = ["first_line", "merged_options", "missing_device", "refuse_unsupported"]

LISTED = 5  # nodes named in a refusal; the count says how many more


def refuse_unsupported(engine: str, graph_name: str, refused: Mapping[str, str] | Iterable[tuple[str, str]]) -> None:
    """Raise ``BackendError`` when ``refused`` (node label -> reason) holds anything."""
    items = list(refused.items() if isinstance(refused, Mapping) else refused)
    if items:
        listed = "; ".join(f"{label}: {reason}" for label, reason in items[:LISTED])
        raise BackendError(f"{engine} cannot run {len(items)} node(s) of graph {graph_name!r}: {listed}")


def missing_device(message: str, fallback: bool, log: Logger, instead: str) -> None:
    """``message`` (what was asked, what this machine has) as a ``BackendError``, or with
    ``fallback`` as a warning followed by ``instead`` (where it runs now)."""
    if not fallback:
        raise BackendError(message + " (fallback=True runs on the CPU instead)")
    log.warning("%s; %s", message, instead)


def merged_options(base: Mapping[str, Any], given: Mapping[str, Any],
                   check: Callable[[Mapping[str, Any]], dict[str, Any]]) -> dict[str, Any]:
    """``base`` (the backend's engine options) with ``given`` (one compile's, checked) on top."""
    return {**base, **check(given)}
