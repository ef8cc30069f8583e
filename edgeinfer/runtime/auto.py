"""``backend="auto"``: time the candidate placements on this device, keep the fastest, cache it.

Candidates: each installed engine on its own (with numpy for what it cannot run), all of them
in the default priority order when several are installed, and numpy alone; where torch sees
a GPU, torch on it alone and beside a CPU engine (``auto_gpu``). Each candidate is
partitioned and compiled, then timed on feeds of one shape signature (the model's own shapes
when they are static, else the caller's ``example_feeds`` or the first real request of that
signature: never guessed dims) in interleaved blocks (``runtime.measure.race``), so machine noise hits
them alike and no engine is timed beside another's spinning threads; the lowest median wins (the native engine excepted, below). A candidate more than 3x slower than the best after a
first short round is dropped early (numpy on a big convolutional net; never the native engine, below).

The native engine: a model converted from a file remembers its format
(``metadata["source_format"]``), and the engine that runs such files (LiteRT for ``.tflite``,
onnxruntime for ``.onnx``, torch for TorchScript, ``.pt2`` and modules; ``NATIVE_ENGINES``) is
always a candidate. When it takes the whole graph it runs an export equivalent to the file the
user had (the tflite backend's export of an imported ``.tflite`` has the original's operators),
so it is kept unless another candidate is faster by more than ``NATIVE_MARGIN`` (10%), measured
in the same interleaved blocks (``decide``): ``auto`` never ends up slower than the engine the
user already had for a difference that is within timing noise. A native engine that leaves
nodes to numpy is timed as any other candidate (``AutoChoice.native_note`` says why).

A candidate that fails to compile or to run is dropped with its reason. The choice is cached
in a small JSON file keyed by the model's content hash, the shape signature, the device, the
threads, the engine options and the versions of edgeinfer and every engine, so the next load
of the same model here does not measure again. The cache lives in ``$EDGEINFER_CACHE_DIR`` or
``~/.cache/edgeinfer`` (``cache=`` overrides it; ``cache=False`` turns it off); a corrupt cache
file is ignored with a warning and rewritten.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

from edgeinfer.backend import installed_backends
from edgeinfer.errors import EdgeInferError
from edgeinfer.format.atomic import atomic_write_bytes
from edgeinfer.model import Model
from edgeinfer.runtime.auto_choice import (  # noqa: F401  (auto's API: the decision and its rule)
    NATIVE_ENGINES,
    NATIVE_MARGIN,
    RULE,
    AutoChoice,
    decide,
    native_engine,
)
from edgeinfer.runtime.auto_gpu import accelerator, accelerator_candidates
from edgeinfer.runtime.auto_race import measure
from edgeinfer.runtime.measure import race

log = logging.getLogger("edgeinfer.runtime.auto")
progress = logging.getLogger("edgeinfer.runtime.auto.progress")  # one INFO line per step (edgeinfer run shows them)
CACHE_FILE = "auto-backends.json"
_ENGINE_DISTRIBUTIONS = ("edgeinfer", "numpy", "onnxruntime", "onnxruntime-gpu", "openvino", "ai-edge-litert",
                         "tflite-runtime")


def candidates(installed: list[str]) -> list[list[str]]:
    engines = [name for name in installed if name != "numpy"]
    found = [[name, "numpy"] for name in engines]
    if len(engines) > 1:
        found.append([*engines, "numpy"])
    found.append(["numpy"])
    return found


def _versions() -> dict[str, str]:
    versions = {}
    for name in _ENGINE_DISTRIBUTIONS:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return versions


def cache_key(model: Model, *, threads: int | None, device: str, fallback: bool,
              options: Mapping[str, Any], signature: Any = "static", precision: Any = None,
              lists: Any = None) -> str:
    """What a cached choice depends on (``precision``: the precision, tolerance and samples
    digest of ``precision="auto"``, None for fp32; ``lists``: the candidates where not auto's own,
    as for a named backend with a precision)."""
    facts = {"model": model.graph.content_hash(), "signature": str(signature), "threads": threads, "rule": RULE,
             "precision": precision, **({} if lists is None else {"lists": lists}),
             "native": native_engine(model),
             "device": device, "fallback": fallback,
             "options": repr(sorted((k, sorted(dict(v).items())) for k, v in options.items())),
             "versions": _versions(), "machine": platform.machine(), "cpus": os.cpu_count(),
             "accelerator": accelerator()}
    return hashlib.sha256(json.dumps(facts, sort_keys=True, default=str).encode()).hexdigest()


def cache_dir(cache: str | os.PathLike | bool | None) -> Path | None:
    if cache is False:
        return None
    if cache not in (None, True):
        return Path(cache)
    env = os.environ.get("EDGEINFER_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "edgeinfer"


def _read_cache(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        log.warning("auto backend cache %s is unreadable (%s); measuring again", path, exc)
        return {}
    return data if isinstance(data, dict) else {}


def _cached_choice(entry: Any, installed: list[str], key: str) -> AutoChoice | None:
    if not isinstance(entry, dict):
        return None
    names = entry.get("backends")
    if not isinstance(names, list) or not names or \
            not all(isinstance(n, str) and n.partition("@")[0] in installed for n in names):  # "torch@cuda:0"
        return None
    medians = entry.get("median_ms")
    medians = {k: float(v) for k, v in medians.items() if isinstance(v, (int, float))} \
        if isinstance(medians, dict) else {}
    native, reason = entry.get("native"), entry.get("reason")
    record = entry.get("precision")
    record = record if isinstance(record, dict) else {}
    options = record.get("engine_options") if isinstance(record.get("engine_options"), dict) else {}
    choice = AutoChoice(names, median_ms=medians, cached=True, key=key,
                        native=native if isinstance(native, str) else None,
                        reason=reason if isinstance(reason, str) else "",
                        precision=str(record.get("precision", "fp32")), options=options)
    errors = record.get("error")
    if isinstance(errors, dict) and all(isinstance(e, dict) for e in errors.values()):
        choice.errors[choice.label] = errors
    notes, kept = record.get("not_offered"), record.get("kept_fp32")
    if isinstance(notes, dict):
        choice.precision_notes = {str(k): str(v) for k, v in notes.items()}
    if isinstance(kept, list):
        choice.kept_fp32[choice.label] = [str(name) for name in kept]
    return choice


def choose_backends(model: Model, feeds: Mapping[str, Any], *, threads: int | None, device: str, fallback: bool,
                    options: Mapping[str, Mapping[str, Any]], cache: str | os.PathLike | bool | None,
                    signature: Any = "static", budget_s: float | None = None, precision: str = "fp32",
                    samples: list[dict[str, Any]] | None = None, tolerance: Any = None,
                    lists: list[list[str]] | None = None) -> AutoChoice:
    """The fastest candidate on ``feeds`` (real feeds of one ``signature``), from the disk cache
    when this model, signature, machine and settings were measured before. ``precision`` other
    than fp32 adds (``"auto"``) or keeps only (``"bf16"``, ``"fp16"``) the reduced-precision
    configurations this CPU computes natively, checked on ``samples`` against ``tolerance``
    (``auto_precision``); ``lists`` replaces the candidates (a named backend with a precision)."""
    installed = installed_backends()
    wanted = None if precision == "fp32" else \
        [precision, repr(tuple(_tolerance(tolerance))), _samples_digest(samples)]
    key = cache_key(model, threads=threads, device=device, fallback=fallback, options=options,
                    signature=signature, precision=wanted, lists=lists)
    folder = cache_dir(cache)
    path = folder / CACHE_FILE if folder is not None else None
    if path is not None:
        hit = _cached_choice(_read_cache(path).get(key), installed, key)
        if hit is not None:
            return hit
    native = native_engine(model)
    if lists is None:
        lists = candidates(installed) + accelerator_candidates(installed, device, options)
    elif native not in {name for names in lists for name in names}:
        native = None
    choice = measure(model, lists, feeds, threads=threads, device=device, fallback=fallback,
                     options=options, native=native if native in installed else None, budget_s=budget_s,
                     precision=precision, samples=samples, tolerance=tolerance)
    choice.key = key
    if path is not None:
        _write_cache(path, key, choice)
    return choice


def _tolerance(tolerance: Any) -> Any:
    from edgeinfer.runtime.precision import tolerance_of

    return tolerance_of(tolerance)


def _samples_digest(samples: list[dict[str, Any]] | None) -> str | None:
    if not samples:
        return None
    import numpy as np

    digest = hashlib.sha256()
    for sample in samples:
        for name in sorted(sample):
            array = np.ascontiguousarray(sample[name])
            digest.update(f"{name}:{array.dtype.str}:{array.shape}".encode())
            digest.update(array.tobytes())
    return digest.hexdigest()


def _write_cache(path: Path, key: str, choice: AutoChoice) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        data = _read_cache(path)
        data[key] = {"backends": choice.backends, "median_ms": choice.median_ms, "native": choice.native,
                     "reason": choice.reason, "precision": choice.precision_record()}
        atomic_write_bytes(path, json.dumps(data, indent=1, sort_keys=True).encode())
    except (OSError, EdgeInferError) as exc:  # a cache that cannot be written only costs time later
        log.warning("auto backend cache %s could not be written: %s", path, exc)


def choose_executor(model: Model, backends: list, feeds: Mapping[str, Any], *, threads: int | None,
                    debug: bool = False, rounds: int = 10) -> tuple[str, Any, Any, dict[str, float]]:
    """``executor="auto"``: build the sequential and the DAG-parallel runner, time them
    interleaved on ``feeds`` (one signature's real feeds), keep the faster. Cutting a graph at its forks pays where
    the engine leaves cores idle inside one branch (numpy), and can cost where it does not
    (onnxruntime re-lays tensors out at every cut), so it is measured, not assumed.
    Returns (executor name, plan, runner, median ms of each)."""
    from edgeinfer.runtime.compile import compile

    built = {}
    excluded: dict[int, dict[str, str]] = {}  # parts that failed to compile, for both
    try:
        for name in ("sequential", "dag"):
            built[name] = compile(model.graph, backends, executor=name, threads=threads, debug=debug,
                                  excluded=excluded)
    except BaseException:
        for _, runner in built.values():
            runner.close()
        raise
    if len(built["dag"][0].parts) == len(built["sequential"][0].parts):  # nothing runs side by side
        built.pop("dag")[1].close()
        return "sequential", *built["sequential"], {}
    feeds = dict(feeds)
    progress.info("executor: timing sequential and dag")
    medians = race({name: (lambda r=runner: r.run(feeds)) for name, (_, runner) in built.items()},
                   calls=rounds).medians_ms()
    winner = min(medians, key=medians.get)
    for name, (_, runner) in built.items():
        if name != winner:
            runner.close()
    log.info("executor='auto' timings (median ms): %s -> %s", medians, winner)
    return winner, *built[winner], medians
