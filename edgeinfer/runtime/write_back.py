"""A compiled section from a Session's plan (``section_of``: ``ei.compile`` writes it), and the plan of
a file left to be compiled on the device written back in its place (``write_back``).

``ei.compile(..., on_device=True)`` (``edgeinfer compile --on-device``) writes the IR and what to
compile it with (``aot.DEFERRED_KEY`` in its metadata, ``deferred_spec``). The first
``Session("model.eim")`` on the device takes that backend (``backend="auto"`` measured there, on the
device's own CPU), and once its plan is built writes the file again with the plan and each part's
artifact, atomically, in place of the IR-only one, where the file and its folder are writable and the
inputs static (one plan): every later start loads the stored plan from its artifacts. Otherwise it
is decided again at each start, in memory, said once. On the device the first result in a fresh
process is not weighed (``AutoOptions.cold_start``: that would start processes inside the app).
Kept apart from ``aot_compile`` (which opens a Session) so that the Session can call it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from edgeinfer.backend import Artifact
from edgeinfer.errors import ModelFormatError
from edgeinfer.log import get_logger
from edgeinfer.machine import machine_key

log = get_logger("edgeinfer.runtime.aot")
DEFERRED_KEY = "edgeinfer.compile_on_device"  # model metadata: {"backend", "threads", "executor"} as JSON


def deferred_spec(model: Any) -> dict[str, Any] | None:
    """What a model written with ``on_device=True`` is to be compiled with (None: not deferred)."""
    text = getattr(model, "metadata", {}).get(DEFERRED_KEY)
    if text is None:
        return None
    try:
        spec = json.loads(text)
    except ValueError:
        spec = None
    backend = spec.get("backend") if isinstance(spec, dict) else None
    threads = spec.get("threads") if isinstance(spec, dict) else None
    if not (isinstance(backend, str) or (isinstance(backend, list) and backend and
                                         all(isinstance(n, str) for n in backend))) or \
            not (threads is None or (isinstance(threads, int) and not isinstance(threads, bool) and threads >= 1)) or \
            spec.get("executor", "sequential") not in ("sequential", "dag"):
        raise ModelFormatError(f"metadata {DEFERRED_KEY!r}: expected {{\"backend\": name or list, \"threads\": "
                               f"int or null, \"executor\"}} as JSON, found {text[:120]!r}")
    return {"backend": backend, "threads": threads, "executor": spec.get("executor", "sequential")}


def without_deferred(metadata: dict[str, str]) -> dict[str, str]:
    """``metadata`` without what to compile the model with on the device (a compiled file's)."""
    return {k: v for k, v in metadata.items() if k != DEFERRED_KEY}


def write_back(model: Any, plan: Any, threads: int | None) -> None:
    """Write ``plan`` (a Session's, decided on the device) into ``model.on_device`` (the file it was
    read from, left to be compiled on the device) in place of the IR-only file, where it can."""
    from edgeinfer.format.eim import save_model
    from edgeinfer.model import Model

    source = Path(model.on_device)
    why = None if plan is not None else "its inputs have symbolic dims (decided per input shape)"
    if why is None and not (os.access(source, os.W_OK) and os.access(source.parent, os.W_OK | os.X_OK)):
        why = "the file or its folder is read-only"
    if why is None:
        plain = Model(model.graph, without_deferred(model.metadata))
        try:
            save_model(plain, source)  # the IR alone first: the section is bound to its stored digest
            plain.compiled = section_of(plan, threads, source)
            save_model(plain, source)
        except OSError as exc:  # the folder filled up, the file is held open elsewhere (Windows)
            why = str(exc)
    if why is not None:
        log.warning("%s: compiled on the device in memory, not written back: %s", source, why)
    else:
        log.info("%s: compiled on the device (%s) and written back", source, ",".join(plain.compiled.backends))


def section_of(plan: Any, threads: int | None, output: Path) -> Any:
    """The compiled section of ``plan``: its placement and each part's artifact."""
    from edgeinfer.format.compiled import CompiledSection, StoredArtifact
    from edgeinfer.format.eim import document_digest

    artifacts: list[StoredArtifact] = []
    parts = []
    for compiled_part in getattr(plan.runner, "parts", []):
        part = compiled_part.part
        made = compiled_part.first.artifact(part.graph)
        index = None
        if made is not None:  # bound to its part's inputs and outputs (aot checks them at load)
            index = len(artifacts)
            artifacts.append(_stored(made, {"inputs": list(part.inputs), "outputs": list(part.outputs)}))
        parts.append({"backend": part.backend, "nodes": list(part.nodes), "artifact": index,
                      "inputs": list(part.graph.inputs), "outputs": list(part.graph.outputs)})
    choice = plan.auto_choice
    auto = None if choice is None else {"backends": choice.backends, "reason": choice.reason,
                                        "median_ms": {k: round(v, 6) for k, v in choice.median_ms.items()},
                                        "skipped": dict(choice.skipped)}  # the candidates not timed, and why
    names = choice.backends if choice is not None else [b.name for b in plan.backends]
    engines = {b.name: v for b in plan.backends if (v := b.engine_version()) is not None}
    return CompiledSection(list(names), list(plan.plan.assignment.backends), plan.executor, threads, machine_key(),
                           engines, document_digest(output), parts, artifacts, auto, os.fspath(output),
                           _precision(plan))


def _precision(plan: Any) -> dict[str, Any] | None:
    """What the plan computes in, where not all fp32: auto's decision (its figures against fp32),
    or the precision options of the engines it was given (``compiled.PRECISION_OPTIONS``)."""
    from edgeinfer.format.compiled import PRECISION_OPTIONS

    choice = plan.auto_choice
    if choice is not None and (choice.precision != "fp32" or choice.precision_notes or choice.errors):
        return choice.precision_record()
    given = {b.name: {k: v for k, v in getattr(b, "engine_options", {}).items() if k in PRECISION_OPTIONS[b.name]}
             for b in plan.backends if b.name in PRECISION_OPTIONS}
    given = {name: values for name, values in given.items() if values}
    if not given:
        return None
    words = {str(v.get("precision")) for v in given.values()}
    return {"precision": ",".join(sorted(words)), "engine_options": given, "error": {}, "kept_fp32": [],
            "not_offered": {}}


def _stored(artifact: Artifact, part: dict[str, list[str]]) -> Any:
    import zlib

    from edgeinfer.format.compiled import StoredArtifact

    data = bytes(artifact.data)
    return StoredArtifact(artifact.kind, {**artifact.facts, "part": part}, data, zlib.crc32(data), True)
