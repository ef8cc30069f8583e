"""What a ``Session`` is asked beyond its common keywords, grouped by what uses it.

    Session(model, "auto", threads=2,
            options=[RunOptions(example_feeds=feeds), AutoOptions(cache=False),
                     StreamOptions(stages=2, replicas=1)])

- ``RunOptions``: every session (device fallback, debug, engine options per backend, the feeds
  and shape buckets plans are decided for, how many signatures stay compiled).
- ``AutoOptions``: ``backend="auto"`` (its disk cache).
- ``StreamOptions``: ``Session.stream`` (the default pipeline shape, the planner's budget).
- ``RayOptions``: ``executor="ray"`` (where Ray runs, each stage actor's resources, transfers).
- ``PrecisionOptions``: the compute precision (``"fp32"``, ``"auto"``, ``"bf16"``, ``"fp16"``), the
  real inputs a reduced precision is checked on, the tolerance (``runtime.precision``). Also
  taken as the Session keywords ``precision=``, ``samples=``, ``tolerance=`` (no warning: they
  are meant as keywords). With a single named backend and a fixed precision, ``precision`` is
  that engine's option (OpenVINO's hint, torch's compute type), as before.

The keywords these replace (``Session(..., fallback=True, stages=2, ...)``) still work: they
are mapped here, in ``from_keywords``, with one ``DeprecationWarning`` per call naming the option
object that takes each of them.
"""

from __future__ import annotations

import os
import warnings
from collections import namedtuple
from collections.abc import Mapping, Sequence
from typing import Any

from edgeinfer.errors import BackendError


class RunOptions(namedtuple("RunOptions", ("fallback", "debug", "backend_options", "example_feeds", "buckets",
                                           "plan_cache_size"), defaults=(False, None, None, None, None, 8))):
    __slots__ = ()
    fallback: bool  # run on the CPU, with a warning, where the device is missing
    debug: bool | None  # per-node timing and shapes (None: $EDGEINFER_DEBUG)
    backend_options: Mapping[str, Mapping[str, Any]] | None  # engine options per backend name
    example_feeds: Mapping[str, Any] | None  # feeds measured decisions are made on
    buckets: Mapping[str, Sequence[int]] | None  # symbolic dim -> values grouped in one signature
    plan_cache_size: int  # signatures kept compiled (least recently used closed first)


class _AutoFields(namedtuple("AutoOptions", ("cache", "cold_start", "budget_s"), defaults=(None, True, None))):
    __slots__ = ()
    cache: str | os.PathLike | bool | None  # the choice's disk cache folder (False: off)
    # ei.compile: a warm winner that is not the native engine must also start (import, load, first
    # result in a fresh process) within 10% of the native engine's (runtime.coldstart)
    cold_start: bool
    budget_s: float | None  # seconds auto's timing rounds take together, after compiling (None: 2)


class AutoOptions(_AutoFields):
    __slots__ = ()

    def __new__(cls, cache: str | os.PathLike | bool | None = None, cold_start: bool = True,
                budget_s: float | None = None) -> AutoOptions:
        _check_seconds("budget_s", budget_s)
        return super().__new__(cls, cache, bool(cold_start), budget_s)


class _StreamFields(namedtuple("StreamOptions", ("stages", "replicas", "plan_budget"), defaults=("auto", "auto", None))):
    __slots__ = ()
    stages: int | str | None  # pipeline stages (or "auto": the planner decides)
    replicas: int | Sequence[int] | str | None  # workers per stage
    plan_budget: float | None  # seconds the stage planner may spend on candidates


class StreamOptions(_StreamFields):
    __slots__ = ()

    def __new__(cls, stages: int | str | None = "auto", replicas: int | Sequence[int] | str | None = "auto",
                plan_budget: float | None = None) -> StreamOptions:
        check_choice(stages, replicas)
        _check_seconds("plan_budget", plan_budget)
        return super().__new__(cls, stages, replicas, plan_budget)


def _check_seconds(name: str, value: Any) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0):
        raise BackendError(f"{name} {value!r}: expected a positive number of seconds")


def check_choice(stages: int | str | None, replicas: int | Sequence[int] | str | None) -> None:
    if not (stages in (None, "auto") or (isinstance(stages, int) and stages >= 1)):
        raise BackendError(f"stages {stages!r}: expected a positive integer or 'auto'")
    if replicas in (None, "auto") or (isinstance(replicas, int) and replicas >= 1):
        return
    if isinstance(replicas, Sequence) and not isinstance(replicas, str) and \
            all(isinstance(r, int) and r >= 1 for r in replicas):
        if isinstance(stages, int) and len(replicas) != stages:
            raise BackendError(f"replicas {list(replicas)}: expected one count per stage ({stages})")
        return
    raise BackendError(f"replicas {replicas!r}: expected a positive integer, a list of them, or 'auto'")


