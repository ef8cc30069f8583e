"""``ei.compile`` / ``edgeinfer compile``: write a model as a compiled ``.eim`` (``aot`` reads it).

Kept apart from ``aot`` because it opens a Session, which itself loads compiled files through
``aot``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from edgeinfer.backend import Artifact
from edgeinfer.errors import InputError
from edgeinfer.runtime.aot import machine_key


def compile_model(model: Any, output: str | os.PathLike, *, backend: Any = "auto", threads: int | None = None,
                  executor: str = "sequential", shapes: dict[str, tuple] | None = None,
                  example_feeds: dict[str, Any] | None = None, options: Any = None, precision: str = "fp32",
                  samples: Any = None, tolerance: Any = None) -> Any:
    """Write ``model`` (a ``Model`` or a model file) to ``output`` as a compiled ``.eim``: the plan
    a Session on this machine chooses (``backend="auto"``: measured here, on ``example_feeds``
    where given, else random data) and each part's artifact; returns the model as loaded from
    the file. ``shapes`` ({input: shape}) binds symbolic dims for good; without them a model with
    symbolic dims needs ``example_feeds``, and its plan and artifacts keep the symbolic dims.
    ``precision``, ``samples`` and ``tolerance`` are the Session's (``runtime.precision``): the
    precision decided, its error against fp32 and the nodes kept fp32 are stored with the plan."""
    import numpy as np

    from edgeinfer.api import load_any
    from edgeinfer.format.eim import load_model, save_model
    from edgeinfer.model import Model
    from edgeinfer.runtime.options import gather, replace
    from edgeinfer.runtime.session import Session

    if not isinstance(model, Model):
        model = load_any(model)
    if Path(output).suffix.lower() != ".eim":
        raise InputError(f"compile to {os.fspath(output)!r}: expected a path ending in .eim")
    feeds = None if example_feeds is None else {name: np.asarray(a) for name, a in example_feeds.items()}
    if shapes:
        model = _bound(model, shapes)
    symbolic = [str(info) for info in model.inputs if info.shape is None or not all(isinstance(d, int) for d in info.shape)]
    if symbolic and feeds is None:  # the plan and its artifacts keep the symbolic dims; auto measures on real shapes
        raise InputError(f"compile: inputs {', '.join(symbolic)} have symbolic dims: give example inputs to decide "
                         "on (-i NAME=FILE.npy, ei.compile(..., example_feeds={...})) or static shapes "
                         "(--shape NAME:1x3x224x224, ei.compile(..., shapes={...}))")
    output = Path(output)
    save_model(Model(model.graph, model.metadata), output)  # the IR alone; the plan is decided on it
    loaded = load_model(output)
    opts = gather(options)
    if feeds is not None:
        opts = replace(opts, run=replace(opts.run, example_feeds=feeds))
    run_feeds = feeds if feeds is not None else loaded.random_feeds()
    reduced = {} if precision == "fp32" and samples is None and tolerance is None else \
        {"precision": precision, "samples": samples, "tolerance": tolerance}
    with Session(loaded, backend=backend, threads=threads, executor=executor, options=opts, **reduced) as session:
        plan = session.compiled_plan(run_feeds)
        loaded.compiled = _section(plan, threads, output)
    save_model(loaded, output)
    choice = plan.auto_choice
    if choice is not None and opts.auto.cold_start and choice.native not in (None, ",".join(choice.backends)):
        _weigh_cold_start(loaded, choice, output, threads=threads, executor=executor, feeds=run_feeds, options=opts)
    return load_model(output)


def _weigh_cold_start(model: Any, choice: Any, output: Path, *, threads: int | None, executor: str,
                      feeds: dict[str, Any], options: Any) -> None:
    """Auto's warm winner is not the native engine: compile the native engine's plan beside
    ``output``, time both files' first result in fresh processes, and leave in ``output`` the
    one ``coldstart.weigh`` keeps, its reason saying both figures. A winner that starts too
    slowly gives way to the next candidate faster warm than the native engine by its margin, if
    any, weighed the same way (else the choice would hang on which of the two won warm)."""
    from types import SimpleNamespace

    from edgeinfer.format.eim import load_model, save_model
    from edgeinfer.log import get_logger
    from edgeinfer.model import Model
    from edgeinfer.runtime.coldstart import first_results, weigh

    plain = Model(model.graph, model.metadata)
    native_path, next_path = (output.with_name(f".{output.stem}.{tag}.eim") for tag in ("native", "next"))
    inputs = [feeds[info.name] for info in model.inputs]

    def built(path: Path, names: list[str]) -> Path:
        compile_model(plain, path, backend=names, threads=threads, executor=executor, example_feeds=feeds,
                      options=options)
        return path

    try:
        built(native_path, choice.native.split(","))
        cold = first_results({"auto": output, "native": native_path}, inputs, threads)
        kept, reason = weigh(choice, cold)
        chosen, path = choice.backends, output
        runner_up = _runner_up(choice)
        if not kept and runner_up is not None:
            contender = SimpleNamespace(backends=runner_up.split(","), native=choice.native, median_ms=choice.median_ms,
                                        reason=f"fastest warm after {','.join(choice.backends)}, which starts too slowly")
            next_cold = first_results({"auto": built(next_path, contender.backends), "native": native_path}, inputs,
                                      threads)
            next_kept, next_reason = weigh(contender, next_cold)
            reason = f"{reason}; then {next_reason}"
            if next_kept:
                kept, cold, chosen, path = True, next_cold, contender.backends, next_path
        get_logger("edgeinfer.runtime.auto.progress").info("cold start: %s", reason)
        written = load_model(path if kept else native_path)
        written.compiled.auto = {"backends": chosen if kept else choice.native.split(","), "reason": reason,
                                 "median_ms": {k: round(v, 6) for k, v in choice.median_ms.items()},
                                 "first_result_s": {k: v if v != float("inf") else None for k, v in cold.items()},
                                 "warm_winner": choice.backends}
        save_model(written, output)
    finally:
        native_path.unlink(missing_ok=True)
        next_path.unlink(missing_ok=True)


def _runner_up(choice: Any) -> str | None:
    """The fastest warm candidate after the winner that is not the native engine and beats it by
    auto's margin (``auto.NATIVE_MARGIN``), if any."""
    from edgeinfer.runtime.auto import NATIVE_MARGIN

    medians, winner, native = choice.median_ms, ",".join(choice.backends), choice.native
    others = [label for label in sorted(medians, key=medians.get) if label not in (winner, native)
              and native in medians and medians[native] > medians[label] * (1 + NATIVE_MARGIN)]
    return others[0] if others else None


def _section(plan: Any, threads: int | None, output: Path) -> Any:
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
                                        "median_ms": {k: round(v, 6) for k, v in choice.median_ms.items()}}
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


def _bound(model: Any, shapes: dict[str, tuple]) -> Any:
    """``model`` with the given static input shapes, types inferred again."""
    from edgeinfer.api import redeclare_inputs
    from edgeinfer.ir.infer import infer_types
    from edgeinfer.model import Model

    graph = infer_types(redeclare_inputs(model.graph, dict(shapes), False))
    graph.verify()
    return Model(graph, model.metadata)


def _stored(artifact: Artifact, part: dict[str, list[str]]) -> Any:
    import zlib

    from edgeinfer.format.compiled import StoredArtifact

    data = bytes(artifact.data)
    return StoredArtifact(artifact.kind, {**artifact.facts, "part": part}, data, zlib.crc32(data), True)
