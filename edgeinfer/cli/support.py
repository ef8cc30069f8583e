"""Error handling shared by every ``edgeinfer`` command.

Every ``EdgeInferError`` (bad file, bad argument, bad input) prints one line to stderr and
exits with status 2; anything else is a bug in edgeinfer: one line, status 1, and the
traceback only with ``EDGEINFER_DEBUG=1``.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import sys
import warnings
from typing import Any

import click

from edgeinfer.errors import EdgeInferError

EXIT_USER_ERROR = 2
EXIT_BUG = 1
_NOTES: list[tuple[str, bool]] = []


def note(text: str, *, explains_errors: bool = False) -> None:
    """Queue a line for stderr (a default the command chose, say). It is printed by
    ``flush_notes`` once the command is under way; if the command fails first, a note that
    ``explains_errors`` is joined to the error line and any other dropped, so an error stays one line."""
    _NOTES.append((text, explains_errors))


def flush_notes() -> None:
    while _NOTES:
        click.echo(_NOTES.pop(0)[0], err=True)


def debug_enabled() -> bool:
    return os.environ.get("EDGEINFER_DEBUG", "") not in ("", "0")


def handle_errors(fn):
    """Turn exceptions into one-line messages and exit codes (no traceback on bad input)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        _NOTES.clear()
        try:
            with warnings.catch_warnings():  # filters a command sets end with it
                warnings.showwarning = _one_line_warning
                result = fn(*args, **kwargs)
            flush_notes()
            return result
        except EdgeInferError as exc:
            explaining = [text for text, explains in _NOTES if explains]
            context = f" ({'; '.join(explaining)})" if explaining else ""
            _NOTES.clear()
            click.echo(f"error: {one_line(exc)}{context}", err=True)
            sys.exit(EXIT_USER_ERROR)
        except (click.exceptions.Exit, click.ClickException, click.Abort, SystemExit):
            raise
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            sys.exit(130)
        except Exception as exc:  # a bug in edgeinfer, not bad input
            if debug_enabled():
                raise
            click.echo(f"internal error ({type(exc).__name__}): {one_line(exc)} "
                       "[rerun with EDGEINFER_DEBUG=1 for the traceback]", err=True)
            sys.exit(EXIT_BUG)

    return wrapper


def _one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """Warnings on the command line: one line on stderr, no source line."""
    click.echo(f"warning: {' '.join(str(message).split())}", err=True)


def one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= 2000 else text[:2000] + "..."


class LazyChoice(click.Choice):
    """A ``click.Choice`` whose names come from a registry imported only when they are needed
    (``--help`` of that command, or a value to check), not when the command line starts."""

    def __init__(self, load) -> None:
        self._load = load
        super().__init__(())

    @property
    def choices(self):
        return tuple(self._load())

    @choices.setter
    def choices(self, _value) -> None:  # click.Choice.__init__ assigns it; the names stay lazy
        pass


class LibraryDefault(click.Option):
    """An option that is None unless given (the library then applies its default), with that
    default shown in ``--help`` (``library_default`` is called only then)."""

    def __init__(self, *args: Any, library_default, **kwargs: Any) -> None:
        self._library_default = library_default
        super().__init__(*args, **kwargs)

    def get_help_extra(self, ctx: click.Context):
        extra = super().get_help_extra(ctx)
        extra["default"] = str(self._library_default())
        return extra


