"""Pipeline stages across machines, on Ray (``Session(model, executor="ray", ...)``).

The same stage planner as the local pipeline (``planner.plan_stages``) splits the graph, now
counting the bytes that cross each cut (``transfer_bytes_per_second``), so cuts go where
activations are small. Each stage becomes a Ray actor (one per replica) that receives its
subgraph as ``.eim`` bytes (edgeinfer's own validated format: nothing executable travels),
compiles it once on its backends, and serves requests. Activations go from actor to actor
through Ray's object store: the driver only chains object references, so a request's values
never pass through it between stages. Results come back in input order.

Faults: at most ``max_in_flight`` requests are in flight (backpressure); an actor that dies is
restarted by Ray and its in-flight calls are retried once (``max_restarts``,
``max_task_retries``), so no request is lost or served twice; a stage that raises passes its
error to the caller; ``close()`` kills the actors, and the Ray instance stops only if
edgeinfer started it and no other session in the process still uses it (one started by the
caller, or shared with other sessions, stays up).
"""

from __future__ import annotations

import collections
import itertools
import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from edgeinfer.errors import BackendError, EdgeInferError, RequestTimeoutError, SchedulerError

if TYPE_CHECKING:
    from edgeinfer.runtime.plans import CompiledPlan

log = logging.getLogger("edgeinfer.runtime.stream.ray")
TRANSFER_BYTES_PER_SECOND = 1e9  # about a 10 GbE link; the object store on one machine is faster
RESOURCE_KEYS = ("num_cpus", "num_gpus", "resources", "memory")


def import_ray():
    try:
        import ray
    except ImportError as exc:
        raise BackendError("executor='ray' needs Ray: pip install 'edgeinfer[ray]' (or pip install ray)") from exc
    return ray


class StageWorker:
    """The body of a stage actor: load the stage's .eim bytes, compile it once, serve it."""

    def __init__(self, eim: bytes, placement: list[str], backend_options: dict[str, dict], device: str,
                 fallback: bool, threads: int, keep: list[str]):
        from edgeinfer.api import load
        from edgeinfer.runtime.compile import compile
        from edgeinfer.runtime.placement import make_backends

        self._folder = tempfile.TemporaryDirectory(prefix="edgeinfer-stage-")
        path = Path(self._folder.name) / "stage.eim"
        path.write_bytes(eim)
        graph = load(path).graph
        names = list(dict.fromkeys([*placement, "numpy"]))
        backends = make_backends(names, device=device, fallback=fallback,
                                 options={k: v for k, v in backend_options.items() if k in names})
        _, self.runner = compile(graph, backends, threads=threads, pinned=dict(enumerate(placement)), busy_wait=False)
        self.keep = frozenset(keep)
        self.inputs = graph.input_names

    def run(self, message: dict[str, Any]) -> dict[str, Any]:
        results = self.runner.run({name: message[name] for name in self.inputs})
        merged = {**message, **results}
        return {name: merged[name] for name in self.keep if name in merged}

    def pid(self) -> int:
        return os.getpid()


def _resources(stage_resources: Any, count: int, threads: int) -> list[dict[str, Any]]:
    """Per-stage actor options: one dict for every stage or a list with one per stage."""
    if stage_resources is None:
        entries: list[Mapping[str, Any]] = [{"num_cpus": threads}] * count
    elif isinstance(stage_resources, Mapping):
        entries = [stage_resources] * count
    elif isinstance(stage_resources, Sequence) and len(stage_resources) == count:
        entries = list(stage_resources)
    else:
        raise BackendError(f"stage_resources: expected a dict or a list of {count} dicts (one per stage), "
                           f"got {stage_resources!r}")
    checked = []
    for entry in entries:
        unknown = sorted(set(entry) - set(RESOURCE_KEYS))
        if unknown:
            raise BackendError(f"stage_resources: unknown key(s) {unknown}; expected some of {list(RESOURCE_KEYS)}")
        checked.append({"num_cpus": threads, **dict(entry)})
    return checked


