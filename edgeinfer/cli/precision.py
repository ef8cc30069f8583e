"""``--precision``, ``--tolerance``, ``--max-error`` and ``--sample`` for ``run``, ``bench`` and
``compile``: the Session keywords ``precision=``, ``tolerance=`` and ``samples=``
(``edgeinfer.runtime.precision``).

A reduced precision is checked on real inputs only: the ``--sample`` files, else the command's
own inputs when every one of them came from a file (``-i``). With random inputs and no
``--sample``, ``--precision auto`` has nothing to check on and keeps fp32 (the plan says so);
``--precision bf16`` is then used unchecked, as asked.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from edgeinfer.errors import InputError
from edgeinfer.runtime.precision import PRECISIONS, Tolerance


def precision_options(fn):
    """The four options, passed on as one keyword ``precision`` (a dict: ``precision``,
    ``tolerance``, ``max_error``, ``samples``)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        kwargs["precision"] = {key: kwargs.pop(key) for key in ("precision", "tolerance", "max_error", "samples")}
        return fn(*args, **kwargs)

    default = Tolerance()
    for option in reversed([
        click.option("--precision", type=click.Choice(PRECISIONS), default="fp32", show_default=True,
                     help="Compute precision. auto: bf16/fp16 configurations this CPU computes natively join auto's "
                          "candidates, each checked against fp32 on real inputs (--sample, or -i files) before it "
                          "may win; bf16/fp16: that precision, on an engine that has it."),
        click.option("--tolerance", type=float, default=None, metavar="DB",
                     help=f"For a reduced precision: every output's SQNR against fp32 at least this "
                          f"(default {default.sqnr_db:g} dB)."),
        click.option("--max-error", type=click.FloatRange(0), default=None, metavar="FRACTION",
                     help=f"For a reduced precision: every output's largest error over its fp32 range at most this "
                          f"(default {default.max_error:g})."),
        click.option("--sample", "samples", multiple=True, metavar="NAME=FILE",
                     help="A real input a reduced precision is checked on (repeatable, one sample each): .npy or "
                          "an image for one input (NAME= optional for a model with one input), or an .npz holding "
                          "every input by name."),
    ]):
        wrapper = option(wrapper)
    return wrapper


def session_precision(model: Any, given: dict[str, Any], feeds: dict[str, Any] | None, feeds_real: bool,
                      load_one: Callable[[str], dict[str, Any]]) -> dict[str, Any]:
    """The Session keywords for ``given`` (``precision_options``' dict): none for plain fp32;
    ``samples`` from ``--sample`` (``load_one(spec)`` reads a .npy or image spec), else ``feeds``
    when they are real (``feeds_real``), else none at all (random data checks nothing)."""
    precision = given["precision"]
    tolerance = {key: value for key, value in (("sqnr_db", given["tolerance"]), ("max_error", given["max_error"]))
                 if value is not None}
    if precision == "fp32":
        if tolerance or given["samples"]:
            raise InputError("--tolerance, --max-error and --sample: expected with --precision auto, bf16 or fp16, "
                             "found with fp32")
        return {}
    samples = [_sample(model, spec, load_one) for spec in given["samples"]]
    if not samples and feeds_real and feeds:
        samples = [feeds]
    return {"precision": precision, "tolerance": tolerance or None, "samples": samples}


def _sample(model: Any, spec: str, load_one: Callable[[str], dict[str, Any]]) -> dict[str, Any]:
    import numpy as np

    path = Path(spec.partition("=")[2] or spec)
    if path.suffix.lower() != ".npz":
        found = load_one(spec)
    else:
        if not path.is_file():
            raise InputError(f"--sample {spec!r}: no such file {path}")
        try:
            with np.load(path, allow_pickle=False) as archive:
                found = {name: archive[name] for name in archive.files}
        except (ValueError, OSError, EOFError) as exc:
            raise InputError(f"--sample {spec!r}: {path} is not a readable .npz without pickles ({exc})") from exc
    names = [info.name for info in model.inputs]
    if set(found) != set(names):
        raise InputError(f"--sample {spec!r}: expected every input of the model ({', '.join(names)}), "
                         f"found {', '.join(found) or 'none'}")
    return found


_ENGINE_WORDS = {"bf16": "bf16", "f16": "fp16", "fp16": "fp16"}  # engines' own precision option values


def computed_precision(session: Any) -> str:
    """What the session computes in: its plan's decision (auto's, a compiled file's), else a
    named engine's own precision option (``precision="bf16"`` on one engine), else fp32."""
    record = session.precision_record
    if record is not None:
        return str(record["precision"])
    words = {_ENGINE_WORDS[str(options.get("precision"))] for options in (session.backend_options or {}).values()
             if str(options.get("precision")) in _ENGINE_WORDS}
    return ",".join(sorted(words)) or "fp32"


def precision_lines(session: Any) -> list[str]:
    """What the session computes in, for ``run`` and ``bench``: the plan's decision (auto's, a
    compiled file's) or what was asked of a named engine, unchecked."""
    from edgeinfer.runtime.precision import describe

    record = session.precision_record
    if record is not None:
        return describe(record)
    asked = computed_precision(session)
    return [] if asked == "fp32" else [f"precision: {asked} on {session.backend_name}, as asked (not checked "
                                       f"against fp32: --precision auto checks)"]