@contextlib.contextmanager
def auto_progress(enabled: bool):
    """While ``backend``/``executor="auto"`` measures, its progress (the INFO lines of
    ``edgeinfer.runtime.auto.progress``: one per candidate) goes to stderr as ``auto: ...`` lines."""
    if not enabled:
        yield
        return
    logger = logging.getLogger("edgeinfer.runtime.auto.progress")

    class ToStderr(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            click.echo(f"auto: {record.getMessage()}", err=True)

    handler, level = ToStderr(logging.INFO), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def choice_lines(session) -> list[str]:
    """What ``auto`` chose and by how much, for a Session built with backend or executor auto."""
    lines = []
    choice = session.auto_choice
    if choice is not None:
        winner = choice.label  # openvino[bf16],numpy for a reduced precision
        if choice.cached:
            lines.append(f"auto: chose {winner} (measured earlier on this machine; cached)")
        else:
            lines.append(f"auto: chose {winner}{_margin(winner, choice.median_ms)}")
        if choice.reason:
            lines.append(f"auto: {winner}: {choice.reason}")
        if choice.native_note:
            lines.append(f"auto: native engine: {choice.native_note}")
        lines += [f"auto: skipped {label}: {why}" for label, why in choice.skipped.items()]
    if session.executor_ms:
        lines.append(f"auto: executor {session.executor}{_margin(session.executor, session.executor_ms)}")
    return lines


def _margin(winner: str, medians: dict[str, float]) -> str:
    if winner not in medians:
        return ""
    others = sorted((ms, label) for label, ms in medians.items() if label != winner)
    if not others:
        return f", {medians[winner]:.3g} ms median (the only candidate timed)"
    runner_up_ms, runner_up = others[0]
    if runner_up_ms < medians[winner]:  # auto kept the native engine within its margin
        return f", {medians[winner]:.3g} ms median against {runner_up_ms:.3g} ms for {runner_up}"
    return (f", {medians[winner]:.3g} ms median: {runner_up_ms / medians[winner]:.2f}x faster than "
            f"{runner_up} ({runner_up_ms:.3g} ms)")


def placement_line(session, asked: str | list[str]) -> str | None:
    """``placement: tflite 0 nodes, numpy 41`` when the nodes did not all go where they were asked
    (a backend that could not run some, numpy taking them), or when auto chose; else None."""
    if asked is None:
        return None
    counts = session.plan.node_counts()
    names = [name.partition("@")[0] for name in ([asked] if isinstance(asked, str) else asked)]  # torch@cuda:0
    if asked != "auto" and set(counts) <= set(names):
        return None
    shown = [name for name in names if name != "auto"] + [name for name in counts if name not in names]
    return "placement: " + ", ".join(f"{name} {counts.get(name, 0)} node{'s' * (counts.get(name, 0) != 1)}"
                                     for name in shown)


def parse_backend(text: str | None) -> str | list[str] | None:
    """``--backend``: a name, ``auto``, or a priority list joined by ``+`` (``openvino+onnxruntime``)."""
    if text is None:  # the compiled plan of a compiled .eim, else numpy (Session's default)
        return None
    names = [name.strip() for name in text.split("+")]
    if not all(names):
        from edgeinfer.errors import InputError

        raise InputError(f"--backend {text!r}: expected a name, 'auto' or names joined by '+'")
    return names[0] if len(names) == 1 else names


def session_options(fn):
    """The options every command that builds a Session takes, with the same names."""
    from edgeinfer.backend import DEVICES, available_backends

    choices = ", ".join([*available_backends(), "auto"])
    for option in reversed([
        click.option("--backend", default=None,
                     help=f"One of {choices}, or a priority list such as openvino+onnxruntime "
                          "(each node goes to the first that runs it, numpy takes the rest). Default: a compiled "
                          ".eim's own plan (edgeinfer compile), else numpy."),
        click.option("--threads", type=click.IntRange(1), default=None, help="CPU threads for the session."),
        click.option("--device", type=click.Choice(DEVICES), default="cpu", show_default=True,
                     help="Where accelerated backends run."),
        click.option("--fallback", is_flag=True, help="Run on the CPU if --device is missing (with a warning)."),
        click.option("--executor", type=click.Choice(["sequential", "dag", "auto"]), default="sequential",
                     show_default=True, help="dag runs independent branches at the same time; auto times both and keeps the faster."),
    ]):
        fn = option(fn)
    return fn