class RayPipeline:
    """Stage actors on a Ray cluster for one session; ``serve`` streams requests through them."""

    def __init__(self, compiled: CompiledPlan, sample: Mapping[str, Any], *, address: str | None,
                 stages: int | str | None = "auto", replicas: Any = "auto", stage_resources: Any = None,
                 transfer_bytes_per_second: float | None = TRANSFER_BYTES_PER_SECOND, max_restarts: int = 3,
                 ray_init: Mapping[str, Any] | None = None):
        from edgeinfer.runtime.placement import backend_priority, spec_options
        from edgeinfer.runtime.stream.planner import plan_stages

        ray = import_ray()
        self.ray = ray
        self.started_ray = False
        self._attached = False
        self._closed = False
        self._lock = threading.Lock()
        self.actors: list[list[Any]] = []
        self.started_ray = _attach(ray, address, ray_init)
        self._attached = True
        try:
            workers = max(1, int(ray.cluster_resources().get("CPU", 1)))
            # the driver plans on a profile and compiles no stage: the actors compile their own
            self.plan = plan_stages(compiled, sample, stages=stages, replicas=replicas, measure=False,
                                    transfer_bytes_per_second=transfer_bytes_per_second, workers=workers,
                                    compile_stages=False)
            resources = _resources(stage_resources, len(self.plan.stages), self.plan.threads_per_worker)
            self._check_capacity(resources)
            remote = ray.remote(StageWorker)
            settings = compiled.settings
            chosen = compiled.auto_choice.backends if compiled.auto_choice is not None else settings.backend
            engine_options = spec_options(backend_priority(chosen), settings.options)  # torch@cuda:0: its device
            for number, (stage, count, options) in enumerate(zip(self.plan.stages, self.plan.replicas, resources)):
                eim = _stage_bytes(stage.graph)
                placement = stage.backends
                actor_options = {**options, "max_restarts": max_restarts, "max_task_retries": 1}
                self.actors.append([
                    remote.options(**actor_options).remote(
                        eim, placement, engine_options, settings.device, settings.fallback,
                        self.plan.threads_per_worker, sorted(stage.keep))
                    for _ in range(count)])
                log.info("stage %d: %d actor(s) with %s", number, count, options)
            ray.get([actor.pid.remote() for group in self.actors for actor in group])  # compiled and alive
        except BaseException:
            self.close()
            raise

    def _check_capacity(self, resources: list[dict[str, Any]]) -> None:
        """Refuse a plan whose actors cannot all be placed (they would wait forever)."""
        total = self.ray.cluster_resources()
        need: dict[str, float] = collections.Counter()
        for options, replicas in zip(resources, self.plan.replicas):
            need["CPU"] += float(options.get("num_cpus") or 0) * replicas
            need["GPU"] += float(options.get("num_gpus") or 0) * replicas
            for key, amount in dict(options.get("resources") or {}).items():
                need[key] += float(amount) * replicas
        short = {k: (v, total.get(k, 0.0)) for k, v in need.items() if v > total.get(k, 0.0) + 1e-9}
        if short:
            listed = ", ".join(f"{k} {v:g} (cluster has {have:g})" for k, (v, have) in short.items())
            raise SchedulerError(f"the Ray stage actors need {listed}: use fewer stages or replicas, or "
                                 "fractional stage_resources such as {'num_cpus': 0.5}")

    def serve(self, requests: Iterable[Mapping[str, Any]], *, check: Callable[[Any], dict] | None = None,
              select: Callable[[dict], dict] | None = None, max_in_flight: int | None = None,
              timeout: float | None = None) -> Iterator[dict[str, np.ndarray]]:
        """Yield each request's outputs in input order, at most ``max_in_flight`` in flight."""
        ray = self.ray
        workers = sum(self.plan.replicas)
        limit = max_in_flight or 2 * workers + 2
        if limit < 1:
            raise BackendError(f"max_in_flight {max_in_flight!r}: expected a positive integer")
        pending: collections.deque = collections.deque()
        self.max_depth_seen = 0
        sequence = 0
        source = iter(requests)
        exhausted = False
        while True:
            while not exhausted and len(pending) < limit:
                try:
                    feeds = next(source)
                except StopIteration:
                    exhausted = True
                    break
                self._check_open()
                try:
                    message = check(feeds) if check is not None else dict(feeds)
                except BaseException as exc:  # noqa: BLE001 - raised at this request's turn
                    pending.append((sequence, None, exc, time.monotonic()))
                else:
                    ref = ray.put(message)
                    for group in self.actors:
                        ref = group[sequence % len(group)].run.remote(ref)
                    pending.append((sequence, ref, None, time.monotonic()))
                sequence += 1
                self.max_depth_seen = max(self.max_depth_seen, len(pending))
            if not pending:
                return
            number, ref, error, started = pending.popleft()
            if error is not None:
                raise error
            message = self._result(ref, number, started, timeout)
            results = {name: message[name] for name in self.plan.output_names}
            yield select(results) if select is not None else results

    def _result(self, ref: Any, number: int, started: float, timeout: float | None) -> dict[str, Any]:
        ray = self.ray
        left = None if timeout is None else max(0.0, started + timeout - time.monotonic())
        try:
            return ray.get(ref, timeout=left)
        except ray.exceptions.GetTimeoutError:
            raise RequestTimeoutError(f"ray stream request {number} did not finish within {timeout} s") from None
        except ray.exceptions.RayTaskError as exc:
            cause = getattr(exc, "cause", None)
            if isinstance(cause, EdgeInferError):
                raise cause from None
            raise SchedulerError(f"ray stream request {number} failed in a stage: {exc}") from exc
        except ray.exceptions.RayActorError as exc:
            raise SchedulerError(f"ray stream request {number}: a stage actor died and could not be "
                                 f"restarted ({str(exc).splitlines()[0]})") from exc

    def _check_open(self) -> None:
        if self._closed:
            raise SchedulerError("the Ray pipeline is closed")

    def close(self) -> None:
        """Kill the stage actors; stop the local Ray instance if this pipeline started it."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        ray = self.ray
        if ray.is_initialized():
            for group in self.actors:
                for actor in group:
                    try:
                        ray.kill(actor, no_restart=True)
                    except Exception as exc:  # noqa: BLE001 - an actor already gone is fine
                        log.debug("killing a stage actor: %s", exc)
        self.actors = []
        if self._attached:
            self._attached = False
            _detach(ray)


# The Ray instance edgeinfer started in this process, and how many pipelines use it: a session
# never shuts down an instance it did not start, nor one another session still uses.
_RAY_LOCK = threading.Lock()
_RAY_USERS = {"started": False, "count": 0}


class RayServing:
    """A session's Ray stage actors (``executor="ray"``): planned and started on its first
    request, serving every ``run`` and ``stream`` of the session; one pipeline shape per session."""

    def __init__(self, backend: Any, options: Any, stages: Any, replicas: Any,
                 plan_for: Callable[[dict[str, Any]], CompiledPlan]):
        self.settings = ray_settings(backend, options)  # checked now: a clear error before any request
        self.stages, self.replicas, self._plan_for = stages, replicas, plan_for
        self.pipeline: RayPipeline | None = None
        self._lock = threading.Lock()
        self._closed = False

    def started(self, sample: dict[str, Any]) -> RayPipeline:
        """The actors, planned on ``sample`` and started the first time."""
        with self._lock:
            if self._closed:
                raise SchedulerError("session is closed: expected an open Session, create a new one")
            if self.pipeline is None:
                self.pipeline = RayPipeline(self._plan_for(sample), sample, stages=self.stages,
                                            replicas=self.replicas, **self.settings)
            return self.pipeline

    def run(self, checked: dict[str, Any]) -> dict[str, np.ndarray]:
        return next(iter(self.started(checked).serve([checked])))

    def check_shape(self, stages: Any, replicas: Any) -> None:
        """With Ray the actors exist once per session: a different shape per stream is an error."""
        for name, given, fixed in (("stages", stages, self.stages), ("replicas", replicas, self.replicas)):
            if given is not None and given != fixed:
                raise BackendError(f"{name}={given!r}: with executor='ray' the pipeline shape is the session's "
                                   f"({name}={fixed!r}); give it to Session(...)")

    def stream(self, requests: Iterable[Mapping[str, Any]], check: Callable[[Any], dict],
               select: Callable[[dict], dict], *, max_in_flight: int | None,
               timeout: float | None) -> Iterator[dict[str, np.ndarray]]:
        source = iter(requests)
        try:
            first = next(source)
        except StopIteration:
            return
        pipeline = self.started(check(first))
        yield from pipeline.serve(itertools.chain([first], source), check=check, select=select,
                                  max_in_flight=max_in_flight, timeout=timeout)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            pipeline, self.pipeline = self.pipeline, None
        if pipeline is not None:
            pipeline.close()


def ray_settings(backend: Any, ray: Any) -> dict[str, Any]:
    """``RayPipeline``'s keywords from ``RayOptions`` (a clear error if Ray is missing or a
    backend cannot travel to the actors)."""
    import_ray()
    if not all(isinstance(b, str) for b in ([backend] if isinstance(backend, str) else list(backend))):
        raise BackendError("executor='ray' needs backends by name: Backend objects cannot travel to actors")
    return ray.settings()


def _attach(ray: Any, address: str | None, ray_init: Mapping[str, Any] | None) -> bool:
    """Join the process's Ray instance, starting one if none is running; True if this call
    started it."""
    with _RAY_LOCK:
        started = False
        if not ray.is_initialized():
            options = {"include_dashboard": False, "log_to_driver": False, "configure_logging": False,
                       **dict(ray_init or {})}
            ray.init(address=address, **options)
            _RAY_USERS["started"], _RAY_USERS["count"] = True, 0
            started = True
        _RAY_USERS["count"] += 1
        return started


def _detach(ray: Any) -> None:
    """Leave the Ray instance; the last pipeline out shuts it down if edgeinfer started it (a
    session that started it and closes first leaves it to the sessions still using it)."""
    with _RAY_LOCK:
        _RAY_USERS["count"] = max(0, _RAY_USERS["count"] - 1)
        if _RAY_USERS["started"] and _RAY_USERS["count"] == 0 and ray.is_initialized():
            ray.shutdown()
            _RAY_USERS["started"] = False


def _stage_bytes(graph) -> bytes:
    from edgeinfer.model import Model

    with tempfile.TemporaryDirectory(prefix="edgeinfer-stage-") as folder:
        path = Path(folder) / "stage.eim"
        Model(graph).save(path)
        return path.read_bytes()
