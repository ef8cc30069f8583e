"""Progress of the steps of long library work: the conversion of a big model (read, passes,
weight check, write), for whoever shows it.

Library functions take ``progress: Steps | None`` and never print. Each step is opened with
``progress.step(label, total, unit)``, a context manager yielding a ``Step`` that is advanced
as the work is done: ``unit`` is ``BYTES`` (``total`` is a size) or a plural noun for a count
(``"passes"``); ``size`` is the bytes the step concerns (its total for a bytes step, the
weights for a step counted in passes), so a listener can show only the steps of big models.
The command line listens with ``edgeinfer.cli.progress.step_reporter``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Protocol

BYTES = "bytes"


class Step(Protocol):
    def advance(self, amount: int = 1) -> None: ...


class Steps(Protocol):
    def step(self, label: str, total: int | None, unit: str = BYTES,
             size: int | None = None) -> AbstractContextManager[Step]: ...


class _NoStep:
    def advance(self, amount: int = 1) -> None:
        pass


class NoSteps:
    """Steps that nobody watches."""

    @contextmanager
    def step(self, label: str, total: int | None, unit: str = BYTES, size: int | None = None) -> Iterator[Step]:
        yield _NoStep()


def steps(progress: Steps | None) -> Steps:
    """``progress``, or a sink that shows nothing."""
    return NoSteps() if progress is None else progress


def human_bytes(count: float) -> str:
    """``3.00 GiB``, ``192.0 MiB``, ``512 B``: the size a person reads."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if count >= scale:
            value = count / scale
            return f"{value:.2f} {unit}" if value < 10 else f"{value:.1f} {unit}"
    return f"{int(count)} B"
