"""The exception hierarchy of edgeinfer.

Every error a user can cause with bad input is an ``EdgeInferError``. Messages say what was
expected, what was found, and where (file, node name, op), so the CLI can print them on one
line and exit with status 2.
"""

from __future__ import annotations


class EdgeInferError(Exception):
    """Root of all errors that bad input (files, arguments, feeds) can cause."""


class ModelFormatError(EdgeInferError):
    """A model file is unreadable, truncated, tampered with or of an unknown kind."""


class ModelValidationError(EdgeInferError):
    """A graph breaks an IR invariant (cycle, dangling input, duplicate name, bad shape)."""


class UnsupportedOpError(EdgeInferError):
    """An op (or layer, or attribute) that edgeinfer cannot convert or run."""


class InputError(EdgeInferError):
    """Feeds given to a session do not match the model's inputs."""


class BackendError(EdgeInferError):
    """A backend could not compile or run a graph."""


class SchedulerError(EdgeInferError):
    """A request could not be served: the session is closed, a stream was cancelled, ..."""


class RequestTimeoutError(SchedulerError, TimeoutError):
    """A request did not finish within its timeout."""


class PassError(EdgeInferError):
    """An optimization pass failed; the message names it and the passes run before it."""


class ConversionError(EdgeInferError):
    """A source model could not be converted (besides an unsupported op)."""


__all__ = [
    "EdgeInferError",
    "ModelFormatError",
    "ModelValidationError",
    "UnsupportedOpError",
    "InputError",
    "BackendError",
    "PassError",
    "SchedulerError",
    "RequestTimeoutError",
    "ConversionError",
]


def first_line(exc: BaseException, limit: int = 600) -> str:
    """The first line of an exception's message (an engine's errors run to pages of stack and
    graph dumps), at most ``limit`` characters; the exception's type name when it says nothing."""
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:limit]
