"""``ei.compile`` / ``edgeinfer compile``: write a model as a compiled ``.eim`` (``aot`` reads it).

Kept apart from ``aot`` because it opens a Session, which itself loads compiled files through
``aot``.

``on_device=True`` (``edgeinfer compile --on-device``) leaves the plan to the device: the file holds
the IR and what to compile it with (``aot.DEFERRED_KEY`` in its metadata); the first
``Session("model.eim")`` there decides (``backend="auto"`` measured on the device itself) and writes
its plan back (``write_back``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from edgeinfer.errors import InputError
from edgeinfer.runtime.write_back import DEFERRED_KEY, section_of, without_deferred


def compile_model(model: Any, output: str | os.PathLike, *, backend: Any = "auto", threads: int | None = None,
                  executor: str = "sequential", shapes: dict[str, tuple] | None = None,
                  example_feeds: dict[str, Any] | None = None, options: Any = None, precision: str = "fp32",
                  samples: Any = None, tolerance: Any = None, on_device: bool = False) -> Any:
    """Write ``model`` (a ``Model`` or a model file) to ``output`` as a compiled ``.eim``: the plan
    a Session on this machine chooses (``backend="auto"``: measured here, on ``example_feeds``
    where given, else random data) and each part's artifact; returns the model as loaded from
    the file. ``shapes`` ({input: shape}) binds symbolic dims for good; without them a model with
    symbolic dims needs ``example_feeds``, and its plan and artifacts keep the symbolic dims.
    ``precision``, ``samples`` and ``tolerance`` are the Session's (``runtime.precision``): the
    precision decided, its error against fp32 and the nodes kept fp32 are stored with the plan.
    ``on_device=True``: the plan is decided on the device at its first Session (module docstring)."""
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
    if on_device:
        return _deferred(model, output, backend, threads, executor, feeds, precision, samples, tolerance)
    save_model(Model(model.graph, without_deferred(model.metadata)), output)  # the IR alone; the plan is decided on it
    loaded = load_model(output)
    opts = gather(options)
    if feeds is not None:
        opts = replace(opts, run=replace(opts.run, example_feeds=feeds))
    run_feeds = feeds if feeds is not None else loaded.random_feeds()
    reduced = {} if precision == "fp32" and samples is None and tolerance is None else \
        {"precision": precision, "samples": samples, "tolerance": tolerance}
    with Session(loaded, backend=backend, threads=threads, executor=executor, options=opts, **reduced) as session:
        plan = session.compiled_plan(run_feeds)
        loaded.compiled = section_of(plan, threads, output)
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
                                 "warm_winner": choice.backends, "skipped": dict(choice.skipped)}
        save_model(written, output)
    finally:
        native_path.unlink(missing_ok=True)
        next_path.unlink(missing_ok=True)


def _deferred(model: Any, output: Path, backend: Any, threads: int | None, executor: str, feeds: Any,
              precision: str, samples: Any, tolerance: Any) -> Any:
    """The IR and what to compile it with on the device (``DEFERRED_KEY``)."""
    from edgeinfer.format.eim import load_model, save_model
    from edgeinfer.model import Model

    names = [backend] if isinstance(backend, str) else list(backend) if isinstance(backend, (list, tuple)) else None
    if not names or not all(isinstance(n, str) for n in names):
        raise InputError(f"compile on the device: backend {backend!r}: expected a name, 'auto' or a list of names")
    if feeds is not None or precision != "fp32" or samples is not None or tolerance is not None:
        raise InputError("compile on the device: example inputs and a precision decided on samples are for "
                         "compiling here; the device decides on its own inputs (fp32)")
    spec = {"backend": names[0] if isinstance(backend, str) else names, "threads": threads, "executor": executor}
    save_model(Model(model.graph, {**model.metadata, DEFERRED_KEY: json.dumps(spec, sort_keys=True)}), output)
    return load_model(output)


def _runner_up(choice: Any) -> str | None:
    """The fastest warm candidate after the winner that is not the native engine and beats it by
    auto's margin (``auto.NATIVE_MARGIN``), if any."""
    from edgeinfer.runtime.auto import NATIVE_MARGIN

    medians, winner, native = choice.median_ms, ",".join(choice.backends), choice.native
    others = [label for label in sorted(medians, key=medians.get) if label not in (winner, native)
              and native in medians and medians[native] > medians[label] * (1 + NATIVE_MARGIN)]
    return others[0] if others else None


def _bound(model: Any, shapes: dict[str, tuple]) -> Any:
    """``model`` with the given static input shapes, types inferred again."""
    from edgeinfer.api import redeclare_inputs
    from edgeinfer.ir.infer import infer_types
    from edgeinfer.model import Model

    graph = infer_types(redeclare_inputs(model.graph, dict(shapes), False))
    graph.verify()
    return Model(graph, model.metadata)
