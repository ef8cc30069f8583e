"""``Session``: compile a model once on a backend, then run it many times.

Feeds are checked against the model's declared inputs before anything runs: unknown or
missing names, wrong rank, a fixed dim that differs, a symbolic dim (``"N"``) bound to two
different sizes, and a wrong dtype each raise ``InputError`` quoting what was expected and
what was given.
"""

from __future__ import annotations

import itertools
import os
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from edgeinfer.backend import Executable, check_device
from edgeinfer.errors import BackendError, InputError, SchedulerError
from edgeinfer.ir import dtypes
from edgeinfer.model import Model, TensorInfo
from edgeinfer.scheduler.executors import DagExecutor


class Session:
    """A model compiled for this device, ready to serve requests.

    ``backend``: a name (``"numpy"``, ``"onnxruntime"``, ``"openvino"``, ``"tflite"``), a list in
    priority order (each node goes to the first that can run it; numpy runs the rest), or
    ``"auto"`` (time the candidate placements here and keep the fastest; the choice is cached).
    A ``Backend`` object may stand in a list for a name (an engine of your own).
    ``threads``: the CPU threads the session may use. ``device``: ``"cpu"``, ``"gpu"`` or
    ``"npu"`` (``fallback=True`` runs on the CPU when the device is missing, with a warning).
    ``executor``: ``"sequential"``, ``"dag"`` (independent branches at once), ``"auto"`` (time
    both here, keep the faster: cutting at forks helps some engines and costs others) or ``"ray"`` (each
    pipeline stage a Ray actor; ``address=None`` starts a local Ray instance, or give
    ``"ray://host:port"`` / ``"auto"``; ``stage_resources`` is one dict of Ray actor resources
    (``num_cpus``, ``num_gpus``, ``resources={"npu": 1}``) for every stage or a list of them;
    ``ray_options`` takes ``transfer_bytes_per_second``, ``max_restarts`` and ``ray_init``).
    ``stages`` / ``replicas``: the pipeline shape ``stream`` uses by default (and Ray always).
    Engine options go to a single backend as keywords, or as ``backend_options={name: {...}}``.

    ``run`` may be called from many threads at once; ``run_async`` returns a future;
    ``stream`` pipelines an iterable of requests over stages. ``close()`` (or ``with``) stops
    every worker thread.
    """

    def __init__(self, model: Model | str | os.PathLike, backend: Any = "numpy",
                 threads: int | None = None, *, device: str = "cpu", fallback: bool = False,
                 executor: str = "sequential", debug: bool | None = None,
                 backend_options: Mapping[str, Mapping[str, Any]] | None = None,
                 cache: str | os.PathLike | bool | None = None, stages: int | str | None = "auto",
                 replicas: int | Sequence[int] | str | None = "auto", address: str | None = None,
                 stage_resources: Any = None, ray_options: Mapping[str, Any] | None = None,
                 **engine_options: Any):
        from edgeinfer import scheduler

        if not isinstance(model, Model):
            from edgeinfer.api import load_any

            model = load_any(model)
        if threads is not None and (not isinstance(threads, int) or threads < 1):
            raise BackendError(f"threads must be a positive integer, got {threads!r}")
        self.model = model
        self.threads = threads
        self.device = check_device(device)
        self.debug = os.environ.get("EDGEINFER_DEBUG", "") not in ("", "0") if debug is None else debug
        options = dict(backend_options or {})
        if engine_options:
            if not isinstance(backend, str) or backend == "auto":
                raise BackendError(f"engine options {sorted(engine_options)} need a single backend; with "
                                   f"{backend!r} give backend_options={{name: {{...}}}}")
            options[backend] = {**options.get(backend, {}), **engine_options}
        self.backend_options = options
        self.fallback = fallback
        self.executor_ms: dict[str, float] = {}
        if executor not in (*scheduler.EXECUTORS, "auto", "ray"):
            raise BackendError(f"executor {executor!r}: expected one of {', '.join(scheduler.EXECUTORS)}, auto, ray")
        from edgeinfer.scheduler.pipeline import check_choice

        check_choice(stages, replicas)
        self.stages, self.replicas = stages, replicas
        self._ray_settings = None
        if executor == "ray":
            from edgeinfer.scheduler.ray_executor import import_ray, ray_settings

            import_ray()  # a clear error now if Ray is missing
            self._ray_settings = ray_settings(address, stage_resources, ray_options)
            if not all(isinstance(b, str) for b in ([backend] if isinstance(backend, str) else list(backend))):
                raise BackendError("executor='ray' needs backends by name: Backend objects cannot travel to actors")
        if backend == "auto":
            from edgeinfer.scheduler.auto import choose_backends

            self.auto_choice = choose_backends(model, threads=threads, device=device, fallback=fallback,
                                               options=options, cache=cache)
            names = self.auto_choice.backends
        else:
            self.auto_choice = None
            names = scheduler.backend_priority(backend)
        self.backend_name = backend if isinstance(backend, str) else ",".join(
            n if isinstance(n, str) else n.name for n in names)
        prepared = self.auto_choice.prepared if self.auto_choice is not None else None
        if prepared is not None and executor == "sequential" and not self.debug:
            self.backends, self.plan, self._runner = prepared  # compiled while measuring
            self.auto_choice.prepared = None
        elif executor == "auto":
            from edgeinfer.scheduler.auto import choose_executor

            self.backends = scheduler.make_backends(names, device=device, fallback=fallback, options=options)
            executor, self.plan, self._runner, self.executor_ms = choose_executor(
                model, self.backends, threads=threads, debug=self.debug)
        else:
            self.backends = scheduler.make_backends(names, device=device, fallback=fallback, options=options)
            self.plan = scheduler.make_plan(model.graph, self.backends, branches=executor == "dag")
            local = "sequential" if executor == "ray" else executor  # Ray: local runner only plans
            self._runner = scheduler.build_executor(self.plan, self.backends, threads=threads, executor=local,
                                                    debug=self.debug)
        self.executor = executor  # with executor="auto": the one measured faster (executor_ms)
        self._inputs = model.inputs
        self._expected = {t.name: t for t in self._inputs}
        self._np_dtypes = {t.name: _feed_dtype(t.dtype) for t in self._inputs}
        self._async_pool: ThreadPoolExecutor | None = None
        self._streams: weakref.WeakSet = weakref.WeakSet()
        self.stage_plans: dict[Any, Any] = {}  # stream plans by (stages, replicas, input shapes)
        self._lock = threading.Lock()
        self._ray = None  # the RayPipeline, made on the first request
        self._closed = False

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

    def run(self, feeds: Mapping[str, Any], outputs: list[str] | None = None) -> dict[str, np.ndarray]:
        """Run once. ``feeds`` maps input name -> array; returns output name -> array."""
        self._check_open()
        return self._select(self._run_checked(self._check_feeds(feeds)), outputs)

    def _run_checked(self, checked: dict[str, Any]) -> dict[str, np.ndarray]:
        if self._ray_settings is not None:
            return next(iter(self._ray_pipeline(checked).serve([checked])))
        return self._runner.run(checked)

    def run_async(self, feeds: Mapping[str, Any], outputs: list[str] | None = None) -> Future:
        """Start a run and return a ``concurrent.futures.Future`` of its outputs. Feeds are checked
        now (a bad feed raises here, not in the future)."""
        self._check_open()
        checked = self._check_feeds(feeds)
        if isinstance(self._runner, DagExecutor):
            future = self._runner.submit(checked)
            if outputs is None:
                return future
            return _chain(future, lambda results: self._select(results, outputs))
        with self._lock:
            if self._async_pool is None:
                workers = max(1, (os.cpu_count() or 1) // (self.threads or os.cpu_count() or 1))
                self._async_pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="edgeinfer-async")
        return self._async_pool.submit(lambda: self._select(self._run_checked(checked), outputs))

    def stream(self, requests: Iterable[Mapping[str, Any]], *, stages: int | str | None = None,
               replicas: int | Sequence[int] | str | None = None, max_in_flight: int | None = None,
               timeout: float | None = None, outputs: list[str] | None = None) -> Iterator[dict[str, np.ndarray]]:
        """Serve an iterable of feeds through a pipeline of stages; yields outputs in input order.

        ``stages``: the number of pipeline stages, or ``"auto"`` (the planner picks stages and
        replicas that maximise measured throughput on this machine's ``threads``). ``replicas``:
        workers per stage (an int for all, a list, or ``"auto"``: spare threads go to the bottleneck).
        Memory stays bounded whatever the stream's length (``max_in_flight`` requests at most).
        ``timeout``: seconds a request may take once started (``RequestTimeoutError``).
        Closing the returned generator (or breaking out of the loop) cancels the rest.
        ``stages`` and ``replicas`` default to the session's; with ``executor="ray"`` the
        session's actors serve every stream.
        """
        from edgeinfer.scheduler import pipeline

        self._check_open()
        if self._ray_settings is not None:
            self._check_ray_shape(stages, replicas)
            return self._ray_stream(requests, max_in_flight=max_in_flight, timeout=timeout, outputs=outputs)
        stages = self.stages if stages is None else stages
        replicas = self.replicas if replicas is None else replicas
        pipeline.check_choice(stages, replicas)
        return pipeline.stream(self, requests, stages=stages, replicas=replicas, max_in_flight=max_in_flight,
                               timeout=timeout, check=self._check_feeds,
                               select=lambda results: self._select(results, outputs), register=self._register)

    def pipeline_plan(self, feeds: Mapping[str, Any] | None = None, *, stages: int | str | None = None,
                      replicas: int | Sequence[int] | str | None = None):
        """The stage plan ``stream`` uses for requests like ``feeds`` (default: random feeds of
        the declared shapes at batch 1): stages, replicas, measured stage times. Planned once per
        choice and input shapes; later streams reuse it."""
        from edgeinfer.scheduler.pipeline import check_choice, plan_key, plan_stages

        stages = self.stages if stages is None else stages
        replicas = self.replicas if replicas is None else replicas
        self._check_open()
        check_choice(stages, replicas)
        checked = self._check_feeds(feeds if feeds is not None else self.model.random_feeds())
        if self._ray_settings is not None:  # the plan of the session's actors
            self._check_ray_shape(stages, replicas)
            return self._ray_pipeline(checked).plan
        key = plan_key(stages, replicas, checked)
        if key not in self.stage_plans:
            self.stage_plans[key] = plan_stages(self, checked, stages=stages, replicas=replicas)
        return self.stage_plans[key]

    def _check_ray_shape(self, stages: Any, replicas: Any) -> None:
        """With Ray the actors exist once per session: a different shape per stream is an error."""
        for name, given, fixed in (("stages", stages, self.stages), ("replicas", replicas, self.replicas)):
            if given is not None and given != fixed:
                raise BackendError(f"{name}={given!r}: with executor='ray' the pipeline shape is the session's "
                                   f"({name}={fixed!r}); give it to Session(...)")

    def _ray_stream(self, requests: Iterable[Mapping[str, Any]], *, max_in_flight: int | None,
                    timeout: float | None, outputs: list[str] | None) -> Iterator[dict[str, np.ndarray]]:
        source = iter(requests)
        try:
            first = next(source)
        except StopIteration:
            return
        ray_pipeline = self._ray_pipeline(self._check_feeds(first))
        yield from ray_pipeline.serve(itertools.chain([first], source), check=self._check_feeds,
                                      select=lambda results: self._select(results, outputs),
                                      max_in_flight=max_in_flight, timeout=timeout)

    def _ray_pipeline(self, sample: dict[str, Any]) -> Any:
        """The session's Ray stage actors, planned and started on the first request."""
        from edgeinfer.scheduler.ray_executor import RayPipeline

        with self._lock:
            self._check_open()
            if self._ray is None:
                self._ray = RayPipeline(self, sample, stages=self.stages, replicas=self.replicas,
                                        **self._ray_settings)
            return self._ray

    @property
    def ray_pipeline(self) -> Any:
        """The Ray stage actors and their plan (None before the first request, or without Ray)."""
        return self._ray

    def _register(self, pipeline: Any) -> None:
        with self._lock:
            if self._closed:
                pipeline.close()
                raise SchedulerError("session is closed: expected an open Session, create a new one")
            self._streams.add(pipeline)

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
        """Stop every worker thread of this session; idempotent. Later calls raise SchedulerError."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            pool, self._async_pool = self._async_pool, None
            ray_pipeline, self._ray = self._ray, None
        for pipeline in list(self._streams):
            pipeline.close()
        if ray_pipeline is not None:
            ray_pipeline.close()
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
        self._runner.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise SchedulerError("session is closed: expected an open Session, create a new one")

    def _select(self, results: dict[str, np.ndarray], outputs: list[str] | None) -> dict[str, np.ndarray]:
        if outputs is None:
            return results
        unknown = [o for o in outputs if o not in results]
        if unknown:
            raise InputError(f"unknown output(s) {unknown}: expected some of {list(results)}")
        return {name: results[name] for name in outputs}

    def _check_feeds(self, feeds: Mapping[str, Any]) -> dict[str, np.ndarray]:
        if not isinstance(feeds, Mapping):
            raise InputError(f"feeds: expected a dict of input name -> array, got {type(feeds).__name__}")
        unknown = [k for k in feeds if k not in self._expected]
        missing = [k for k in self._expected if k not in feeds]
        if unknown or missing:
            raise InputError(f"feeds: expected inputs {list(self._expected)}, got {list(feeds)}"
                             + (f" (unknown: {unknown})" if unknown else "")
                             + (f" (missing: {missing})" if missing else ""))
        bound: dict[str, tuple[int, str]] = {}
        checked = {}
        for name, info in self._expected.items():
            array = feeds[name]
            if info.dtype is not None and not dtypes.is_tensor_type(info.dtype):
                checked[name] = _check_container(name, info.dtype, array)
                continue
            if not isinstance(array, np.ndarray):
                array = np.asarray(array)
            want = self._np_dtypes[name]
            if want is not None and array.dtype != want and not (want.kind == "O" and array.dtype.kind in "OUS"):
                raise InputError(f"input {name!r}: expected dtype {info.dtype}, got {array.dtype}")
            if info.shape is not None:
                _check_shape(name, info.shape, array.shape, bound)
            checked[name] = array
        return checked


def _chain(future: Future, then: Callable[[Any], Any]) -> Future:
    """A future of ``then(result)`` of ``future``."""
    from edgeinfer.scheduler.executors import settle

    chained: Future = Future()

    def done(source: Future) -> None:
        try:
            settle(chained, result=then(source.result()))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller through the future
            settle(chained, error=exc)

    future.add_done_callback(done)
    return chained


def _check_container(name: str, dtype: str, value: Any) -> Any:
    """Sequence inputs take a list of arrays; optional inputs also take None."""
    if dtype.startswith("optional(") and value is None:
        return None
    inner = dtype[dtype.index("(") + 1:-1]
    if dtype.startswith("optional("):
        return _check_container(name, inner, value) if not dtypes.is_tensor_type(inner) else np.asarray(value)
    if not isinstance(value, (list, tuple)):
        raise InputError(f"input {name!r}: expected a list of arrays ({dtype}), got {type(value).__name__}")
    return [np.asarray(item) for item in value]


def _feed_dtype(name: str | None):
    if name is None or not dtypes.is_tensor_type(name):
        return None
    return dtypes.numpy_dtype(name)


def _check_shape(name: str, expected: tuple, got: tuple, bound: dict[str, tuple[int, str]]) -> None:
    def show(shape) -> str:
        return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"

    if len(expected) != len(got):
        raise InputError(f"input {name!r}: expected rank {len(expected)} shape {show(expected)}, "
                         f"got rank {len(got)} shape {show(got)}")
    for axis, (want, have) in enumerate(zip(expected, got)):
        if isinstance(want, int) and want != have:
            raise InputError(f"input {name!r}: expected shape {show(expected)}, got {show(got)} "
                             f"(dim {axis} must be {want})")
        if isinstance(want, str):
            previous = bound.setdefault(want, (have, name))
            if previous[0] != have:
                raise InputError(f"input {name!r}: dim {axis} is symbol {want!r} = {have}, but input "
                                 f"{previous[1]!r} bound {want!r} = {previous[0]}")
