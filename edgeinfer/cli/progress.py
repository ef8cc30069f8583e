"""Progress bars for long work (bench, convert --verify, conversion of large models).

Library code takes a ``Progress`` (``advance(steps=1)``, ``describe(text)``) and never prints;
the command line passes ``progress_bar(...)``, a rich bar on stderr that shows only when
stderr is a terminal and ``--quiet`` is not given, so scripts and pipes get clean output.
The steps of a conversion (``edgeinfer.progress.Steps``: read, passes, weight check, write)
go to ``step_reporter(...)``: bars with sizes on a terminal, and for big models one line per
step in logs.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol

from edgeinfer.progress import BYTES, NoSteps, Step, human_bytes


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


SHOWN_STEP_BYTES = 64 << 20  # steps of models this big are reported; smaller ones only flash by on a terminal


@contextmanager
def step_reporter(label: str, *, quiet: bool = False) -> Iterator[Any]:
    """Where library steps (``edgeinfer.progress.Steps``: read, passes, weight check, write)
    are shown: on a terminal, a rich bar per step under a ``label`` spinner, with bytes done
    and total (the bars of steps of at least ``SHOWN_STEP_BYTES`` stay on screen once done);
    elsewhere (logs, pipes), one line per such step on stderr once it is done; with ``quiet``,
    nothing."""
    if quiet:
        yield NoSteps()
        return
    if not sys.stderr.isatty():
        yield _LineSteps()
        return
    from rich.console import Console
    from rich.progress import BarColumn, SpinnerColumn, TextColumn, TimeElapsedColumn
    from rich.progress import Progress as RichProgress

    bar = RichProgress(SpinnerColumn(), TextColumn("{task.description:<36}"), BarColumn(), _amount_column(),
                       TimeElapsedColumn(), console=Console(stderr=True), transient=False)
    with bar:
        headline = bar.add_task(label, total=None, unit="")
        yield _RichSteps(bar)
        bar.remove_task(headline)


def _amount(done: float, total: float | None, unit: str) -> str:
    if unit == BYTES:
        if total is None:
            return human_bytes(done)
        number, suffix = human_bytes(total).split(" ")  # done in the total's unit: 1.50/3.00 GiB
        scale = {"GiB": 2**30, "MiB": 2**20, "KiB": 2**10, "B": 1}[suffix]
        return f"{done / scale:.{len(number.partition('.')[2])}f}/{number} {suffix}"
    return f"{int(done)}/{int(total)} {unit}" if total is not None else f"{int(done)} {unit}"


def _shown(total: int | None, unit: str, size: int | None) -> bool:
    size = size if size is not None else (total if unit == BYTES else None)
    return size is not None and size >= SHOWN_STEP_BYTES


def _sized(label: str, unit: str, size: int | None) -> str:
    return f"{label} ({human_bytes(size)} of weights)" if unit != BYTES and size is not None else label


class _CountedStep:
    def __init__(self) -> None:
        self.done = 0

    def advance(self, amount: int = 1) -> None:
        self.done += amount


class _LineSteps:
    """One line on stderr per finished step of a big model: what, how much, how long."""

    @contextmanager
    def step(self, label: str, total: int | None, unit: str = BYTES, size: int | None = None) -> Iterator[Step]:
        import time

        import click

        counted = _CountedStep()
        started = time.perf_counter()
        yield counted
        if _shown(total, unit, size):
            click.echo(f"{_sized(label, unit, size)}: {_amount(counted.done, total, unit)} "
                       f"in {time.perf_counter() - started:.2f} s", err=True)


class _RichStep:
    def __init__(self, bar, task) -> None:
        self._bar, self._task = bar, task

    def advance(self, amount: int = 1) -> None:
        self._bar.advance(self._task, amount)


class _RichSteps:
    def __init__(self, bar) -> None:
        self._bar = bar

    @contextmanager
    def step(self, label: str, total: int | None, unit: str = BYTES, size: int | None = None) -> Iterator[Step]:
        task = self._bar.add_task(_sized(label, unit, size), total=total, unit=unit)
        yield _RichStep(self._bar, task)
        if _shown(total, unit, size):
            self._bar.update(task, completed=total if total is not None else None)
            self._bar.stop_task(task)
        else:
            self._bar.remove_task(task)


def _amount_column():
    from rich.progress import ProgressColumn
    from rich.table import Column
    from rich.text import Text

    class AmountColumn(ProgressColumn):
        """Bytes (``1.50 GiB / 3.00 GiB``) or a count (``7/14 passes``) done of the total."""

        def render(self, task) -> Text:
            unit = task.fields.get("unit")  # "" for the headline spinner
            return Text(_amount(task.completed, task.total, unit) if unit else "", style="progress.download")

    return AmountColumn(table_column=Column(no_wrap=True))
