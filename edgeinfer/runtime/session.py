"""``Session``: compile a model once per shape signature on a backend, then run it many times.

The facade only checks feeds (``feeds.FeedChecker``), finds the compiled plan of their shape
signature in its plan cache (``plans.PlanCache``; built by ``plans.build_plan``), and hands the
plan to an executor (sequential, DAG, pipeline, Ray). It owns everything compiled: ``close()``
closes every plan, part, replica and stage plan.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from typing import TYPE_CHECKING, Any

import numpy as np

from edgeinfer.backend import Executable, check_device
from edgeinfer.errors import BackendError, InputError, SchedulerError
from edgeinfer.log import get_logger
from edgeinfer.model import Model, TensorInfo
from edgeinfer.runtime.aot import resolve, write_back
from edgeinfer.runtime.executors import DagExecutor
from edgeinfer.runtime.feeds import FeedChecker, Signature, select_outputs
from edgeinfer.runtime.futures import chain
from edgeinfer.runtime.lean import compiled_plan as section_plan
from edgeinfer.runtime.options import check_choice, from_keywords, gather, precision_keywords
from edgeinfer.runtime.options import engine_options as merged_engine_options
from edgeinfer.runtime.plans import CompiledPlan, EngineSettings, PlanCache, build_plan

if TYPE_CHECKING:  # futures are imported by the first run_async, not by a load
    from concurrent.futures import Future, ThreadPoolExecutor

log = get_logger("edgeinfer.runtime.session")


class Session:
    """A model compiled for this device, ready to serve requests.

    ``backend``: left out, the plan of a compiled ``.eim`` (``edgeinfer compile``: its parts built
    from their stored artifacts), else numpy; a name (``"numpy"``, ``"onnxruntime"``, ``"openvino"``, ``"tflite"``, ``"torch"``),
    a list in priority order (each node goes to the first that takes it; numpy runs the rest;
    a ``Backend`` object may stand for a name), or ``"auto"`` (the candidate placements timed
    here, the fastest kept and cached per shape signature). ``threads``: the CPU threads it may
    use. ``device``: ``"cpu"``, ``"gpu"`` or ``"npu"``. ``executor``: ``"sequential"``,
    ``"dag"`` (independent branches at once), ``"auto"`` (both timed here, the faster kept) or
    ``"ray"`` (each pipeline stage a Ray actor). Extra keywords are engine options of a single
    backend. ``options``: ``RunOptions`` (device fallback, debug, engine options per backend,
    ``example_feeds``, ``buckets``, ``plan_cache_size``), ``AutoOptions``, ``StreamOptions``
    (the pipeline shape ``stream`` uses by default), ``RayOptions``; one or a list
    (``edgeinfer.runtime.options``, where the old keywords are mapped).

    What is measured is decided per shape signature (each symbolic dim bound to its value,
    ``buckets`` grouping values): at construction when every input is static or
    ``example_feeds`` are given, else on the first request of each signature; the least
    recently used beyond ``plan_cache_size`` is closed.

    ``run`` may be called from many threads at once; ``run_async`` returns a future;
    ``stream`` pipelines an iterable of requests over stages. ``close()`` (or ``with``) stops
    every worker thread and closes everything compiled.
    """

    def __init__(self, model: Model | str | os.PathLike, backend: Any = None, threads: int | None = None, *,
                 device: str = "cpu", executor: str = "sequential", options: Any = None, **engine_options: Any):
        from edgeinfer.runtime import placement

        opts, engine_options = from_keywords(*precision_keywords(gather(options), dict(engine_options), backend))
        # a compiled .eim whose plan is what is asked: its plan, its graph not read (aot.resolve)
        model, section, backend, executor, threads = resolve(model, backend, executor, threads)
        if threads is not None and (not isinstance(threads, int) or threads < 1):
            raise BackendError(f"threads must be a positive integer, got {threads!r}")
        run, stream = opts.run, opts.stream
        self.model, self.threads, self.device, self.options = model, threads, check_device(device), opts
        self.debug = os.environ.get("EDGEINFER_DEBUG", "") not in ("", "0") if run.debug is None else run.debug
        self.backend_options = merged_engine_options(backend, run.backend_options, engine_options, section)
        self.fallback = run.fallback
        if executor not in (*placement.EXECUTORS, "auto", "ray"):
            raise BackendError(f"executor {executor!r}: expected one of {', '.join(placement.EXECUTORS)}, auto, ray")
        self.stages, self.replicas, self.plan_budget = stream.stages, stream.replicas, stream.plan_budget
        self._ray = None  # executor="ray": the session's stage actors, started on the first request
        if executor == "ray":
            from edgeinfer.runtime.stream.ray import RayServing

            self._ray = RayServing(backend, opts.ray, stream.stages, stream.replicas, self._plan_for)
        self.backend_name = backend if isinstance(backend, str) else ",".join(
            n if isinstance(n, str) else n.name for n in placement.backend_priority(backend))
        self._settings = EngineSettings(backend, executor, threads, self.device, self.fallback, self.backend_options,
                                        self.debug, opts.auto.cache, run.plan_cache_size, section, opts.auto.budget_s,
                                        opts.precision)
        self._checker = FeedChecker(model.inputs, run.buckets)
        self._inputs = model.inputs
        self.plan_cache = PlanCache(run.plan_cache_size)  # CompiledPlan per signature (auto decisions)
        self._single: CompiledPlan | None = None  # the one plan when only one can exist
        self._current: CompiledPlan | None = None  # the plan used last
        self._async_pool: ThreadPoolExecutor | None = None
        self._streams: Any = None  # the StreamContext of this session's streams, made by the first
        self._lock = threading.Lock()
        self._closed = False
        self._example = self._checker.check(run.example_feeds) if run.example_feeds is not None else None
        given = opts.precision.samples  # what a reduced precision is checked on: real inputs only
        self._settings.samples = [self._checker.check(s) for s in given] if given is not None else \
            None if self._example is None else [self._example]
        if section is not None:  # a compiled .eim: its stored plan, from its artifacts
            self._single = self._current = section_plan(model, self._settings)
        elif not self._settings.per_signature:
            self._single = self._current = build_plan(model, self._settings, None, None)
        else:
            sample = self._example if self._example is not None else (
                model.random_feeds() if self._checker.static else None)
            if sample is not None:
                plan = self._plan_for(sample)
                if self._checker.static:  # static inputs: no other signature can come
                    self._single = plan
        if getattr(model, "on_device", None) is not None:  # a file left to be compiled here: its plan written back
            write_back(model, self._single, self.threads)
        # what ``run`` hands checked feeds to: the one plan (its ``run`` is the engine's once
        # proven), or None where the plan depends on the request (signatures, Ray)
        self._fast = self._single if self._ray is None else None

    # -- plans --------------------------------------------------------------------------------
    def check_feeds(self, feeds: Mapping[str, Any]) -> dict[str, Any]:
        """``feeds`` as ``run`` takes them: checked against the inputs, converted where allowed."""
        return self._checker.check(feeds)

    def signature(self, feeds: Mapping[str, Any]) -> Signature:
        """The shape signature of ``feeds`` (each symbolic dim bound to its value, bucketed)."""
        return self._checker.signature(self._checker.check(feeds))

    def _build(self, signature: Signature, checked: dict[str, Any]) -> CompiledPlan:
        self._check_open()
        return build_plan(self.model, self._settings, signature, checked)

    def _plan_for(self, checked: dict[str, Any]) -> CompiledPlan:
        if self._single is not None:
            return self._single
        signature = self._checker.signature(checked)
        plan = self.plan_cache.get(signature, self._build, signature, checked)
        self._current = plan
        return plan

    def _lease(self, checked: dict[str, Any]):
        """A context manager holding the plan of ``checked``'s signature open while in use."""
        if self._single is not None:
            return nullcontext(self._single)
        signature = self._checker.signature(checked)
        return self._leased(signature, checked)

    @contextmanager
    def _leased(self, signature: Signature, checked: dict[str, Any]):
        with self.plan_cache.lease(signature, self._build, signature, checked) as plan:
            self._current = plan
            yield plan

    def _now(self) -> CompiledPlan:
        plan = self._current  # still readable after close() (the partition; its executables are closed)
        if plan is None:
            raise SchedulerError("no plan yet: with symbolic input dims, backend='auto' and executor='auto' decide "
                                 "on the first run with real shapes (or give Session(..., example_feeds=...))")
        return plan

    def compiled_plan(self, feeds: Mapping[str, Any]) -> CompiledPlan:
        """The compiled plan that serves requests like ``feeds`` (decided now if it is not yet)."""
        self._check_open()
        return self._plan_for(self._checker.check(feeds))

    @property
    def compiled_plans(self) -> dict[Signature | None, CompiledPlan]:
        """The compiled plans held now, by signature (None: one plan serves every signature)."""
        if self._single is not None:
            return {self._single.signature: self._single}
        return {plan.signature: plan for plan in self.plan_cache.values()}

    @property
    def plan(self):
        """The partition of the plan used last: which subgraph runs where, and why."""
        return self._now().plan

    @property
    def backends(self) -> list:
        return self._now().backends

    @property
    def _runner(self):
        return self._now().runner

    @property
    def precision_record(self) -> dict | None:
        """The precision decided for the plan used last (auto's, a compiled file's; None: not decided)."""
        return self._now().precision_record

    @property
    def auto_choice(self):
        """``backend="auto"``'s choice for the signature used last (None before it is made)."""
        plan = self._current
        return plan.auto_choice if plan is not None else None

    @property
    def executor(self) -> str:
        """With ``executor="auto"``: the one measured faster for the signature used last."""
        plan = self._current
        return plan.executor if plan is not None else self._settings.executor

    @property
    def executor_ms(self) -> dict[str, float]:
        plan = self._current
        return plan.executor_ms if plan is not None else {}

    @property
    def stage_plans(self) -> dict[Any, Any]:
        """Every stream plan held now, by (stages, replicas, signature)."""
        found = {}
        for plan in self.compiled_plans.values():
            for key in plan.stage_plans.keys():
                found[key] = plan.stage_plans.peek(key)
        return found

    @property
    def inputs(self) -> list[TensorInfo]:
        return list(self._inputs)

    @property
    def outputs(self) -> list[TensorInfo]:
        return self.model.outputs

    @property
    def executable(self) -> Executable | None:
        """The backend executable when the whole model is one part, else None (see ``plan``)."""
        parts = self._runner.parts
        return parts[0].executable() if len(parts) == 1 else None

    # -- serving ------------------------------------------------------------------------------
    def run(self, feeds: Mapping[str, Any], outputs: list[str] | None = None) -> dict[str, np.ndarray]:
        """Run once. ``feeds`` maps input name -> array; returns output name -> array."""
        if self._closed:
            self._check_open()
        fast = self._fast
        results = fast.run(self._checker.check(feeds)) if fast is not None else \
            self._run_checked(self._checker.check(feeds))
        return results if outputs is None else select_outputs(results, outputs)

    def _run_checked(self, checked: dict[str, Any]) -> dict[str, np.ndarray]:
        if self._ray is not None:
            return self._ray.run(checked)
        if self._single is not None:
            return self._single.run(checked)
        signature = self._checker.signature(checked)
        plan = self.plan_cache.acquire(signature, self._build, signature, checked)  # held open while it runs
        try:
            self._current = plan
            return plan.run(checked)
        finally:
            plan.release()

    def run_async(self, feeds: Mapping[str, Any], outputs: list[str] | None = None) -> Future:
        """Start a run and return a ``concurrent.futures.Future`` of its outputs. Feeds are checked
        now (a bad feed raises here, not in the future)."""
        self._check_open()
        checked = self._checker.check(feeds)
        if self._ray is None:
            plan = self._plan_for(checked)
            if isinstance(plan.runner, DagExecutor) and plan.proven:
                future = plan.runner.submit(checked)
                if outputs is None:
                    return future
                return chain(future, lambda results: select_outputs(results, outputs))
        with self._lock:
            if self._async_pool is None:
                from concurrent.futures import ThreadPoolExecutor

                workers = max(1, (os.cpu_count() or 1) // (self.threads or os.cpu_count() or 1))
                self._async_pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="edgeinfer-async")
        return self._async_pool.submit(lambda: select_outputs(self._run_checked(checked), outputs))

    def stream(self, requests: Iterable[Mapping[str, Any]], *, stages: int | str | None = None,
               replicas: int | Sequence[int] | str | None = None, max_in_flight: int | None = None,
               timeout: float | None = None, outputs: list[str] | None = None,
               plan: str = "background", plan_budget: float | None = None) -> Iterator[dict[str, np.ndarray]]:
        """Serve an iterable of feeds through a pipeline of stages; yields outputs in input order,
        each as soon as it and every earlier one are done.

        ``stages``: the number of pipeline stages, or ``"auto"`` (the planner picks stages and
        replicas that maximise measured throughput on this machine's ``threads``). ``replicas``:
        workers per stage (an int for all, a list, or ``"auto"``: spare threads go to the bottleneck).
        With ``"auto"`` and no plan yet for this signature, ``plan="background"`` serves at once
        on replicas of the whole graph (one single-threaded copy, one worker per core) and
        switches to the measured plan when it is ready;
        ``plan="first"`` plans before serving. ``plan_budget``: seconds the planner may spend
        trying candidates (default the session's). Memory stays bounded whatever the stream's
        length (``max_in_flight`` requests at most). ``timeout``: seconds a request may take once
        started (``RequestTimeoutError``). Closing the returned generator (or breaking out of the
        loop) cancels the rest. ``stages`` and ``replicas`` default to the session's; with
        ``executor="ray"`` the session's actors serve every stream.
        """
        from edgeinfer.runtime.stream import serve

        self._check_open()
        if plan not in ("background", "first"):
            raise BackendError(f"plan {plan!r}: expected 'background' or 'first'")
        if self._ray is not None:
            self._ray.check_shape(stages, replicas)
            return self._ray.stream(requests, self._checker.check, lambda results: select_outputs(results, outputs),
                                    max_in_flight=max_in_flight, timeout=timeout)
        stages = self.stages if stages is None else stages
        replicas = self.replicas if replicas is None else replicas
        check_choice(stages, replicas)
        return serve.stream(self._stream_context(), requests, stages=stages, replicas=replicas,
                            max_in_flight=max_in_flight, timeout=timeout, outputs=outputs,
                            background=plan == "background", plan_budget=plan_budget)

    def _stream_context(self) -> Any:
        from edgeinfer.runtime.stream.serve import StreamContext

        with self._lock:
            self._check_open()
            if self._streams is None:
                self._streams = StreamContext(self._checker.check, self._checker.signature, self._lease,
                                              self.plan_budget)
            return self._streams

    def pipeline_plan(self, feeds: Mapping[str, Any] | None = None, *, stages: int | str | None = None,
                      replicas: int | Sequence[int] | str | None = None):
        """The stage plan ``stream`` uses for requests like ``feeds`` (default: the session's
        ``example_feeds``, or random feeds when every input is static): stages, replicas,
        measured stage times. Planned once per choice and signature; later streams reuse it."""
        from edgeinfer.runtime.stream.planner import plan_stages
        from edgeinfer.runtime.stream.serve import plan_key

        stages = self.stages if stages is None else stages
        replicas = self.replicas if replicas is None else replicas
        self._check_open()
        check_choice(stages, replicas)
        checked = self._checker.check(feeds) if feeds is not None else self._default_sample()
        if self._ray is not None:  # the plan of the session's actors
            self._ray.check_shape(stages, replicas)
            return self._ray.started(checked).plan
        compiled = self._plan_for(checked)
        if not compiled.proven:
            compiled.run(checked)
        key = plan_key(stages, replicas, self._checker.signature(checked))
        return compiled.stage_plan(key, lambda: plan_stages(compiled, checked, stages=stages, replicas=replicas,
                                                            budget=self.plan_budget))

    def _default_sample(self) -> dict[str, Any]:
        if self._example is not None:
            return self._example
        if self._checker.static:
            return self.model.random_feeds()
        symbolic = [t.name for t in self._inputs if t.shape is None or not all(isinstance(d, int) for d in t.shape)]
        raise InputError(f"inputs {symbolic} have symbolic dims: give feeds of real shapes "
                         "(or Session(..., example_feeds=...)); edgeinfer does not plan on guessed dims")

    @property
    def ray_pipeline(self) -> Any:
        """The Ray stage actors and their plan (None before the first request, or without Ray)."""
        return self._ray.pipeline if self._ray is not None else None

    def stats(self) -> dict[str, Any]:
        """The executable's facts when the model is one part; else ``parts`` (each part's facts)
        and the numpy fallback ops of all parts together."""
        parts = self._runner.parts
        if len(parts) == 1:
            return parts[0].executable().stats()
        per_part = [{"backend": p.part.backend, "nodes": len(p.part.nodes), **p.executable().stats()}
                    for p in parts]
        fallback: dict[str, int] = {}
        for stats in per_part:
            for op, count in stats.get("fallback_ops", {}).items():
                fallback[op] = fallback.get(op, 0) + count
        return {"parts": per_part, "fallback_ops": fallback}

    def close(self) -> None:
        """Stop every worker thread of this session and close everything it compiled (every
        signature's plan, parts, replicas, stage plans); idempotent. Later calls raise SchedulerError."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._fast = None
            pool, self._async_pool = self._async_pool, None
            streams, ray = self._streams, self._ray
        if streams is not None:
            streams.close()  # pipelines, planners, workers a timeout detached
        if ray is not None:
            ray.close()
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
        self.plan_cache.close()
        if self._single is not None:
            self._single.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise SchedulerError("session is closed: expected an open Session, create a new one")