class _PrecisionFields(namedtuple("PrecisionOptions", ("precision", "samples", "tolerance"), defaults=("fp32", None, None))):
    __slots__ = ()
    precision: str  # "fp32", "auto" (reduced candidates where they hold), "bf16", "fp16"
    samples: Sequence[Mapping[str, Any]] | None  # real inputs reduced precision is checked on
    tolerance: Any  # dB SQNR floor, {"sqnr_db", "max_error"} or a precision.Tolerance (None: default)


class PrecisionOptions(_PrecisionFields):
    __slots__ = ()

    def __new__(cls, precision: str = "fp32", samples: Any = None, tolerance: Any = None) -> PrecisionOptions:
        if precision == "fp32" and samples is None and tolerance is None:  # the default: nothing to check or import
            return super().__new__(cls, precision, None, None)
        from edgeinfer.runtime.precision import check_precision, tolerance_of

        tolerance_of(tolerance)
        if isinstance(samples, Mapping):
            samples = [samples]
        if samples is not None and (isinstance(samples, (str, bytes)) or not isinstance(samples, Sequence)
                                    or not all(isinstance(s, Mapping) for s in samples)):
            raise BackendError(f"samples: expected a list of feed dicts (input name -> array), got "
                               f"{type(samples).__name__}")
        return super().__new__(cls, check_precision(precision), None if samples is None else list(samples), tolerance)


class RayOptions(namedtuple("RayOptions", ("address", "stage_resources", "transfer_bytes_per_second", "max_restarts",
                                           "ray_init"), defaults=(None,) * 5)):
    __slots__ = ()
    address: str | None  # None: a local Ray instance; "ray://host:port" or "auto"
    stage_resources: Any  # one dict of actor resources for every stage, or one per stage
    transfer_bytes_per_second: float | None
    max_restarts: int | None
    ray_init: Mapping[str, Any] | None  # keywords for ray.init when edgeinfer starts Ray

    def settings(self) -> dict[str, Any]:
        """The keyword arguments of ``RayPipeline``, checked."""
        if self.address is not None and not isinstance(self.address, str):
            raise BackendError(f"address: expected None (a local Ray instance) or 'ray://host:port', "
                               f"got {self.address!r}")
        extra = {name: getattr(self, name) for name in self._fields[2:] if getattr(self, name) is not None}
        return {"address": self.address, "stage_resources": self.stage_resources, **extra}


OPTION_TYPES = (RunOptions, AutoOptions, StreamOptions, RayOptions, PrecisionOptions)


class Options(namedtuple("Options", ("run", "auto", "stream", "ray", "precision"),
                        defaults=(RunOptions(), AutoOptions(), StreamOptions(), RayOptions(), PrecisionOptions()))):
    """One of each option group (the defaults where a caller gave none)."""

    __slots__ = ()
    run: RunOptions
    auto: AutoOptions
    stream: StreamOptions
    ray: RayOptions
    precision: PrecisionOptions


def replace(options: Any, **changes: Any) -> Any:
    """A copy of an option object with ``changes``, checked again as at construction. (Option
    objects are named tuples, not dataclasses: a device's cold start imports no ``dataclasses``.)"""
    return type(options)(**{**options._asdict(), **changes})


_SLOTS = {RunOptions: "run", AutoOptions: "auto", StreamOptions: "stream", RayOptions: "ray",
          PrecisionOptions: "precision"}
_PRECISION_ENGINES = ("openvino", "torch")  # engines with a precision option
_ENGINE_PRECISION = {"openvino": {"fp32": "f32", "bf16": "bf16", "fp16": "f16"}}  # else the same words
# each deprecated Session keyword -> the option group that takes it now
_KEYWORDS = {name: cls for cls in (RunOptions, AutoOptions, StreamOptions) for name in cls._fields}
_KEYWORDS.update(address=RayOptions, stage_resources=RayOptions, ray_options=RayOptions)


def gather(options: Any) -> Options:
    """``Session(options=...)``: None, one option object, a list of them, or ``Options``."""
    if options is None:
        return Options()
    if isinstance(options, Options):
        return options
    given = [options] if isinstance(options, OPTION_TYPES) else options
    if not isinstance(given, (list, tuple)) or not all(isinstance(o, OPTION_TYPES) for o in given):
        raise BackendError(f"options: expected one of {[t.__name__ for t in OPTION_TYPES]}, a list of them "
                           f"or Options, got {options!r}")
    slots: dict[str, Any] = {}
    for option in given:
        slot = _SLOTS[type(option)]
        if slot in slots:
            raise BackendError(f"options: {type(option).__name__} given twice")
        slots[slot] = option
    return Options(**slots)


