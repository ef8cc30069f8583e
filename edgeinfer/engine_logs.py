"""Engines' own log lines, off unless asked for (``EDGEINFER_DEBUG=1``, or ``edgeinfer -v``, which
sets ``EDGEINFER_VERBOSE=1``).

Native engines write to file descriptor 2 directly, past Python's ``sys.stderr``: LiteRT says
"INFO: Created TensorFlow Lite XNNPACK delegate for CPU." on every interpreter. ``native_info_quiet()``
points descriptor 2 at a temporary file for the few calls that print such lines (creating an
interpreter), then writes back every captured line that is not an ``INFO:`` line, so a real
error still shows. The loggers that have a switch are lowered to errors: onnxruntime's default
logger, its coloured ``[W:onnxruntime ...]`` lines (``quiet_onnxruntime``), TensorFlow's C++ log
and Ray's core-worker log (``quiet_engine_environment``).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

NOISE_PREFIXES = ("INFO: ",)


def verbose() -> bool:
    return any(os.environ.get(name, "") not in ("", "0") for name in ("EDGEINFER_DEBUG", "EDGEINFER_VERBOSE"))


@contextmanager
def native_info_quiet() -> Iterator[None]:
    """Drop the ``INFO:`` lines native code writes to descriptor 2 inside the block (unless verbose)."""
    if verbose():
        yield
        return
    try:
        saved = os.dup(2)
    except OSError:  # no descriptor 2 (an embedded interpreter): nothing to filter
        yield
        return
    with _capture_file() as capture:
        sys.stderr.flush()
        os.dup2(capture.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            capture.seek(0)
            kept = [line for line in capture.read().decode(errors="replace").splitlines(keepends=True)
                    if not line.startswith(NOISE_PREFIXES)]
            if kept:
                sys.stderr.write("".join(kept))
                sys.stderr.flush()


def _capture_file():
    """An anonymous file for descriptor 2's lines: in memory where Linux allows (``tempfile`` costs
    a cold start about 7 ms of imports), else a temporary file."""
    if hasattr(os, "memfd_create"):
        try:
            return open(os.memfd_create("edgeinfer-stderr", os.MFD_CLOEXEC), "w+b")  # noqa: SIM115
        except OSError:
            pass
    import tempfile

    return tempfile.TemporaryFile(mode="w+b")


def quiet_engine_environment() -> None:
    """TensorFlow's C++ log and Ray's core-worker log to errors only, unless verbose; read when
    those engines start, so set before they are imported. Imports nothing."""
    if verbose():
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    os.environ.setdefault("RAY_BACKEND_LOG_LEVEL", "error")


def quiet_onnxruntime() -> None:
    """onnxruntime's default logger (every session's, unless it sets its own) to errors only,
    unless verbose; imports onnxruntime if installed, so call it where a model is about to run."""
    if verbose() or importlib.util.find_spec("onnxruntime") is None:
        return
    import onnxruntime

    onnxruntime.set_default_logger_severity(3)


def quiet_teardown_errors() -> None:
    """Unless verbose, drop the "Exception ignored in ... __del__" tracebacks that engines leave
    when an object they failed to build is collected (LiteRT's ``Delegate`` after a delegate
    library fails to load): the failure itself was already said in one line."""
    if verbose():
        return
    sys.unraisablehook = lambda unraisable: None
