"""Progress bars for long work (bench, convert --verify, conversion of large models).

Library code takes a ``Progress`` (``advance(steps=1)``, ``describe(text)``) and never prints;
the command line passes ``progress_bar(...)``, a rich bar on stderr that shows only when
stderr is a terminal and ``--quiet`` is not given, so scripts and pipes get clean output.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol


class Progress(Protocol):
    def advance(self, steps: int = 1) -> None: ...

    def describe(self, text: str) -> None: ...


class NoProgress:
    """A progress sink that shows nothing."""

    def advance(self, steps: int = 1) -> None:
        pass

    def describe(self, text: str) -> None:
        pass


class _RichProgress:
    def __init__(self, bar, task) -> None:
        self._bar, self._task = bar, task

    def advance(self, steps: int = 1) -> None:
        self._bar.advance(self._task, steps)

    def describe(self, text: str) -> None:
        self._bar.update(self._task, description=text)


def shows_progress(quiet: bool = False) -> bool:
    """A bar is drawn only for a person: stderr is a terminal and ``--quiet`` was not given."""
    return not quiet and sys.stderr.isatty()


@contextmanager
def progress_bar(label: str, total: int | None, *, enabled: bool) -> Iterator[Progress]:
    """A transient rich progress bar on stderr (or ``NoProgress`` when not ``enabled``)."""
    if not enabled:
        yield NoProgress()
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    bar = Progress(TextColumn("{task.description:<36}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   console=Console(stderr=True), transient=True)
    with bar:
        yield _RichProgress(bar, bar.add_task(label, total=total))