def precision_keywords(options: Options, keywords: dict[str, Any], backend: Any) -> tuple[Options, dict[str, Any]]:
    """``precision=``, ``samples=``, ``tolerance=`` out of ``keywords`` into ``options.precision``;
    with a single named backend and a fixed precision, ``precision`` stays that engine's option."""
    given = {name: keywords.pop(name) for name in PrecisionOptions._fields if name in keywords}
    if not given:
        return options, keywords
    word = given.get("precision")
    single = isinstance(backend, str) and backend != "auto"
    checked = bool(given.get("samples")) or given.get("tolerance") is not None  # a check asked for: auto's path
    if single and word not in ("auto", None) and not checked:
        if backend in _PRECISION_ENGINES:
            keywords["precision"] = _ENGINE_PRECISION.get(backend, {}).get(word, word)  # the engine checks it
        elif word != "fp32":
            raise BackendError(f"precision={word!r}: backend {backend!r} computes in fp32 only (bf16 and fp16: "
                               f"{', '.join(_PRECISION_ENGINES)}; precision='auto' chooses where it holds)")
        return options, keywords
    return replace(options, precision=replace(options.precision, **given)), keywords


def from_keywords(options: Options, keywords: dict[str, Any]) -> tuple[Options, dict[str, Any]]:
    """Take the deprecated Session keywords out of ``keywords`` (the rest are engine options)
    into ``options``; warn once, naming where each of them goes now."""
    old = {name: keywords.pop(name) for name in list(keywords) if name in _KEYWORDS}
    if not old:
        return options, keywords
    groups: dict[str, list[str]] = {}
    for name in old:
        groups.setdefault(_KEYWORDS[name].__name__, []).append(name)
    hint = ", ".join(f"{cls}({', '.join(f'{k}=...' for k in names)})" for cls, names in groups.items())
    warnings.warn(f"Session keyword(s) {sorted(old)} are deprecated: pass options=[{hint}] "
                  "(edgeinfer.runtime.options)", DeprecationWarning, stacklevel=3)
    return _mapped(options, old)[0], keywords


def session_keywords(**keywords: Any) -> dict[str, Any]:
    """``Session``'s keywords from flat settings (what a command line or a config file holds:
    ``fallback=``, ``cache=``, ``stages=`` beside ``backend=``, ``threads=``...): the option
    groups become ``options=``; the rest are passed as they are."""
    old = {name: keywords.pop(name) for name in list(keywords) if name in _KEYWORDS}
    options, _ = _mapped(gather(keywords.pop("options", None)), old)
    return {**keywords, "options": options}


def _mapped(options: Options, old: Mapping[str, Any]) -> tuple[Options, dict[str, dict[str, Any]]]:
    """``options`` with the flat keywords ``old`` set in their groups; also what went where
    (``ray_options={...}`` is checked and spread into ``RayOptions``)."""
    moved: dict[str, dict[str, Any]] = {}
    for name, value in old.items():
        cls = _KEYWORDS[name]
        if name == "ray_options":
            value = dict(value or {})
            allowed = list(RayOptions._fields[2:])
            unknown = sorted(set(value) - set(allowed))
            if unknown:
                raise BackendError(f"ray_options: unknown key(s) {unknown}; expected some of {allowed}")
            moved.setdefault(cls.__name__, {}).update(value)
        else:
            moved.setdefault(cls.__name__, {})[name] = value
    by_name = {cls.__name__: cls for cls in OPTION_TYPES}
    for cls_name, values in moved.items():
        slot = _SLOTS[by_name[cls_name]]
        options = replace(options, **{slot: replace(getattr(options, slot), **values)})
    return options, moved


def engine_options(backend: Any, per_backend: Mapping[str, Mapping[str, Any]] | None,
                   keywords: Mapping[str, Any], compiled: Any = None) -> dict[str, dict[str, Any]]:
    """Engine options by backend name: those a compiled ``.eim`` decided its precision with
    (``compiled.precision``), under ``RunOptions.backend_options``, plus the Session's extra
    keywords for a single backend."""
    stored = (getattr(compiled, "precision", None) or {}).get("engine_options", {})
    options = {name: dict(values) for name, values in stored.items()}
    for name, values in (per_backend or {}).items():
        options[name] = {**options.get(name, {}), **values}
    if keywords:
        if not isinstance(backend, str) or backend == "auto":
            raise BackendError(f"engine options {sorted(keywords)} need a single backend; with "
                               f"{backend!r} give options=RunOptions(backend_options={{name: {{...}}}})")
        options[backend] = {**options.get(backend, {}), **keywords}
    return options
